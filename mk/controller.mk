# natgw-controller: its envtest tests (controller/reconciler) need the real
# kube-apiserver + etcd that mk/envtest.mk builds; that fragment already
# exports KUBEBUILDER_ASSETS to every recipe, so `make test` only has to
# build them first.
#
#   make controller        build bin/natgw-controller
#   make controller-test   the controller's tests alone (as root: gateways in namespaces)

TEST_DEPS += envtest-assets

.PHONY: controller controller-test
controller:
	$(GO) build -o bin/natgw-controller ./controller/cmd/natgw-controller

controller-test: envtest-assets
	$(GO) test -race -count=1 -timeout 30m ./controller/...
