package nattest

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// testIPv6 runs a round trip of IPv6 objects beside IPv4 ones (apply,
// reopen, reload, update, Sync, delete by UID) and the FIP, DNAT, SNAT
// (longest prefix), hairpin and QoS cases in IPv6, with real TCP and UDP through a dual-stack topology; a backend of
// Options.NoIPv6 must refuse every IPv6 object instead.
func (s *suite) testIPv6(t *testing.T) {
	if s.opts.NoIPv6 {
		s.testIPv6Refused(t)
		return
	}
	for _, tc := range []test{
		{"RoundTrip", s.testIPv6RoundTrip},
		{"FIP", s.testFIP6Packets},
		{"DNAT", s.testDNAT6Packets},
		{"SNATLongestPrefix", s.testSNAT6Packets},
		{"Hairpin", s.testHairpin6},
		{"QoS", func(t *testing.T) { s.testQoSFamily(t, true) }},
	} {
		t.Run(tc.name, tc.run)
	}
}

// EIP6 is an IPv6-only EIP object with a /64 (the dual-stack topology's
// external network).
func EIP6(uid string, a netip.Addr) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindEIP, EIP: &nat.EIP{V6Address: a, V6PrefixLen: 64}}
}

// DualEIP is a dual-stack EIP object: an IPv4 /24 and an IPv6 /64.
func DualEIP(uid string, v4, v6 netip.Addr) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindEIP, EIP: &nat.EIP{Address: v4, PrefixLen: 24, V6Address: v6, V6PrefixLen: 64}}
}

// topoEnv6 is topoEnv on a dual-stack topology: the probe servers listen
// on every host's IPv4 wildcard and on its IPv6 address.
func (s *suite) topoEnv6(t *testing.T) *env {
	e := s.newEnvWith(t, true, netlab.GatewayOptions{IPv6: true})
	for _, h := range append([]netlab.Host{e.gw.Ext}, e.gw.VMs...) {
		tcp, udp := vmTCP, vmUDP
		if h.NS == e.gw.Ext.NS {
			tcp, udp = extTCP, extUDP
		}
		for _, a := range []netip.Addr{netip.IPv4Unspecified(), h.Addr6} {
			if _, err := e.lab.ServeTCP(e.ctx, h.NS, netip.AddrPortFrom(a, uint16(tcp)).String()); err != nil {
				t.Fatal(err)
			}
			if _, err := e.lab.ServeUDP(e.ctx, h.NS, netip.AddrPortFrom(a, uint16(udp)).String()); err != nil {
				t.Fatal(err)
			}
		}
	}
	return e
}

// hasAddr6 reports whether p is an IPv6 address of the external interface.
func (e *env) hasAddr6(p netip.Prefix) bool {
	e.t.Helper()
	as, err := netlab.Addrs6(e.ns, e.cfg.ExternalInterface)
	if err != nil {
		e.t.Fatal(err)
	}
	return slices.Contains(as, p)
}

// applyEIPs6 applies EIP objects and checks that their IPv6 addresses are
// on the external interface (the gateway answers neighbour solicitations
// for them).
func (e *env) applyEIPs6(objs ...nat.Object) {
	e.t.Helper()
	e.apply(objs...)
	for _, o := range objs {
		if p := netip.PrefixFrom(o.EIP.V6Address, o.EIP.V6PrefixLen); !e.hasAddr6(p) {
			e.t.Fatalf("EIP %s not on %s after apply", p, e.cfg.ExternalInterface)
		}
	}
}

// host6 is h with its IPv6 address as the address of interest.
func host6(h netlab.Host) netlab.Host { return netlab.Host{NS: h.NS, Addr: h.Addr6} }

