package scenario

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/bench/stats"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/qoslab"
	"github.com/natgw/natgw/internal/upstream"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/shape"
)

// Scenario 9: an EIP limited to 1, 10 and 100 Mbit/s through a
// FIP, the three ways side by side on the same lab (internal/qoslab) and
// paths with added RTT.
const (
	// s9PingEvery spaces the pings under load (ext → EIP while the bulk
	// flow runs).
	s9PingEvery = 50 * time.Millisecond
	// s9Flows is the shared-limit case.
	s9Flows = 8
	// s9Overload is the UDP sender's rate, in multiples of the limit.
	s9Overload = 2
	// s9MaxRate bounds NATGW_BENCH_S9's rates (Mbit/s; a veth in this lab
	// carries a few Gbit/s).
	s9MaxRate = 1000
)

// Targets of scenario 9 (bench/README.md): natgw's default (shape).
const (
	s9GoodputTol   = 0.10                   // goodput within ±10% of the rate, 1 and 8 flows
	s9JainMin      = 0.8                    // Jain's index of the 8 flows
	s9AddedP99     = 100 * time.Millisecond // ping p99 under load − idle median
	s9RetransBound = 1.0                    // retransmitted segments, % of new segments
	s9UDPRxTol     = 0.10                   // UDP at 2×: delivered within ±10% of the rate
	s9UDPLossMax   = 55.0                   // UDP at 2×: loss % (what is above the rate is 50%)
	s9BurstTol     = 0.25                   // bytes passed above the rate within ±25% of the burst
)

// s9BurstMB is the burst of the burst measurement at a limit of rate
// Mbit/s, in upstream's MB (2^20 bytes): 0.8 s of rate, at least 1 MB.
func s9BurstMB(rate int) float64 { return max(1, float64(rate)/10) }

// s9Plane is one way of limiting the EIP.
type s9Plane string

const (
	s9Shape    s9Plane = "shape"    // nat/shape's HTB classes (natgw's default, --eip-qos=shape)
	s9Police   s9Plane = "police"   // natgw's nftables policer (--eip-qos=police)
	s9Upstream s9Plane = "upstream" // Kube-OVN v1.16.2's nat-gateway.sh eip-*-qos-add
)

// s9UDPDur is the length of the UDP run: the policer's bucket (one
// second of rate) empties after 1 s at twice the rate, so the second half
// (what "delivered" counts) starts after it.
const s9UDPDur = 2500 * time.Millisecond

// s9Plan is a run's size. The burst run lasts side().
type s9Plan struct {
	RTTs      []time.Duration
	Rates     []int // Mbit/s
	Dirs      []qoslab.Dir
	Runs      int
	Warm, Dur time.Duration
}

// side is the length of the burst run: the TCP window, at least 1 s.
func (p s9Plan) side() time.Duration { return max(p.Dur-p.Warm, time.Second) }

// s9PlanFor returns the plan of a full or quick run, or the one
// NATGW_BENCH_S9=RTT[+RTT...],RATE[+RATE...],RUNS,DURATION sets (e.g.
// "20ms,10,1,3s"; development: the report states the size).
func s9PlanFor(quick bool) (s9Plan, error) {
	rates, dirs := []int{1, 10, 100}, []qoslab.Dir{qoslab.Download, qoslab.Upload}
	p := s9Plan{RTTs: []time.Duration{0, 20 * time.Millisecond}, Rates: rates, Dirs: dirs, Runs: 2, Warm: time.Second, Dur: 2500 * time.Millisecond}
	if quick {
		p = s9Plan{RTTs: []time.Duration{20 * time.Millisecond}, Rates: rates, Dirs: dirs, Runs: 1, Warm: time.Second, Dur: 2500 * time.Millisecond}
	}
	v := os.Getenv("NATGW_BENCH_S9")
	if v == "" {
		return p, nil
	}
	f := strings.Split(v, ",")
	if len(f) != 4 {
		return p, fmt.Errorf("NATGW_BENCH_S9 %q: want RTT[+RTT...],RATE[+RATE...],RUNS,DURATION", v)
	}
	p.RTTs, p.Rates = nil, nil
	for _, s := range strings.Split(f[0], "+") {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return p, fmt.Errorf("NATGW_BENCH_S9 %q: RTT %q: want a duration ≥ 0", v, s)
		}
		p.RTTs = append(p.RTTs, d)
	}
	for _, s := range strings.Split(f[1], "+") {
		r, err := strconv.Atoi(s)
		if err != nil || r < 1 || r > s9MaxRate {
			return p, fmt.Errorf("NATGW_BENCH_S9 %q: RATE %q: want whole Mbit/s from 1 to %d", v, s, s9MaxRate)
		}
		p.Rates = append(p.Rates, r)
	}
	n, err := strconv.Atoi(f[2])
	if err != nil || n < 1 {
		return p, fmt.Errorf("NATGW_BENCH_S9 %q: RUNS %q: want a count ≥ 1", v, f[2])
	}
	p.Runs = n
	d, err := time.ParseDuration(f[3])
	if err != nil || d < 2*time.Second {
		return p, fmt.Errorf("NATGW_BENCH_S9 %q: DURATION %q: want ≥ 2s", v, f[3])
	}
	p.Dur, p.Warm = d, min(p.Warm, d/2)
	return p, nil
}

