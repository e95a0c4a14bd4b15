package shape

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
	"testing"
	"time"

	"github.com/natgw/natgw/internal/delayline"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftables"
)

// topo is the QoS lab: ext ── [delay line] ── net1 gw eth0 ── vm, with the
// nftables data plane in gw holding one EIP and a FIP of it to vm.
//
//	ext (eth0 192.0.2.1) ─┬─ veth ─────────────────────── (net1 192.0.2.254, EIP 192.0.2.10) gw
//	                      └─ veth ─ (la) mid (lb) ─ veth ─┘   (with an added RTT)
//	gw (eth0 198.51.100.1) ── veth ── (eth0 198.51.100.10, default via .1) vm
type topo struct {
	ext, gw, vm string
	cfg         nat.Config
	dp          nat.Dataplane
	line        *delayline.Line
}

var (
	labEIP = netlab.EIP(0)
	labVM  = netlab.VMAddr(0)
)

// newTopo builds the lab with rtt added between ext and gw (0: a plain veth).
func newTopo(t *testing.T, ctx context.Context, rtt time.Duration) *topo {
	t.Helper()
	lab := netlab.ForTest(t)
	var err error
	mk := func(role string) string {
		if err != nil {
			return ""
		}
		var n string
		n, err = lab.NS(role)
		return n
	}
	tp := &topo{ext: mk("ext"), gw: mk("gw"), vm: mk("vm")}
	if err != nil {
		t.Fatal(err)
	}
	tp.cfg = nat.Config{NetNS: tp.gw, ExternalInterface: nat.DefaultExternalInterface, InternalInterface: nat.DefaultInternalInterface}
	net1 := netlab.End{NS: tp.gw, Name: "net1", Addrs: []netip.Prefix{netip.PrefixFrom(netlab.GWExtAddr, 24)}}
	extEnd := netlab.End{NS: tp.ext, Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(netlab.ExtAddr, 24)}}
	steps := []func() error{
		func() error {
			return netlab.Veth(netlab.End{NS: tp.gw, Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(netlab.GWVPCAddr, 24)}},
				netlab.End{NS: tp.vm, Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(labVM, 24)}})
		},
		func() error {
			return netlab.AddRoute(tp.vm, netip.MustParsePrefix("0.0.0.0/0"), netlab.GWVPCAddr, "eth0")
		},
		func() error { return netlab.Sysctl(tp.gw, "net.ipv4.ip_forward", "1") },
	}
	if rtt == 0 {
		steps = append(steps, func() error { return netlab.Veth(net1, extEnd) })
	} else {
		mid := mk("mid")
		if err != nil {
			t.Fatal(err)
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
			t.Fatal(err)
		}
	}
	if tp.line != nil {
		t.Cleanup(func() { tp.line.Close() })
	}
	dp, err := nftables.New(ctx, tp.cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	tp.dp = dp
	tp.police(ctx, t, nil)
	if err := dp.Apply(ctx, nat.Object{UID: "fip-0", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: labEIP, InternalIP: labVM}}); err != nil {
		t.Fatal(err)
	}
	// Warm up neighbors through the whole path.
	if _, err := netlab.Ping(ctx, tp.ext, labEIP, 1, 0, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	return tp
}

// police sets the EIP's policer (nil: none).
func (tp *topo) police(ctx context.Context, t *testing.T, q *nat.QoS) {
	t.Helper()
	o := nat.Object{UID: "eip-0", Kind: nat.KindEIP, EIP: &nat.EIP{Address: labEIP, PrefixLen: 24, QoS: q}}
	if err := tp.dp.Apply(ctx, o); err != nil {
		t.Fatalf("police %+v: %v", q, err)
	}
}

// Ports of the lab's traffic.
const (
	tcpPort = 5001
	udpPort = 5002
)

// direction of a measurement, from the VPC host's side.
type flowDir string

const (
	download flowDir = "download" // to the EIP: ext sends, vm receives
	upload   flowDir = "upload"   // from the EIP: vm sends, ext receives
)