func (s *suite) testFIP6Packets(t *testing.T) {
	e := s.topoEnv6(t)
	eip := netlab.EIP6(0)
	ext, v1, v2 := host6(e.gw.Ext), host6(e.gw.VMs[0]), host6(e.gw.VMs[1])
	e.wantNoReach(probe{nat.TCP, ext, eip, vmTCP},
		probe{nat.TCP, v1, ext.Addr, extTCP})

	// A dual-stack EIP: its IPv4 address works beside the IPv6 one.
	e.applyEIPs6(DualEIP(UID(nat.KindEIP, 0), netlab.EIP(0), eip))
	if !e.hasAddr(netip.PrefixFrom(netlab.EIP(0), 24)) {
		t.Errorf("the dual-stack EIP's IPv4 address is not on %s", e.cfg.ExternalInterface)
	}
	fip := FIP(UID(nat.KindFIP, 0), eip, v1.Addr)
	fip4 := FIP(UID(nat.KindFIP, 1), netlab.EIP(0), e.gw.VMs[0].Addr)
	e.apply(fip, fip4)
	for _, proto := range []nat.Protocol{nat.TCP, nat.UDP} {
		vmPort, extPort := uint16(vmTCP), uint16(extTCP)
		if proto == nat.UDP {
			vmPort, extPort = vmUDP, extUDP
		}
		e.wantReach(probe{proto, ext, eip, vmPort}, v1.NS, ext.Addr)
		e.wantReach(probe{proto, v1, ext.Addr, extPort}, ext.NS, eip)
	}
	// The IPv4 FIP of the same VM through the same dual-stack EIP's IPv4 address.
	e.wantReach(probe{nat.TCP, e.gw.Ext, netlab.EIP(0), vmTCP}, v1.NS, e.gw.Ext.Addr)
	e.wantNoReach(probe{nat.TCP, v2, ext.Addr, extTCP})

	e.apply(FIP(fip.UID, eip, v2.Addr))
	e.wantReach(probe{nat.TCP, ext, eip, vmTCP}, v2.NS, ext.Addr)
	e.wantReach(probe{nat.TCP, v2, ext.Addr, extTCP}, ext.NS, eip)
	e.wantNoReach(probe{nat.TCP, v1, ext.Addr, extTCP})

	conn, _, err := netlab.Connect(e.ctx, ext.NS, netip.AddrPortFrom(eip, vmTCP).String(), netlab.DialTimeout)
	if err != nil {
		t.Fatalf("open a connection through the IPv6 FIP: %v", err)
	}
	defer conn.Close()
	e.wantFlows("with a live connection through the IPv6 FIP", eip)
	e.del(fip.UID)
	e.wantNoFlows("after deleting the IPv6 FIP", eip)
	e.wantNoReach(probe{nat.TCP, ext, eip, vmTCP},
		probe{nat.UDP, ext, eip, vmUDP},
		probe{nat.TCP, v2, ext.Addr, extTCP})
	// The IPv4 FIP is untouched.
	e.wantReach(probe{nat.TCP, e.gw.Ext, netlab.EIP(0), vmTCP}, v1.NS, e.gw.Ext.Addr)
	e.del(fip4.UID, UID(nat.KindEIP, 0))
	if e.hasAddr6(netip.PrefixFrom(eip, 64)) || e.hasAddr(netip.PrefixFrom(netlab.EIP(0), 24)) {
		t.Errorf("EIP %s / %s still on %s after its deletion", eip, netlab.EIP(0), e.cfg.ExternalInterface)
	}
}

func (s *suite) testDNAT6Packets(t *testing.T) {
	e := s.topoEnv6(t)
	eip := netlab.EIP6(1)
	ext, v2 := host6(e.gw.Ext), host6(e.gw.VMs[1])
	e.applyEIPs6(EIP6(UID(nat.KindEIP, 1), eip))
	tcp := DNAT(UID(nat.KindDNAT, 0), eip, nat.TCP, 2222, v2.Addr, vmTCP)
	udp := DNAT(UID(nat.KindDNAT, 1), eip, nat.UDP, 2223, v2.Addr, vmUDP)
	e.apply(tcp, udp)
	e.wantReach(probe{nat.TCP, ext, eip, 2222}, v2.NS, ext.Addr)
	e.wantReach(probe{nat.UDP, ext, eip, 2223}, v2.NS, ext.Addr)
	e.wantNoReach(probe{nat.TCP, ext, eip, 2223},
		probe{nat.UDP, ext, eip, 2222},
		probe{nat.TCP, ext, eip, vmTCP})
	e.wantFlows("after IPv6 DNAT traffic", eip)
	e.del(tcp.UID, udp.UID)
	e.wantNoFlows("after deleting the IPv6 DNATs", eip)
	e.wantNoReach(probe{nat.TCP, ext, eip, 2222},
		probe{nat.UDP, ext, eip, 2223})
}

