package ctsync

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/procfs"
	"github.com/natgw/natgw/internal/testsummary"
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

// loadBurst writes total synthetic entries into the active namespace in one
// Apply and returns how long that took.
func loadBurst(t *testing.T, ctx context.Context, w *Writer, total int) time.Duration {
	t.Helper()
	batch := make([]Entry, 0, total)
	for i := range total {
		batch = append(batch, synth(i))
	}
	t0 := time.Now()
	if failed, err := w.Apply(ctx, batch); err != nil || failed != 0 {
		t.Fatalf("load: %d failed: %v", failed, err)
	}
	return time.Since(t0)
}

type repLab struct {
	act, sb  *netns.NS
	w        *Writer // writes the load into act (the kernel reports it as events)
	recv     *Receiver
	sender   *Sender
	stopSend context.CancelFunc
	sendDone chan struct{}
	refresh  time.Duration // the Sender's Refresh (0: its default)
}

// newRepLab makes an active and a standby namespace joined by a veth
// (10.9.0.1 — 10.9.0.2) with a Receiver in the standby.
func newRepLab(t *testing.T, ctx context.Context) *repLab {
	lab := netlab.ForTest(t)
	act, err := lab.NS("act")
	if err != nil {
		t.Fatal(err)
	}
	return newRepLabOn(t, ctx, lab, act, "eth0")
}