// sender returns the namespace that sends in dir.
func (tp *topo) sender(dir flowDir) string {
	if dir == download {
		return tp.ext
	}
	return tp.vm
}

// tcpRun is what runTCP measured.
type tcpRun struct {
	window   []int64 // bytes each flow delivered in the window
	windowD  time.Duration
	total    []int64      // bytes each flow delivered in all
	timeline [][2]float64 // (seconds since start, bytes of all flows), every 10 ms
	retrans  float64      // retransmitted segments, % of segments sent
	pings    []time.Duration
}

// goodput returns the flows' total in the window in Mbit/s.
func (r tcpRun) goodput() float64 {
	var s int64
	for _, b := range r.window {
		s += b
	}
	return float64(s) * 8 / r.windowD.Seconds() / 1e6
}

// jain is Jain's fairness index of the flows' window bytes (1: equal).
func (r tcpRun) jain() float64 {
	var s, s2 float64
	for _, b := range r.window {
		s += float64(b)
		s2 += float64(b) * float64(b)
	}
	if s2 == 0 {
		return 0
	}
	return s * s / (float64(len(r.window)) * s2)
}

// runTCP runs n bulk TCP flows for d, all opened by vm to ext (vm's FIP
// SNAT makes them the EIP's): in dir download ext sends, in upload vm.
// It counts each flow's bytes delivered between warm and d, the
// retransmits of the sending namespace and, when ping is set, pings ext →
// EIP every 100 ms from warm to d.
func (tp *topo) runTCP(ctx context.Context, dir flowDir, n int, warm, d time.Duration, ping bool) (tcpRun, error) {
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	var ln net.Listener
	if err := netns.Do(tp.ext, func() error {
		var err error
		ln, err = (&net.ListenConfig{}).Listen(ctx, "tcp4", fmt.Sprintf("0.0.0.0:%d", tcpPort))
		return err
	}); err != nil {
		return tcpRun{}, fmt.Errorf("listen in %s: %w", tp.ext, err)
	}
	defer ln.Close()
	counts := make([]atomic.Int64, n)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var conns []net.Conn
	var mu sync.Mutex
	track := func(c net.Conn) { mu.Lock(); conns = append(conns, c); mu.Unlock() }
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
	before, err := tcpStats(tp.sender(dir))
	if err != nil {
		return tcpRun{}, err
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
				acc <- fmt.Errorf("flow %d: bad hello %q: %v", i, line, err)
				return
			}
			track(c)
			wg.Add(1)
			go pump(c, dir == download, idx)
		}
		acc <- nil
	}()
	for i := range n {
		var c net.Conn
		if err := netns.Do(tp.vm, func() error {
			var err error
			c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp4", fmt.Sprintf("%s:%d", netlab.ExtAddr, tcpPort))
			return err
		}); err != nil {
			close(stop)
			return tcpRun{}, fmt.Errorf("dial %d from %s: %w", i, tp.vm, err)
		}
		// One byte at a time, so the accept side's reader takes no more.
		for _, b := range []byte(strconv.Itoa(i) + "\n") {
			if _, err := c.Write([]byte{b}); err != nil {
				close(stop)
				return tcpRun{}, err
			}
		}
		track(c)
		wg.Add(1)
		go pump(c, dir == upload, i)
	}
	if err := <-acc; err != nil {
		close(stop)
		return tcpRun{}, err
	}
	start := time.Now()
	var res tcpRun
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
		res.timeline = append(res.timeline, [2]float64{el.Seconds(), float64(sum())})
		if atWarm == nil && el >= warm {
			atWarm = make([]int64, n)
			for i := range counts {
				atWarm[i] = counts[i].Load()
			}
			res.windowD = -el
			if ping {
				go func() {
					cnt := int((d - warm) / (100 * time.Millisecond))
					p, _ := netlab.Ping(ctx, tp.ext, labEIP, max(cnt, 1), 100*time.Millisecond, 2*time.Second)
					pingDone <- p
				}()
			}
		}
		if el >= d {
			res.windowD += el
			break
		}
	}
	tick.Stop()
	res.window = make([]int64, n)
	res.total = make([]int64, n)
	for i := range counts {
		res.total[i] = counts[i].Load()
		res.window[i] = res.total[i] - atWarm[i]
	}
	close(stop)
	mu.Lock()
	for _, c := range conns {
		c.Close()
	}
	mu.Unlock()
	wg.Wait()
	after, err := tcpStats(tp.sender(dir))
	if err != nil {
		return tcpRun{}, err
	}
	if out := after.out - before.out; out > 0 {
		res.retrans = 100 * float64(after.retrans-before.retrans) / float64(out)
	}
	if ping {
		res.pings = <-pingDone
	}
	return res, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