func (s *suite) testSNAT6Packets(t *testing.T) {
	e := s.topoEnv6(t)
	ext, v1, v2, v3 := host6(e.gw.Ext), host6(e.gw.VMs[0]), host6(e.gw.VMs[1]), host6(e.gw.VMs[2])
	a, b, c := netlab.EIP6(2), netlab.EIP6(3), netlab.EIP6(4)
	e.applyEIPs6(EIP6(UID(nat.KindEIP, 2), a), EIP6(UID(nat.KindEIP, 3), b), EIP6(UID(nat.KindEIP, 4), c))
	wide := SNAT(UID(nat.KindSNAT, 0), a, netlab.VPCNet6, false)
	// ::8/126 holds vm1 (::a) and vm2 (::b), not vm3 (::c).
	narrow := SNAT(UID(nat.KindSNAT, 1), b, netip.PrefixFrom(netip.MustParseAddr("2001:db8:100::8"), 126), true)
	check := func(what string) {
		t.Helper()
		for _, proto := range []nat.Protocol{nat.TCP, nat.UDP} {
			port := uint16(extTCP)
			if proto == nat.UDP {
				port = extUDP
			}
			e.wantReach(probe{proto, v1, ext.Addr, port}, ext.NS, b)
			e.wantReach(probe{proto, v2, ext.Addr, port}, ext.NS, b)
			e.wantReach(probe{proto, v3, ext.Addr, port}, ext.NS, a)
		}
		if t.Failed() {
			t.Logf("failed %s", what)
		}
	}
	e.apply(wide)
	e.wantReach(probe{nat.TCP, v1, ext.Addr, extTCP}, ext.NS, a)
	e.apply(narrow)
	check("wide then narrow")
	e.del(wide.UID, narrow.UID)
	e.wantNoReach(probe{nat.TCP, v1, ext.Addr, extTCP})
	e.apply(narrow)
	e.wantNoReach(probe{nat.TCP, v3, ext.Addr, extTCP})
	e.apply(wide)
	check("narrow then wide")

	// A FIP's SNAT comes before CIDR SNAT.
	fip := FIP(UID(nat.KindFIP, 0), c, v3.Addr)
	e.apply(fip)
	e.wantReach(probe{nat.TCP, v3, ext.Addr, extTCP}, ext.NS, c)
	e.del(fip.UID)
	e.wantReach(probe{nat.TCP, v3, ext.Addr, extTCP}, ext.NS, a)

	e.wantFlows("after IPv6 SNAT traffic", b)
	e.del(narrow.UID)
	e.wantNoFlows("after deleting the narrow IPv6 SNAT", b)
	e.wantReach(probe{nat.TCP, v1, ext.Addr, extTCP}, ext.NS, a)
	e.del(wide.UID)
	e.wantNoFlows("after deleting every IPv6 SNAT", a, b)
	e.wantNoReach(probe{nat.TCP, v1, ext.Addr, extTCP},
		probe{nat.UDP, v3, ext.Addr, extUDP})
}

// testHairpin6: a VPC host reaches another through the other's IPv6 FIP
// and an IPv6 DNAT; the gateway SNATs it to the EIP so the reply returns
// through it.
func (s *suite) testHairpin6(t *testing.T) {
	e := s.topoEnv6(t)
	v1, v2, v3 := host6(e.gw.VMs[0]), host6(e.gw.VMs[1]), host6(e.gw.VMs[2])
	eipF, eipD := netlab.EIP6(0), netlab.EIP6(1)
	e.applyEIPs6(EIP6(UID(nat.KindEIP, 0), eipF), EIP6(UID(nat.KindEIP, 1), eipD))
	e.apply(FIP(UID(nat.KindFIP, 0), eipF, v1.Addr), DNAT(UID(nat.KindDNAT, 0), eipD, nat.TCP, 2222, v3.Addr, vmTCP))
	e.wantReach(probe{nat.TCP, v2, eipF, vmTCP}, v1.NS, eipF)
	e.wantReach(probe{nat.UDP, v2, eipF, vmUDP}, v1.NS, eipF)
	e.wantReach(probe{nat.TCP, v2, eipD, 2222}, v3.NS, eipD)
}