// newRepLabOn is newRepLab with the active namespace act given (a
// gateway's, say), its end of the veth named dev.
func newRepLabOn(t *testing.T, ctx context.Context, lab *netlab.Lab, act, dev string) *repLab {
	r := newRepNS(t, lab, act, dev)
	var err error
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

// newRepNS is newRepLabOn without the Receiver: the namespaces, the veth
// and the Writer of the load.
func newRepNS(t *testing.T, lab *netlab.Lab, act, dev string) *repLab {
	sb, err := lab.NS("sb")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlab.Veth(netlab.End{NS: act, Name: dev, Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.1/24")}},
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
	return r
}

func (r *repLab) startSender(ctx context.Context) {
	r.sender = &Sender{Peer: "10.9.0.2:7400", NS: r.act, Refresh: r.refresh, Log: logr.Discard()}
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

// pacedLag creates rate new NATed entries per second for secs seconds in
// the active namespace (10 ms ticks) and polls the standby's entry count
// every millisecond: the lag of entry k is when the standby first counted
// k entries (above base) minus when the k-th was created. It measures any
// replicator (ctsync, conntrackd) the same way, from the kernels' view.
func pacedLag(t *testing.T, ctx context.Context, w *Writer, sb *netns.NS, first, rate, secs int) (lags []time.Duration, offered float64, caughtUp bool) {
	c, err := ct.Dial(&netlink.Config{NetNS: sb.Fd()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	count := func() int {
		st, err := c.StatsGlobal()
		if err != nil {
			t.Fatal(err)
		}
		return int(st.Entries)
	}
	base := count()
	per, n := rate/100, rate*secs
	created := make([]time.Time, 0, n/per+1) // created[i]: (i+1)*per entries exist
	seen := make([]time.Time, 0, n/per+1)
	done := make(chan struct{})
	pollDone := make(chan struct{})
	go func() {
		defer close(pollDone)
		for {
			k := count() - base
			now := time.Now()
			for len(seen) < k/per {
				seen = append(seen, now)
			}
			if len(seen) >= n/per {
				return
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	t0 := time.Now()
	next := t0
	for i := 0; i < n; i += per {
		batch := make([]Entry, 0, per)
		for j := i; j < i+per; j++ {
			batch = append(batch, synth(first+j))
		}
		if failed, err := w.Apply(ctx, batch); err != nil || failed != 0 {
			t.Fatalf("load: %d failed: %v", failed, err)
		}
		created = append(created, time.Now())
		next = next.Add(10 * time.Millisecond)
		time.Sleep(time.Until(next))
	}
	offered = float64(n) / time.Since(t0).Seconds()
	select {
	case <-pollDone:
	case <-time.After(30 * time.Second):
	}
	close(done)
	<-pollDone
	for i := range min(len(seen), len(created)) {
		lags = append(lags, max(seen[i].Sub(created[i]), 0))
	}
	return lags, offered, len(seen) >= n/per
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
	total := figureFlows()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Paced new flows: lag from creation on the active to the entry in
	// the standby's table. The sender and the receiver are processes of
	// their own in their namespaces (startRole), so that the CPU of the
	// active side, of the standby side and of the load generator (this
	// process) are measured apart, as conntrackd's.
	for _, rate := range figureRates(t) {
		lab := netlab.ForTest(t)
		act, err := lab.NS("act")
		if err != nil {
			t.Fatal(err)
		}
		r := newRepNS(t, lab, act, "eth0")
		recv := startRole(t, ctx, r.sb, "receiver", "10.9.0.2:7400")
		send := startRole(t, ctx, r.act, "sender", "10.9.0.2:7400")
		recv.waitSynced(t, 5*time.Second)
		cpu0, actCPU0, sbCPU0, t0 := cpuTime(), procCPU(t, send.pid), procCPU(t, recv.pid), time.Now()
		lags, offered, ok := pacedLag(t, ctx, r.w, r.sb, 0, rate, 2)
		wall := time.Since(t0) // all three over pacedLag alone, as conntrackd's
		pct := func(d time.Duration) float64 { return 100 * d.Seconds() / wall.Seconds() }
		load, actCPU, sbCPU := pct(cpuTime()-cpu0), pct(procCPU(t, send.pid)-actCPU0), pct(procCPU(t, recv.pid)-sbCPU0)
		var st SenderStats
		send.stop(t, &st)
		natOK, all := natKept(t, r.sb)
		fmt.Printf("ctsync standby entries with the DNAT binding and NAT status: %d of %d\n", natOK, all)
		fmt.Printf("ctsync     paced %5d new flows/s (offered %.0f/s): lag p50=%s p99=%s max=%s caught up=%t; sender-measured (event→ack) p50=%s p99=%s; overruns=%d; CPU of the load generator %.0f%% of one core; CPU ctsync active %.0f%% standby %.0f%% of one core\n",
			rate, offered, testsummary.Percentile(lags, 50).Round(100*time.Microsecond), testsummary.Percentile(lags, 99).Round(100*time.Microsecond), testsummary.Percentile(lags, 100).Round(100*time.Microsecond), ok,
			testsummary.Percentile(st.LagSamples, 50).Round(100*time.Microsecond), testsummary.Percentile(st.LagSamples, 99).Round(100*time.Microsecond), st.Overruns, load, actCPU, sbCPU)
		var rst ReceiverStats
		recv.stop(t, &rst)
	}

	// Burst and catch-up with total concurrent flows.
	r := newRepLab(t, ctx)
	r.startSender(ctx)
	waitFor(t, "first sync", 5*time.Second, r.recv.Synced)
	loaded := loadBurst(t, ctx, r.w, total)
	d := waitFor(t, "standby caught up", 60*time.Second, func() bool { return r.recv.Stats().Applied >= int64(total) })
	st := r.sender.Stats()
	rs := r.recv.Stats()
	fmt.Printf("ctsync burst of %d new flows (created in %s): standby has them all after %s: %.0f entries/s (events sent %d, overruns %d → full dumps; receiver applied %d failed %d)\n",
		total, loaded.Round(time.Millisecond), (loaded + d).Round(time.Millisecond), float64(total)/(loaded+d).Seconds(), st.Sent, st.Overruns, rs.Applied, rs.Failed)

	// A (re)connecting standby catches up through a full dump.
	r.stopSender()
	before := r.recv.Stats().Dumps
	r.startSender(ctx)
	d = waitFor(t, "full dump", 60*time.Second, func() bool { return r.recv.Stats().Dumps > before })
	fmt.Printf("ctsync full dump of %d concurrent flows to a reconnecting standby: %s (%.0f entries/s)\n", total, d.Round(time.Millisecond), float64(total)/d.Seconds())
	r.stopSender()
}

// conntrackdConf is a conntrackd configuration for one side of a pair:
// FTFW over UDP on eth0, committing what it receives straight into the
// kernel (no external cache), as keepalived setups run it.
const conntrackdConf = `Sync {
	Mode FTFW {
		DisableExternalCache On
	}
	UDP {
		IPv4_address %s
		IPv4_Destination_Address %s
		Port 3780
		Interface eth0
		SndSocketBuffer 8388608
		RcvSocketBuffer 8388608
		Checksum on
	}
}
General {
	HashSize 65536
	HashLimit 524288
	LogFile %s
	Syslog off
	LockFile %s
	UNIX {
		Path %s
	}
	NetlinkBufferSize 8388608
	NetlinkBufferSizeMaxGrowth 16777216
}
`

// TestConntrackdFigures measures conntrackd (conntrack-tools) on the same
// synthetic load and with the same kernel-view lag as
// TestReplicationFigures, for the comparison in nat/ha/README.md.
// NATGW_CTSYNC_FIGURES=1 runs it when conntrackd is installed.
func TestConntrackdFigures(t *testing.T) {
	if os.Getenv("NATGW_CTSYNC_FIGURES") == "" {
		t.Skip("measurement: set NATGW_CTSYNC_FIGURES=1")
	}
	bin, err := exec.LookPath("conntrackd")
	if err != nil {
		t.Skip("conntrackd not installed (apt conntrack-tools / conntrackd)")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, rate := range figureRates(t) {
		r := newRepLab(t, ctx) // its Receiver stays idle: no Sender runs
		dir := t.TempDir()
		act := startConntrackd(t, ctx, bin, dir, "act", r.act, "10.9.0.1", "10.9.0.2")
		sb := startConntrackd(t, ctx, bin, dir, "sb", r.sb, "10.9.0.2", "10.9.0.1")
		time.Sleep(200 * time.Millisecond)
		cpu0, actCPU0, sbCPU0 := cpuTime(), procCPU(t, act.Process.Pid), procCPU(t, sb.Process.Pid)
		t0 := time.Now()
		lags, offered, ok := pacedLag(t, ctx, r.w, r.sb, 0, rate, 2)
		wall := time.Since(t0)
		pct := func(d time.Duration) float64 { return 100 * d.Seconds() / wall.Seconds() }
		actCPU, sbCPU := pct(procCPU(t, act.Process.Pid)-actCPU0), pct(procCPU(t, sb.Process.Pid)-sbCPU0)
		natOK, all := natKept(t, r.sb)
		fmt.Printf("conntrackd standby entries with the DNAT binding and NAT status: %d of %d\n", natOK, all)
		fmt.Printf("conntrackd paced %5d new flows/s (offered %.0f/s): lag p50=%s p99=%s max=%s caught up=%t (%d of %d steps); CPU of the load generator %.0f%% of one core; CPU conntrackd active %.0f%% standby %.0f%% of one core\n",
			rate, offered, testsummary.Percentile(lags, 50).Round(100*time.Microsecond), testsummary.Percentile(lags, 99).Round(100*time.Microsecond), testsummary.Percentile(lags, 100).Round(100*time.Microsecond), ok, len(lags), rate*2/(rate/100), pct(cpuTime()-cpu0), actCPU, sbCPU)
	}

	// Burst and catch-up with total concurrent flows, as ctsync's.
	total := figureFlows()
	r := newRepLab(t, ctx)
	dir := t.TempDir()
	startConntrackd(t, ctx, bin, dir, "act", r.act, "10.9.0.1", "10.9.0.2")
	sb := startConntrackd(t, ctx, bin, dir, "sb", r.sb, "10.9.0.2", "10.9.0.1")
	time.Sleep(200 * time.Millisecond)
	count := entryCounter(t, r.sb)
	base := count()
	loaded := loadBurst(t, ctx, r.w, total)
	if d, ok := waitCount(count, base+total, 60*time.Second); ok {
		fmt.Printf("conntrackd burst of %d new flows (created in %s): standby has them all after %s: %.0f entries/s\n",
			total, loaded.Round(time.Millisecond), (loaded + d).Round(time.Millisecond), float64(total)/(loaded+d).Seconds())
	} else {
		fmt.Printf("conntrackd burst of %d new flows (created in %s): standby has %d of them after %s: not caught up\n",
			total, loaded.Round(time.Millisecond), count()-base, (loaded + d).Round(time.Millisecond))
	}

	// A restarted standby catches up: its conntrackd stopped, its table
	// flushed (no conntrackd runs there, so the flush is not replicated),
	// a new conntrackd started and a resync requested (conntrackd -n), the
	// way a keepalived notify script brings a backup up to date.
	_ = sb.Process.Kill()
	_ = sb.Wait()
	if err := flushTable(r.sb); err != nil {
		t.Fatal(err)
	}
	base = count()
	t0 := time.Now()
	startConntrackd(t, ctx, bin, dir, "sb2", r.sb, "10.9.0.2", "10.9.0.1")
	if out, err := netlab.Command(ctx, r.sb.Ref(), bin, "-C", filepath.Join(dir, "sb2.conf"), "-n").CombinedOutput(); err != nil {
		t.Fatalf("conntrackd -n: %v: %s", err, out)
	}
	if d, ok := waitCount(count, base+total, 60*time.Second); ok {
		d = time.Since(t0)
		fmt.Printf("conntrackd full dump of %d concurrent flows to a reconnecting standby: %s (%.0f entries/s; conntrackd restarted on a flushed standby, resync requested with -n)\n", total, d.Round(time.Millisecond), float64(total)/d.Seconds())
	} else {
		fmt.Printf("conntrackd full dump of %d concurrent flows to a reconnecting standby: has %d of them after %s: not caught up\n", total, count()-base, time.Since(t0).Round(time.Millisecond))
	}
}

// figureRates are the paced rates of the figure tests: 10k and 50k new
// flows/s, or NATGW_CTSYNC_RATES (comma-separated, for a quick run).
func figureRates(t *testing.T) []int {
	v := os.Getenv("NATGW_CTSYNC_RATES")
	if v == "" {
		return []int{10000, 50000}
	}
	var rates []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 100 {
			t.Fatalf("NATGW_CTSYNC_RATES=%q: %q is not a rate ≥ 100 new flows/s", v, f)
		}
		rates = append(rates, n)
	}
	return rates
}

// figureFlows is the burst's number of concurrent flows: 100k, or
// NATGW_CTSYNC_FLOWS.
func figureFlows() int {
	if n, _ := strconv.Atoi(os.Getenv("NATGW_CTSYNC_FLOWS")); n > 0 {
		return n
	}
	return 100000
}

// startConntrackd starts conntrackd in ns with the configuration
// conntrackdConf (files in dir named after name) and waits for its socket.
func startConntrackd(t *testing.T, ctx context.Context, bin, dir, name string, ns *netns.NS, own, peer string) *exec.Cmd {
	t.Helper()
	conf := filepath.Join(dir, name+".conf")
	body := fmt.Sprintf(conntrackdConf, own, peer, filepath.Join(dir, name+".log"), filepath.Join(dir, name+".lock"), filepath.Join(dir, name+".sock"))
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := netlab.Command(ctx, ns.Ref(), bin, "-C", conf)
	if err := cmd.Start(); err != nil {
		t.Fatalf("conntrackd in %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if b, _ := os.ReadFile(filepath.Join(dir, name+".log")); testing.Verbose() {
			t.Logf("conntrackd %s log:\n%s", name, b)
		}
	})
	sock := filepath.Join(dir, name+".sock")
	waitFor(t, "conntrackd socket "+sock, 5*time.Second, func() bool { _, err := os.Stat(sock); return err == nil })
	return cmd
}

// procCPU is the user+system CPU time process pid has used (/proc/PID/stat,
// clock ticks of 10 ms).
func procCPU(t *testing.T, pid int) time.Duration {
	d, err := procfs.CPUTime(pid)
	if err != nil {
		t.Fatalf("CPU of process %d: %v", pid, err)
	}
	return d
}

// entryCounter returns a function counting the entries of ns's conntrack
// table.
func entryCounter(t *testing.T, ns *netns.NS) func() int {
	c, err := ct.Dial(&netlink.Config{NetNS: ns.Fd()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return func() int {
		st, err := c.StatsGlobal()
		if err != nil {
			t.Fatal(err)
		}
		return int(st.Entries)
	}
}

// waitCount polls count every millisecond until it reaches want or within
// has passed.
func waitCount(count func() int, want int, within time.Duration) (time.Duration, bool) {
	start := time.Now()
	for count() < want {
		if time.Since(start) > within {
			return time.Since(start), false
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start), true
}

// flushTable empties ns's conntrack table.
func flushTable(ns *netns.NS) error {
	c, err := ct.Dial(&netlink.Config{NetNS: ns.Fd()})
	if err != nil {
		return fmt.Errorf("conntrack in %s: %w", ns.Ref(), err)
	}
	defer c.Close()
	if err := c.Flush(); err != nil {
		return fmt.Errorf("flush conntrack in %s: %w", ns.Ref(), err)
	}
	return nil
}

// natKept counts the standby's entries that carry their DNAT binding (the
// translated reply tuple) and the kernel's NAT status.
func natKept(t *testing.T, sb *netns.NS) (ok, all int) {
	flows := dumpFlows(t, sb)
	for i := range flows {
		e := FromFlow(OpUpsert, &flows[i])
		if e.Proto != 6 {
			continue
		}
		all++
		if e.ReplySrc != e.OrigDst && flows[i].Status&ct.StatusDstNAT != 0 {
			ok++
		}
	}
	return ok, all
}
