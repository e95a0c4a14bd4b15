// Package qoslab is the QoS measurement lab shared by nat/shape's tests and
// the benchmark (bench/scenario, scenario 9): a gateway with one EIP and a
// FIP of it to one VPC host, an external host behind an optional delay line
// (internal/delayline: this kernel has no netem), and the traffic that
// measures a limit on that EIP: bulk TCP flows with their goodput, the
// sender's retransmits and pings under load, and paced UDP.
//
//	ext (eth0 192.0.2.1) ─┬─ veth ─────────────────────── (net1 192.0.2.254, EIP) gw
//	                      └─ veth ─ (la) mid (lb) ─ veth ─┘   (with an added RTT)
//	gw (eth0 198.51.100.1) ── veth ── (eth0 VM, default via .1) vm
//
// The nftables data plane runs in gw. How the EIP is limited (policer,
// shaper, a script's tc classes) is the caller's business; Police sets
// natgw's own policer.
package qoslab

import (
	"bufio"
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
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/internal/delayline"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftables"
)

// Addresses of the lab.
var (
	// EIP is the limited EIP (netlab.EIP(0)).
	EIP = netlab.EIP(0)
	// VM is the VPC host its FIP points to (netlab.VMAddr(0)).
	VM = netlab.VMAddr(0)
)

// Ports of the lab's traffic.
const (
	TCPPort = 5001
	UDPPort = 5002
)

// Topo is one lab: namespaces Ext, GW (the gateway, nftables data plane
// DP with configuration Cfg) and VM, and the delay line when the lab has
// an added RTT.
type Topo struct {
	Ext, GW, VM string
	Cfg         nat.Config
	DP          nat.Dataplane
	line        *delayline.Line
}

// New builds the lab in lab's namespaces with rtt added between ext and gw
// (0: a plain veth), programs the EIP and its FIP in the nftables data
// plane and pings the EIP once through the whole path. Close releases
// what lab.Close does not (the delay line, the data plane's handle).
func New(ctx context.Context, lab *netlab.Lab, rtt time.Duration) (_ *Topo, err error) {
	mk := func(role string) string {
		if err != nil {
			return ""
		}
		var n string
		n, err = lab.NS(role)
		return n
	}
	tp := &Topo{Ext: mk("ext"), GW: mk("gw"), VM: mk("vm")}
	if err != nil {
		return nil, fmt.Errorf("qoslab: %w", err)
	}
	defer func() {
		if err != nil {
			tp.Close()
		}
	}()
	tp.Cfg = nat.Config{NetNS: tp.GW, ExternalInterface: nat.DefaultExternalInterface, InternalInterface: nat.DefaultInternalInterface}
	net1 := netlab.End{NS: tp.GW, Name: "net1", Addrs: []netip.Prefix{netip.PrefixFrom(netlab.GWExtAddr, 24)}}
	extEnd := netlab.End{NS: tp.Ext, Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(netlab.ExtAddr, 24)}}
	steps := []func() error{
		func() error {
			return netlab.Veth(netlab.End{NS: tp.GW, Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(netlab.GWVPCAddr, 24)}},
				netlab.End{NS: tp.VM, Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(VM, 24)}})
		},
		func() error {
			return netlab.AddRoute(tp.VM, netip.MustParsePrefix("0.0.0.0/0"), netlab.GWVPCAddr, "eth0")
		},
		func() error { return netlab.Sysctl(tp.GW, "net.ipv4.ip_forward", "1") },
	}
	if rtt == 0 {
		steps = append(steps, func() error { return netlab.Veth(net1, extEnd) })
	} else {
		mid := mk("mid")
		if err != nil {
			return nil, fmt.Errorf("qoslab: %w", err)
		}
		steps = append(steps,
			func() error { return netlab.Veth(net1, netlab.End{NS: mid, Name: "lb"}) },
			func() error { return netlab.Veth(netlab.End{NS: mid, Name: "la"}, extEnd) },
			func() error {
				l, err := delayline.Start(ctx, delayline.Options{NS: mid, A: "la", B: "lb", Delay: rtt / 2})
				tp.line = l
				return err
			})
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, fmt.Errorf("qoslab: %w", err)
		}
	}
	dp, err := nftables.New(ctx, tp.Cfg)
	if err != nil {
		return nil, fmt.Errorf("qoslab: nftables data plane in %s: %w", tp.GW, err)
	}
	tp.DP = dp
	if err := tp.Police(ctx, nil); err != nil {
		return nil, err
	}
	if err := dp.Apply(ctx, nat.Object{UID: "fip-0", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: EIP, InternalIP: VM}}); err != nil {
		return nil, fmt.Errorf("qoslab: FIP %s → %s: %w", EIP, VM, err)
	}
	// Warm up neighbors through the whole path.
	if _, err := netlab.Ping(ctx, tp.Ext, EIP, 1, 0, 3*time.Second); err != nil {
		return nil, fmt.Errorf("qoslab: first ping of %s: %w", EIP, err)
	}
	return tp, nil
}

