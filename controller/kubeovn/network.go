package kubeovn

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// Network is what a gateway's kernel needs from Kube-OVN's subnets: the
// default routes of both families and the IPv4 VPC subnet routes.
type Network struct {
	// ExternalGateway is the next hop of the default route through the
	// external interface: the external subnet's IPv4 gateway (upstream:
	// the pod's net1 route annotation and GATEWAY_V4,
	// vpc_nat_gateway.go:1025-1051, :1088-1096). Invalid when the subnet
	// has none.
	ExternalGateway netip.Addr
	// ExternalGatewayV6 is the next hop of the IPv6 default route through
	// the external interface: the external subnet's IPv6 gateway
	// (upstream's GATEWAY_V6, the v6 half of util.SplitStringIP of the
	// subnet's spec.gateway, GetGwBySubnet, vpc_nat_gw_eip.go:613-625).
	// Invalid when the subnet has none (an IPv4-only subnet).
	ExternalGatewayV6 netip.Addr
	// InternalGateway is the gateway subnet's IPv4 gateway, the next hop of
	// VPCRoutes. Invalid when the subnet has none.
	InternalGateway netip.Addr
	// VPCRoutes are the IPv4 CIDRs of the VPC's subnets that do not contain
	// InternalGateway, routed via InternalGateway on the internal interface
	// (handleUpdateNatGwSubnetRoute, vpc_nat_gateway.go:641-704:
	// subnet-route-add CIDR,GW), in VPCSubnets' order.
	VPCRoutes []netip.Prefix
}

// GatewayNetwork derives gateway g's Network from the cluster's subnets.
// Errors name the field and the value: a missing subnet or external
// subnet, a gateway address or CIDR that is not IPv4.
func GatewayNetwork(g *v1.VpcNatGateway, subnets map[string]Subnet) (Network, error) {
	var n Network
	extName := GatewayExternalSubnet(g)
	ext, ok := subnets[extName]
	if !ok {
		return n, fmt.Errorf("external subnet %q not found", extName)
	}
	var err error
	if n.ExternalGateway, err = gatewayV4(ext); err != nil {
		return n, err
	}
	if n.ExternalGatewayV6, err = gatewayV6(ext); err != nil {
		return n, err
	}
	sub, ok := subnets[g.Spec.Subnet]
	if !ok {
		return n, fmt.Errorf("spec.subnet: subnet %q not found", g.Spec.Subnet)
	}
	if n.InternalGateway, err = gatewayV4(sub); err != nil {
		return n, err
	}
	if !n.InternalGateway.IsValid() {
		return n, nil
	}
	for _, s := range VPCSubnets(g.Spec.Vpc, subnets) {
		if c4, _ := SplitIP(s.CIDRBlock); c4 == "" {
			continue // IPv6 only: natgw routes IPv4
		}
		p, err := s.V4CIDR()
		if err != nil {
			return n, err
		}
		if p.Contains(n.InternalGateway) {
			continue
		}
		n.VPCRoutes = append(n.VPCRoutes, p)
	}
	return n, nil
}

// EIPPrefixLen is the prefix length of an EIP address in external subnet
// ext: the length of its IPv4 CIDR (handleAddIptablesEip,
// vpc_nat_gw_eip.go:120-131, util.GetIPAddrWithMask).
func EIPPrefixLen(ext Subnet) (int, error) {
	p, err := ext.V4CIDR()
	if err != nil {
		return 0, fmt.Errorf("external %w", err)
	}
	return p.Bits(), nil
}

// EIPV6PrefixLen is the prefix length of an EIP's IPv6 address in
// external subnet ext: the length of its IPv6 CIDR, or 0 when it has none
// (an IPv4-only subnet).
func EIPV6PrefixLen(ext Subnet) (int, error) {
	_, c6 := SplitIP(ext.CIDRBlock)
	if c6 == "" {
		return 0, nil
	}
	p, err := netip.ParsePrefix(c6)
	if err != nil || !p.Addr().Is6() {
		return 0, fmt.Errorf("external subnet %q spec.cidrBlock: %q is not an IPv6 CIDR", ext.Name, c6)
	}
	return p.Bits(), nil
}

// Contains reports whether a is in one of the subnet's CIDRs (spec.cidrBlock,
// "v4", "v6" or "v4,v6"), as util.CIDRContainIP.
func (s Subnet) Contains(a netip.Addr) bool {
	for c := range strings.SplitSeq(s.CIDRBlock, ",") {
		if p, err := netip.ParsePrefix(strings.TrimSpace(c)); err == nil && p.Contains(a) {
			return true
		}
	}
	return false
}

// V4CIDR is the subnet's IPv4 CIDR (spec.cidrBlock, which may also hold an
// IPv6 one), masked.
func (s Subnet) V4CIDR() (netip.Prefix, error) {
	c4, _ := SplitIP(s.CIDRBlock)
	if c4 == "" {
		return netip.Prefix{}, fmt.Errorf("subnet %q spec.cidrBlock: %q has no IPv4 CIDR", s.Name, s.CIDRBlock)
	}
	p, err := netip.ParsePrefix(c4)
	if err != nil || !p.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("subnet %q spec.cidrBlock: %q is not an IPv4 CIDR", s.Name, c4)
	}
	return p.Masked(), nil
}

// gatewayV6 parses a subnet's IPv6 gateway (invalid when it has none).
func gatewayV6(s Subnet) (netip.Addr, error) {
	_, gw6 := SplitIP(s.Gateway)
	if gw6 == "" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(gw6)
	if err != nil || !a.Is6() {
		return netip.Addr{}, fmt.Errorf("subnet %q spec.gateway: %q is not an IPv6 address", s.Name, gw6)
	}
	return a, nil
}

// gatewayV4 parses a subnet's IPv4 gateway (invalid when it has none).
func gatewayV4(s Subnet) (netip.Addr, error) {
	gw4, _ := SplitIP(s.Gateway)
	if gw4 == "" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(gw4)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("subnet %q spec.gateway: %q is not an IPv4 address", s.Name, gw4)
	}
	return a, nil
}
