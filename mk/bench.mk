# Benchmarks (bench/README.md): natgw side by side with the upstream way of
# programming a VPC NAT gateway, in network namespaces the runner creates and
# removes. Needs root (namespaces, netfilter).
#
#   make bench        every scenario at full size (56 min here, 2026-12-07, after the
#                     assets below are built); writes the
#                     committed bench/results/ (REPORT.md, summary.json, SVG plots)
#   make bench-quick  the same at reduced sizes and repetitions (a few minutes;
#                     scenario 7 adds ~2 min when the cluster is built); writes .cache/bench-quick/
#
# Not part of `make test`; bench/scenario's own tests run the harness at tiny
# sizes there. Scenario 3 (controller path) runs kube-apiserver + etcd from
# the envtest assets (mk/envtest.mk builds them; a stamp check when current).
# Scenario 7 (the exec path in a real cluster) brings up internal/cluster's
# single-node Kubernetes: `make bench` builds its assets and images first,
# and Kube-OVN's own controller and OVN's databases (mk/kubeovn.mk) for its
# two-replica comparison; scenario 8 compares ctsync with conntrackd
# (hack/install-deps.sh installs it). bench-quick runs scenario 7 at
# reduced sizes when its assets are built, and otherwise
# reports it not run, with the reason.

BENCH_BIN := $(CURDIR)/.cache/bin
BENCH_SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
BENCH_ARGS ?=
BENCH_FLAGS = -natgw $(BENCH_BIN)/natgw -envtest-assets $(ENVTEST_ASSETS) -crds $(CURDIR)/controller/config/crd \
	-ha-lab $(BENCH_BIN)/ha.test -ctsync-lab $(BENCH_BIN)/ctsync.test

# natgw and natgw-controller are built static (CGO_ENABLED=0) as their
# images build them: a dynamically linked natgw ran the dynamic loader at
# every agent's start (≈ 4% of a `natgw serve` start's CPU, perf).
.PHONY: bench bench-quick bench-build
bench-build:
	@mkdir -p $(BENCH_BIN)
	$(GO) build -o $(BENCH_BIN)/ ./bench/cmd/natgw-bench
	CGO_ENABLED=0 $(GO) build -o $(BENCH_BIN)/ ./controller/cmd/natgw-controller
	CGO_ENABLED=0 $(GO) build -tags natgw_omit_ha -o $(BENCH_BIN)/natgw ./gwimage/cmd/natgw
	CGO_ENABLED=0 $(GO) build -o $(BENCH_BIN)/natgw-ha ./gwimage/cmd/natgw
	$(GO) test -c -o $(BENCH_BIN)/ha.test ./nat/ha
	$(GO) test -c -o $(BENCH_BIN)/ctsync.test ./nat/ha/ctsync

bench: deps envtest-assets cluster-assets kubeovn-assets image cluster-images bench-build
	$(BENCH_SUDO) $(BENCH_BIN)/natgw-bench -out bench/results $(BENCH_FLAGS) $(BENCH_ARGS)

bench-quick: deps envtest-assets bench-build
	$(BENCH_SUDO) $(BENCH_BIN)/natgw-bench -quick -out .cache/bench-quick $(BENCH_FLAGS) $(BENCH_ARGS)
