# envtest control plane: kube-apiserver v1.37.2 and etcd v3.7.3, built from
# the Go module proxy by the wrapper modules under hack/envtest/ (see build.sh)
# into a git-ignored cache. Cold build: minutes; afterwards a stamp check.
#
#   make envtest-assets      build once, skip when current
#   make envtest-clean       drop the built binaries
#
# Every recipe sees KUBEBUILDER_ASSETS pointing at the cache, so a test target
# only has to depend on envtest-assets.

ENVTEST_ASSETS ?= $(CURDIR)/.cache/envtest/bin
export KUBEBUILDER_ASSETS := $(ENVTEST_ASSETS)

.PHONY: envtest-assets envtest-clean
envtest-assets:
	@ENVTEST_ASSETS="$(ENVTEST_ASSETS)" hack/envtest/build.sh

envtest-clean:
	rm -rf "$(ENVTEST_ASSETS)"

# `make test` (top-level Makefile) builds the assets first and passes the path.
TEST_DEPS += envtest-assets
TEST_ENV += KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)"