// s9Key names one cell.
type s9Key struct {
	rtt   time.Duration
	rate  int
	dir   qoslab.Dir
	plane s9Plane
}

// s9Cell is one cell's runs: goodput in % of the rate, retransmits in %
// of new segments, Jain's index of the 8 flows, pings in ms (idle: the
// median of each run's idle pings; loaded: every answered ping under
// load, pooled over the runs), UDP at 2× (delivered in the second half,
// % of the rate; loss, % of datagrams sent), the burst run (MB passed
// above the rate; ms until the burst's bytes had arrived). err is the
// failure of one of its runs: the cell is then not measured (its figures
// so far are not reported and its later runs are skipped), the other
// cells still are. slowDial is its flows' slowest dial (slowWhere: which
// run and part), redials how many of its dials timed out and were tried
// again (qoslab.DialTimeout).
type s9Cell struct {
	g1, g8, r1, r8, j8 []float64
	idle, loaded       []float64
	pingsSent          int
	udpRx, udpLoss     []float64
	burst, burstMs     []float64
	err                error
	slowDial           time.Duration
	slowWhere          string
	redials            int
}

// measured says whether c holds figures to report: it ran, no run failed.
func (c *s9Cell) measured() bool { return c != nil && c.err == nil && len(c.g1) > 0 }

// s9SlowDial is the dial time above which the report names a cell's
// dials: one SYN retransmitted (TCP's first after 1 s) or a SYN queued as
// long behind the limit.
const s9SlowDial = time.Second

// dialed adds run's dials of part (e.g. "8 flows") to c.
func (c *s9Cell) dialed(run int, part string, r qoslab.TCPRun) {
	c.redials += r.Redials
	if r.SlowestDial > c.slowDial {
		c.slowDial, c.slowWhere = r.SlowestDial, fmt.Sprintf("run %d, %s", run, part)
	}
}

// s9Script runs upstream's script in the lab's gateway, as
// kube-ovn-controller does (`/bin/bash -c "bash nat-gateway.sh OP RULE"`,
// judged by controllerVerdict). shim is a directory put first on the
// script's PATH (for the calls that ask for it) whose `tc` skips the
// fq_codel leaf this kernel lacks (upstream.TCWithoutFqCodel).
type s9Script struct {
	script string
	shim   string
}

// call runs OP RULE in the gateway; it returns the verdict's error
// (exit status or standard error), with standard error's text.
func (u *s9Script) call(ctx context.Context, ns *netns.NS, shimmed bool, op, rule string) error {
	var env []string
	if shimmed {
		env = []string{"PATH=" + u.shim + ":" + os.Getenv("PATH")}
	}
	_, stderr, err := runOutputs(ctx, ns, nil, env, "/bin/bash", "-c", "bash "+u.script+" "+op+" "+rule)
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			// The script's own words, not the whole command line.
			return fmt.Errorf("%s %s: exit %d, standard error %q", op, rule, ee.ExitCode(), strings.TrimSpace(string(stderr)))
		}
		return fmt.Errorf("%s %s: %w", op, rule, err)
	}
	return controllerVerdict(op, stderr)
}

// s9Rule is upstream's eip-*-qos-add rule: EIP,PRIORITY,RATE,BURST (Mbit/s,
// MB; burst 0 is tc's default, as natgw's shaper's).
func s9Rule(rate int, burstMB float64) string {
	return fmt.Sprintf("%s,1,%d,%s", qoslab.EIP, rate, strconv.FormatFloat(burstMB, 'g', -1, 64))
}

// s9Reset removes every plane's limit: natgw's policer and shaper, and
// upstream's root HTB on net1, ingress qdisc and IFB device.
func s9Reset(ctx context.Context, tp *qoslab.Topo) error {
	if err := tp.Police(ctx, nil); err != nil {
		return err
	}
	if err := shape.Set(ctx, tp.Cfg, nil); err != nil {
		return fmt.Errorf("shape.Set(nil): %w", err)
	}
	// Upstream's state (and any root qdisc natgw's shaper left): absent is
	// fine, so only the final check counts.
	for _, argv := range [][]string{
		{"tc", "qdisc", "del", "dev", "net1", "root"},
		{"tc", "qdisc", "del", "dev", "eth0", "root"},
		{"tc", "qdisc", "del", "dev", "net1", "ingress"},
		{"ip", "link", "del", "ifb-net1"},
	} {
		_, _ = netlab.Exec(ctx, tp.GW, "", argv...)
	}
	for _, dev := range []string{"net1", "eth0"} {
		out, err := netlab.Exec(ctx, tp.GW, "", "tc", "class", "show", "dev", dev)
		if err != nil {
			return fmt.Errorf("tc class show dev %s: %w", dev, err)
		}
		if strings.TrimSpace(out) != "" {
			return fmt.Errorf("reset: classes left on %s: %s", dev, out)
		}
	}
	return nil
}

