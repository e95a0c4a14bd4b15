# gwimage (gwimage/README.md): the natgw binary and the gateway image.
#
#   make natgw         static natgw binaries as the image has them ->
#                      gwimage/out/natgw (without ha: tag natgw_omit_ha) and
#                      gwimage/out/natgw-ha (`natgw ha` execs it)
#   make image         the gateway image, built without a Docker daemon ->
#                      gwimage/out/natgw-image.tar (OCI image layout that is
#                      also a docker-save archive: docker load -i / podman
#                      load -i); prints digest and sizes. Same inputs, same
#                      digest.
#   make gwimage-fuzz  each gwimage fuzz target for $(FUZZTIME) (run by
#                      `make test` through TEST_AFTER)
#
# gwimage/Dockerfile builds the same layout with Docker.

# The version of every image `make image` builds: gwimage/version/RELEASE,
# the one place it is written (controller/config and the Helm chart reference
# it; charts/chart_test.go checks). Overriding it here builds images the
# shipped manifests do not name.
NATGW_VERSION ?= $(shell cat $(CURDIR)/gwimage/version/RELEASE)
NATGW_OUT := $(CURDIR)/gwimage/out
NATGW_LDFLAGS := -s -w -buildid= -X github.com/natgw/natgw/gwimage/version.Version=$(NATGW_VERSION)
# A count, not a duration: with a duration, Go 1.26's fuzz coordinator can
# report "context deadline exceeded" at the end of the window without any
# finding (go.dev/issue/75804, fixed in Go 1.27), which failed CI on a loaded
# machine. A count has no deadline to race; 50000 runs is about what 5 s
# bought on this machine.
FUZZTIME ?= 50000x
# package:FuzzTarget, one package at a time.
GWIMAGE_FUZZ := ./agentapi:FuzzDecodeRequest ./agentapi:FuzzFastDecode ./agentapi:FuzzParseIPv4 ./agentapi:FuzzStrRun ./agentapi:FuzzServe ./gwimage/compat:FuzzParse

.PHONY: natgw image gwimage-fuzz
natgw:
	@mkdir -p $(NATGW_OUT)
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -tags natgw_omit_ha -ldflags '$(NATGW_LDFLAGS)' -o $(NATGW_OUT)/natgw ./gwimage/cmd/natgw
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags '$(NATGW_LDFLAGS)' -o $(NATGW_OUT)/natgw-ha ./gwimage/cmd/natgw

image:
	$(GO) run ./gwimage/cmd/mkimage -version $(NATGW_VERSION) -o $(NATGW_OUT)/natgw-image.tar

gwimage-fuzz:
	@set -e; for t in $(GWIMAGE_FUZZ); do \
	  pkg=$${t%%:*}; fn=$${t#*:}; \
	  echo "fuzz $$fn in $$pkg for $(FUZZTIME)"; \
	  $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

TEST_AFTER += gwimage-fuzz
