package nattest

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// Ports of the probe servers.
const (
	vmTCP  = 8080 // TCP probe on every VM
	vmUDP  = 8081 // UDP probe on every VM
	extTCP = 9090 // TCP probe on ext
	extUDP = 9091 // UDP probe on ext
)

// testLink checks the addresses and routes the data plane programs, in
// IPv4 and under Link/IPv6 in IPv6 (a backend of Options.NoIPv6 refuses
// those: testIPv6Refused): an EIP's address on the external interface
// (updated, deleted), an internal route via a VPC host and the default
// route via the external gateway (onlink) in the main table, a next-hop
// update, and their deletion.
func (s *suite) testLink(t *testing.T) {
	s.testLinkFamily(t, ipv4)
	if !s.opts.NoIPv6 {
		t.Run("IPv6", func(t *testing.T) { s.testLinkFamily(t, ipv6) })
	}
}

func (s *suite) testLinkFamily(t *testing.T, f family) {
	var e *env
	dst, def, vmA, vmB, extGW := prefix("203.0.113.0/24"), prefix("0.0.0.0/0"), vm1, vm2, netlab.ExtAddr
	if f.v6 {
		// The dual-stack topology: eth0 and net1 have IPv6 addresses,
		// so the next hops are on link.
		e = s.newEnvWith(t, true, netlab.GatewayOptions{IPv6: true})
		dst, def, vmA, vmB, extGW = prefix("2001:db8:300::/48"), prefix("::/0"), netlab.VMAddr6(0), netlab.VMAddr6(1), netlab.ExtAddr6
	} else {
		e = s.newEnv(t, false)
	}
	eip := f.eipObject(UID(nat.KindEIP, 0), f.eip(0))
	eipPfx := f.eipPrefix(f.eip(0))
	e.apply(eip)
	if !e.hasAddr(eipPfx) {
		t.Errorf("EIP %s: address not on %s after apply", eipPfx, e.cfg.ExternalInterface)
	}
	e.apply(f.eipObject(eip.UID, f.eip(1)))
	if e.hasAddr(eipPfx) || !e.hasAddr(f.eipPrefix(f.eip(1))) {
		t.Errorf("EIP update %s -> %s: addresses of %s are %v", f.eip(0), f.eip(1), e.cfg.ExternalInterface, e.addrsOf(f.v6))
	}
	e.del(eip.UID)
	if e.hasAddr(eipPfx) || e.hasAddr(f.eipPrefix(f.eip(1))) {
		t.Errorf("EIP deleted: addresses of %s still %v", e.cfg.ExternalInterface, e.addrsOf(f.v6))
	}

	in := Route(UID(nat.KindRoute, 0), dst, vmA, nat.DeviceInternal)
	dr := Route(UID(nat.KindRoute, 1), def, extGW, nat.DeviceExternal)
	wantIn := netlab.Route{Dst: dst, Via: vmA, Dev: e.cfg.InternalInterface}
	wantDef := netlab.Route{Dst: def, Via: extGW, Dev: e.cfg.ExternalInterface, OnLink: true}
	e.apply(in, dr)
	e.wantRoutes("after applying routes", []netlab.Route{wantIn, wantDef}, nil)
	e.apply(Route(in.UID, dst, vmB, nat.DeviceInternal))
	wantIn2 := wantIn
	wantIn2.Via = vmB
	e.wantRoutes("after updating the next hop", []netlab.Route{wantIn2, wantDef}, []netlab.Route{wantIn})
	e.del(in.UID, dr.UID)
	e.wantRoutes("after deleting routes", nil, []netlab.Route{wantIn, wantIn2, wantDef})
	e.wantEquiv("after deleting everything", e.empty)
}

// addrs returns the IPv4 addresses of the external interface.
func (e *env) addrs() []netip.Prefix {
	e.t.Helper()
	return e.addrsOf(false)
}