// s9Configure limits the EIP to rate Mbit/s with a burst of burstMB
// (upstream's MB; 0: each plane's default) both ways with plane p, from a
// reset state (buckets full, queues empty). The policer's burst is whole
// Mbit, rounded up, as natgw-controller converts upstream's MB.
func s9Configure(ctx context.Context, tp *qoslab.Topo, ns *netns.NS, up *s9Script, p s9Plane, rate int, burstMB float64) error {
	if err := s9Reset(ctx, tp); err != nil {
		return err
	}
	switch p {
	case s9Police:
		b := uint32(math.Ceil(burstMB * shape.BytesPerMB * 8 / 1e6))
		return tp.Police(ctx, &nat.QoS{IngressRateMbps: uint32(rate), IngressBurstMbit: b, EgressRateMbps: uint32(rate), EgressBurstMbit: b})
	case s9Shape:
		l := shape.Limit{RateMbps: float64(rate), BurstMB: burstMB}
		return shape.Set(ctx, tp.Cfg, []shape.EIP{{Address: qoslab.EIP, Ingress: l, Egress: l}})
	case s9Upstream:
		for _, op := range []string{"eip-ingress-qos-add", "eip-egress-qos-add"} {
			if err := up.call(ctx, ns, true, op, s9Rule(rate, burstMB)); err != nil {
				return fmt.Errorf("upstream %w", err)
			}
		}
		return nil
	}
	return fmt.Errorf("plane %q: unknown", p)
}

// s9Refresh limits the EIP again with plane p for the next part of a
// measurement in direction dir: queues empty, buckets full, a burst of
// burstMB in dir. natgw's planes are cheap to set, so they are configured
// afresh both ways (s9Configure). Upstream's script costs one to three
// seconds a call on this loaded machine, so for it only dir is redone:
// with burst 0 the leaf of the EIP's class that shapes dir (download: on
// the IFB of net1; upload: on net1) is replaced by the same leaf, HTB's
// default (pfifo at the device's txqueuelen), which empties its queue,
// and the class's own bucket is tc's default burst, refilled within a
// millisecond; with a burst, dir's root qdisc is deleted and dir's
// eip-*-qos-add run again with it (the script makes the root, its default
// class and the EIP's class anew). The other direction keeps its limit.
// s9UDPAttempts is how many times a UDP run is made before a busy
// machine's stalls are an error.
const s9UDPAttempts = 3

// s9RunUDP runs UDP at s9Overload× the rate with the limit refreshed
// before, again (up to s9UDPAttempts) while the sender stalled: a stalled
// sender catches up in a burst, and what then passes measures the machine,
// not the limit.
func s9RunUDP(ctx context.Context, tp *qoslab.Topo, ns *netns.NS, up *s9Script, p s9Plane, dir qoslab.Dir, rate int) (qoslab.UDPRun, error) {
	var u qoslab.UDPRun
	for range s9UDPAttempts {
		if err := s9Refresh(ctx, tp, ns, up, p, dir, rate, 0); err != nil {
			return u, err
		}
		var err error
		if u, err = tp.RunUDP(ctx, dir, s9Overload*float64(rate), s9UDPDur); err != nil {
			return u, fmt.Errorf("UDP at %d×: %w", s9Overload, err)
		}
		if u.Steady() {
			return u, nil
		}
	}
	return u, fmt.Errorf("UDP at %d×: the sender stalled up to %v (more than %v) in each of %d runs: the machine is too busy to offer a steady rate",
		s9Overload, u.MaxGap, qoslab.UDPMaxGap, s9UDPAttempts)
}

func s9Refresh(ctx context.Context, tp *qoslab.Topo, ns *netns.NS, up *s9Script, p s9Plane, dir qoslab.Dir, rate int, burstMB float64) error {
	if p != s9Upstream {
		return s9Configure(ctx, tp, ns, up, p, rate, burstMB)
	}
	dev, op := "ifb-net1", "eip-ingress-qos-add"
	if dir == qoslab.Upload {
		dev, op = "net1", "eip-egress-qos-add"
	}
	if burstMB == 0 {
		out, err := netlab.Exec(ctx, tp.GW, "", "tc", "class", "show", "dev", dev)
		if err != nil {
			return fmt.Errorf("upstream plane: tc class show dev %s: %w", dev, err)
		}
		id, err := s9EIPClass(out)
		if err != nil {
			return fmt.Errorf("upstream plane: classes of %s: %w", dev, err)
		}
		if _, err := netlab.Exec(ctx, tp.GW, "", "tc", "qdisc", "replace", "dev", dev, "parent", id, "pfifo"); err != nil {
			return fmt.Errorf("upstream plane: empty the leaf of %s on %s: %w", id, dev, err)
		}
		return nil
	}
	if _, err := netlab.Exec(ctx, tp.GW, "", "tc", "qdisc", "del", "dev", dev, "root"); err != nil {
		return fmt.Errorf("upstream plane: delete the root qdisc of %s: %w", dev, err)
	}
	if err := up.call(ctx, ns, true, op, s9Rule(rate, burstMB)); err != nil {
		return fmt.Errorf("upstream %w", err)
	}
	return nil
}

// s9EIPClass picks, from `tc class show` of a device upstream's script
// shapes, the id of the one HTB class that is not its default class 1:9999
// (the EIP's: one EIP in this lab).
func s9EIPClass(show string) (string, error) {
	var ids []string
	for _, line := range strings.Split(show, "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "class" && f[1] == "htb" && f[2] != "1:9999" {
			ids = append(ids, f[2])
		}
	}
	if len(ids) != 1 {
		return "", fmt.Errorf("want one class besides 1:9999, got %q in %q", ids, show)
	}
	return ids[0], nil
}

