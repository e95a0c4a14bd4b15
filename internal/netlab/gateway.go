package netlab

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/natgw/natgw/nat"
)

// Addresses of the standard gateway topology (RFC 5737 documentation nets).
var (
	// ExtNet is the external network between ext and the gateway's net1.
	ExtNet = netip.MustParsePrefix("192.0.2.0/24")
	// ExtAddr is the external host's address.
	ExtAddr = netip.MustParseAddr("192.0.2.1")
	// GWExtAddr is the gateway's own address on net1.
	GWExtAddr = netip.MustParseAddr("192.0.2.254")
	// VPCNet is the VPC subnet behind the gateway's eth0.
	VPCNet = netip.MustParsePrefix("198.51.100.0/24")
	// GWVPCAddr is the gateway's address on eth0, the VPC hosts' default route.
	GWVPCAddr = netip.MustParseAddr("198.51.100.1")

	// The IPv6 addresses of a dual-stack topology (GatewayOptions.IPv6;
	// RFC 3849 documentation prefix): the same roles, one /64 per network.
	ExtNet6    = netip.MustParsePrefix("2001:db8:2::/64")
	ExtAddr6   = netip.MustParseAddr("2001:db8:2::1")
	GWExtAddr6 = netip.MustParseAddr("2001:db8:2::fe")
	VPCNet6    = netip.MustParsePrefix("2001:db8:100::/64")
	GWVPCAddr6 = netip.MustParseAddr("2001:db8:100::1")
)

// EIP6 returns the i-th IPv6 address handed out as an EIP in a dual-stack
// topology: 2001:db8:2::100 + i for i in 0..199; the invalid Addr otherwise.
func EIP6(i int) netip.Addr {
	if i < 0 || i > 199 {
		return netip.Addr{}
	}
	b := ExtNet6.Addr().As16()
	b[14], b[15] = byte((0x100+i)>>8), byte(0x100+i)
	return netip.AddrFrom16(b)
}

// VMAddr6 returns the IPv6 address of the i-th VPC host (0-based) of a
// dual-stack topology: 2001:db8:100::a + i.
func VMAddr6(i int) netip.Addr {
	b := VPCNet6.Addr().As16()
	b[14], b[15] = byte((10+i)>>8), byte(10+i)
	return netip.AddrFrom16(b)
}

// EIP returns the i-th address handed out as an EIP in the standard
// topology: 192.0.2.10+i for i in 0..199; the invalid Addr otherwise.
func EIP(i int) netip.Addr {
	if i < 0 || i > 199 {
		return netip.Addr{}
	}
	return netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})
}

// VMAddr returns the address of the i-th VPC host (0-based): 198.51.100.10+i.
func VMAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + i)})
}

// GatewayOptions shape one gateway topology.
type GatewayOptions struct {
	// Name distinguishes several topologies in one Lab: their namespaces
	// are named "<name>-ext", "<name>-gw", ... ("ext", "gw", ... when empty).
	Name string
	// VMs is the number of VPC hosts (default 3, at most 100).
	VMs int
	// IPv6 makes the topology dual-stack: every interface also gets its
	// IPv6 address (ExtAddr6, GWExtAddr6, GWVPCAddr6, VMAddr6; without
	// duplicate address detection), the VMs an IPv6 default route via
	// GWVPCAddr6, every namespace accept_ra off and gw IPv6 forwarding
	// on. Only sysctls of the topology's own namespaces are set.
	IPv6 bool
}

// Host is a namespace with one address of interest (and, in a dual-stack
// topology, its IPv6 address).
type Host struct {
	NS    string
	Addr  netip.Addr
	Addr6 netip.Addr
}

