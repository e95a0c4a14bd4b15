# A real single-node Kubernetes for tests and people (package
# internal/cluster; e2e/cluster/README.md): kubelet, kube-controller-manager, kube-scheduler,
# kubectl, containerd + shim + ctr and the CNI plugins built from the Go
# module proxy by hack/cluster/build.sh into .cache/cluster/bin (stamp check
# when current; cold ~15 min on 2 cores), kube-apiserver and etcd from the
# envtest assets, runc from Debian, a self-built pause image.
#
#   make cluster-assets    build what the cluster needs (once)
#   make controller-image  natgw-controller's image -> gwimage/out/natgw-controller-image.tar
#                          (`make image` builds it too)
#   make cluster-images    the iptables variant of the gateway image (gateway image +
#                          Debian's iptables-legacy tools) -> .cache/cluster/natgw-iptables-image.tar
#   make cluster-up        start the cluster with natgw's images imported; prints KUBECONFIG
#   make cluster-down      stop it and restore the host (also after a killed run)

CLUSTER_BIN ?= $(CURDIR)/.cache/cluster/bin
CLUSTER_PAUSE ?= $(CURDIR)/.cache/cluster/pause-image.tar
CLUSTER_IPTABLES_IMAGE ?= $(CURDIR)/.cache/cluster/natgw-iptables-image.tar

.PHONY: cluster-deps cluster-assets controller-image cluster-images cluster-up cluster-down
# runc from Debian (the cluster's only apt package besides install-deps.sh's).
cluster-deps:
	@command -v runc >/dev/null 2>&1 || { echo "cluster-deps: installing runc"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && \
	  apt-get install -y -qq --no-install-recommends runc >/dev/null; }
	@command -v openssl >/dev/null 2>&1 || { echo "cluster-deps: installing openssl"; \
	  export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && \
	  apt-get install -y -qq --no-install-recommends openssl >/dev/null; }

cluster-assets: cluster-deps envtest-assets
	@CLUSTER_BIN="$(CLUSTER_BIN)" hack/cluster/build.sh
	@$(GO) run ./gwimage/cmd/mkimage -image pause -o $(CLUSTER_PAUSE) >/dev/null

controller-image:
	$(GO) run ./gwimage/cmd/mkimage -image controller -version $(NATGW_VERSION) -o $(NATGW_OUT)/natgw-controller-image.tar

# `make image` builds the gateway image (mk/gwimage.mk) and the controller's.
image: controller-image

cluster-images: image
	@$(GO) run ./gwimage/cmd/mkimage -image gateway-iptables -version $(NATGW_VERSION) \
	  -base $(NATGW_OUT)/natgw-image.tar -o $(CLUSTER_IPTABLES_IMAGE) >/dev/null

cluster-up: cluster-assets cluster-images
	@$(GO) run ./internal/cluster/cmd/natgw-cluster -repo $(CURDIR) \
	  -image $(NATGW_OUT)/natgw-image.tar -image $(NATGW_OUT)/natgw-controller-image.tar -image $(CLUSTER_IPTABLES_IMAGE) up

cluster-down:
	@$(GO) run ./internal/cluster/cmd/natgw-cluster -repo $(CURDIR) down

# The cluster e2e (e2e/cluster) runs in `make test`: it needs the binaries and
# every image, and fails instead of skipping when they are missing.
TEST_DEPS += cluster-assets cluster-images
TEST_ENV += NATGW_CLUSTER_REQUIRED=1