// s9Unmodified runs upstream's two calls (rate Mbit/s, burst 0) without
// the shim, as the script runs on this kernel, and says what each did.
func s9Unmodified(ctx context.Context, tp *qoslab.Topo, ns *netns.NS, up *s9Script, rate int) (string, error) {
	if err := s9Reset(ctx, tp); err != nil {
		return "", err
	}
	var parts []string
	for _, op := range []string{"eip-ingress-qos-add", "eip-egress-qos-add"} {
		if err := up.call(ctx, ns, false, op, s9Rule(rate, 0)); err != nil {
			parts = append(parts, fmt.Sprintf("fails (%v)", err))
		} else {
			parts = append(parts, fmt.Sprintf("`%s %s` succeeds", op, s9Rule(rate, 0)))
		}
	}
	return strings.Join(parts, "; "), s9Reset(ctx, tp)
}

// s9Measure adds run (1-based) of plane p at k.rate in direction k.dir to c,
// the plane configured afresh before the first part and refreshed
// (s9Refresh) before each other: idle pings and one bulk
// flow with pings under load; s9Flows flows sharing the limit; UDP at
// s9Overload× the rate; one flow with a burst of s9BurstMB.
func s9Measure(ctx context.Context, tp *qoslab.Topo, ns *netns.NS, up *s9Script, k s9Key, plan s9Plan, run int, c *s9Cell) error {
	p, rate, dir := k.plane, k.rate, k.dir
	if err := s9Configure(ctx, tp, ns, up, p, rate, 0); err != nil {
		return err
	}
	idle, err := netlab.Ping(ctx, tp.Ext, qoslab.EIP, 10, s9PingEvery, time.Second)
	if err != nil {
		return fmt.Errorf("idle ping: %w", err)
	}
	if len(idle) == 0 {
		return errors.New("idle ping: no answer")
	}
	c.idle = append(c.idle, stats.Summarize(msOf(idle)).Median)
	r1, err := tp.RunTCP(ctx, qoslab.TCPOptions{Dir: dir, Flows: 1, Warm: plan.Warm, Dur: plan.Dur, PingEvery: s9PingEvery})
	if err != nil {
		return fmt.Errorf("1 flow: %w", err)
	}
	c.dialed(run, "1 flow", r1)
	c.g1 = append(c.g1, 100*r1.Goodput()/float64(rate))
	c.r1 = append(c.r1, r1.Retrans)
	c.loaded = append(c.loaded, msOf(r1.Pings)...)
	c.pingsSent += r1.PingsSent
	if err := s9Refresh(ctx, tp, ns, up, p, dir, rate, 0); err != nil {
		return err
	}
	rn, err := tp.RunTCP(ctx, qoslab.TCPOptions{Dir: dir, Flows: s9Flows, Warm: plan.Warm, Dur: plan.Dur})
	if err != nil {
		return fmt.Errorf("%d flows: %w", s9Flows, err)
	}
	c.dialed(run, fmt.Sprintf("%d flows", s9Flows), rn)
	c.g8 = append(c.g8, 100*rn.Goodput()/float64(rate))
	c.r8 = append(c.r8, rn.Retrans)
	c.j8 = append(c.j8, rn.Jain())
	u, err := s9RunUDP(ctx, tp, ns, up, p, dir, rate)
	if err != nil {
		return err
	}
	c.udpRx = append(c.udpRx, 100*u.RxMbps/float64(rate))
	c.udpLoss = append(c.udpLoss, u.Loss())
	b := s9BurstMB(rate)
	if err := s9Refresh(ctx, tp, ns, up, p, dir, rate, b); err != nil {
		return err
	}
	rb, err := tp.RunTCP(ctx, qoslab.TCPOptions{Dir: dir, Flows: 1, Warm: plan.side() / 2, Dur: plan.side()})
	if err != nil {
		return fmt.Errorf("burst of %g MB: %w", b, err)
	}
	c.dialed(run, "burst", rb)
	excess, at := rb.AboveRate(b * shape.BytesPerMB)
	c.burst = append(c.burst, excess/shape.BytesPerMB)
	c.burstMs = append(c.burstMs, at*1000)
	return nil
}

func msOf(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}

// RunS9 measures EIP QoS through a FIP at 1, 10 and 100 Mbit/s on paths
// with added RTT: natgw's shaper (its default), natgw's policer, and
// Kube-OVN v1.16.2's own nat-gateway.sh (its HTB classes on net1 and on an
// IFB of net1, with HTB's default leaf where it asks for fq_codel), in
// both directions; goodput of 1 and 8 flows, fairness of the 8, ping
// under load, retransmits, UDP at twice the rate, a burst.
func RunS9(ctx context.Context, e *Env) error {
	e.Progress.Scenario("scenario 9: EIP QoS through a FIP (shape / police / upstream's script; RTT added by a delay line)")
	sec := e.Report.Section("s9", "Scenario 9: EIP QoS at 1, 10 and 100 Mbit/s: shaping, policing and upstream's script")
	if why := netlab.Unavailable(); why != "" {
		sec.NotRun = why
		return nil
	}
	plan, err := s9PlanFor(e.Quick)
	if err != nil {
		sec.NotRun = err.Error()
		return err
	}
	return runS9(ctx, e, sec, plan)
}