// testIPv6Refused: a backend of Options.NoIPv6 refuses each IPv6 kind
// (alone and in a batch with a valid IPv4 object) with a *nat.FieldError
// naming an IPv6 field, and neither the kernel nor List changes.
func (s *suite) testIPv6Refused(t *testing.T) {
	e := s.newEnv(t, false)
	present := sample()
	e.apply(present...)
	before := e.kernel()
	good := FIP("fip-good", netlab.EIP(6), vm3)
	v6 := netlab.EIP6(0)
	for _, bad := range []nat.Object{
		EIP6("eip6", v6),
		DualEIP("eip46", netlab.EIP(7), netlab.EIP6(1)),
		FIP("fip6", v6, netlab.VMAddr6(0)),
		DNAT("dnat6", v6, nat.TCP, 2222, netlab.VMAddr6(1), vmTCP),
		SNAT("snat6", v6, netlab.VPCNet6, false),
		Route("route6", netip.MustParsePrefix("::/0"), netlab.ExtAddr6, nat.DeviceExternal),
	} {
		e.run(bad.UID, func(t *testing.T) {
			for _, batch := range [][]nat.Object{{bad}, {good, bad}} {
				err := e.tryApply(batch...)
				var fe *nat.FieldError
				if !errors.As(err, &fe) || fe.UID != bad.UID || !isIPv6Text(fe.Value) {
					t.Errorf("apply %s: error %v, want a *nat.FieldError naming an IPv6 field of %s", describe(batch), err, bad.UID)
				}
				e.wantKernel("after a refused IPv6 apply", before)
				e.wantList("after a refused IPv6 apply", present...)
			}
		})
	}
}

// isIPv6Text reports whether s is an IPv6 address or CIDR.
func isIPv6Text(s string) bool {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr().Is6()
	}
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6()
}

// sample6 is one IPv6 object of every kind the IPv6 data plane takes: a
// dual-stack EIP with QoS, an IPv6-only EIP, a FIP, TCP and UDP DNATs on
// one port, overlapping SNATs (one random-fully) and the IPv6 default route.
func sample6() []nat.Object {
	dual := DualEIP(UID(nat.KindEIP, 10), netlab.EIP(10), netlab.EIP6(10))
	dual.EIP.QoS = &nat.QoS{IngressRateMbps: 10, EgressRateMbps: 20, EgressBurstMbit: 2}
	return []nat.Object{
		dual,
		EIP6(UID(nat.KindEIP, 11), netlab.EIP6(11)),
		FIP(UID(nat.KindFIP, 10), netlab.EIP6(10), netlab.VMAddr6(0)),
		DNAT(UID(nat.KindDNAT, 10), netlab.EIP6(11), nat.TCP, 2222, netlab.VMAddr6(1), 8080),
		DNAT(UID(nat.KindDNAT, 11), netlab.EIP6(11), nat.UDP, 2222, netlab.VMAddr6(1), 8081),
		SNAT(UID(nat.KindSNAT, 10), netlab.EIP6(11), netlab.VPCNet6, false),
		SNAT(UID(nat.KindSNAT, 11), netlab.EIP6(10), netip.MustParsePrefix("2001:db8:100::8/126"), true),
		Route(UID(nat.KindRoute, 10), netip.MustParsePrefix("::/0"), netlab.ExtAddr6, nat.DeviceExternal),
	}
}

// testIPv6RoundTrip: IPv6 objects beside the IPv4 sample survive a reopen
// and a reload unchanged (kernel and List, same boot id), an update of an
// IPv6 object replaces it, a Sync to a subset of both families leaves
// exactly that subset, and deleting by UID leaves the empty state.
func (s *suite) testIPv6RoundTrip(t *testing.T) {
	e := s.newEnvWith(t, true, netlab.GatewayOptions{IPv6: true})
	objs := append(sample(), sample6()...)
	e.apply(objs...)
	e.wantList("after apply", objs...)
	k, boot := e.kernel(), e.dp.BootID()
	e.reopen()
	e.wantList("after reopen", objs...)
	e.wantKernel("reopen must not change the kernel", k)
	if got := e.dp.BootID(); got != boot {
		t.Errorf("BootID after reopen = %q, want %q", got, boot)
	}
	ctx, cancel := e.opCtx()
	defer cancel()
	e.touch()
	if err := e.dp.Reload(ctx); err != nil {
		t.Errorf("reload: %v", err)
	}
	e.wantList("after reload", objs...)
	// Update: the IPv6 FIP moves to another VM.
	moved := FIP(UID(nat.KindFIP, 10), netlab.EIP6(10), netlab.VMAddr6(2))
	e.apply(moved)
	objs[len(sample())+2] = moved
	e.wantList("after updating the IPv6 FIP", objs...)
	// Sync to every other object, both families.
	var half []nat.Object
	for i, o := range objs {
		if i%2 == 0 {
			half = append(half, o)
		}
	}
	e.sync(half...)
	e.wantList("after a Sync to half", half...)
	e.reopen()
	e.wantList("after a Sync to half and a reopen", half...)
	e.del(nat.UIDs(half)...)
	e.wantList("after deleting everything")
	e.wantEquiv("after deleting everything", e.empty)
}
