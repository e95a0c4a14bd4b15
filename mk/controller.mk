# natgw-controller. Its envtest tests (controller/reconciler) need the real
# kube-apiserver + etcd: mk/envtest.mk already adds envtest-assets to
# TEST_DEPS and KUBEBUILDER_ASSETS to TEST_ENV (and exports it to every
# recipe), so nothing is repeated here.
#
#   make controller        build bin/natgw-controller
#   make controller-test   the controller's tests alone (as root: gateways in namespaces)

.PHONY: controller controller-test
controller:
	$(GO) build -o bin/natgw-controller ./controller/cmd/natgw-controller

controller-test: envtest-assets
	$(GO) test -race -count=1 -timeout 30m ./controller/...