// runS9 runs plan into sec (TestS9Tiny runs a plan of its own).
func runS9(ctx context.Context, e *Env, sec *report.Section, plan s9Plan) error {
	planes := []s9Plane{s9Shape, s9Police, s9Upstream}
	up, cleanup, why := s9OpenUpstream(ctx)
	defer cleanup()
	if why != "" {
		planes = planes[:2]
		sec.Notes = append(sec.Notes, "upstream's script not measured: "+why)
	}
	cells := map[s9Key]*s9Cell{}
	var unmodified string
	var errs []error
	start := time.Now()
	for _, rtt := range plan.RTTs {
		err := withLab(ctx, func(l *netlab.Lab) error {
			tp, err := qoslab.New(ctx, l, rtt)
			if err != nil {
				return err
			}
			defer tp.Close()
			ns, err := netns.Open(tp.GW)
			if err != nil {
				return err
			}
			defer ns.Close()
			if up != nil && unmodified == "" {
				if unmodified, err = s9Unmodified(ctx, tp, ns, up, plan.Rates[0]); err != nil {
					return err
				}
			}
			errs = append(errs, s9RunCells(ctx, plan, planes, rtt, cells, func(k s9Key, run int, c *s9Cell) error {
				e.Progress.Printf("RTT %v, %d Mbit/s, %s, %s: run %d/%d (%s so far)", k.rtt, k.rate, k.dir, k.plane, run, plan.Runs, time.Since(start).Round(time.Second))
				err := s9Measure(ctx, tp, ns, up, k, plan, run, c)
				if err != nil {
					e.Progress.Printf("RTT %v, %d Mbit/s, %s, %s: run %d failed, the cell is not measured: %v", k.rtt, k.rate, k.dir, k.plane, run, err)
				}
				return err
			})...)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return s9Reset(ctx, tp)
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("scenario 9: %w", err))
			sec.Notes = append(sec.Notes, err.Error())
			if ctx.Err() != nil {
				break
			}
		}
	}
	reportS9(e.Report, sec, plan, planes, cells, unmodified, time.Since(start))
	return errors.Join(errs...)
}

// s9RunCells runs measure (run 1-based) for every run and cell of RTT rtt
// in plan's order (planes interleaved, the first one rotated per run),
// the cells made in cells as needed. A cell whose run fails keeps the
// error (c.err: the cell is not measured, its later runs are skipped)
// and the other cells still run, each from its plane configured afresh;
// only ctx's end stops the loop. It returns the cells' errors.
func s9RunCells(ctx context.Context, plan s9Plan, planes []s9Plane, rtt time.Duration, cells map[s9Key]*s9Cell, measure func(k s9Key, run int, c *s9Cell) error) []error {
	var errs []error
	for run := range plan.Runs {
		for _, rate := range plan.Rates {
			for _, dir := range plan.Dirs {
				for i := range planes {
					p := planes[(i+run)%len(planes)] // rotate which plane goes first
					k := s9Key{rtt, rate, dir, p}
					if cells[k] == nil {
						cells[k] = &s9Cell{}
					}
					c := cells[k]
					if c.err != nil {
						continue // failed in an earlier run: not measured
					}
					if err := measure(k, run+1, c); err != nil {
						c.err = fmt.Errorf("run %d: %w", run+1, err)
						errs = append(errs, fmt.Errorf("scenario 9: RTT %v, %d Mbit/s, %s, %s: %w", rtt, rate, dir, p, c.err))
						if ctx.Err() != nil {
							return errs
						}
					}
				}
			}
		}
	}
	return errs
}

// s9OpenUpstream finds upstream's script (the Go module proxy, through
// internal/upstream) and writes the tc shim; why says what is missing
// (then up is nil). cleanup removes the shim.
func s9OpenUpstream(ctx context.Context) (up *s9Script, cleanup func(), why string) {
	cleanup = func() {}
	script, err := upstream.Path(ctx, upstream.NatGatewayScript)
	if err != nil {
		return nil, cleanup, err.Error()
	}
	realTC, err := exec.LookPath("tc")
	if err != nil {
		return nil, cleanup, "no tc on PATH"
	}
	dir, err := os.MkdirTemp("", "ngw-s9-shim-")
	if err != nil {
		return nil, cleanup, err.Error()
	}
	cleanup = func() { os.RemoveAll(dir) }
	if err := os.WriteFile(filepath.Join(dir, "tc"), []byte(upstream.TCWithoutFqCodel(realTC)), 0o755); err != nil {
		return nil, cleanup, err.Error()
	}
	return &s9Script{script: script, shim: dir}, cleanup, ""
}

// s9Summary is one cell's figures (medians over the runs; pings pooled).
type s9Summary struct {
	g1, g8, r1, r8, j8 float64
	idle, loadP50      float64
	loadP99            float64
	lost               float64 // pings under load lost, %
	udpRx, udpLoss     float64
	burst, burstMs     float64
	runs               int
}