// addrsOf returns the IPv4 addresses of the external interface, or with
// v6 its IPv6 ones (link-local left out).
func (e *env) addrsOf(v6 bool) []netip.Prefix {
	e.t.Helper()
	get := netlab.Addrs
	if v6 {
		get = netlab.Addrs6
	}
	a, err := get(e.ns, e.cfg.ExternalInterface)
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

// hasAddr reports whether p (IPv4 or IPv6) is an address of the external
// interface.
func (e *env) hasAddr(p netip.Prefix) bool {
	e.t.Helper()
	return slices.Contains(e.addrsOf(p.Addr().Is6()), p)
}

// wantRoutes checks that the routes in want are present and those in
// gone are not (routes are compared by destination, next hop, device and
// the onlink flag), in the main table of the family of want and gone (all
// of one family).
func (e *env) wantRoutes(what string, want, gone []netlab.Route) {
	e.t.Helper()
	list := netlab.Routes
	if rs := append(slices.Clone(want), gone...); len(rs) > 0 && rs[0].Dst.Addr().Is6() {
		list = netlab.Routes6
	}
	rs, err := list(e.ns)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, w := range want {
		if !slices.Contains(rs, w) {
			e.t.Errorf("%s: route %q missing; routes: %v", what, w, rs)
		}
	}
	for _, g := range gone {
		if slices.Contains(rs, g) {
			e.t.Errorf("%s: route %q still present", what, g)
		}
	}
}

// topoEnv is an env with the topology of family f (IPv4: the standard one;
// IPv6: the dual-stack one) and probe servers on every VM and on ext, on
// the IPv4 wildcard and, in IPv6, on the host's IPv6 address too.
func (s *suite) topoEnv(t *testing.T, f family) *env {
	e := s.newEnvWith(t, true, netlab.GatewayOptions{IPv6: f.v6})
	for _, h := range append([]netlab.Host{e.gw.Ext}, e.gw.VMs...) {
		tcp, udp := vmTCP, vmUDP
		if h.NS == e.gw.Ext.NS {
			tcp, udp = extTCP, extUDP
		}
		addrs := []netip.Addr{netip.IPv4Unspecified()}
		if f.v6 {
			addrs = append(addrs, h.Addr6)
		}
		for _, a := range addrs {
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

// applyEIPs applies EIP objects and checks that each of their addresses
// (IPv4, IPv6 or both) is on the external interface (the packet tests need
// the gateway to answer ARP and neighbour solicitations for them).
func (e *env) applyEIPs(objs ...nat.Object) {
	e.t.Helper()
	e.apply(objs...)
	for _, o := range objs {
		for _, p := range []netip.Prefix{
			netip.PrefixFrom(o.EIP.Address, o.EIP.PrefixLen),
			netip.PrefixFrom(o.EIP.V6Address, o.EIP.V6PrefixLen),
		} {
			if p.Addr().IsValid() && !e.hasAddr(p) {
				e.t.Fatalf("EIP %s not on %s after apply; addresses: %v", p, e.cfg.ExternalInterface, e.addrsOf(p.Addr().Is6()))
			}
		}
	}
}

// probe is one connection attempt: from namespace src to dst:port.
type probe struct {
	proto nat.Protocol
	src   netlab.Host
	dst   netip.Addr
	port  uint16
}

func (p probe) String() string {
	return fmt.Sprintf("%s %s(%s) -> %s:%d", p.proto, p.src.NS, p.src.Addr, p.dst, p.port)
}

func (p probe) run(ctx context.Context, timeout time.Duration) (netlab.Reply, error) {
	target := netip.AddrPortFrom(p.dst, p.port).String()
	if p.proto == nat.UDP {
		return netlab.DialUDP(ctx, p.src.NS, target, timeout)
	}
	return netlab.Dial(ctx, p.src.NS, target, timeout)
}

// wantReach checks that p connects, reaches the server in namespace server
// and that the server sees the client as client (any address when client
// is the zero Addr).
func (e *env) wantReach(p probe, server string, client netip.Addr) {
	e.t.Helper()
	r, err := p.run(e.ctx, netlab.DialTimeout)
	if err != nil {
		e.t.Errorf("%s: %v", p, err)
		return
	}
	if !strings.HasPrefix(r.Server, server+"/") {
		e.t.Errorf("%s: answered by %s, want a server in %s", p, r.Server, server)
	}
	if client.IsValid() && r.Client.Addr() != client {
		e.t.Errorf("%s: server saw the client as %s, want %s", p, r.Client.Addr(), client)
	}
}

// wantNoReach checks that no probe of ps connects (within the short
// timeout). The probes run concurrently, so a batch costs one timeout.
func (e *env) wantNoReach(ps ...probe) {
	e.t.Helper()
	errs := make([]error, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, err := p.run(e.ctx, netlab.FailTimeout); err == nil {
				errs[i] = fmt.Errorf("%s: connected (server %s saw %s), want no connection", p, r.Server, r.Client)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			e.t.Error(err)
		}
	}
}

// wantNoFlows checks that conntrack has no entry with any of addrs.
func (e *env) wantNoFlows(what string, addrs ...netip.Addr) {
	e.t.Helper()
	flows, err := netlab.ConntrackEntries(e.ctx, e.ns)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, a := range addrs {
		for _, f := range netlab.FlowsWith(flows, a) {
			e.t.Errorf("%s: conntrack entry of %s left: %s", what, a, f)
		}
	}
}

// wantDistinctMarks checks, where the backend marks connections (Options.CtMark),
// that the conntrack entries of the connections to each of eips carry
// one non-zero ct mark per EIP, distinct from the others' (the nftables
// data plane: the IPv4 EIP, or the IPv6 EIP's mark id), so that a flush
// by mark forgets one EIP's connections only.
func (e *env) wantDistinctMarks(f family, eips ...netip.Addr) {
	e.t.Helper()
	if !e.s.opts.CtMark {
		return
	}
	flows, err := netlab.ConntrackEntries(e.ctx, e.ns)
	if err != nil {
		e.t.Fatal(err)
	}
	seen := map[uint32]netip.Addr{}
	for _, a := range eips {
		var marks []uint32
		for _, fl := range flows {
			if fl.OrigDst.Addr() == a {
				marks = append(marks, fl.Mark)
			}
		}
		if len(marks) == 0 {
			e.t.Errorf("%s: no conntrack entry to %s", f, a)
			continue
		}
		for _, m := range marks {
			if m == 0 || m != marks[0] {
				e.t.Errorf("%s: connections to %s carry ct marks %#x, want one non-zero mark", f, a, marks)
				break
			}
		}
		if b, dup := seen[marks[0]]; dup {
			e.t.Errorf("%s: connections to %s and to %s carry the same ct mark %#x", f, a, b, marks[0])
		}
		seen[marks[0]] = a
	}
}

// wantFlows checks that conntrack has an entry with a (so that a later
// "no entries" check means something).
func (e *env) wantFlows(what string, a netip.Addr) {
	e.t.Helper()
	flows, err := netlab.ConntrackEntries(e.ctx, e.ns)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(netlab.FlowsWith(flows, a)) == 0 {
		e.t.Errorf("%s: no conntrack entry of %s; entries: %v", what, a, flows)
	}
}

// family is the address family a packet case runs in: IPv4 through the
// standard topology, or IPv6 through the dual-stack one.
type family struct{ v6 bool }

var (
	ipv4 = family{}
	ipv6 = family{v6: true}
)

func (f family) String() string {
	if f.v6 {
		return "IPv6"
	}
	return "IPv4"
}

// host is h with its address of the family as the address of interest.
func (f family) host(h netlab.Host) netlab.Host {
	if f.v6 {
		return netlab.Host{NS: h.NS, Addr: h.Addr6}
	}
	return h
}

// eip is the topology's i-th EIP address of the family.
func (f family) eip(i int) netip.Addr {
	if f.v6 {
		return netlab.EIP6(i)
	}
	return netlab.EIP(i)
}

// eipObject is an EIP object with the one address a of the family (a /24
// in IPv4, a /64 in IPv6: the external network of the topology).
func (f family) eipObject(uid string, a netip.Addr) nat.Object {
	if f.v6 {
		return EIP6(uid, a)
	}
	return EIP(uid, a)
}

// eipPrefix is a with the prefix length of an EIP of the family.
func (f family) eipPrefix(a netip.Addr) netip.Prefix {
	if f.v6 {
		return netip.PrefixFrom(a, 64)
	}
	return netip.PrefixFrom(a, 24)
}

// vpcNet is the VPC network of the family; vm12Net a prefix of it that
// holds vm1 and vm2 but not vm3 (IPv4: .8/30 holds .10 and .11, not .12;
// IPv6: ::8/126 holds ::a and ::b, not ::c).
func (f family) vpcNet() netip.Prefix {
	if f.v6 {
		return netlab.VPCNet6
	}
	return netlab.VPCNet
}

func (f family) vm12Net() netip.Prefix {
	if f.v6 {
		return prefix("2001:db8:100::8/126")
	}
	return prefix("198.51.100.8/30")
}

// familyCase is a packet case with one body for both families.
type familyCase struct {
	name string
	run  func(*testing.T, family)
}

// packetCases are the packet cases run in IPv4 under Packets and in IPv6
// under Packets/IPv6.
func (s *suite) packetCases() []familyCase {
	return []familyCase{
		{"FIP", s.testFIPPackets},
		{"DNAT", s.testDNATPackets},
		{"SNATLongestPrefix", s.testSNATPackets},
		{"Hairpin", s.testHairpin},
		{"QoS", s.testQoS},
	}
}

// runPackets runs every packet case in family f as a subtest.
func (s *suite) runPackets(t *testing.T, f family) {
	for _, c := range s.packetCases() {
		t.Run(c.name, func(t *testing.T) { c.run(t, f) })
	}
}

func (s *suite) testPackets(t *testing.T) {
	s.runPackets(t, ipv4)
	t.Run("IPv6", s.testIPv6)
}

// testFIPPackets: a FIP carries TCP and UDP both ways for its VM only,
// follows an update to another VM, and its deletion removes its conntrack
// entries, its connectivity and (with its EIP) the EIP's address. In IPv6
// the EIP is dual-stack and an IPv4 FIP through its IPv4 address works
// beside the IPv6 one and survives the IPv6 FIP's deletion.
func (s *suite) testFIPPackets(t *testing.T, f family) {
	e := s.topoEnv(t, f)
	eip := f.eip(0)
	ext, v1, v2 := f.host(e.gw.Ext), f.host(e.gw.VMs[0]), f.host(e.gw.VMs[1])
	// Before anything: no way in, no way out.
	e.wantNoReach(probe{nat.TCP, ext, eip, vmTCP},
		probe{nat.TCP, v1, ext.Addr, extTCP})

	fip := FIP(UID(nat.KindFIP, 0), eip, v1.Addr)
	fip4 := FIP(UID(nat.KindFIP, 1), netlab.EIP(0), e.gw.VMs[0].Addr)
	// The IPv4 FIP of vm1 through the dual-stack EIP's IPv4 address.
	wantFIP4 := func() {
		t.Helper()
		e.wantReach(probe{nat.TCP, e.gw.Ext, netlab.EIP(0), vmTCP}, v1.NS, e.gw.Ext.Addr)
	}
	if f.v6 {
		// applyEIPs checks both of the dual-stack EIP's addresses.
		e.applyEIPs(DualEIP(UID(nat.KindEIP, 0), netlab.EIP(0), eip))
		e.apply(fip, fip4)
	} else {
		e.applyEIPs(EIP(UID(nat.KindEIP, 0), eip))
		e.apply(fip)
	}
	for _, proto := range []nat.Protocol{nat.TCP, nat.UDP} {
		vmPort, extPort := uint16(vmTCP), uint16(extTCP)
		if proto == nat.UDP {
			vmPort, extPort = vmUDP, extUDP
		}
		e.wantReach(probe{proto, ext, eip, vmPort}, v1.NS, ext.Addr)
		e.wantReach(probe{proto, v1, ext.Addr, extPort}, ext.NS, eip)
	}
	if f.v6 {
		wantFIP4()
	}
	// The FIP is vm1's only: vm2 has no way out.
	e.wantNoReach(probe{nat.TCP, v2, ext.Addr, extTCP})

	// Moving the FIP to vm2 moves both directions.
	e.apply(FIP(fip.UID, eip, v2.Addr))
	e.wantReach(probe{nat.TCP, ext, eip, vmTCP}, v2.NS, ext.Addr)
	e.wantReach(probe{nat.TCP, v2, ext.Addr, extTCP}, ext.NS, eip)
	e.wantNoReach(probe{nat.TCP, v1, ext.Addr, extTCP})

	// A live connection through the FIP and one through another EIP's
	// FIP (vm1's), then delete the first: its entries go, the other
	// EIP's stay.
	other := f.eip(1)
	otherEIP, otherFIP := f.eipObject(UID(nat.KindEIP, 1), other), FIP(UID(nat.KindFIP, 2), other, v1.Addr)
	e.applyEIPs(otherEIP)
	e.apply(otherFIP)
	conn, _, err := netlab.Connect(e.ctx, ext.NS, netip.AddrPortFrom(eip, vmTCP).String(), netlab.DialTimeout)
	if err != nil {
		t.Fatalf("open a connection through the %s FIP: %v", f, err)
	}
	defer conn.Close()
	conn2, _, err := netlab.Connect(e.ctx, ext.NS, netip.AddrPortFrom(other, vmTCP).String(), netlab.DialTimeout)
	if err != nil {
		t.Fatalf("open a connection through the other %s FIP: %v", f, err)
	}
	defer conn2.Close()
	e.wantFlows(fmt.Sprintf("with a live connection through the %s FIP", f), eip)
	e.wantFlows(fmt.Sprintf("with a live connection through the other %s FIP", f), other)
	e.wantDistinctMarks(f, eip, other)
	e.del(fip.UID)
	e.wantNoFlows(fmt.Sprintf("after deleting the %s FIP", f), eip)
	e.wantFlows(fmt.Sprintf("after deleting the %s FIP, the other EIP's connection", f), other)
	e.del(otherFIP.UID, otherEIP.UID)
	e.wantNoReach(probe{nat.TCP, ext, eip, vmTCP},
		probe{nat.UDP, ext, eip, vmUDP},
		probe{nat.TCP, v1, ext.Addr, extTCP},
		probe{nat.TCP, v2, ext.Addr, extTCP})
	// The EIP's addresses go with its object.
	gone, pfxs := []string{UID(nat.KindEIP, 0)}, []netip.Prefix{f.eipPrefix(eip)}
	if f.v6 {
		// The IPv4 FIP is untouched.
		wantFIP4()
		gone = append([]string{fip4.UID}, gone...)
		pfxs = append(pfxs, netip.PrefixFrom(netlab.EIP(0), 24))
	}
	e.del(gone...)
	for _, p := range pfxs {
		if e.hasAddr(p) {
			t.Errorf("EIP %s still on %s after its deletion", p, e.cfg.ExternalInterface)
		}
	}
}

// testDNATPackets: TCP and UDP DNATs forward only their port and protocol,
// and the deletion of each removes its own conntrack entries (not the
// other's) and its connectivity.
func (s *suite) testDNATPackets(t *testing.T, f family) {
	e := s.topoEnv(t, f)
	eip := f.eip(1)
	ext, v2 := f.host(e.gw.Ext), f.host(e.gw.VMs[1])
	e.applyEIPs(f.eipObject(UID(nat.KindEIP, 1), eip))
	tcp := DNAT(UID(nat.KindDNAT, 0), eip, nat.TCP, 2222, v2.Addr, vmTCP)
	udp := DNAT(UID(nat.KindDNAT, 1), eip, nat.UDP, 2223, v2.Addr, vmUDP)
	e.apply(tcp, udp)
	e.wantReach(probe{nat.TCP, ext, eip, 2222}, v2.NS, ext.Addr)
	e.wantReach(probe{nat.UDP, ext, eip, 2223}, v2.NS, ext.Addr)
	// Only the forwarded port and protocol.
	e.wantNoReach(probe{nat.TCP, ext, eip, 2223},
		probe{nat.UDP, ext, eip, 2222},
		probe{nat.TCP, ext, eip, vmTCP})

	e.wantFlows(fmt.Sprintf("after %s DNAT traffic", f), eip)
	// Deleting one DNAT forgets its own connections only, as upstream's
	// dnat-del (`conntrack -D -d EIP -p PROTO --dport PORT`): the other
	// DNAT's entry on the same EIP stays.
	tcpTo, udpTo := netip.AddrPortFrom(eip, 2222), netip.AddrPortFrom(eip, 2223)
	if e.flowsTo(nat.TCP, tcpTo) == 0 || e.flowsTo(nat.UDP, udpTo) == 0 {
		t.Fatalf("%s: want conntrack entries to %s/tcp and %s/udp before the deletes", f, tcpTo, udpTo)
	}
	e.del(tcp.UID)
	if n := e.flowsTo(nat.TCP, tcpTo); n != 0 {
		t.Errorf("%s: %d conntrack entries to %s/tcp left after deleting its DNAT", f, n, tcpTo)
	}
	if e.flowsTo(nat.UDP, udpTo) == 0 {
		t.Errorf("%s: deleting the TCP DNAT %s also deleted the UDP DNAT's connection to %s", f, tcpTo, udpTo)
	}
	e.del(udp.UID)
	// No translated connection is left (an untranslated probe to the EIP
	// itself, answered by the gateway, is no DNAT's: it stays until the
	// EIP goes, as upstream's narrow delete leaves it).
	e.wantNoFlows(fmt.Sprintf("after deleting the %s DNATs", f), v2.Addr)
	e.wantNoReach(probe{nat.TCP, ext, eip, 2222},
		probe{nat.UDP, ext, eip, 2223})
}

// flowsTo counts the conntrack entries whose original destination is dst
// over proto.
func (e *env) flowsTo(proto nat.Protocol, dst netip.AddrPort) int {
	e.t.Helper()
	flows, err := netlab.ConntrackEntries(e.ctx, e.ns)
	if err != nil {
		e.t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		if f.Proto == proto.Number() && f.OrigDst == dst {
			n++
		}
	}
	return n
}

// testSNATPackets: of overlapping CIDR SNATs the longest prefix wins
// whatever the order of application, a FIP's SNAT comes before CIDR SNAT,
// and deleting an SNAT moves its VMs to the next one and removes its
// conntrack entries.
func (s *suite) testSNATPackets(t *testing.T, f family) {
	e := s.topoEnv(t, f)
	ext, v1, v2, v3 := f.host(e.gw.Ext), f.host(e.gw.VMs[0]), f.host(e.gw.VMs[1]), f.host(e.gw.VMs[2])
	a, b, c := f.eip(2), f.eip(3), f.eip(4)
	e.applyEIPs(f.eipObject(UID(nat.KindEIP, 2), a), f.eipObject(UID(nat.KindEIP, 3), b), f.eipObject(UID(nat.KindEIP, 4), c))
	wide := SNAT(UID(nat.KindSNAT, 0), a, f.vpcNet(), false)
	narrow := SNAT(UID(nat.KindSNAT, 1), b, f.vm12Net(), true)
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
	// Longest prefix wins whatever the order of application.
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
	e.del(wide.UID, narrow.UID)
	e.apply(narrow, wide)
	check("both in one batch")

	// A FIP's SNAT comes before CIDR SNAT.
	fip := FIP(UID(nat.KindFIP, 0), c, v3.Addr)
	e.apply(fip)
	e.wantReach(probe{nat.TCP, v3, ext.Addr, extTCP}, ext.NS, c)
	e.wantReach(probe{nat.TCP, v1, ext.Addr, extTCP}, ext.NS, b)
	e.del(fip.UID)
	e.wantReach(probe{nat.TCP, v3, ext.Addr, extTCP}, ext.NS, a)

	// Deleting the narrow SNAT moves vm1 to the wide one and forgets the
	// flows through B.
	e.wantFlows(fmt.Sprintf("after %s SNAT traffic", f), b)
	e.del(narrow.UID)
	e.wantNoFlows(fmt.Sprintf("after deleting the narrow %s SNAT", f), b)
	e.wantReach(probe{nat.TCP, v1, ext.Addr, extTCP}, ext.NS, a)
	e.wantFlows(fmt.Sprintf("after %s SNAT traffic", f), a)
	e.del(wide.UID)
	e.wantNoFlows(fmt.Sprintf("after deleting every %s SNAT", f), a, b)
	e.wantNoReach(probe{nat.TCP, v1, ext.Addr, extTCP},
		probe{nat.UDP, v3, ext.Addr, extUDP})
}

// testHairpin: a VPC host reaches another VPC host through the other's FIP
// EIP (and a DNAT's EIP); the gateway SNATs such traffic to the EIP so that
// the reply returns through it.
func (s *suite) testHairpin(t *testing.T, f family) {
	e := s.topoEnv(t, f)
	v1, v2, v3 := f.host(e.gw.VMs[0]), f.host(e.gw.VMs[1]), f.host(e.gw.VMs[2])
	eipF, eipD := f.eip(0), f.eip(1)
	e.applyEIPs(f.eipObject(UID(nat.KindEIP, 0), eipF), f.eipObject(UID(nat.KindEIP, 1), eipD))
	e.apply(FIP(UID(nat.KindFIP, 0), eipF, v1.Addr), DNAT(UID(nat.KindDNAT, 0), eipD, nat.TCP, 2222, v3.Addr, vmTCP))
	e.wantReach(probe{nat.TCP, v2, eipF, vmTCP}, v1.NS, eipF)
	e.wantReach(probe{nat.UDP, v2, eipF, vmUDP}, v1.NS, eipF)
	e.wantReach(probe{nat.TCP, v2, eipD, 2222}, v3.NS, eipD)
	// vm1, which has a FIP of its own, reaches the DNAT too (its source is
	// translated to one of the EIPs, either way the reply comes back).
	e.wantReach(probe{nat.TCP, v1, eipD, 2222}, v3.NS, netip.Addr{})
}

// testQoS sends bulk TCP through a FIP whose EIP is policed and checks that
// each direction is held near its rate (WantPoliced). Then the QoS is
// removed by an update and the same transfer is much faster. In IPv6 the
// FIP and its EIP are IPv6-only, in the dual-stack topology.
func (s *suite) testQoS(t *testing.T, f family) {
	const rateMbps = 16
	q := nat.QoS{IngressRateMbps: rateMbps, IngressBurstMbit: 1, EgressRateMbps: rateMbps, EgressBurstMbit: 1}
	e, eip := s.topoEnv(t, f), f.eip(0)
	ext, v1 := f.host(e.gw.Ext), f.host(e.gw.VMs[0])
	policed, unlimit := f.eipObject(UID(nat.KindEIP, 0), eip), f.eipObject(UID(nat.KindEIP, 0), eip)
	policed.EIP.QoS = &q
	e.applyEIPs(policed)
	e.apply(FIP(UID(nat.KindFIP, 0), eip, v1.Addr))
	served := func(_ netip.AddrPort, r netlab.Reply) error {
		if !strings.HasPrefix(r.Server, v1.NS+"/") {
			return fmt.Errorf("answered by %s", r.Server)
		}
		return nil
	}
	WantPoliced(t, e.ctx, ext.NS, []netip.AddrPort{netip.AddrPortFrom(eip, vmTCP)}, rateMbps, served, func() { e.apply(unlimit) })
}

// WantPoliced checks an EIP QoS of rateMbps in both directions (burst 1
// Mbit) with bulk TCP from namespace client to each target (a TCP probe
// server of netlab behind an EIP): an upload (ingress to the EIP) and a
// download (egress from it) of 6 MB each may beat the rate by no more than
// a burst of 1.5 s (backends may round bursts up), and served, when not
// nil, checks who answered. Then lift removes the QoS and the same
// transfers must take at most half as long.
func WantPoliced(t *testing.T, ctx context.Context, client string, targets []netip.AddrPort, rateMbps int64, served func(netip.AddrPort, netlab.Reply) error, lift func()) {
	t.Helper()
	const (
		size    = 6 << 20 // bytes: about 3 s at 16 Mbit/s
		timeout = 30 * time.Second
	)
	rate := rateMbps * 1_000_000 / 8 // bytes per second
	// 80% of the time the bytes beyond a 1.5 s burst need at the rate.
	floor := time.Duration((size - 3*rate/2) * int64(time.Second) / rate * 8 / 10)
	type xfer struct {
		name   string
		target netip.AddrPort
		run    func() (netlab.Reply, time.Duration, error)
	}
	var xfers []xfer
	for _, target := range targets {
		xfers = append(xfers,
			xfer{"ingress (" + client + " uploads to " + target.String() + ")", target, func() (netlab.Reply, time.Duration, error) {
				return netlab.Upload(ctx, client, target.String(), size, timeout)
			}},
			xfer{"egress (" + client + " downloads from " + target.String() + ")", target, func() (netlab.Reply, time.Duration, error) {
				return netlab.Download(ctx, client, target.String(), size, timeout)
			}})
	}
	took := make([]time.Duration, len(xfers))
	for i, x := range xfers {
		r, d, err := x.run()
		if err != nil {
			t.Errorf("%s with QoS %d Mbit/s: %v", x.name, rateMbps, err)
			continue
		}
		if served != nil {
			if err := served(x.target, r); err != nil {
				t.Errorf("%s: %v", x.name, err)
			}
		}
		took[i] = d
		t.Logf("%s, policed at %d Mbit/s: %d bytes in %v (%.1f Mbit/s)", x.name, rateMbps, size, d, float64(size)*8/d.Seconds()/1e6)
		if d < floor {
			t.Errorf("%s: %d bytes in %v, faster than %d Mbit/s allows (at least %v)", x.name, size, d, rateMbps, floor)
		}
	}
	lift()
	for i, x := range xfers {
		_, d, err := x.run()
		if err != nil {
			t.Errorf("%s without QoS: %v", x.name, err)
			continue
		}
		t.Logf("%s, QoS removed: %d bytes in %v (%.1f Mbit/s)", x.name, size, d, float64(size)*8/d.Seconds()/1e6)
		if took[i] > 0 && d > took[i]/2 {
			t.Errorf("%s: still slow after removing the QoS: %v (policed: %v)", x.name, d, took[i])
		}
	}
}