// Gateway is one standard topology:
//
//	ext (eth0 192.0.2.1/24) ── veth ── (net1 192.0.2.254/24) gw (eth0 198.51.100.1/24)
//	                                                           │ veth
//	                          sw: bridge br0 ── veth ── vmN (eth0 198.51.100.10+N/24, default via .1)
//
// gw forwards IPv4 (and, with GatewayOptions.IPv6, IPv6: every interface
// then also has the IPv6 address of its role). The names of the gateway's
// interfaces are Kube-OVN's.
type Gateway struct {
	Name              string
	Ext               Host // 192.0.2.1
	GW                string
	Switch            string
	VMs               []Host // 198.51.100.10, .11, .12, ...
	ExternalInterface string // "net1" in GW
	InternalInterface string // "eth0" in GW

	lab  *Lab
	role string // of GW
	ipv6 bool   // GatewayOptions.IPv6
}

// IPv6Sysctls prepares namespace ns of a dual-stack topology before its
// interfaces exist: no router advertisements (nothing but the test's own
// addresses and routes), no DAD on new interfaces; forward is set in the
// gateway.
func IPv6Sysctls(ns string, forward bool) error {
	kv := [][2]string{
		{"net.ipv6.conf.all.accept_ra", "0"}, {"net.ipv6.conf.default.accept_ra", "0"},
		{"net.ipv6.conf.all.accept_dad", "0"}, {"net.ipv6.conf.default.accept_dad", "0"},
	}
	if forward {
		kv = append(kv, [2]string{"net.ipv6.conf.all.forwarding", "1"})
	}
	for _, s := range kv {
		if err := Sysctl(ns, s[0], s[1]); err != nil {
			return err
		}
	}
	return nil
}

// wireGW links the (new, empty) gateway namespace to ext and the switch and
// turns on forwarding. The gateway's interfaces get MAC addresses derived
// from their IP addresses, so that a recreated gateway has the same ones, as
// a restarted Kube-OVN gateway pod keeps the MACs its IPAM gave it: the
// neighbors' ARP caches stay right.
func (g *Gateway) wireGW() error {
	gwExt, ext, gwVPC := []netip.Prefix{netip.PrefixFrom(GWExtAddr, ExtNet.Bits())}, []netip.Prefix{netip.PrefixFrom(ExtAddr, ExtNet.Bits())}, []netip.Prefix{netip.PrefixFrom(GWVPCAddr, VPCNet.Bits())}
	if g.ipv6 {
		if err := IPv6Sysctls(g.GW, true); err != nil {
			return err
		}
		gwExt = append(gwExt, netip.PrefixFrom(GWExtAddr6, ExtNet6.Bits()))
		ext = append(ext, netip.PrefixFrom(ExtAddr6, ExtNet6.Bits()))
		gwVPC = append(gwVPC, netip.PrefixFrom(GWVPCAddr6, VPCNet6.Bits()))
	}
	if err := Veth(End{NS: g.GW, Name: g.ExternalInterface, Addrs: gwExt, MAC: macOf(GWExtAddr)},
		End{NS: g.Ext.NS, Name: "eth0", Addrs: ext}); err != nil {
		return err
	}
	if err := Veth(End{NS: g.GW, Name: g.InternalInterface, Addrs: gwVPC, MAC: macOf(GWVPCAddr)},
		End{NS: g.Switch, Name: "gw"}); err != nil {
		return err
	}
	if err := Enslave(g.Switch, "gw", "br0"); err != nil {
		return err
	}
	return Sysctl(g.GW, "net.ipv4.ip_forward", "1")
}

// macOf returns the locally administered unicast MAC 02:00:a.b.c.d of an
// IPv4 address.
func macOf(a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x02, 0x00, b[0], b[1], b[2], b[3]}
}

// recreateWait bounds RecreateGW's wait for the old namespace's links. The
// kernel tears a namespace down in a shared work queue after its last user
// is gone; on a machine busy creating and deleting many namespaces (make
// test runs packages in parallel) that took over 10 s once in CI.
const recreateWait = 30 * time.Second