func summarizeS9(c *s9Cell) s9Summary {
	med := func(v []float64) float64 {
		v = slices.DeleteFunc(slices.Clone(v), func(x float64) bool { return math.IsNaN(x) })
		if len(v) == 0 {
			return math.NaN()
		}
		return stats.Summarize(v).Median
	}
	l := stats.Summarize(c.loaded)
	s := s9Summary{g1: med(c.g1), g8: med(c.g8), r1: med(c.r1), r8: med(c.r8), j8: med(c.j8),
		idle: med(c.idle), loadP50: l.Median, loadP99: l.P99, lost: math.NaN(),
		udpRx: med(c.udpRx), udpLoss: med(c.udpLoss), burst: med(c.burst), burstMs: med(c.burstMs), runs: len(c.g1)}
	if len(c.loaded) == 0 {
		s.loadP50, s.loadP99 = math.NaN(), math.NaN()
	}
	if c.pingsSent > 0 {
		s.lost = 100 * float64(c.pingsSent-len(c.loaded)) / float64(c.pingsSent)
	}
	return s
}

// s9Fmt formats x with prec decimals, NaN as "–".
func s9Fmt(x float64, prec int) string {
	if math.IsNaN(x) {
		return "–"
	}
	return strconv.FormatFloat(x, 'f', prec, 64)
}

