package scenario

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/bench/stats"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat/netns"
)

// s4Variant is one way of holding N FIPs on the gateway.
type s4Variant struct {
	Key, Label string
	Ours       bool
	// IPv6: the FIPs are IPv6 (a dual-stack topology, Probe6, Filler6)
	// and the new flows are IPv6 datagrams.
	IPv6 bool
	// Program installs fillers and then probe (the last-installed FIP).
	Program func(ctx context.Context, e *Env, gw *netlab.Gateway, fillers []FIP, probe FIP) (io.Closer, error)
}

func s4Variants() []s4Variant {
	return []s4Variant{
		{Key: "ipt", Label: "iptables-legacy, linear chains (upstream layout)", Program: programScriptChains},
		{Key: "natgw", Label: "natgw nftables backend (maps)", Ours: true, Program: programDataplane(openNftables)},
		{Key: "natgw6", Label: "natgw nftables backend (maps), IPv6", Ours: true, IPv6: true, Program: programDataplane(openNftables)},
	}
}

// programScriptChains loads the upstream-shaped chains with the probe FIP
// appended last, so a new flow to it walks every DNAT rule first.
func programScriptChains(ctx context.Context, e *Env, gw *netlab.Gateway, fillers []FIP, probe FIP) (io.Closer, error) {
	p, err := openScript(legacyScript)(ctx, e, gw)
	if err != nil {
		return nil, err
	}
	if err := p.Preload(ctx, append(fillers, probe)); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func programDataplane(open Opener) func(context.Context, *Env, *netlab.Gateway, []FIP, FIP) (io.Closer, error) {
	return func(ctx context.Context, e *Env, gw *netlab.Gateway, fillers []FIP, probe FIP) (io.Closer, error) {
		p, err := openDataplane(open)(ctx, e, gw)
		if err != nil {
			return nil, err
		}
		if err := p.Preload(ctx, fillers); err != nil {
			p.Close()
			return nil, err
		}
		if err := p.Add(ctx, probe); err != nil {
			p.Close()
			return nil, fmt.Errorf("add the probe FIP: %w", err)
		}
		return p, nil
	}
}

// s4Cell is one (variant, size) measurement.
type s4Cell struct {
	flows     stats.Summary // new flows per second
	tcp       stats.Summary // established TCP, bits per second
	sent      uint64        // datagrams sent over all measured windows
	delivered uint64        // of them, arrived at vm1
	err       error
}

// RunS4 measures the packet path through a gateway holding N FIPs: new UDP
// flows per second to the last-installed FIP and established TCP throughput.
func RunS4(ctx context.Context, e *Env) error {
	plan, err := s4Size(e.plan())
	if err != nil {
		return err
	}
	return runS4(ctx, e, plan, s4Variants())
}

// s4SizeEnv names the variable that sets scenario 4's size for
// development: SIZE[+SIZE...],REPS,WINDOW (e.g. "1+50000,5,300ms"): the FIP
// counts (each ≥ 1, at most MaxFillers−2), the measured windows per cell and
// the length of one window.
const s4SizeEnv = "NATGW_BENCH_S4"

// s4Size returns p with the size s4SizeEnv sets, or p when it is unset.
func s4Size(p Plan) (Plan, error) {
	v := os.Getenv(s4SizeEnv)
	if v == "" {
		return p, nil
	}
	f := strings.Split(v, ",")
	if len(f) != 3 {
		return p, fmt.Errorf("%s %q: want SIZE[+SIZE...],REPS,WINDOW", s4SizeEnv, v)
	}
	var sizes []int
	for _, x := range strings.Split(f[0], "+") {
		n, err := strconv.Atoi(x)
		if err != nil || n < 1 || n > MaxFillers-2 {
			return p, fmt.Errorf("%s %q: SIZE %q: want 1..%d", s4SizeEnv, v, x, MaxFillers-2)
		}
		sizes = append(sizes, n)
	}
	reps, err := strconv.Atoi(f[1])
	if err != nil || reps < 1 {
		return p, fmt.Errorf("%s %q: REPS %q: want a count ≥ 1", s4SizeEnv, v, f[1])
	}
	w, err := time.ParseDuration(f[2])
	if err != nil || w < 10*time.Millisecond {
		return p, fmt.Errorf("%s %q: WINDOW %q: want a duration ≥ 10ms", s4SizeEnv, v, f[2])
	}
	p.S4Sizes, p.S4Reps, p.S4Window, p.S4Env = sizes, reps, w, v
	return p, nil
}

func runS4(ctx context.Context, e *Env, plan Plan, variants []s4Variant) error {
	e.Progress.Scenario("scenario 4: packet path (new UDP flows/s to the last FIP, established TCP) with N FIPs")
	res := map[string]map[int]*s4Cell{}
	var cells []*s4Gateway
	for _, n := range plan.S4Sizes {
		for _, v := range variants {
			c := &s4Gateway{v: v, n: n, cell: &s4Cell{}, label: fmt.Sprintf("%s N=%s", v.Label, report.SizeLabel(n))}
			if res[v.Key] == nil {
				res[v.Key] = map[int]*s4Cell{}
			}
			res[v.Key][n] = c.cell
			cells = append(cells, c)
		}
	}
	err := withLab(ctx, func(l *netlab.Lab) error { return measureS4(ctx, e, plan, l, cells) })
	if ctx.Err() != nil {
		return ctx.Err()
	}
	errs := []error{err}
	for _, c := range cells {
		if c.cell.err != nil {
			c.cell.err = sizeErr(c.v.Label, c.n, c.cell.err)
			errs = append(errs, c.cell.err)
			e.Progress.Printf("%s: FAILED: %v", c.label, c.cell.err)
			continue
		}
		e.Progress.Printf("%s: %s new flows/s, TCP %s", c.label, report.Count(c.cell.flows.Median), gbps(c.cell.tcp.Median))
	}
	reportS4(e, plan, variants, res)
	return errors.Join(errs...)
}

func gbps(bps float64) string {
	if math.IsNaN(bps) {
		return "—"
	}
	return strconv.FormatFloat(bps/1e9, 'f', 2, 64) + " Gb/s"
}

// TCP port of the throughput server on vm1 (forwarded by the FIP).
const s4TCPPort = 5201

// s4Gateway is one (variant, size) cell with its own topology.
type s4Gateway struct {
	v     s4Variant
	n     int
	label string
	cell  *s4Cell
	prog  io.Closer
	m     *s4Meter
}

func (g *s4Gateway) live() bool { return g.cell.err == nil && g.m != nil }

// measureS4 builds every cell's topology first, then measures in rounds:
// each round gives every cell one window, so all cells (both variants, all
// sizes) see the same machine conditions, and a load spike from other
// users of the machine hits them alike instead of one cell.
func measureS4(ctx context.Context, e *Env, plan Plan, l *netlab.Lab, cells []*s4Gateway) error {
	defer func() {
		for _, g := range cells {
			if g.m != nil {
				g.m.Close()
			}
			if g.prog != nil {
				g.prog.Close()
			}
		}
	}()
	for i, g := range cells {
		e.Progress.Step(i+1, len(cells), "set-up: %s", g.label)
		g.cell.err = setupS4(ctx, e, l, fmt.Sprintf("c%d", i), g)
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	for i, g := range cells {
		if !g.live() {
			continue
		}
		e.Progress.Step(i+1, len(cells), "warm-up and check: %s", g.label)
		if _, err := g.m.newFlows(ctx, plan.S4Window/4, 2000); err != nil {
			g.cell.err = fmt.Errorf("warm-up: %w", err)
		} else if err := g.m.checkTranslated(ctx); err != nil {
			g.cell.err = fmt.Errorf("warm-up: %w", err)
		} else if _, err := g.m.tcp(ctx, plan.S4TCPWindow/4); err != nil {
			g.cell.err = fmt.Errorf("TCP warm-up: %w", err)
		}
	}
	rates := make([][]float64, len(cells))
	for r := 0; r < plan.S4Reps; r++ {
		for k := range cells {
			i := (k + r) % len(cells) // rotate the order between rounds
			g := cells[i]
			if !g.live() {
				continue
			}
			e.Progress.Step(r+1, plan.S4Reps, "new UDP flows, round of %s windows: %s", plan.S4Window, g.label)
			w, err := g.m.newFlows(ctx, plan.S4Window, plan.S4MaxFlows)
			if err != nil {
				g.cell.err = fmt.Errorf("new flows, round %d: %w", r+1, err)
				continue
			}
			rates[i] = append(rates[i], w.rate)
			g.cell.sent += w.sent
			g.cell.delivered += w.delivered
		}
	}
	tput := make([][]float64, len(cells))
	for r := 0; r < plan.S4TCPReps; r++ {
		for k := range cells {
			i := (k + r) % len(cells)
			g := cells[i]
			if !g.live() {
				continue
			}
			e.Progress.Step(r+1, plan.S4TCPReps, "established TCP, round of %s runs: %s", plan.S4TCPWindow, g.label)
			bps, err := g.m.tcp(ctx, plan.S4TCPWindow)
			if err != nil {
				g.cell.err = fmt.Errorf("TCP, round %d: %w", r+1, err)
				continue
			}
			tput[i] = append(tput[i], bps)
		}
	}
	for i, g := range cells {
		g.cell.flows, g.cell.tcp = stats.Summarize(rates[i]), stats.Summarize(tput[i])
	}
	return ctx.Err()
}

// setupS4 builds one cell's topology (namespaces named after name), installs
// its N FIPs and opens its meter.
func setupS4(ctx context.Context, e *Env, l *netlab.Lab, name string, g *s4Gateway) error {
	gw, err := l.Gateway(netlab.GatewayOptions{Name: name, VMs: 1, IPv6: g.v.IPv6})
	if err != nil {
		return err
	}
	probe, bits, src, family := Probe(false), netlab.ExtNet.Bits(), gw.Ext.Addr, "ip"
	if g.v.IPv6 {
		probe, bits, src, family = Probe(true), netlab.ExtNet6.Bits(), gw.Ext.Addr6, "ip6"
	}
	vm := gw.VMs[0]
	if err := netlab.AddAddr(gw.GW, gw.ExternalInterface, netip.PrefixFrom(probe.EIP, bits)); err != nil {
		return err
	}
	// vm1 drops the datagrams silently (no ICMP back through the
	// gateway); the counter of its interface still sees them.
	vmNS, err := netns.Open(vm.NS)
	if err != nil {
		return err
	}
	_, err = run(ctx, vmNS, strings.NewReader("table "+family+" sink {\n\tchain sink { type filter hook input priority 0; policy accept; meta l4proto udp drop; }\n}\n"), nil, "nft", "-f", "-")
	vmNS.Close()
	if err != nil {
		return err
	}
	if g.prog, err = g.v.Program(ctx, e, gw, Fillers(probe.EIP.Is6(), g.n-1), probe); err != nil {
		return err
	}
	g.m, err = newS4Meter(gw, vm, src, probe)
	return err
}

// s4Meter sends and counts traffic through one gateway topology.
type s4Meter struct {
	probe   FIP
	snd     *udpSender
	ct      *ctTable
	vmNS    *netns.NS
	vmLink  *netlink.Handle
	extNS   string
	ln      net.Listener
	results chan tcpResult
	sport   uint16
	dport   uint16
}

type tcpResult struct {
	bytes       int64
	first, last time.Time
	err         error
}

// newS4Meter opens the meter of one topology: datagrams and the TCP
// stream from src (ext's address of the probe's family) to probe.EIP, the
// TCP server on vm at probe.Internal.
func newS4Meter(gw *netlab.Gateway, vm netlab.Host, src netip.Addr, probe FIP) (m *s4Meter, err error) {
	m = &s4Meter{probe: probe, extNS: gw.Ext.NS, results: make(chan tcpResult, 1), sport: 1024, dport: 1}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	if m.snd, err = newUDPSender(gw.Ext.NS, src); err != nil {
		return nil, err
	}
	if m.ct, err = openCT(gw.GW); err != nil {
		return nil, err
	}
	if m.vmNS, err = netns.Open(vm.NS); err != nil {
		return nil, err
	}
	if m.vmLink, err = netlink.NewHandleAt(vnetns.NsHandle(m.vmNS.Fd())); err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", vm.NS, err)
	}
	err = m.vmNS.Do(func() error {
		var lerr error
		m.ln, lerr = net.Listen("tcp", netip.AddrPortFrom(probe.Internal, s4TCPPort).String())
		return lerr
	})
	if err != nil {
		return nil, fmt.Errorf("TCP server in %s: %w", vm.NS, err)
	}
	go m.serve()
	return m, nil
}

// serve accepts one connection at a time and reports how many bytes it
// carried between its first and last read.
func (m *s4Meter) serve() {
	buf := make([]byte, 256<<10)
	for {
		c, err := m.ln.Accept()
		if err != nil {
			return
		}
		var r tcpResult
		for {
			k, err := c.Read(buf)
			if k > 0 {
				now := time.Now()
				if r.bytes == 0 {
					r.first = now
				}
				r.bytes += int64(k)
				r.last = now
			}
			if err != nil {
				if err != io.EOF {
					r.err = err
				}
				break
			}
		}
		c.Close()
		m.results <- r
	}
}

func (m *s4Meter) rx() (uint64, error) {
	l, err := m.vmLink.LinkByName("eth0")
	if err != nil {
		return 0, fmt.Errorf("vm1 eth0: %w", err)
	}
	st := l.Attrs().Statistics
	if st == nil {
		return 0, errors.New("vm1 eth0: no statistics")
	}
	return st.RxPackets, nil
}

type flowWindow struct {
	rate            float64
	sent, delivered uint64
}

// newFlows empties the gateway's conntrack table, then sends datagrams to
// the probe EIP, each from a (source port, destination port) pair not used
// before in this topology, so each is a new flow whose first packet walks
// the NAT rules, for at most window or maxFlows datagrams. The rate is what
// arrived at vm1 divided by the time from the first send to the last
// arrival observed.
func (m *s4Meter) newFlows(ctx context.Context, window time.Duration, maxFlows int) (flowWindow, error) {
	var w flowWindow
	if err := m.ct.Flush(); err != nil {
		return w, err
	}
	rx0, err := m.rx()
	if err != nil {
		return w, err
	}
	start := time.Now()
	for w.sent < uint64(maxFlows) {
		if w.sent%256 == 0 && (time.Since(start) >= window || ctx.Err() != nil) {
			break
		}
		if err := m.snd.Send(m.probe.EIP, m.sport, m.dport); err != nil {
			return w, err
		}
		w.sent++
		if m.sport++; m.sport == 0 {
			m.sport, m.dport = 1024, m.dport+1
		}
	}
	end := time.Now()
	last, changed := rx0, end
	for quiet := time.Now(); time.Since(quiet) < 20*time.Millisecond && time.Since(end) < 2*time.Second; {
		time.Sleep(2 * time.Millisecond)
		v, err := m.rx()
		if err != nil {
			return w, err
		}
		if v != last {
			last, changed, quiet = v, time.Now(), time.Now()
		}
	}
	if err := ctx.Err(); err != nil {
		return w, err
	}
	w.delivered = last - rx0
	if w.delivered == 0 {
		return w, fmt.Errorf("none of %d datagrams to %s reached %s", w.sent, m.probe.EIP, m.probe.Internal)
	}
	w.rate = float64(w.delivered) / changed.Sub(start).Seconds()
	return w, nil
}

// checkTranslated proves that flows to the EIP are translated to the probe's
// internal address (in the gateway's conntrack table).
func (m *s4Meter) checkTranslated(ctx context.Context) error {
	if err := m.ct.Flush(); err != nil {
		return err
	}
	if err := m.snd.Send(m.probe.EIP, 1000, 1); err != nil {
		return err
	}
	_, natted, err := m.ct.WaitCount(ctx, m.probe.EIP, m.probe.Internal, 1, 2*time.Second)
	if err != nil {
		return err
	}
	if natted != 1 {
		return fmt.Errorf("a flow to %s was not translated to %s", m.probe.EIP, m.probe.Internal)
	}
	return nil
}

// tcp streams from ext to the EIP's forwarded port for d and returns the
// throughput vm1 received, in bits per second.
func (m *s4Meter) tcp(ctx context.Context, d time.Duration) (float64, error) {
	var c net.Conn
	err := netns.Do(m.extNS, func() error {
		var derr error
		dl := net.Dialer{Timeout: 3 * time.Second}
		c, derr = dl.DialContext(ctx, "tcp", netip.AddrPortFrom(m.probe.EIP, s4TCPPort).String())
		return derr
	})
	if err != nil {
		return 0, fmt.Errorf("dial %s from ext: %w", m.probe.EIP, err)
	}
	buf := make([]byte, 256<<10)
	if err := c.SetWriteDeadline(time.Now().Add(d + 10*time.Second)); err != nil {
		c.Close()
		return 0, err
	}
	start := time.Now()
	for time.Since(start) < d && ctx.Err() == nil {
		if _, err := c.Write(buf); err != nil {
			c.Close()
			return 0, fmt.Errorf("write: %w", err)
		}
	}
	if err := c.Close(); err != nil {
		return 0, err
	}
	select {
	case r := <-m.results:
		if r.err != nil {
			return 0, fmt.Errorf("server: %w", r.err)
		}
		if r.bytes == 0 || !r.last.After(r.first) {
			return 0, fmt.Errorf("server received %d bytes", r.bytes)
		}
		return float64(r.bytes*8) / r.last.Sub(r.first).Seconds(), nil
	case <-time.After(10 * time.Second):
		return 0, errors.New("server did not finish")
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (m *s4Meter) Close() error {
	var errs []error
	if m.ln != nil {
		errs = append(errs, m.ln.Close())
	}
	if m.vmLink != nil {
		m.vmLink.Close()
	}
	if m.vmNS != nil {
		errs = append(errs, m.vmNS.Close())
	}
	if m.ct != nil {
		errs = append(errs, m.ct.Close())
	}
	if m.snd != nil {
		errs = append(errs, m.snd.Close())
	}
	return errors.Join(errs...)
}

func reportS4(e *Env, plan Plan, variants []s4Variant, res map[string]map[int]*s4Cell) {
	sec := e.Report.Section("s4", "Scenario 4: packet path")
	sec.Text = append(sec.Text,
		"**New flows are where NAT rules are evaluated**: netfilter consults the nat chains only for the first packet of a connection; "+
			"later packets follow the conntrack entry. So the cost of N FIPs shows in new connections per second, not in established throughput.",
		"Topology: ext (192.0.2.1) ── veth ── gw (net1 / eth0) ── veth ── bridge ── vm1 (198.51.100.10). The gateway holds N FIPs; "+
			"the probe FIP ("+Probe(false).EIP.String()+" → "+Probe(false).Internal.String()+") is installed last, the other N−1 map unused EIPs from 100.64.0.0/10. "+
			"A Go sender in ext writes single UDP datagrams through a raw socket to the probe EIP, each from a (source port, destination port) pair "+
			"not used before, so every datagram is a new conntrack flow; vm1 drops them in its input hook and the rx counter of its interface counts them. "+
			fmt.Sprintf("A window lasts %s or %s datagrams, whichever ends first; the gateway's conntrack table is flushed before each. ", plan.S4Window, report.Count(float64(plan.S4MaxFlows)))+
			"Rate = datagrams that reached vm1 / time from the first send to the last arrival. "+
			fmt.Sprintf("Established TCP: one connection from ext to EIP:%d (forwarded to vm1), written for %s, throughput measured by the receiver in vm1. ", s4TCPPort, plan.S4TCPWindow)+
			"Each (variant, N) gets a fresh topology; a short warm-up window resolves neighbours and checks that the flows are translated to vm1.",
		"Variants: iptables-legacy with upstream-shaped chains (PREROUTING → EXCLUSIVE_DNAT, POSTROUTING → EXCLUSIVE_SNAT, one rule per FIP each, loaded with iptables-legacy-restore), "+
			"where every new flow walks the DNAT chain to the probe's rule and the whole SNAT chain (its source matches no FIP); "+
			"versus natgw's nftables backend, whose maps look a FIP up in O(1).",
		"IPv6: the same natgw backend on IPv6 FIPs, its cells measured in the same rounds as the IPv4 ones: a dual-stack topology, "+
			"the probe FIP "+Probe(true).EIP.String()+" → "+Probe(true).Internal.String()+" installed last after N−1 IPv6 FIPs (EIPs from 2001:db8:6400::/40), "+
			"datagrams from ext's IPv6 address through a raw IPv6 UDP socket (the kernel adds the IPv6 header and the UDP checksum, which IPv6 requires; "+
			"the IPv4 sender writes whole datagrams), vm1 dropping them in an ip6 input hook, TCP to [EIP6]:5201. "+
			"The IPv4 baseline (iptables-legacy) has no IPv6 counterpart: upstream's gateway never translated IPv6.")
	flows := report.Table{Caption: "**new UDP flows per second** to the last-installed FIP, median (min / max, windows)", Header: []string{"variant"}}
	tcp := report.Table{Caption: "**established TCP throughput**, median (min / max, runs)", Header: []string{"variant"}}
	adv := report.Table{Caption: "**natgw vs iptables-legacy**, new flows per second (natgw median / iptables-legacy median, same run; the last row: natgw IPv6 median / natgw IPv4 median)", Header: []string{""}}
	for _, n := range plan.S4Sizes {
		h := "N=" + report.SizeLabel(n)
		flows.Header, tcp.Header, adv.Header = append(flows.Header, h), append(tcp.Header, h), append(adv.Header, h)
	}
	med := func(key string, n int, f func(*s4Cell) float64) float64 {
		if c := res[key][n]; c != nil && c.err == nil {
			return f(c)
		}
		return math.NaN()
	}
	flowMed := func(c *s4Cell) float64 { return c.flows.Median }
	tcpMed := func(c *s4Cell) float64 { return c.tcp.Median }
	var base, ours, ours6 *s4Variant
	for i, v := range variants {
		fr, tr := []string{v.Label}, []string{v.Label}
		for _, n := range plan.S4Sizes {
			c := res[v.Key][n]
			switch {
			case c == nil:
				fr, tr = append(fr, "not run"), append(tr, "not run")
			case c.err != nil:
				fr, tr = append(fr, "failed"), append(tr, "failed")
			default:
				fr = append(fr, fmt.Sprintf("%s (%s / %s, %d)", report.Count(c.flows.Median), report.Count(c.flows.Min), report.Count(c.flows.Max), c.flows.N))
				tr = append(tr, fmt.Sprintf("%s (%s / %s, %d)", gbps(c.tcp.Median), gbps(c.tcp.Min), gbps(c.tcp.Max), c.tcp.N))
				if c.sent > 0 && float64(c.delivered) < 0.99*float64(c.sent) {
					sec.Notes = append(sec.Notes, fmt.Sprintf("%s at N=%s: %d of %d datagrams arrived (the rest was dropped on the way, counted as not delivered).",
						v.Label, report.SizeLabel(n), c.delivered, c.sent))
				}
			}
			if c != nil && c.err != nil {
				sec.Notes = append(sec.Notes, fmt.Sprintf("%s at N=%s failed: %v", v.Label, report.SizeLabel(n), c.err))
			}
		}
		flows.Rows, tcp.Rows = append(flows.Rows, fr), append(tcp.Rows, tr)
		switch {
		case v.Ours && !v.IPv6 && ours == nil:
			ours = &variants[i]
		case v.Ours && v.IPv6 && ours6 == nil:
			ours6 = &variants[i]
		case !v.Ours:
			base = &variants[i]
		}
	}
	if ours != nil && base != nil {
		row := []string{"natgw / iptables-legacy"}
		for _, n := range plan.S4Sizes {
			row = append(row, report.Times(report.Advantage(med(ours.Key, n, flowMed), med(base.Key, n, flowMed), true)))
		}
		adv.Rows = append(adv.Rows, row)
		for _, n := range plan.S4Sizes {
			e.Report.AddMetric(
				report.NewMetric("s4.new_udp_flows.N="+report.SizeLabel(n), "flows/s", report.HigherIsBetter, med(ours.Key, n, flowMed), med(base.Key, n, flowMed), base.Label),
				report.NewMetric("s4.tcp_established.N="+report.SizeLabel(n), "bit/s", report.HigherIsBetter, med(ours.Key, n, tcpMed), med(base.Key, n, tcpMed), base.Label))
		}
		first, last := plan.S4Sizes[0], plan.S4Sizes[len(plan.S4Sizes)-1]
		r1, rN := med(ours.Key, first, flowMed), med(ours.Key, last, flowMed)
		keep := stats.Ratio(rN, r1)
		t := report.Target{
			Name: fmt.Sprintf("S4 natgw new-flow rate at N=%s vs at N=%s", report.SizeLabel(last), report.SizeLabel(first)),
			Want: "≥ 0.9×", Got: report.Times(keep), Pass: !math.IsNaN(keep) && keep >= 0.9,
			Reason: fmt.Sprintf("%s/s at %s, %s/s at %s", report.Count(rN), report.SizeLabel(last), report.Count(r1), report.SizeLabel(first)),
		}
		if math.IsNaN(keep) {
			t.Got, t.Reason = "not measured", "natgw did not run at both sizes"
		} else if !t.Pass {
			t.Reason += "; " + s4MissReason(res[ours.Key][first], res[ours.Key][last])
		}
		sec.Targets = append(sec.Targets, t)
	}
	if ours != nil && ours6 != nil {
		s4IPv6(e, plan, sec, &adv, res, *ours, *ours6)
	}
	sec.Tables = append(sec.Tables, flows, adv, tcp)
	if plan.S4Env != "" {
		sec.Notes = append(sec.Notes, fmt.Sprintf("Size set by %s=%s (development size, not the mode's).", s4SizeEnv, plan.S4Env))
	}
	sec.Notes = append(sec.Notes,
		fmt.Sprintf("%d measured windows per cell after one warm-up window; %d TCP runs after one warm-up run.", plan.S4Reps, plan.S4TCPReps),
		"Sender, gateway and receiver share the machine's CPUs (the veth path runs the gateway's netfilter hooks in the sender's softirq), so the rate is the single-path packet rate of this machine, not a NIC figure.")
	s4Plot(e, plan, variants, res, sec)
}

// s4IPv6 adds the IPv6 rows: natgw IPv6 ÷ natgw IPv4 new-flow rate per
// size (a row of adv, a metric each), and the targets: at the
// largest size IPv6 ÷ IPv4 ≥ 0.9, and IPv6's own rate at the largest size
// ≥ 0.9× its rate at the smallest.
func s4IPv6(e *Env, plan Plan, sec *report.Section, adv *report.Table, res map[string]map[int]*s4Cell, v4, v6 s4Variant) {
	med := func(key string, n int) float64 {
		if c := res[key][n]; c != nil && c.err == nil {
			return c.flows.Median
		}
		return math.NaN()
	}
	row := []string{"natgw IPv6 / natgw IPv4"}
	for _, n := range plan.S4Sizes {
		row = append(row, report.Times(stats.Ratio(med(v6.Key, n), med(v4.Key, n))))
		e.Report.AddMetric(report.NewMetric("s4.new_udp_flows.ipv6_vs_ipv4.N="+report.SizeLabel(n), "flows/s", report.HigherIsBetter,
			med(v6.Key, n), med(v4.Key, n), v4.Label+", IPv4"))
	}
	adv.Rows = append(adv.Rows, row)
	first, last := plan.S4Sizes[0], plan.S4Sizes[len(plan.S4Sizes)-1]
	target := func(name string, num, den *s4Cell, numAt, denAt string) {
		n, d := math.NaN(), math.NaN()
		if num != nil && num.err == nil {
			n = num.flows.Median
		}
		if den != nil && den.err == nil {
			d = den.flows.Median
		}
		r := stats.Ratio(n, d)
		t := report.Target{Name: name, Want: "≥ 0.9×", Got: report.Times(r), Pass: !math.IsNaN(r) && r >= 0.9,
			Reason: fmt.Sprintf("%s/s (%s), %s/s (%s)", report.Count(n), numAt, report.Count(d), denAt)}
		switch {
		case math.IsNaN(r):
			t.Got, t.Reason = "not measured", "a cell did not run (see the notes)"
		case !t.Pass && num.flows.Max >= den.flows.Min:
			t.Reason += fmt.Sprintf("; the window ranges overlap (%s–%s vs %s–%s): the difference is within this run's noise (shared machine, load average in the header)",
				report.Count(num.flows.Min), report.Count(num.flows.Max), report.Count(den.flows.Min), report.Count(den.flows.Max))
		case !t.Pass:
			t.Reason += fmt.Sprintf("; every %s window (max %s) was slower than every %s window (min %s)", numAt, report.Count(num.flows.Max), denAt, report.Count(den.flows.Min))
		}
		sec.Targets = append(sec.Targets, t)
	}
	target(fmt.Sprintf("S4 natgw new-flow rate at N=%s: IPv6 ÷ IPv4", report.SizeLabel(last)),
		res[v6.Key][last], res[v4.Key][last], "IPv6", "IPv4")
	target(fmt.Sprintf("S4 natgw IPv6 new-flow rate at N=%s vs at N=%s", report.SizeLabel(last), report.SizeLabel(first)),
		res[v6.Key][last], res[v6.Key][first], report.SizeLabel(last), report.SizeLabel(first))
}

// s4MissReason explains a missed flat-rate target from the spread of the
// windows: overlapping ranges mean the difference is within the noise of
// this (shared) machine.
func s4MissReason(small, big *s4Cell) string {
	if small == nil || big == nil || small.err != nil || big.err != nil {
		return "incomplete data"
	}
	if big.flows.Max >= small.flows.Min {
		return fmt.Sprintf("the window ranges overlap (%s–%s vs %s–%s): the difference is within this run's noise (shared machine, load average in the header)",
			report.Count(big.flows.Min), report.Count(big.flows.Max), report.Count(small.flows.Min), report.Count(small.flows.Max))
	}
	return fmt.Sprintf("every window at the big size (max %s) was slower than every window at the small size (min %s): a real per-packet cost grows with N",
		report.Count(big.flows.Max), report.Count(small.flows.Min))
}

func s4Plot(e *Env, plan Plan, variants []s4Variant, res map[string]map[int]*s4Cell, sec *report.Section) {
	var cats []string
	for _, n := range plan.S4Sizes {
		cats = append(cats, report.SizeLabel(n))
	}
	pf := report.Panel{Title: "new UDP flows per second to the last FIP", XLabel: "FIPs on the gateway (N)", YLabel: "flows/s (median), log scale", LogY: true, Categories: cats}
	pt := report.Panel{Title: "established TCP throughput", XLabel: "FIPs on the gateway (N)", YLabel: "Gb/s (median)", Categories: cats}
	for _, v := range variants {
		var fy, ty []float64
		for _, n := range plan.S4Sizes {
			c := res[v.Key][n]
			if c == nil || c.err != nil {
				fy, ty = append(fy, math.NaN()), append(ty, math.NaN())
				continue
			}
			fy, ty = append(fy, c.flows.Median), append(ty, c.tcp.Median/1e9)
		}
		pf.Series = append(pf.Series, report.Series{Label: v.Label, Y: fy, Dashed: !v.Ours})
		pt.Series = append(pt.Series, report.Series{Label: v.Label, Y: ty, Dashed: !v.Ours})
	}
	path, name := e.plotPath("s4")
	if err := (report.Figure{Panels: []report.Panel{pf, pt}}).Save(path); err != nil {
		sec.Notes = append(sec.Notes, "plot failed: "+err.Error())
		return
	}
	sec.Plot = name
}