// RecreateGW deletes the gateway namespace and makes it again, empty, with
// the same name and links: what a gateway pod restart does to the kernel
// state. Processes still inside the old namespace keep it (and its links)
// alive, so stop them first; RecreateGW waits up to ctx's deadline (at most
// recreateWait) for the old links to go.
func (g *Gateway) RecreateGW(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, recreateWait)
	defer cancel()
	if err := g.lab.RemoveNS(g.GW); err != nil {
		return err
	}
	for _, old := range []End{{NS: g.Ext.NS, Name: "eth0"}, {NS: g.Switch, Name: "gw"}} {
		for {
			ok, err := LinkExists(old.NS, old.Name)
			if err != nil {
				return fmt.Errorf("netlab: recreate %s: %w", g.GW, err)
			}
			if !ok {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("netlab: recreate %s: old link %s in %s still there (a process still in the namespace?): %w", g.GW, old.Name, old.NS, ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	if _, err := g.lab.NS(g.role); err != nil {
		return err
	}
	if err := g.wireGW(); err != nil {
		return fmt.Errorf("netlab: recreate %s: %w", g.GW, err)
	}
	return nil
}

func hostNS(hs []Host) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.NS
	}
	return out
}

// Config returns the nat.Config that targets this gateway.
func (g *Gateway) Config() nat.Config {
	return nat.Config{NetNS: g.GW, ExternalInterface: g.ExternalInterface, InternalInterface: g.InternalInterface}
}

// Gateway builds a standard topology in the Lab.
func (l *Lab) Gateway(opts GatewayOptions) (*Gateway, error) {
	if opts.VMs == 0 {
		opts.VMs = 3
	}
	if opts.VMs < 0 || opts.VMs > 100 {
		return nil, fmt.Errorf("netlab: gateway %q: %d VMs, want 1..100", opts.Name, opts.VMs)
	}
	role := func(r string) string {
		if opts.Name == "" {
			return r
		}
		return opts.Name + "-" + r
	}
	g := &Gateway{lab: l, role: role("gw"), Name: opts.Name, ExternalInterface: nat.DefaultExternalInterface, InternalInterface: nat.DefaultInternalInterface, ipv6: opts.IPv6}
	var err error
	mk := func(r string) string {
		if err != nil {
			return ""
		}
		var n string
		n, err = l.NS(role(r))
		return n
	}
	g.Ext = Host{NS: mk("ext"), Addr: ExtAddr}
	g.GW = mk("gw")
	g.Switch = mk("sw")
	for i := 0; i < opts.VMs; i++ {
		g.VMs = append(g.VMs, Host{NS: mk("vm" + strconv.Itoa(i+1)), Addr: VMAddr(i)})
	}
	if err != nil {
		return nil, fmt.Errorf("netlab: gateway %q: %w", opts.Name, err)
	}
	var steps []func() error
	if opts.IPv6 {
		g.Ext.Addr6 = ExtAddr6
		for i := range g.VMs {
			g.VMs[i].Addr6 = VMAddr6(i)
		}
		for _, ns := range append([]string{g.Ext.NS, g.Switch}, hostNS(g.VMs)...) {
			steps = append(steps, func() error { return IPv6Sysctls(ns, false) })
		}
	}
	steps = append(steps,
		func() error { return Bridge(g.Switch, "br0") },
		func() error { return g.wireGW() },
	)
	for i, vm := range g.VMs {
		port := "vm" + strconv.Itoa(i+1)
		addrs := []netip.Prefix{netip.PrefixFrom(vm.Addr, VPCNet.Bits())}
		if opts.IPv6 {
			addrs = append(addrs, netip.PrefixFrom(vm.Addr6, VPCNet6.Bits()))
		}
		steps = append(steps,
			func() error {
				return Veth(End{NS: vm.NS, Name: "eth0", Addrs: addrs}, End{NS: g.Switch, Name: port})
			},
			func() error { return Enslave(g.Switch, port, "br0") },
			func() error { return AddRoute(vm.NS, netip.MustParsePrefix("0.0.0.0/0"), GWVPCAddr, "eth0") },
		)
		if opts.IPv6 {
			steps = append(steps, func() error { return AddRoute(vm.NS, netip.MustParsePrefix("::/0"), GWVPCAddr6, "eth0") })
		}
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, fmt.Errorf("netlab: gateway %q: %w", opts.Name, err)
		}
	}
	return g, nil
}