type tcpCounters struct{ out, retrans uint64 }

// tcpStats reads Tcp OutSegs and RetransSegs of namespace ns
// (/proc/thread-self/net/snmp on a thread inside it).
func tcpStats(ns string) (tcpCounters, error) {
	var b []byte
	if err := netns.Do(ns, func() error {
		var err error
		b, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	}); err != nil {
		return tcpCounters{}, fmt.Errorf("read snmp in %s: %w", ns, err)
	}
	var names, vals []string
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Tcp: "); ok {
			if names == nil {
				names = strings.Fields(rest)
			} else {
				vals = strings.Fields(rest)
			}
		}
	}
	var c tcpCounters
	for i, n := range names {
		if i >= len(vals) {
			break
		}
		v, _ := strconv.ParseUint(vals[i], 10, 64)
		switch n {
		case "OutSegs":
			c.out = v
		case "RetransSegs":
			c.retrans = v
		}
	}
	if names == nil {
		return c, fmt.Errorf("no Tcp counters in snmp of %s", ns)
	}
	return c, nil
}

// udpRun is what runUDP measured.
type udpRun struct {
	sent, received int64
	rxMbps         float64 // delivered in the second half
}

func (r udpRun) loss() float64 {
	if r.sent == 0 {
		return math.NaN()
	}
	return 100 * float64(r.sent-r.received) / float64(r.sent)
}

// runUDP sends 1,200-byte datagrams at mbps for d in dir (download: ext
// to the EIP, which the FIP forwards to vm; upload: vm to ext) and counts
// what arrives.
func (tp *topo) runUDP(ctx context.Context, dir flowDir, mbps float64, d time.Duration) (udpRun, error) {
	const size = 1200
	rxNS, txNS, dst := tp.vm, tp.ext, netip.AddrPortFrom(labEIP, udpPort)
	if dir == upload {
		rxNS, txNS, dst = tp.ext, tp.vm, netip.AddrPortFrom(netlab.ExtAddr, udpPort)
	}
	var pc net.PacketConn
	if err := netns.Do(rxNS, func() error {
		var err error
		pc, err = (&net.ListenConfig{}).ListenPacket(ctx, "udp4", fmt.Sprintf("0.0.0.0:%d", udpPort))
		return err
	}); err != nil {
		return udpRun{}, fmt.Errorf("listen udp in %s: %w", rxNS, err)
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
		return udpRun{}, fmt.Errorf("dial udp from %s: %w", txNS, err)
	}
	defer c.Close()
	pps := mbps * 1e6 / 8 / size
	buf := make([]byte, size)
	var sent int64
	start := time.Now()
	var halfAt time.Time
	for {
		el := time.Since(start)
		if el >= d {
			break
		}
		if halfAt.IsZero() && el >= d/2 {
			halfAt = time.Now()
			half.Store(true)
		}
		for owed := int64(el.Seconds()*pps) - sent; owed > 0; owed-- {
			if _, err := c.Write(buf); err == nil {
				sent++
			} else {
				sent++ // a local drop is a loss too
			}
		}
		time.Sleep(time.Millisecond)
	}
	end := time.Now()
	half.Store(false)
	time.Sleep(300 * time.Millisecond) // what is queued arrives
	pc.Close()
	<-rxDone
	r := udpRun{sent: sent, received: got.Load()}
	r.rxMbps = float64(gotHalf.Load()) * size * 8 / end.Sub(halfAt).Seconds() / 1e6
	return r, nil
}