// Close stops the delay line and closes the data plane's handle (the
// namespaces are the lab's).
func (tp *Topo) Close() error {
	var errs []error
	if tp.line != nil {
		errs = append(errs, tp.line.Close())
		tp.line = nil
	}
	if tp.DP != nil {
		errs = append(errs, tp.DP.Close())
		tp.DP = nil
	}
	return errors.Join(errs...)
}

// Police sets natgw's policer on the EIP (the EIP object's QoS, as
// `natgw serve --eip-qos=police` applies it; nil: none).
func (tp *Topo) Police(ctx context.Context, q *nat.QoS) error {
	o := nat.Object{UID: "eip-0", Kind: nat.KindEIP, EIP: &nat.EIP{Address: EIP, PrefixLen: 24, QoS: q}}
	if err := tp.DP.Apply(ctx, o); err != nil {
		return fmt.Errorf("qoslab: police %s with %+v: %w", EIP, q, err)
	}
	return nil
}

// Dir is a measurement's direction, from the VPC host's side.
type Dir string

const (
	Download Dir = "download" // to the EIP: ext sends, vm receives
	Upload   Dir = "upload"   // from the EIP: vm sends, ext receives
)

// Sender returns the namespace that sends in dir.
func (tp *Topo) Sender(dir Dir) string {
	if dir == Download {
		return tp.Ext
	}
	return tp.VM
}

// TCPRun is what RunTCP measured.
type TCPRun struct {
	Window   []int64 // bytes each flow delivered in the window
	WindowD  time.Duration
	Total    []int64      // bytes each flow delivered in all
	Timeline [][2]float64 // (seconds since start, bytes of all flows), every 10 ms
	// Retrans is the sender's retransmitted segments in % of the new
	// segments it sent (RetransSegs / OutSegs of its namespace's
	// /proc/net/snmp; OutSegs excludes retransmissions, so this can pass
	// 100); Segs the new segments.
	Retrans float64
	Segs    uint64
	// Pings are the answered pings' round trips (ext → EIP, in the order
	// sent); PingsSent how many were sent.
	Pings     []time.Duration
	PingsSent int
	// Redials is how many flows' dials timed out and were tried again
	// (see DialTimeout); SlowestDial the longest time one flow took to
	// connect, redials included. A dial behind a saturated limit waits for
	// the queue ahead of its SYN or for TCP's SYN retransmits (1 s, then
	// 3 s, 7 s after the first).
	Redials     int
	SlowestDial time.Duration
}

// Dials of RunTCP's flows: each attempt may take DialTimeout (TCP sends
// its SYN at 0, 1, 3 and 7 s, so three lost SYNs, or a SYN queued for
// seconds behind a limit the earlier flows fill, still connect) and a flow
// is dialed up to DialAttempts times.
const (
	DialTimeout  = 8 * time.Second
	DialAttempts = 3
)

