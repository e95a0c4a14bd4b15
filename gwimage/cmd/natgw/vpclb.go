package main

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
)

// Kube-OVN's VPC LB Deployment (vpc_lb.go) runs two init containers from the
// gateway image: `ip -4 route replace SVC_CIDR via GW` and `iptables -t nat
// -I POSTROUTING -d SVC_CIDR -j MASQUERADE` (and the -6 / ip6tables forms).
// natgw serves exactly these: the route over netlink, the masquerade as a
// rule of its own nftables table (natgw_vpclb in the ip or ip6 family),
// inserted first like -I.

// vpcLBTable names the table of the masquerade rules.
const vpcLBTable = "natgw_vpclb"

// runIP is `ip [-4|-6] route replace CIDR via GW`.
func runIP(e env, args []string) int {
	fam := 0
	if len(args) > 0 && (args[0] == "-4" || args[0] == "-6") {
		fam = map[string]int{"-4": 4, "-6": 6}[args[0]]
		args = args[1:]
	}
	if len(args) != 5 || args[0] != "route" || args[1] != "replace" || args[3] != "via" {
		fmt.Fprintf(e.stderr, "ip: natgw serves only `ip [-4|-6] route replace CIDR via GATEWAY`, got %q\n", strings.Join(args, " "))
		return exitUsage
	}
	dst, err := parseCIDR(args[2])
	if err != nil {
		fmt.Fprintf(e.stderr, "ip: route replace: destination %q: %v\n", args[2], err)
		return exitUsage
	}
	gw, err := netip.ParseAddr(args[4])
	if err != nil || gw.Is4() != dst.Addr().Is4() || (fam == 4 && !gw.Is4()) || (fam == 6 && !gw.Is6()) {
		fmt.Fprintf(e.stderr, "ip: route replace: gateway %q: not an address of the destination's family\n", args[4])
		return exitUsage
	}
	r := &netlink.Route{Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())}, Gw: gw.AsSlice()}
	if err := netlink.RouteReplace(r); err != nil {
		fmt.Fprintf(e.stderr, "ip: route replace %s via %s: %v\n", dst, gw, err)
		return exitUsage
	}
	return exitOK
}

// runIptables is `iptables|ip6tables -t nat -I POSTROUTING -d CIDR -j
// MASQUERADE`.
func runIptables(e env, prog string, args []string) int {
	want := []string{"-t", "nat", "-I", "POSTROUTING", "-d", "CIDR", "-j", "MASQUERADE"}
	ok := len(args) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = want[i] == "CIDR" || args[i] == want[i]
	}
	if !ok {
		fmt.Fprintf(e.stderr, "%s: natgw serves only `%s -t nat -I POSTROUTING -d CIDR -j MASQUERADE`, got %q\n", prog, prog, strings.Join(args, " "))
		return exitUsage
	}
	dst, err := parseCIDR(args[5])
	if err == nil && dst.Addr().Is4() != (prog == "iptables") {
		err = fmt.Errorf("not an IPv%d CIDR", map[bool]int{true: 4, false: 6}[prog == "iptables"])
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "%s: -d %q: %v\n", prog, args[5], err)
		return exitUsage
	}
	if err := insertMasquerade(dst); err != nil {
		fmt.Fprintf(e.stderr, "%s: %v\n", prog, err)
		return exitFail
	}
	return exitOK
}

// parseCIDR reads an address or CIDR (a bare address is a host route) with
// no host bits set.
func parseCIDR(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("not an address or CIDR")
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("not an address or CIDR")
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("host bits set (want %s)", p.Masked())
	}
	return p, nil
}

// insertMasquerade makes (if missing) the table and its postrouting NAT
// chain and inserts `daddr CIDR masquerade` first, in one transaction.
func insertMasquerade(dst netip.Prefix) error {
	c, err := nft.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	fam, off := nft.TableFamilyIPv4, uint32(16)
	if dst.Addr().Is6() {
		fam, off = nft.TableFamilyIPv6, 24
	}
	t := c.AddTable(&nft.Table{Name: vpcLBTable, Family: fam})
	ch := c.AddChain(&nft.Chain{Name: "postrouting", Table: t, Type: nft.ChainTypeNAT, Hooknum: nft.ChainHookPostrouting, Priority: nft.ChainPriorityNATSource})
	n := uint32(dst.Addr().BitLen() / 8)
	mask := net.CIDRMask(dst.Bits(), dst.Addr().BitLen())
	c.InsertRule(&nft.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dst.Addr().AsSlice()},
		&expr.Masq{},
	}, UserData: []byte("natgw: vpc lb masquerade " + dst.String())})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: insert masquerade for %s: %w", dst, err)
	}
	return nil
}
