// Package vpclb carries out the two init containers Kube-OVN's VPC LB
// Deployment (vpc_lb.go) runs from the gateway image: `ip -4 route replace
// SVC_CIDR via GW` and `iptables -t nat -I POSTROUTING -d SVC_CIDR -j
// MASQUERADE` (and the -6 / ip6tables forms). natgw serves exactly these:
// the route over netlink, the masquerade as a rule of its own nftables
// table (nftconn.VPCLBTable, in the ip or ip6 family), inserted first like -I. Both act
// in the calling thread's network namespace.
package vpclb

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

// Route is `ip [-4|-6] route replace Dst via Via`.
type Route struct {
	Dst netip.Prefix
	Via netip.Addr
}

// ParseRoute reads the arguments of `ip [-4|-6] route replace CIDR via
// GATEWAY` (after the program name) and refuses any other form.
func ParseRoute(args []string) (Route, error) {
	fam := 0
	if len(args) > 0 && (args[0] == "-4" || args[0] == "-6") {
		fam = map[string]int{"-4": 4, "-6": 6}[args[0]]
		args = args[1:]
	}
	if len(args) != 5 || args[0] != "route" || args[1] != "replace" || args[3] != "via" {
		return Route{}, fmt.Errorf("natgw serves only `ip [-4|-6] route replace CIDR via GATEWAY`, got %q", strings.Join(args, " "))
	}
	// nat's parsers and its rule for a route (the agent's).
	dst, err := nat.ParsePrefix("destination", args[2])
	var gw netip.Addr
	if err == nil {
		gw, err = nat.ParseIP("gateway", args[4])
	}
	if err == nil {
		err = nat.CheckRoute("destination", dst, "gateway", gw)
	}
	if err == nil && (fam == 4 && !gw.Is4() || fam == 6 && !gw.Is6()) {
		err = &nat.FieldError{Field: "gateway", Value: args[4], Reason: fmt.Sprintf("not an IPv%d address (ip -%d)", fam, fam)}
	}
	if err != nil {
		return Route{}, fmt.Errorf("route replace: %w", err)
	}
	return Route{Dst: dst, Via: gw}, nil
}

// Replace adds the route to the main table, or replaces the one there.
func (r Route) Replace() error {
	nr := &netlink.Route{Dst: &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())}, Gw: r.Via.AsSlice()}
	if err := netlink.RouteReplace(nr); err != nil {
		return fmt.Errorf("route replace %s via %s: %w", r.Dst, r.Via, err)
	}
	return nil
}

// Masquerade is `iptables|ip6tables -t nat -I POSTROUTING -d Dst -j
// MASQUERADE`.
type Masquerade struct {
	Dst netip.Prefix
}

// ParseMasquerade reads the arguments of `prog -t nat -I POSTROUTING -d
// CIDR -j MASQUERADE` (after the program name; prog is iptables or
// ip6tables and sets the family CIDR must have) and refuses any other form.
func ParseMasquerade(prog string, args []string) (Masquerade, error) {
	want := []string{"-t", "nat", "-I", "POSTROUTING", "-d", "CIDR", "-j", "MASQUERADE"}
	ok := len(args) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = want[i] == "CIDR" || args[i] == want[i]
	}
	if !ok {
		return Masquerade{}, fmt.Errorf("natgw serves only `%s -t nat -I POSTROUTING -d CIDR -j MASQUERADE`, got %q", prog, strings.Join(args, " "))
	}
	dst, err := parseCIDR("-d", args[5])
	if err == nil && dst.Addr().Is4() != (prog == "iptables") {
		err = &nat.FieldError{Field: "-d", Value: args[5], Reason: fmt.Sprintf("not an IPv%d CIDR", map[bool]int{true: 4, false: 6}[prog == "iptables"])}
	}
	if err != nil {
		return Masquerade{}, fmt.Errorf("%s: %w", prog, err)
	}
	return Masquerade{Dst: dst}, nil
}

// parseCIDR reads field's network, by nat's rules: an address or CIDR of
// either family (a bare address is a host route, nat.ParsePrefix) with no
// host bits set (nat.CheckNetwork).
func parseCIDR(field, s string) (netip.Prefix, error) {
	p, err := nat.ParsePrefix(field, s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if err := nat.CheckNetwork(field, p); err != nil {
		return netip.Prefix{}, err
	}
	return p, nil
}

// Insert makes (if missing) the table and its postrouting NAT chain and
// inserts `daddr Dst masquerade` first, in one transaction, in the calling
// thread's network namespace.
func (m Masquerade) Insert() error {
	return m.InsertInto(context.Background(), nftconn.Current())
}

// InsertInto is Insert on c.
func (m Masquerade) InsertInto(ctx context.Context, c nftconn.Conn) error {
	if err := c.Apply(ctx, m.Tx()); err != nil {
		return fmt.Errorf("nftables: insert masquerade for %s: %w", m.Dst, err)
	}
	return nil
}

// Tx is Insert's transaction: the table of Dst's family (ip or ip6
// natgw_vpclb), its postrouting chain, and the masquerade rule first.
func (m Masquerade) Tx() *nftconn.Tx {
	dst := m.Dst
	t, off, word := nftconn.Table{Family: nft.TableFamilyIPv4, Name: nftconn.VPCLBTable}, uint32(16), "ip"
	if dst.Addr().Is6() {
		t, off, word = nftconn.Table{Family: nft.TableFamilyIPv6, Name: nftconn.VPCLBTable}, 24, "ip6"
	}
	n := uint32(dst.Addr().BitLen() / 8)
	mask := net.CIDRMask(dst.Bits(), dst.Addr().BitLen())
	match := dst.String()
	if dst.IsSingleIP() {
		match = dst.Addr().String()
	}
	tx := &nftconn.Tx{}
	tx.AddTable(t)
	tx.AddChain(t, nftconn.Chain{Name: nftconn.VPCLBPostroutingChain, Type: nft.ChainTypeNAT, Hook: nft.ChainHookPostrouting, Priority: nft.ChainPriorityNATSource})
	tx.InsertRule(t, nftconn.VPCLBPostroutingChain, nftconn.Rule{
		Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: dst.Addr().AsSlice()},
			&expr.Masq{},
		},
		Text: word + " daddr " + match + " masquerade",
		Tag:  "natgw: vpc lb masquerade " + dst.String(),
	})
	return tx
}