// Goodput returns the flows' total in the window in Mbit/s.
func (r TCPRun) Goodput() float64 {
	var s int64
	for _, b := range r.Window {
		s += b
	}
	return float64(s) * 8 / r.WindowD.Seconds() / 1e6
}

// Jain is Jain's fairness index of the flows' window bytes (1: equal).
func (r TCPRun) Jain() float64 {
	var s, s2 float64
	for _, b := range r.Window {
		s += float64(b)
		s2 += float64(b) * float64(b)
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(r.Window)) * s2)
}

// AboveRate reads a single flow's Timeline after a limit with a burst: the
// bytes it got through above the steady rate (the slope of the
// timeline's last half, extended back to the start: what passed before
// the limit held, less what the limit alone would have passed by then)
// and when the first mark bytes had arrived (seconds since the start; NaN
// if they never did). Both are NaN with fewer than 4 samples.
func (r TCPRun) AboveRate(mark float64) (excess, markAt float64) {
	tl := r.Timeline
	if len(tl) < 4 {
		return math.NaN(), math.NaN()
	}
	end, mid := tl[len(tl)-1], tl[len(tl)/2]
	slope := (end[1] - mid[1]) / (end[0] - mid[0])
	excess = end[1] - slope*end[0]
	markAt = math.NaN()
	for _, p := range tl {
		if p[1] >= mark {
			markAt = p[0]
			break
		}
	}
	return excess, markAt
}

// TCPOptions of one RunTCP.
type TCPOptions struct {
	Dir   Dir
	Flows int
	// Warm is when the window starts, Dur when the run ends.
	Warm, Dur time.Duration
	// PingEvery > 0 pings ext → EIP at that interval from Warm to Dur.
	PingEvery time.Duration
}

// dial connects vm to ext's TCPPort: up to DialAttempts attempts of
// DialTimeout each while ctx lasts. It returns the connection, how many
// attempts timed out before it and how long it took in all.
func (tp *Topo) dial(ctx context.Context) (c net.Conn, redials int, took time.Duration, err error) {
	t0 := time.Now()
	for a := range DialAttempts {
		err = netns.Do(tp.VM, func() error {
			var err error
			c, err = (&net.Dialer{Timeout: DialTimeout}).DialContext(ctx, "tcp4", fmt.Sprintf("%s:%d", netlab.ExtAddr, TCPPort))
			return err
		})
		if err == nil || !isTimeout(err) || ctx.Err() != nil || a == DialAttempts-1 {
			break
		}
		redials++
	}
	return c, redials, time.Since(t0), err
}

