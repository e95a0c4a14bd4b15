# `make demo`: natgw end to end on this machine, as root, without a
# cluster: namespaces ext/gw/vm1/vm2, `natgw serve` in gw driven through the
# protocol, real TCP through an EIP, FIP, DNAT and SNAT, then delete and
# cleanup (also on Ctrl-C). See gwimage/cmd/natgw-demo.
#
#   make demo                      nftables data plane
#   make demo DEMO_DATAPLANE=iptables

DEMO_DATAPLANE ?= nftables

.PHONY: demo
demo: deps natgw
	@$(GO) build -o $(NATGW_OUT)/natgw-demo ./gwimage/cmd/natgw-demo
	@$(NATGW_OUT)/natgw-demo -natgw $(NATGW_OUT)/natgw -dataplane $(DEMO_DATAPLANE)
