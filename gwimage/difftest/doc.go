// Package difftest holds the differential test of the natgw image against
// Kube-OVN's own gateway script: upstream v1.16.2's nat-gateway.sh (from the
// Go module proxy, internal/upstream) runs with its userland (bash,
// iproute2, iptables-legacy, iputils arping, conntrack) in one gateway
// namespace, the built natgw image's root filesystem in a second, identical
// one, each call run the way kube-ovn-controller execs it. After every call
// both gateways are probed with real TCP and UDP; see difftest_test.go.
package difftest