// reportS9 writes the table, the targets (natgw's default, shape) and the
// metrics (shape and police, each against upstream's script in the same
// run).
func reportS9(r *report.Report, sec *report.Section, plan s9Plan, planes []s9Plane, cells map[s9Key]*s9Cell, unmodified string, took time.Duration) {
	var rtts, rates, bursts []string
	for _, d := range plan.RTTs {
		rtts = append(rtts, d.String())
	}
	for _, x := range plan.Rates {
		rates = append(rates, strconv.Itoa(x))
		bursts = append(bursts, fmt.Sprintf("%g MB at %d", s9BurstMB(x), x))
	}
	sec.Text = append(sec.Text,
		fmt.Sprintf("One EIP limited to %s Mbit/s in both directions, through a FIP to a VPC host, in `internal/qoslab`'s lab "+
			"(ext ─ [delay line] ─ gw ─ vm; the nftables data plane in gw; RTT added by `internal/delayline`, a user-space relay: "+
			"this kernel has no netem). Flows are opened by the VPC host; download = ext sends to it (through the EIP), upload = it sends. "+
			"Planes: **shape** (`nat/shape`: HTB classes, natgw's default `--eip-qos=shape`), **police** (natgw's nftables limit, `--eip-qos=police`), "+
			"**upstream** (Kube-OVN v1.16.2's `nat-gateway.sh eip-ingress-qos-add` / `eip-egress-qos-add EIP,1,RATE,BURST`, exec'd as kube-ovn-controller does: "+
			"its HTB class on net1 for upload and on an IFB of net1 for download, u32 filters). Burst 0 (tc's default for the HTB classes; "+
			"the policer's bucket is then one second of rate) except in the burst run.", strings.Join(rates, ", ")),
		fmt.Sprintf("Per cell, over %d run(s), each part from empty queues and full buckets (the plane configured afresh; for upstream's script, whose calls cost seconds here, only the measured direction: its EIP class's leaf replaced by the same pfifo, or with a burst its `eip-*-qos-add` run again; planes interleaved, the first one rotated per run): "+
			"goodput of 1 flow and of %d flows sharing the limit (%v each, measured from %v; median, %% of the rate: payload bytes delivered, so HTB's framing costs ~4%%), "+
			"Jain's index of the %d, the sender's retransmitted segments (%% of new segments, `/proc/net/snmp` of its namespace), "+
			"ping ext → EIP idle (median) and every %v while the 1-flow run fills the limit (median and p99 of every answered ping, pooled over the runs; lost %%); "+
			"UDP (1,200-byte datagrams) sent at %d× the rate for %v (the policer's bucket, one second of rate, is empty after 1 s): delivered in its second half (%% of the rate) and datagrams lost (%% of those sent); "+
			"the burst run: the limit with a burst of B MB (2^20 bytes; %s Mbit/s; the policer's burst in whole Mbit rounded up, as natgw-controller converts it), "+
			"one flow for %v: the bytes it got through above the steady rate (the slope of the run's last half extended back to its start: "+
			"what passed before the limit held, less what the limit alone passes in that time; MB) and when its first B MB had arrived "+
			"(ms; at the rate alone B MB take B×8.39/rate s). RTTs: %s.",
			plan.Runs, s9Flows, plan.Dur, plan.Warm, s9Flows, s9PingEvery, s9Overload, s9UDPDur, strings.Join(bursts, ", "), plan.side(), strings.Join(rtts, ", ")))
	t := report.Table{
		Caption: "**EIP QoS at 1, 10 and 100 Mbit/s** (goodput and UDP delivered in % of the rate)",
		Header: []string{"RTT", "limit", "dir", "plane", "1 flow", fmt.Sprintf("%d flows", s9Flows), "Jain", "retr 1 flow", fmt.Sprintf("retr %d flows", s9Flows),
			"ping idle (ms)", "loaded p50 (ms)", "loaded p99 (ms)", "lost", "UDP 2× rx", "UDP 2× loss", "burst (MB)", "passed (MB)", "burst in (ms)"},
	}
	dirs := plan.Dirs
	for _, rtt := range plan.RTTs {
		for _, rate := range plan.Rates {
			for _, dir := range dirs {
				for _, p := range planes {
					c := cells[s9Key{rtt, rate, dir, p}]
					if !c.measured() {
						t.Rows = append(t.Rows, s9NotMeasuredRow(rtt, rate, dir, p, c, len(t.Header)))
						continue
					}
					s := summarizeS9(c)
					t.Rows = append(t.Rows, []string{rtt.String(), fmt.Sprintf("%d Mbit/s", rate), string(dir), string(p), s9Fmt(s.g1, 1), s9Fmt(s.g8, 1), s9Fmt(s.j8, 3),
						s9Fmt(s.r1, 2), s9Fmt(s.r8, 2), s9Fmt(s.idle, 1), s9Fmt(s.loadP50, 1), s9Fmt(s.loadP99, 1), s9Fmt(s.lost, 1) + "%",
						s9Fmt(s.udpRx, 1), s9Fmt(s.udpLoss, 1) + "%", fmt.Sprintf("%g", s9BurstMB(rate)), s9Fmt(s.burst, 2), s9Fmt(s.burstMs, 0)})
				}
			}
		}
	}
	sec.Tables = append(sec.Tables, t)
	for _, rtt := range plan.RTTs {
		for _, rate := range plan.Rates {
			for _, dir := range dirs {
				c := cells[s9Key{rtt, rate, dir, s9Shape}]
				name := fmt.Sprintf("S9 shape, RTT %v, %d Mbit/s, %s", rtt, rate, dir)
				if !c.measured() {
					sec.Targets = append(sec.Targets, report.Target{Name: name, Want: "measured", Got: "not measured", Reason: s9NotMeasured(c)})
					continue
				}
				sec.Targets = append(sec.Targets, s9Targets(name, rate, summarizeS9(c))...)
				base := cells[s9Key{rtt, rate, dir, s9Upstream}]
				for _, p := range []s9Plane{s9Shape, s9Police} {
					pc := cells[s9Key{rtt, rate, dir, p}]
					if !pc.measured() {
						continue
					}
					ours := summarizeS9(pc)
					theirs := s9Summary{g1: math.NaN(), g8: math.NaN(), j8: math.NaN(), r1: math.NaN(), loadP99: math.NaN(), idle: math.NaN()}
					if base.measured() {
						theirs = summarizeS9(base)
					}
					const bn = "Kube-OVN v1.16.2 nat-gateway.sh, same run"
					pre := fmt.Sprintf("s9.%s.%s.rate=%d.rtt=%dms.", p, dir, rate, rtt.Milliseconds())
					r.AddMetric(
						report.NewMetric(pre+"goodput_1flow", "% of rate", report.HigherIsBetter, ours.g1, theirs.g1, bn),
						report.NewMetric(pre+fmt.Sprintf("goodput_%dflows", s9Flows), "% of rate", report.HigherIsBetter, ours.g8, theirs.g8, bn),
						report.NewMetric(pre+fmt.Sprintf("jain_%dflows", s9Flows), "index", report.HigherIsBetter, ours.j8, theirs.j8, bn),
						report.NewMetric(pre+"retransmits_1flow", "% of segments", report.LowerIsBetter, ours.r1, theirs.r1, bn),
						report.NewMetric(pre+"ping_under_load_p99", "ms", report.LowerIsBetter, ours.loadP99, theirs.loadP99, bn),
					)
				}
			}
		}
	}
	if unmodified != "" {
		sec.Notes = append(sec.Notes, "Upstream's script as it is, on this kernel: "+unmodified+
			". This kernel has HTB, u32, mirred, the ingress qdisc and IFB, but no fq_codel: the script's `exec_cmd tc qdisc replace ... fq_codel` "+
			"ends the call (exit 2) after it added the HTB class and before the u32 filter that sends the EIP's traffic to it. "+
			"So the upstream plane runs the script with a `tc` first on its PATH that skips that one command (the class keeps HTB's default leaf, "+
			"pfifo at the device's txqueuelen, as natgw's shaper on this kernel): upstream's shape without fq_codel. fq_codel itself is not measured here.")
	}
	if n := s9DialNote(plan, planes, cells); n != "" {
		sec.Notes = append(sec.Notes, n)
	}
	sec.Notes = append(sec.Notes, fmt.Sprintf("%d RTT(s) × %d rate(s) × %d direction(s) × %d planes × %d run(s) in %v.",
		len(plan.RTTs), len(plan.Rates), len(dirs), len(planes), plan.Runs, took.Round(time.Second)))
}

// s9NotMeasured says why cell c has no figures: its run's error, or that
// it never ran (its RTT's lab failed: the notes say how).
func s9NotMeasured(c *s9Cell) string {
	if c != nil && c.err != nil {
		return "not measured: " + c.err.Error()
	}
	return "not measured: not run (see the notes)"
}

// s9NotMeasuredRow is the table's row of a cell without figures: why in
// the first figure's column, "–" in the others (width columns in all).
func s9NotMeasuredRow(rtt time.Duration, rate int, dir qoslab.Dir, p s9Plane, c *s9Cell, width int) []string {
	row := []string{rtt.String(), fmt.Sprintf("%d Mbit/s", rate), string(dir), string(p), s9NotMeasured(c)}
	for len(row) < width {
		row = append(row, "–")
	}
	return row
}

