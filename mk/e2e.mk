# End-to-end suite (e2e/): kube-apiserver + etcd (envtest assets),
# natgw-controller and `natgw serve` as real processes, real packets through
# gateway network namespaces. `make test` runs it with ./...; `make e2e`
# runs it alone, verbose, so that the E2E-SUMMARY lines show.
#
#   make e2e                 every scenario, both data planes
#   make e2e E2E_FULL=1      scenario 2 at full scale (2,000 cycles per data plane)

.PHONY: e2e
e2e: deps envtest-assets
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" E2E_FULL="$(E2E_FULL)" $(GO) test -race -count=1 -v -timeout 60m ./e2e/...

# make test runs ./e2e/... too: it needs the envtest assets (a duplicate of
# envtest.mk's own entry is harmless: make builds a prerequisite once).
TEST_DEPS += envtest-assets