// RunTCP runs o.Flows bulk TCP flows for o.Dur, all opened by vm to ext
// (vm's FIP SNAT makes them the EIP's): in Download ext sends, in Upload
// vm. It counts each flow's bytes delivered between o.Warm and o.Dur, the
// retransmits of the sending namespace and, with o.PingEvery, pings ext →
// EIP from o.Warm to o.Dur.
func (tp *Topo) RunTCP(ctx context.Context, o TCPOptions) (TCPRun, error) {
	n, dir, warm, d := o.Flows, o.Dir, o.Warm, o.Dur
	if n <= 0 || d <= warm {
		return TCPRun{}, fmt.Errorf("qoslab: RunTCP: %d flows, window %v..%v: want flows ≥ 1 and Dur > Warm", n, warm, d)
	}
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second+time.Duration(n)*DialAttempts*DialTimeout)
	defer cancel()
	var ln net.Listener
	if err := netns.Do(tp.Ext, func() error {
		var err error
		ln, err = (&net.ListenConfig{}).Listen(ctx, "tcp4", fmt.Sprintf("0.0.0.0:%d", TCPPort))
		return err
	}); err != nil {
		return TCPRun{}, fmt.Errorf("qoslab: listen in %s: %w", tp.Ext, err)
	}
	defer ln.Close()
	counts := make([]atomic.Int64, n)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var conns []net.Conn
	var mu sync.Mutex
	track := func(c net.Conn) { mu.Lock(); conns = append(conns, c); mu.Unlock() }
	var stopOnce sync.Once
	halt := func() {
		stopOnce.Do(func() { close(stop) })
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}
	// pump moves bytes on c: writes zeros if send, else reads and counts.
	pump := func(c net.Conn, send bool, i int) {
		defer wg.Done()
		buf := make([]byte, 128<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
			if send {
				if _, err := c.Write(buf); err != nil && !isTimeout(err) {
					return
				}
				continue
			}
			k, err := c.Read(buf)
			counts[i].Add(int64(k))
			if err != nil && !isTimeout(err) {
				return
			}
		}
	}
	before, err := TCPStats(tp.Sender(dir))
	if err != nil {
		return TCPRun{}, err
	}
	acc := make(chan error, 1)
	go func() {
		for i := range n {
			c, err := ln.Accept()
			if err != nil {
				acc <- err
				return
			}
			// The first line is the flow's index.
			line, err := bufio.NewReader(io.LimitReader(c, 8)).ReadString('\n')
			idx, perr := strconv.Atoi(strings.TrimSpace(line))
			if err != nil || perr != nil || idx < 0 || idx >= n {
				c.Close()
				acc <- fmt.Errorf("qoslab: flow %d: bad hello %q: %v", i, line, err)
				return
			}
			track(c)
			wg.Add(1)
			go pump(c, dir == Download, idx)
		}
		acc <- nil
	}()
	var res TCPRun
	for i := range n {
		c, redials, took, err := tp.dial(ctx)
		res.Redials += redials
		res.SlowestDial = max(res.SlowestDial, took)
		if err != nil {
			ln.Close()
			halt()
			return TCPRun{}, fmt.Errorf("qoslab: dial %d from %s (%d attempt(s) of %v): %w", i, tp.VM, redials+1, DialTimeout, err)
		}
		// One byte at a time, so the accept side's reader takes no more.
		for _, b := range []byte(strconv.Itoa(i) + "\n") {
			if _, err := c.Write([]byte{b}); err != nil {
				c.Close()
				ln.Close()
				halt()
				return TCPRun{}, fmt.Errorf("qoslab: hello of flow %d: %w", i, err)
			}
		}
		track(c)
		wg.Add(1)
		go pump(c, dir == Upload, i)
	}
	if err := <-acc; err != nil {
		halt()
		return TCPRun{}, err
	}
	start := time.Now()
	sum := func() (s int64) {
		for i := range counts {
			s += counts[i].Load()
		}
		return s
	}
	pingDone := make(chan []time.Duration, 1)
	tick := time.NewTicker(10 * time.Millisecond)
	var atWarm []int64
	for now := range tick.C {
		el := now.Sub(start)
		res.Timeline = append(res.Timeline, [2]float64{el.Seconds(), float64(sum())})
		if atWarm == nil && el >= warm {
			atWarm = make([]int64, n)
			for i := range counts {
				atWarm[i] = counts[i].Load()
			}
			res.WindowD = -el
			if o.PingEvery > 0 {
				res.PingsSent = max(int((d-warm)/o.PingEvery), 1)
				go func() {
					p, _ := netlab.Ping(ctx, tp.Ext, EIP, res.PingsSent, o.PingEvery, 2*time.Second)
					pingDone <- p
				}()
			}
		}
		if el >= d {
			res.WindowD += el
			break
		}
	}
	tick.Stop()
	res.Window = make([]int64, n)
	res.Total = make([]int64, n)
	for i := range counts {
		res.Total[i] = counts[i].Load()
		res.Window[i] = res.Total[i] - atWarm[i]
	}
	halt()
	after, err := TCPStats(tp.Sender(dir))
	if err != nil {
		return TCPRun{}, err
	}
	if out := after.Out - before.Out; out > 0 {
		res.Segs = out
		res.Retrans = 100 * float64(after.Retrans-before.Retrans) / float64(out)
	}
	if o.PingEvery > 0 {
		res.Pings = <-pingDone
	}
	return res, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TCPCounters are a namespace's TCP segment counters.
