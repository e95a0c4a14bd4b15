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

// testLink checks the addresses and routes the data plane programs: an
// EIP's address on the external interface, routes in the main table.
func (s *suite) testLink(t *testing.T) {
	e := s.newEnv(t, false)
	eip := EIP(UID(nat.KindEIP, 0), netlab.EIP(0))
	eipPfx := netip.PrefixFrom(netlab.EIP(0), 24)
	e.apply(eip)
	if !e.hasAddr(eipPfx) {
		t.Errorf("EIP %s: address not on %s after apply", eipPfx, e.cfg.ExternalInterface)
	}
	e.apply(EIP(eip.UID, netlab.EIP(1)))
	if e.hasAddr(eipPfx) || !e.hasAddr(netip.PrefixFrom(netlab.EIP(1), 24)) {
		t.Errorf("EIP update %s -> %s: addresses of %s are %v", netlab.EIP(0), netlab.EIP(1), e.cfg.ExternalInterface, e.addrs())
	}
	e.del(eip.UID)
	if e.hasAddr(eipPfx) || e.hasAddr(netip.PrefixFrom(netlab.EIP(1), 24)) {
		t.Errorf("EIP deleted: addresses of %s still %v", e.cfg.ExternalInterface, e.addrs())
	}

	in := Route(UID(nat.KindRoute, 0), prefix("203.0.113.0/24"), vm1, nat.DeviceInternal)
	def := Route(UID(nat.KindRoute, 1), prefix("0.0.0.0/0"), netlab.ExtAddr, nat.DeviceExternal)
	wantIn := netlab.Route{Dst: in.Route.Destination, Via: vm1, Dev: e.cfg.InternalInterface}
	wantDef := netlab.Route{Dst: def.Route.Destination, Via: netlab.ExtAddr, Dev: e.cfg.ExternalInterface, OnLink: true}
	e.apply(in, def)
	e.wantRoutes("after applying routes", []netlab.Route{wantIn, wantDef}, nil)
	e.apply(Route(in.UID, in.Route.Destination, vm2, nat.DeviceInternal))
	wantIn2 := wantIn
	wantIn2.Via = vm2
	e.wantRoutes("after updating the next hop", []netlab.Route{wantIn2, wantDef}, []netlab.Route{wantIn})
	e.del(in.UID, def.UID)
	e.wantRoutes("after deleting routes", nil, []netlab.Route{wantIn, wantIn2, wantDef})
	e.wantEquiv("after deleting everything", e.empty)
}

func (e *env) addrs() []netip.Prefix {
	e.t.Helper()
	a, err := netlab.Addrs(e.ns, e.cfg.ExternalInterface)
	if err != nil {
		e.t.Fatal(err)
	}
	return a
}

func (e *env) hasAddr(p netip.Prefix) bool { return slices.Contains(e.addrs(), p) }

