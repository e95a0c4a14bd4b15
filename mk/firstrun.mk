# A person's first run (e2e/firstrun/README.md): the READMEs' commands taken literally
# (e2e/firstrun, see its README for the command table) and the Helm chart
# charts/natgw-controller.
#
#   make helm            build helm (helm.sh/helm/v4, pinned in hack/helm/go.mod)
#                        from the Go module proxy into .cache/helm/bin (stamp check)
#   make firstrun-test   e2e/firstrun: make cluster-up, kubectl apply -k
#                        controller/config, a FIP with real TCP, kubectl delete -k,
#                        helm install/uninstall of the chart, make cluster-down, the
#                        host compared; run by `make test` after the package tests
#                        (TEST_AFTER), so that it never waits on the cluster lock
#                        while e2e/cluster and e2e/kubeovn hold it

.PHONY: helm firstrun-test
helm:
	@hack/helm/build.sh >/dev/null

firstrun-test: cluster-assets helm
	NATGW_FIRSTRUN=1 NATGW_CLUSTER_REQUIRED=1 $(GO) test -count=1 -timeout 60m -v -run '^TestFirstRun$$' ./e2e/firstrun

# charts/chart_test.go renders the chart with helm in the package tests.
TEST_DEPS += helm
TEST_AFTER += firstrun-test