type TCPCounters struct{ Out, Retrans uint64 }

// TCPStats reads Tcp OutSegs and RetransSegs of namespace ns
// (/proc/thread-self/net/snmp on a thread inside it).
func TCPStats(ns string) (TCPCounters, error) {
	var b []byte
	if err := netns.Do(ns, func() error {
		var err error
		b, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	}); err != nil {
		return TCPCounters{}, fmt.Errorf("qoslab: read snmp in %s: %w", ns, err)
	}
	return parseSNMP(ns, string(b))
}

// parseSNMP picks OutSegs and RetransSegs from the Tcp lines of
// /proc/net/snmp.
func parseSNMP(ns, snmp string) (TCPCounters, error) {
	var names, vals []string
	for _, line := range strings.Split(snmp, "\n") {
		if rest, ok := strings.CutPrefix(line, "Tcp: "); ok {
			if names == nil {
				names = strings.Fields(rest)
			} else {
				vals = strings.Fields(rest)
			}
		}
	}
	var c TCPCounters
	found := 0
	for i, n := range names {
		if i >= len(vals) {
			break
		}
		var dst *uint64
		switch n {
		case "OutSegs":
			dst = &c.Out
		case "RetransSegs":
			dst = &c.Retrans
		default:
			continue // others may be negative (MaxConn -1)
		}
		v, err := strconv.ParseUint(vals[i], 10, 64)
		if err != nil {
			return c, fmt.Errorf("qoslab: snmp of %s: Tcp %s %q: %w", ns, n, vals[i], err)
		}
		*dst = v
		found++
	}
	if found != 2 {
		return c, fmt.Errorf("qoslab: no Tcp OutSegs and RetransSegs in snmp of %s", ns)
	}
	return c, nil
}

// UDPRun is what RunUDP measured.
type UDPRun struct {
	Sent, Received int64
	RxMbps         float64 // delivered in the second half (NaN when the sender never reached it)
	// MaxGap is the longest time the sender went without sending: its
	// 1 ms pacing loop stalled by a busy machine. After a stall the
	// sender catches up in one burst, so the offered load was not the
	// steady rate asked for (see Steady).
	MaxGap time.Duration
}

// UDPMaxGap is the longest sender stall a steady UDP run allows.
const UDPMaxGap = 100 * time.Millisecond

// Steady reports whether the sender offered its rate without a stall
// longer than UDPMaxGap, so RxMbps and Loss measure the limit and not
// the machine. A run that is not steady is to be repeated.
func (r UDPRun) Steady() bool {
	return r.MaxGap <= UDPMaxGap && !math.IsNaN(r.RxMbps)
}

// Loss is the datagrams lost in % of those sent (NaN when none were).
func (r UDPRun) Loss() float64 {
	if r.Sent == 0 {
		return math.NaN()
	}
	return 100 * float64(r.Sent-r.Received) / float64(r.Sent)
}

// udpSendBuf is the UDP sender's socket buffer: more than a leaf queue of
// the device's txqueuelen (1,000 datagrams of ~2.3 kB of kernel memory).
const udpSendBuf = 8 << 20

