# Kube-OVN's own controller driving natgw's gateway image (packages
# internal/kubeovn, e2e/kubeovn): kube-ovn-controller v1.16.2 built from the
# Go module proxy by hack/kubeovn/build.sh into .cache/kubeovn/bin (stamp
# check when current; cold ~400 s on 2 cores), the OVN databases served by
# Debian's ovn-central (ovsdb-server, ovsdb-tool, ovn-sbctl).
#
#   make kubeovn-assets    build/install what the scenario needs (once)
#   make kubeovn-e2e       run the scenario (needs the cluster's assets and `make image`)

KUBEOVN_BIN ?= $(CURDIR)/.cache/kubeovn/bin

.PHONY: kubeovn-deps kubeovn-assets kubeovn-e2e
kubeovn-deps:
	@command -v ovsdb-server >/dev/null 2>&1 && command -v ovn-sbctl >/dev/null 2>&1 || { \
	  echo "kubeovn-deps: installing ovn-central"; export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends ovn-central >/dev/null; }

kubeovn-assets: kubeovn-deps
	@KUBEOVN_BIN="$(KUBEOVN_BIN)" hack/kubeovn/build.sh

kubeovn-e2e: kubeovn-assets cluster-assets image
	NATGW_KUBEOVN_REQUIRED=1 $(GO) test -count=1 -v -timeout 20m ./e2e/kubeovn

# The scenario runs in `make test` (it shares the cluster lock with
# e2e/cluster); missing assets fail instead of skipping.
TEST_DEPS += kubeovn-assets
TEST_ENV += NATGW_KUBEOVN_REQUIRED=1
