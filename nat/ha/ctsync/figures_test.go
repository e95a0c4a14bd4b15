package ctsync

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat/netns"
)

// synth returns the i-th synthetic DNATed TCP entry: 192.0.2.0/24 clients
// to 192.0.2.11:8080, translated to 198.51.100.x:7001.
func synth(i int) Entry {
	src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), uint16(1024+i%60000))
	return Entry{
		Op: OpUpsert, Proto: 6, OrigSrc: src, OrigDst: ap("192.0.2.11:8080"),
		ReplySrc: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(10 + i%200)}), 7001), ReplyDst: src,
		Status: 1<<1 | 1<<2 | 1<<3 | 1<<5, Timeout: 600, Mark: 0xc000020b, TCPState: 3,
	}
}

type repLab struct {
	act, sb  *netns.NS
	w        *Writer // writes the load into act (the kernel reports it as events)
	recv     *Receiver
	sender   *Sender
	stopSend context.CancelFunc
	sendDone chan struct{}
}

// newRepLab makes an active and a standby namespace joined by a veth
// (10.9.0.1 — 10.9.0.2) with a Receiver in the standby.
func newRepLab(t *testing.T, ctx context.Context) *repLab {
	lab := netlab.ForTest(t)
	act, err := lab.NS("act")
	if err != nil {
		t.Fatal(err)
	}
	sb, err := lab.NS("sb")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlab.Veth(netlab.End{NS: act, Name: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.1/24")}},
		netlab.End{NS: sb, Name: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")}}); err != nil {
		t.Fatal(err)
	}
	r := &repLab{}
	if r.act, err = netns.Open(act); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.act.Close() })
	if r.sb, err = netns.Open(sb); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.sb.Close() })
	if r.w, err = NewWriter(r.act); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.w.Close() })
	if r.recv, err = NewReceiver(r.sb, logr.Discard()); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := r.sb.Do(func() error {
		var err error
		ln, err = net.Listen("tcp4", "10.9.0.2:7400")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	go r.recv.Serve(ctx, ln)
	return r
}

func (r *repLab) startSender(ctx context.Context) {
	r.sender = &Sender{Peer: "10.9.0.2:7400", NS: r.act, Log: logr.Discard()}
	sctx, cancel := context.WithCancel(ctx)
	r.stopSend, r.sendDone = cancel, make(chan struct{})
	go func() { defer close(r.sendDone); _ = r.sender.Run(sctx) }()
}

func (r *repLab) stopSender() {
	r.stopSend()
	<-r.sendDone
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !ok() {
		if time.Since(start) > within {
			t.Fatalf("%s: not after %s", what, within)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

func pctl(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}

// TestReplicationFigures measures the replication stream with a synthetic
// load: entries created (with their NAT bindings) in the active namespace
// through ctnetlink, which the kernel reports as events like any new
// connection. NATGW_CTSYNC_FIGURES=1 runs it; it prints lag percentiles at
// paced rates, burst throughput and the catch-up time of a full dump.
func TestReplicationFigures(t *testing.T) {
	if os.Getenv("NATGW_CTSYNC_FIGURES") == "" {
		t.Skip("measurement: set NATGW_CTSYNC_FIGURES=1")
	}
	total := 100000
	if n, _ := strconv.Atoi(os.Getenv("NATGW_CTSYNC_FLOWS")); n > 0 {
		total = n
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Paced new flows: lag from the kernel's event to the standby's
	// acknowledged write.
	for _, rate := range []int{10000, 50000} {
		r := newRepLab(t, ctx)
		r.startSender(ctx)
		waitFor(t, "first sync", 5*time.Second, r.recv.Synced)
		const tick = 10 * time.Millisecond
		per := rate / 100
		n := rate * 2 // two seconds
		cpu0, t0 := cpuTime(), time.Now()
		next := time.Now()
		for i := 0; i < n; i += per {
			batch := make([]Entry, 0, per)
			for j := i; j < i+per && j < n; j++ {
				batch = append(batch, synth(j))
			}
			if failed, err := r.w.Apply(ctx, batch); err != nil || failed != 0 {
				t.Fatalf("load: %d failed: %v", failed, err)
			}
			next = next.Add(tick)
			time.Sleep(time.Until(next))
		}
		elapsed := time.Since(t0)
		waitFor(t, "standby caught up", 30*time.Second, func() bool { return r.recv.Stats().Applied >= int64(n) })
		cpu := cpuTime() - cpu0
		st := r.sender.Stats()
		fmt.Printf("ctsync paced %6d new flows/s for %s: offered %.0f/s, lag p50=%s p99=%s max=%s (%d batches), overruns=%d, CPU (load+sender+receiver, one process) %.0f%% of one core\n",
			rate, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), pctl(st.LagSamples, 50).Round(10*time.Microsecond), pctl(st.LagSamples, 99).Round(10*time.Microsecond), pctl(st.LagSamples, 100).Round(10*time.Microsecond), len(st.LagSamples), st.Overruns, 100*cpu.Seconds()/time.Since(t0).Seconds())
		r.stopSender()
	}

	// Burst and catch-up with total concurrent flows.
	r := newRepLab(t, ctx)
	r.startSender(ctx)
	waitFor(t, "first sync", 5*time.Second, r.recv.Synced)
	batch := make([]Entry, 0, total)
	for i := range total {
		batch = append(batch, synth(i))
	}
	t0 := time.Now()
	if failed, err := r.w.Apply(ctx, batch); err != nil || failed != 0 {
		t.Fatalf("load: %d failed: %v", failed, err)
	}
	loaded := time.Since(t0)
	d := waitFor(t, "standby caught up", 60*time.Second, func() bool { return r.recv.Stats().Applied >= int64(total) })
	st := r.sender.Stats()
	rs := r.recv.Stats()
	fmt.Printf("ctsync burst of %d new flows (created in %s): standby has them all after %s: %.0f entries/s (events sent %d, overruns %d → full dumps; receiver applied %d failed %d)\n",
		total, loaded.Round(time.Millisecond), (loaded + d).Round(time.Millisecond), float64(total)/(loaded+d).Seconds(), st.Sent, st.Overruns, rs.Applied, rs.Failed)

	// A (re)connecting standby catches up through a full dump.
	r.stopSender()
	before := r.recv.Stats().Dumps
	t0 = time.Now()
	r.startSender(ctx)
	d = waitFor(t, "full dump", 60*time.Second, func() bool { return r.recv.Stats().Dumps > before })
	fmt.Printf("ctsync full dump of %d concurrent flows to a reconnecting standby: %s (%.0f entries/s)\n", total, d.Round(time.Millisecond), float64(total)/d.Seconds())
	r.stopSender()
	_ = t0
}