// udpSender returns a send function for c that never waits. A datagram
// queued by a shaper in another namespace of this host is still charged to
// the sender's socket (veth does not orphan it), so a blocking write would
// wait for the gateway's queue to drain: back-pressure that a sender on
// another host never feels, and a stall of seconds in the pacing loop. So
// the socket gets a buffer larger than a shaper's queue (SO_SNDBUFFORCE as
// root; the system's limit otherwise), and a datagram the socket cannot
// take at once (EAGAIN) is dropped, as a NIC's full queue drops it.
func udpSender(c *net.UDPConn) (func([]byte), error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, udpSendBuf); errors.Is(serr, unix.EPERM) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, udpSendBuf)
		}
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, fmt.Errorf("send buffer: %w", serr)
	}
	return func(b []byte) {
		_ = rc.Write(func(fd uintptr) bool {
			_, _ = unix.Write(int(fd), b) // EAGAIN: dropped, not waited for
			return true
		})
	}, nil
}

// RunUDP sends 1,200-byte datagrams at mbps for d in dir (Download: ext
// to the EIP, which the FIP forwards to vm; Upload: vm to ext) and counts
// what arrives.
func (tp *Topo) RunUDP(ctx context.Context, dir Dir, mbps float64, d time.Duration) (UDPRun, error) {
	const size = 1200
	rxNS, txNS, dst := tp.VM, tp.Ext, netip.AddrPortFrom(EIP, UDPPort)
	if dir == Upload {
		rxNS, txNS, dst = tp.Ext, tp.VM, netip.AddrPortFrom(netlab.ExtAddr, UDPPort)
	}
	var pc net.PacketConn
	if err := netns.Do(rxNS, func() error {
		var err error
		pc, err = (&net.ListenConfig{}).ListenPacket(ctx, "udp4", fmt.Sprintf("0.0.0.0:%d", UDPPort))
		return err
	}); err != nil {
		return UDPRun{}, fmt.Errorf("qoslab: listen udp in %s: %w", rxNS, err)
	}
	defer pc.Close()
	if uc, ok := pc.(*net.UDPConn); ok {
		_ = uc.SetReadBuffer(8 << 20)
	}
	var got, gotHalf atomic.Int64
	var half atomic.Bool
	rxDone := make(chan struct{})
	go func() {
		defer close(rxDone)
		buf := make([]byte, 2048)
		for {
			_, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			got.Add(1)
			if half.Load() {
				gotHalf.Add(1)
			}
		}
	}()
	var c net.Conn
	if err := netns.Do(txNS, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "udp4", dst.String())
		return err
	}); err != nil {
		pc.Close()
		<-rxDone
		return UDPRun{}, fmt.Errorf("qoslab: dial udp from %s: %w", txNS, err)
	}
	defer c.Close()
	uc, ok := c.(*net.UDPConn)
	if !ok {
		return UDPRun{}, fmt.Errorf("qoslab: dial udp from %s: a %T, not a UDP socket", txNS, c)
	}
	send, err := udpSender(uc)
	if err != nil {
		return UDPRun{}, fmt.Errorf("qoslab: udp sender in %s: %w", txNS, err)
	}
	pps := mbps * 1e6 / 8 / size
	buf := make([]byte, size)
	var sent int64
	start := time.Now()
	var halfAt time.Time
	var maxGap, last time.Duration
	for {
		el := time.Since(start)
		maxGap, last = max(maxGap, el-last), el
		if el >= d {
			break
		}
		if halfAt.IsZero() && el >= d/2 {
			halfAt = time.Now()
			half.Store(true)
		}
		for owed := int64(el.Seconds()*pps) - sent; owed > 0; owed-- {
			send(buf) // a local drop is a loss too
			sent++
		}
		time.Sleep(time.Millisecond)
	}
	end := time.Now()
	half.Store(false)
	time.Sleep(300 * time.Millisecond) // what is queued arrives
	pc.Close()
	<-rxDone
	r := UDPRun{Sent: sent, Received: got.Load(), MaxGap: maxGap, RxMbps: math.NaN()}
	if !halfAt.IsZero() {
		r.RxMbps = float64(gotHalf.Load()) * size * 8 / end.Sub(halfAt).Seconds() / 1e6
	}
	return r, nil
}