// s9DialNote names the cells whose flows' dials took longer than
// s9SlowDial or were tried again (a SYN lost behind, or queued in, a
// limit the earlier flows fill); "" if none did.
func s9DialNote(plan s9Plan, planes []s9Plane, cells map[s9Key]*s9Cell) string {
	var parts []string
	for _, rtt := range plan.RTTs {
		for _, rate := range plan.Rates {
			for _, dir := range plan.Dirs {
				for _, p := range planes {
					c := cells[s9Key{rtt, rate, dir, p}]
					if c == nil || (c.slowDial <= s9SlowDial && c.redials == 0) {
						continue
					}
					parts = append(parts, fmt.Sprintf("RTT %v, %d Mbit/s, %s, %s: slowest dial %v (%s), %d redial(s)",
						rtt, rate, dir, p, c.slowDial.Round(10*time.Millisecond), c.slowWhere, c.redials))
				}
			}
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("Flows' dials that waited behind the limit (over %v: a SYN retransmitted, TCP's first after 1 s, or queued as long "+
		"behind the earlier flows' bytes; each flow may dial %d times, %v each): %s.",
		s9SlowDial, qoslab.DialAttempts, qoslab.DialTimeout, strings.Join(parts, "; "))
}

// s9Targets checks one shape cell at rate Mbit/s against bench/README.md's
// targets.
func s9Targets(name string, rate int, s s9Summary) []report.Target {
	lo, hi := 100*(1-s9GoodputTol), 100*(1+s9GoodputTol)
	in := func(x float64) bool { return x >= lo && x <= hi }
	g := report.Target{Name: name + ": goodput of 1 / " + strconv.Itoa(s9Flows) + " flows", Want: fmt.Sprintf("%.0f–%.0f%% of the rate", lo, hi),
		Got: fmt.Sprintf("%s%% / %s%%", s9Fmt(s.g1, 1), s9Fmt(s.g8, 1)), Pass: in(s.g1) && in(s.g8)}
	if !g.Pass {
		g.Reason = "goodput counts payload, HTB whole frames (~4% headers); a larger gap is lost goodput (see the table)"
	}
	j := report.Target{Name: name + ": fairness of " + strconv.Itoa(s9Flows) + " flows (Jain)", Want: fmt.Sprintf("≥ %.2f", s9JainMin),
		Got: s9Fmt(s.j8, 3), Pass: s.j8 >= s9JainMin}
	if !j.Pass {
		j.Reason = "one HTB class per EIP and direction with a FIFO leaf: no per-flow queues (fq_codel, absent here, would be)"
	}
	added := s.loadP99 - s.idle
	l := report.Target{Name: name + ": ping p99 under load − idle", Want: fmt.Sprintf("≤ %d ms", s9AddedP99.Milliseconds()),
		Got: fmt.Sprintf("%.1f ms (p99 %.1f, idle %.1f)", added, s.loadP99, s.idle), Pass: added <= float64(s9AddedP99.Milliseconds())}
	if math.IsNaN(added) {
		l.Got, l.Pass, l.Reason = "no pings answered", false, "every ping under load was lost"
	} else if !l.Pass {
		l.Reason = "the class's leaf queue (pfifo, no fq_codel in this kernel) fills up to the flow's window"
	}
	rt := report.Target{Name: name + ": retransmits, 1 / " + strconv.Itoa(s9Flows) + " flows", Want: fmt.Sprintf("≤ %.0f%% of segments", s9RetransBound),
		Got: fmt.Sprintf("%s%% / %s%%", s9Fmt(s.r1, 2), s9Fmt(s.r8, 2)), Pass: s.r1 <= s9RetransBound && s.r8 <= s9RetransBound}
	ulo, uhi := 100*(1-s9UDPRxTol), 100*(1+s9UDPRxTol)
	u := report.Target{Name: name + fmt.Sprintf(": UDP at %d×: delivered / loss", s9Overload),
		Want: fmt.Sprintf("%.0f–%.0f%% of the rate / ≤ %.0f%%", ulo, uhi, s9UDPLossMax),
		Got:  fmt.Sprintf("%s%% / %s%%", s9Fmt(s.udpRx, 1), s9Fmt(s.udpLoss, 1)),
		Pass: s.udpRx >= ulo && s.udpRx <= uhi && s.udpLoss <= s9UDPLossMax}
	if !u.Pass {
		u.Reason = "the limit lets more or less than its rate through under overload"
	}
	bmb := s9BurstMB(rate)
	b := report.Target{Name: name + fmt.Sprintf(": burst of %g MB passed above the rate", bmb),
		Want: fmt.Sprintf("%.2f–%.2f MB", bmb*(1-s9BurstTol), bmb*(1+s9BurstTol)),
		Got:  fmt.Sprintf("%s MB (the %g MB in %s ms)", s9Fmt(s.burst, 2), bmb, s9Fmt(s.burstMs, 0)),
		Pass: math.Abs(s.burst-bmb) <= bmb*s9BurstTol}
	if !b.Pass {
		b.Reason = "the flow did not use the burst up (TCP's slow start over the RTT) or the bucket held more than asked"
	}
	return []report.Target{g, j, l, rt, u, b}
}