// wantRoutes checks that the routes in want are present and those in
// gone are not (routes are compared by destination, next hop, device and
// the onlink flag).
func (e *env) wantRoutes(what string, want, gone []netlab.Route) {
	e.t.Helper()
	rs, err := netlab.Routes(e.ns)
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

// topoEnv is an env with the standard topology and probe servers on every
// VM and on ext.
func (s *suite) topoEnv(t *testing.T) *env {
	e := s.newEnv(t, true)
	hosts := append([]netlab.Host{e.gw.Ext}, e.gw.VMs...)
	for _, h := range hosts {
		tcp, udp := vmTCP, vmUDP
		if h == e.gw.Ext {
			tcp, udp = extTCP, extUDP
		}
		if _, err := e.lab.ServeTCP(e.ctx, h.NS, fmt.Sprintf("0.0.0.0:%d", tcp)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.lab.ServeUDP(e.ctx, h.NS, fmt.Sprintf("0.0.0.0:%d", udp)); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// applyEIPs applies EIP objects and checks that their addresses are on the
// external interface (the packet tests need the gateway to answer ARP for
// them).
func (e *env) applyEIPs(objs ...nat.Object) {
	e.t.Helper()
	e.apply(objs...)
	for _, o := range objs {
		if p := netip.PrefixFrom(o.EIP.Address, o.EIP.PrefixLen); !e.hasAddr(p) {
			e.t.Fatalf("EIP %s not on %s after apply; addresses: %v", p, e.cfg.ExternalInterface, e.addrs())
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

func (s *suite) testPackets(t *testing.T) {
	for _, tc := range []test{
		{"FIP", s.testFIPPackets},
		{"DNAT", s.testDNATPackets},
		{"SNATLongestPrefix", s.testSNATPackets},
		{"Hairpin", s.testHairpin},
		{"QoS", s.testQoS},
		{"IPv6", s.testIPv6},
	} {
		t.Run(tc.name, tc.run)
	}
}

func (s *suite) testFIPPackets(t *testing.T) {
	e := s.topoEnv(t)
	eip := netlab.EIP(0)
	ext, v1, v2 := e.gw.Ext, e.gw.VMs[0], e.gw.VMs[1]
	// Before anything: no way in, no way out.
	e.wantNoReach(probe{nat.TCP, ext, eip, vmTCP},
		probe{nat.TCP, v1, ext.Addr, extTCP})

	e.applyEIPs(EIP(UID(nat.KindEIP, 0), eip))
	fip := FIP(UID(nat.KindFIP, 0), eip, v1.Addr)
	e.apply(fip)
	for _, proto := range []nat.Protocol{nat.TCP, nat.UDP} {
		vmPort, extPort := uint16(vmTCP), uint16(extTCP)
		if proto == nat.UDP {
			vmPort, extPort = vmUDP, extUDP
		}
		e.wantReach(probe{proto, ext, eip, vmPort}, v1.NS, ext.Addr)
		e.wantReach(probe{proto, v1, ext.Addr, extPort}, ext.NS, eip)
	}
	// The FIP is vm1's only: vm2 has no way out.
	e.wantNoReach(probe{nat.TCP, v2, ext.Addr, extTCP})

	// Moving the FIP to vm2 moves both directions.
	e.apply(FIP(fip.UID, eip, v2.Addr))
	e.wantReach(probe{nat.TCP, ext, eip, vmTCP}, v2.NS, ext.Addr)
	e.wantReach(probe{nat.TCP, v2, ext.Addr, extTCP}, ext.NS, eip)
	e.wantNoReach(probe{nat.TCP, v1, ext.Addr, extTCP})

	// A live connection through the FIP, then delete.
	conn, _, err := netlab.Connect(e.ctx, ext.NS, netip.AddrPortFrom(eip, vmTCP).String(), netlab.DialTimeout)
	if err != nil {
		t.Fatalf("open a connection through the FIP: %v", err)
	}
	defer conn.Close()
	e.wantFlows("with a live connection through the FIP", eip)
	e.del(fip.UID)
	e.wantNoFlows("after deleting the FIP", eip)
	e.wantNoReach(probe{nat.TCP, ext, eip, vmTCP},
		probe{nat.UDP, ext, eip, vmUDP},
		probe{nat.TCP, v1, ext.Addr, extTCP},
		probe{nat.TCP, v2, ext.Addr, extTCP})
	// The EIP's address goes with its object.
	e.del(UID(nat.KindEIP, 0))
	if p := netip.PrefixFrom(eip, 24); e.hasAddr(p) {
		t.Errorf("EIP %s still on %s after its deletion", p, e.cfg.ExternalInterface)
	}
}

func (s *suite) testDNATPackets(t *testing.T) {
	e := s.topoEnv(t)
	eip := netlab.EIP(1)
	ext, v2 := e.gw.Ext, e.gw.VMs[1]
	e.applyEIPs(EIP(UID(nat.KindEIP, 1), eip))
	tcp := DNAT(UID(nat.KindDNAT, 0), eip, nat.TCP, 2222, v2.Addr, vmTCP)
	udp := DNAT(UID(nat.KindDNAT, 1), eip, nat.UDP, 2223, v2.Addr, vmUDP)
	e.apply(tcp, udp)
	e.wantReach(probe{nat.TCP, ext, eip, 2222}, v2.NS, ext.Addr)
	e.wantReach(probe{nat.UDP, ext, eip, 2223}, v2.NS, ext.Addr)
	// Only the forwarded port and protocol.
	e.wantNoReach(probe{nat.TCP, ext, eip, 2223},
		probe{nat.UDP, ext, eip, 2222},
		probe{nat.TCP, ext, eip, vmTCP})

	e.wantFlows("after DNAT traffic", eip)
	e.del(tcp.UID, udp.UID)
	e.wantNoFlows("after deleting the DNATs", eip)
	e.wantNoReach(probe{nat.TCP, ext, eip, 2222},
		probe{nat.UDP, ext, eip, 2223})
}

func (s *suite) testSNATPackets(t *testing.T) {
	e := s.topoEnv(t)
	ext, v1, v2, v3 := e.gw.Ext, e.gw.VMs[0], e.gw.VMs[1], e.gw.VMs[2]
	a, b, c := netlab.EIP(2), netlab.EIP(3), netlab.EIP(4)
	e.applyEIPs(EIP(UID(nat.KindEIP, 2), a), EIP(UID(nat.KindEIP, 3), b), EIP(UID(nat.KindEIP, 4), c))
	wide := SNAT(UID(nat.KindSNAT, 0), a, prefix("198.51.100.0/24"), false)
	// .8/30 holds vm1 (.10) and vm2 (.11), not vm3 (.12).
	narrow := SNAT(UID(nat.KindSNAT, 1), b, prefix("198.51.100.8/30"), true)
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
	e.wantFlows("after SNAT traffic", b)
	e.del(narrow.UID)
	e.wantNoFlows("after deleting the narrow SNAT", b)
	e.wantReach(probe{nat.TCP, v1, ext.Addr, extTCP}, ext.NS, a)
	e.wantFlows("after SNAT traffic", a)
	e.del(wide.UID)
	e.wantNoFlows("after deleting every SNAT", a, b)
	e.wantNoReach(probe{nat.TCP, v1, ext.Addr, extTCP},
		probe{nat.UDP, v3, ext.Addr, extUDP})
}

// testHairpin: a VPC host reaches another VPC host through the other's FIP
// EIP (and a DNAT's EIP); the gateway SNATs such traffic to the EIP so that
// the reply returns through it.
func (s *suite) testHairpin(t *testing.T) {
	e := s.topoEnv(t)
	v1, v2, v3 := e.gw.VMs[0], e.gw.VMs[1], e.gw.VMs[2]
	eipF, eipD := netlab.EIP(0), netlab.EIP(1)
	e.applyEIPs(EIP(UID(nat.KindEIP, 0), eipF), EIP(UID(nat.KindEIP, 1), eipD))
	e.apply(FIP(UID(nat.KindFIP, 0), eipF, v1.Addr), DNAT(UID(nat.KindDNAT, 0), eipD, nat.TCP, 2222, v3.Addr, vmTCP))
	e.wantReach(probe{nat.TCP, v2, eipF, vmTCP}, v1.NS, eipF)
	e.wantReach(probe{nat.UDP, v2, eipF, vmUDP}, v1.NS, eipF)
	e.wantReach(probe{nat.TCP, v2, eipD, 2222}, v3.NS, eipD)
	// vm1, which has a FIP of its own, reaches the DNAT too (its source is
	// translated to one of the EIPs, either way the reply comes back).
	e.wantReach(probe{nat.TCP, v1, eipD, 2222}, v3.NS, netip.Addr{})
}

// testQoS sends bulk TCP through a FIP whose EIP is policed and checks that
// each direction is held near its rate: the transfer cannot beat the rate
// by more than a burst of 1.5 s (backends may round bursts up). Then the
// QoS is removed by an update and the same transfer is much faster.
func (s *suite) testQoS(t *testing.T) { s.testQoSFamily(t, false) }

// testQoSFamily is testQoS through an IPv4 FIP, or with v6 an IPv6 FIP of
// an IPv6-only EIP in the dual-stack topology.
func (s *suite) testQoSFamily(t *testing.T, v6 bool) {
	const (
		rateMbps = 16
		size     = 6 << 20                  // bytes: about 3 s at the rate
		rate     = rateMbps * 1_000_000 / 8 // bytes per second
		timeout  = 30 * time.Second
	)
	// 80% of the time the bytes beyond a 1.5 s burst need at the rate.
	const floor = time.Duration((size - 3*rate/2) * int64(time.Second) / rate * 8 / 10)
	q := nat.QoS{IngressRateMbps: rateMbps, IngressBurstMbit: 1, EgressRateMbps: rateMbps, EgressBurstMbit: 1}
	var (
		e                *env
		eip              netip.Addr
		ext, v1          netlab.Host
		policed, unlimit nat.Object
	)
	if v6 {
		e, eip = s.topoEnv6(t), netlab.EIP6(0)
		ext, v1 = host6(e.gw.Ext), host6(e.gw.VMs[0])
		policed, unlimit = EIP6(UID(nat.KindEIP, 0), eip), EIP6(UID(nat.KindEIP, 0), eip)
		policed.EIP.QoS = &q
		e.applyEIPs6(policed)
	} else {
		e, eip = s.topoEnv(t), netlab.EIP(0)
		ext, v1 = e.gw.Ext, e.gw.VMs[0]
		policed, unlimit = EIPQoS(UID(nat.KindEIP, 0), eip, q), EIP(UID(nat.KindEIP, 0), eip)
		e.applyEIPs(policed)
	}
	e.apply(FIP(UID(nat.KindFIP, 0), eip, v1.Addr))
	target := netip.AddrPortFrom(eip, vmTCP).String()
	type xfer struct {
		name string
		run  func() (netlab.Reply, time.Duration, error)
	}
	xfers := []xfer{
		{"ingress (ext uploads to the EIP)", func() (netlab.Reply, time.Duration, error) {
			return netlab.Upload(e.ctx, ext.NS, target, size, timeout)
		}},
		{"egress (ext downloads from the EIP)", func() (netlab.Reply, time.Duration, error) {
			return netlab.Download(e.ctx, ext.NS, target, size, timeout)
		}},
	}
	took := make([]time.Duration, len(xfers))
	for i, x := range xfers {
		r, d, err := x.run()
		if err != nil {
			t.Errorf("%s with QoS %d Mbit/s: %v", x.name, rateMbps, err)
			continue
		}
		if !strings.HasPrefix(r.Server, v1.NS+"/") {
			t.Errorf("%s: answered by %s", x.name, r.Server)
		}
		took[i] = d
		t.Logf("%s, policed at %d Mbit/s: %d bytes in %v (%.1f Mbit/s)", x.name, rateMbps, size, d, float64(size)*8/d.Seconds()/1e6)
		if d < floor {
			t.Errorf("%s: %d bytes in %v, faster than %d Mbit/s allows (at least %v)", x.name, size, d, rateMbps, floor)
		}
	}
	e.apply(unlimit)
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
