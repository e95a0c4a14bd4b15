# natgw. The README's two commands: `make demo` and `make test`.
SHELL := /bin/bash
GO ?= go
export PATH := $(PATH):/usr/local/go/bin:/usr/sbin:/sbin

# Fragments in mk/ add targets and append to these lists.
TEST_DEPS :=
TEST_ENV :=
TEST_AFTER :=

-include mk/*.mk

.PHONY: deps test vet unit
deps:
	@bash hack/install-deps.sh

vet:
	$(GO) vet ./...

# Every test, with the race detector, as root (namespace tests skip when not root).
test: deps $(TEST_DEPS) vet
	$(TEST_ENV) $(GO) test -race -count=1 -timeout 75m ./...
	@for t in $(TEST_AFTER); do $(MAKE) --no-print-directory $$t || exit 1; done
