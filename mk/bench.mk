# Benchmarks (issue 6): natgw side by side with the upstream way of
# programming a VPC NAT gateway, in network namespaces the runner creates and
# removes. Needs root (namespaces, netfilter).
#
#   make bench        every scenario at full size (~30 min); writes the
#                     committed bench/results/ (REPORT.md, summary.json, PNGs)
#   make bench-quick  the same at reduced sizes and repetitions (< 3 min);
#                     writes .cache/bench-quick/
#
# Not part of `make test`; bench/scenario's own tests run the harness at tiny
# sizes there.

BENCH_BIN := $(CURDIR)/.cache/bin
BENCH_SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
BENCH_ARGS ?=

.PHONY: bench bench-quick bench-build
bench-build:
	@mkdir -p $(BENCH_BIN)
	$(GO) build -o $(BENCH_BIN)/natgw-bench ./bench/cmd/natgw-bench
	@if [ -d gwimage/cmd/natgw ]; then $(GO) build -o $(BENCH_BIN)/natgw ./gwimage/cmd/natgw; else rm -f $(BENCH_BIN)/natgw; fi

bench: deps bench-build
	$(BENCH_SUDO) $(BENCH_BIN)/natgw-bench -out bench/results $(if $(wildcard $(BENCH_BIN)/natgw),-natgw $(BENCH_BIN)/natgw) $(BENCH_ARGS)

bench-quick: deps bench-build
	$(BENCH_SUDO) $(BENCH_BIN)/natgw-bench -quick -out .cache/bench-quick $(if $(wildcard $(BENCH_BIN)/natgw),-natgw $(BENCH_BIN)/natgw) $(BENCH_ARGS)
