package scenario

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
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

// Scenario 9 (issue 24): an EIP limited to s9RateMbps through a FIP, the
// three ways side by side on the same lab (internal/qoslab) and paths with
// added RTT.
const (
	s9RateMbps = 10
	// s9PingEvery spaces the pings under load (ext → EIP while the bulk
	// flow runs).
	s9PingEvery = 50 * time.Millisecond
	// s9Flows is the shared-limit case.
	s9Flows = 4
)

// Targets of scenario 9 (bench/README.md): natgw's default (shape).
const (
	s9GoodputTol   = 0.10                   // goodput within ±10% of the rate, 1 and 4 flows
	s9AddedP99     = 100 * time.Millisecond // ping p99 under load − idle median
	s9RetransBound = 1.0                    // retransmitted segments, % of new segments
)

// s9Plane is one way of limiting the EIP.
type s9Plane string

const (
	s9Shape    s9Plane = "shape"    // nat/shape's HTB classes (natgw's default, --eip-qos=shape)
	s9Police   s9Plane = "police"   // natgw's nftables policer (--eip-qos=police)
	s9Upstream s9Plane = "upstream" // Kube-OVN v1.16.2's nat-gateway.sh eip-*-qos-add
)

// s9Plan is a run's size.
type s9Plan struct {
	RTTs      []time.Duration
	Runs      int
	Warm, Dur time.Duration
}

// s9PlanFor returns the plan of a full or quick run, or the one
// NATGW_BENCH_S9=RTT[+RTT...],RUNS,DURATION sets (e.g. "20ms,1,4s";
// development: the report states the size).
func s9PlanFor(quick bool) (s9Plan, error) {
	p := s9Plan{RTTs: []time.Duration{0, 20 * time.Millisecond, 80 * time.Millisecond}, Runs: 3, Warm: 2 * time.Second, Dur: 6 * time.Second}
	if quick {
		p = s9Plan{RTTs: []time.Duration{0, 20 * time.Millisecond}, Runs: 1, Warm: 1500 * time.Millisecond, Dur: 4 * time.Second}
	}
	v := os.Getenv("NATGW_BENCH_S9")
	if v == "" {
		return p, nil
	}
	f := strings.Split(v, ",")
	if len(f) != 3 {
		return p, fmt.Errorf("NATGW_BENCH_S9 %q: want RTT[+RTT...],RUNS,DURATION", v)
	}
	p.RTTs = nil
	for _, s := range strings.Split(f[0], "+") {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return p, fmt.Errorf("NATGW_BENCH_S9 %q: RTT %q: want a duration ≥ 0", v, s)
		}
		p.RTTs = append(p.RTTs, d)
	}
	n, err := strconv.Atoi(f[1])
	if err != nil || n < 1 {
		return p, fmt.Errorf("NATGW_BENCH_S9 %q: RUNS %q: want a count ≥ 1", v, f[1])
	}
	p.Runs = n
	d, err := time.ParseDuration(f[2])
	if err != nil || d < 2*time.Second {
		return p, fmt.Errorf("NATGW_BENCH_S9 %q: DURATION %q: want ≥ 2s", v, f[2])
	}
	p.Dur, p.Warm = d, min(p.Warm, d/2)
	return p, nil
}

// s9Key names one cell.
type s9Key struct {
	rtt   time.Duration
	dir   qoslab.Dir
	plane s9Plane
}

// s9Cell is one cell's runs: goodput in % of the rate, retransmits in %
// of new segments, Jain's index of the 4 flows, pings in ms (idle: the
// median of each run's idle pings; loaded: every answered ping under
// load, pooled over the runs).
type s9Cell struct {
	g1, g4, r1, r4, j4 []float64
	idle, loaded       []float64
	pingsSent          int
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
func s9Rule() string { return fmt.Sprintf("%s,1,%d,0", qoslab.EIP, s9RateMbps) }

// s9Reset removes every plane's limit: natgw's policer and shaper, and
// upstream's root HTB on net1, ingress qdisc and IFB device.
func s9Reset(ctx context.Context, tp *qoslab.Topo) error {
	if err := tp.Police(ctx, nil); err != nil {
		return err
	}
	if err := shape.Set(tp.Cfg, nil); err != nil {
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

// s9Configure limits the EIP to s9RateMbps both ways with plane p, from a
// reset state (buckets full, queues empty).
func s9Configure(ctx context.Context, tp *qoslab.Topo, ns *netns.NS, up *s9Script, p s9Plane) error {
	if err := s9Reset(ctx, tp); err != nil {
		return err
	}
	switch p {
	case s9Police:
		return tp.Police(ctx, &nat.QoS{IngressRateMbps: s9RateMbps, EgressRateMbps: s9RateMbps})
	case s9Shape:
		l := shape.Limit{RateMbps: s9RateMbps}
		return shape.Set(tp.Cfg, []shape.EIP{{Address: qoslab.EIP, Ingress: l, Egress: l}})
	case s9Upstream:
		for _, op := range []string{"eip-ingress-qos-add", "eip-egress-qos-add"} {
			if err := up.call(ctx, ns, true, op, s9Rule()); err != nil {
				return fmt.Errorf("upstream %w", err)
			}
		}
		return nil
	}
	return fmt.Errorf("plane %q: unknown", p)
}

// s9Unmodified runs upstream's two calls without the shim, as the script
// runs on this kernel, and says what each did.
func s9Unmodified(ctx context.Context, tp *qoslab.Topo, ns *netns.NS, up *s9Script) (string, error) {
	if err := s9Reset(ctx, tp); err != nil {
		return "", err
	}
	var parts []string
	for _, op := range []string{"eip-ingress-qos-add", "eip-egress-qos-add"} {
		if err := up.call(ctx, ns, false, op, s9Rule()); err != nil {
			parts = append(parts, fmt.Sprintf("fails (%v)", err))
		} else {
			parts = append(parts, fmt.Sprintf("`%s %s` succeeds", op, s9Rule()))
		}
	}
	return strings.Join(parts, "; "), s9Reset(ctx, tp)
}

// s9Measure adds one run of plane p in direction dir to c: idle pings, one
// bulk flow with pings under load, then s9Flows flows sharing the limit
// (the plane configured afresh before each).
func s9Measure(ctx context.Context, tp *qoslab.Topo, ns *netns.NS, up *s9Script, p s9Plane, dir qoslab.Dir, plan s9Plan, c *s9Cell) error {
	if err := s9Configure(ctx, tp, ns, up, p); err != nil {
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
	c.g1 = append(c.g1, 100*r1.Goodput()/s9RateMbps)
	c.r1 = append(c.r1, r1.Retrans)
	c.loaded = append(c.loaded, msOf(r1.Pings)...)
	c.pingsSent += r1.PingsSent
	if err := s9Configure(ctx, tp, ns, up, p); err != nil {
		return err
	}
	r4, err := tp.RunTCP(ctx, qoslab.TCPOptions{Dir: dir, Flows: s9Flows, Warm: plan.Warm, Dur: plan.Dur})
	if err != nil {
		return fmt.Errorf("%d flows: %w", s9Flows, err)
	}
	c.g4 = append(c.g4, 100*r4.Goodput()/s9RateMbps)
	c.r4 = append(c.r4, r4.Retrans)
	c.j4 = append(c.j4, r4.Jain())
	return nil
}

func msOf(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	return out
}

// RunS9 measures EIP QoS through a FIP at 10 Mbit/s on paths with added
// RTT: natgw's shaper (its default), natgw's policer, and Kube-OVN
// v1.16.2's own nat-gateway.sh (its HTB classes on net1 and on an IFB of
// net1, with HTB's default leaf where it asks for fq_codel), in both
// directions; goodput of 1 and 4 flows, ping under load, retransmits.
func RunS9(ctx context.Context, e *Env) error {
	e.Progress.Scenario("scenario 9: EIP QoS through a FIP (shape / police / upstream's script; RTT added by a delay line)")
	sec := e.Report.Section("s9", "Scenario 9: EIP QoS at 10 Mbit/s: shaping, policing and upstream's script")
	if why := netlab.Unavailable(); why != "" {
		sec.NotRun = why
		return nil
	}
	plan, err := s9PlanFor(e.Quick)
	if err != nil {
		sec.NotRun = err.Error()
		return err
	}
	planes := []s9Plane{s9Shape, s9Police, s9Upstream}
	up, cleanup, why := s9OpenUpstream(ctx)
	defer cleanup()
	if why != "" {
		planes = planes[:2]
		sec.Notes = append(sec.Notes, "upstream's script not measured: "+why)
	}
	dirs := []qoslab.Dir{qoslab.Download, qoslab.Upload}
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
				if unmodified, err = s9Unmodified(ctx, tp, ns, up); err != nil {
					return err
				}
			}
			for run := range plan.Runs {
				for _, dir := range dirs {
					for i := range planes {
						p := planes[(i+run)%len(planes)] // rotate which plane goes first
						k := s9Key{rtt, dir, p}
						if cells[k] == nil {
							cells[k] = &s9Cell{}
						}
						e.Progress.Printf("RTT %v, %s, %s: run %d/%d (%s so far)", rtt, dir, p, run+1, plan.Runs, time.Since(start).Round(time.Second))
						if err := s9Measure(ctx, tp, ns, up, p, dir, plan, cells[k]); err != nil {
							return fmt.Errorf("RTT %v, %s, %s, run %d: %w", rtt, dir, p, run+1, err)
						}
					}
				}
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

// s9Summary is one cell's figures.
type s9Summary struct {
	g1, g4, r1, r4, j4 float64
	idle, loadP50      float64
	loadP99            float64
	lost               float64 // pings under load lost, %
	runs               int
}

func summarizeS9(c *s9Cell) s9Summary {
	med := func(v []float64) float64 { return stats.Summarize(v).Median }
	l := stats.Summarize(c.loaded)
	s := s9Summary{g1: med(c.g1), g4: med(c.g4), r1: med(c.r1), r4: med(c.r4), j4: med(c.j4),
		idle: med(c.idle), loadP50: l.Median, loadP99: l.P99, lost: math.NaN(), runs: len(c.g1)}
	if c.pingsSent > 0 {
		s.lost = 100 * float64(c.pingsSent-len(c.loaded)) / float64(c.pingsSent)
	}
	return s
}

// reportS9 writes the table, the targets (natgw's default, shape) and the
// metrics (shape and police, each against upstream's script in the same
// run).
func reportS9(r *report.Report, sec *report.Section, plan s9Plan, planes []s9Plane, cells map[s9Key]*s9Cell, unmodified string, took time.Duration) {
	var rtts []string
	for _, d := range plan.RTTs {
		rtts = append(rtts, d.String())
	}
	sec.Text = append(sec.Text,
		fmt.Sprintf("One EIP limited to %d Mbit/s in both directions, through a FIP to a VPC host, in `internal/qoslab`'s lab "+
			"(ext ─ [delay line] ─ gw ─ vm; the nftables data plane in gw; RTT added by `internal/delayline`, a user-space relay: "+
			"this kernel has no netem). Flows are opened by the VPC host; download = ext sends to it (through the EIP), upload = it sends. "+
			"Planes: **shape** (`nat/shape`: HTB classes, natgw's default `--eip-qos=shape`), **police** (natgw's nftables limit, `--eip-qos=police`), "+
			"**upstream** (Kube-OVN v1.16.2's `nat-gateway.sh eip-ingress-qos-add` / `eip-egress-qos-add %s`, exec'd as kube-ovn-controller does: "+
			"its HTB class on net1 for upload and on an IFB of net1 for download, u32 filters). Burst 0 everywhere (tc's default for the HTB classes; "+
			"the policer's bucket is then one second of rate).", s9RateMbps, s9Rule()),
		fmt.Sprintf("Per cell, over %d run(s) (%v each, measured from %v; planes interleaved, the first one rotated per run): "+
			"goodput of 1 flow and of %d flows sharing the limit (median, %% of the rate: payload bytes delivered, so HTB's framing costs ~4%%), "+
			"Jain's index of the %d, the sender's retransmitted segments (%% of new segments, `/proc/net/snmp` of its namespace), "+
			"ping ext → EIP idle (median) and every %v while the 1-flow run fills the limit (median and p99 of every answered ping, pooled over the runs; lost %%). "+
			"RTTs: %s.", plan.Runs, plan.Dur, plan.Warm, s9Flows, s9Flows, s9PingEvery, strings.Join(rtts, ", ")))
	t := report.Table{
		Caption: fmt.Sprintf("**EIP QoS at %d Mbit/s** (goodput in %% of the rate)", s9RateMbps),
		Header:  []string{"RTT", "dir", "plane", "1 flow", fmt.Sprintf("%d flows", s9Flows), "Jain", "retr 1 flow", fmt.Sprintf("retr %d flows", s9Flows), "ping idle (ms)", "loaded p50 (ms)", "loaded p99 (ms)", "lost"},
	}
	f1 := func(x float64) string {
		if math.IsNaN(x) {
			return "–"
		}
		return strconv.FormatFloat(x, 'f', 1, 64)
	}
	f2 := func(x float64) string {
		if math.IsNaN(x) {
			return "–"
		}
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
	dirs := []qoslab.Dir{qoslab.Download, qoslab.Upload}
	for _, rtt := range plan.RTTs {
		for _, dir := range dirs {
			for _, p := range planes {
				c := cells[s9Key{rtt, dir, p}]
				if c == nil || len(c.g1) == 0 {
					continue
				}
				s := summarizeS9(c)
				t.Rows = append(t.Rows, []string{rtt.String(), string(dir), string(p), f1(s.g1), f1(s.g4), fmt.Sprintf("%.3f", s.j4),
					f2(s.r1), f2(s.r4), f1(s.idle), f1(s.loadP50), f1(s.loadP99), f1(s.lost) + "%"})
			}
		}
	}
	sec.Tables = append(sec.Tables, t)
	for _, rtt := range plan.RTTs {
		for _, dir := range dirs {
			c := cells[s9Key{rtt, dir, s9Shape}]
			name := fmt.Sprintf("S9 shape, RTT %v, %s", rtt, dir)
			if c == nil || len(c.g1) == 0 {
				sec.Targets = append(sec.Targets, report.Target{Name: name, Want: "measured", Got: "not measured", Reason: "the run failed (see the notes)"})
				continue
			}
			sec.Targets = append(sec.Targets, s9Targets(name, summarizeS9(c))...)
			base := cells[s9Key{rtt, dir, s9Upstream}]
			for _, p := range []s9Plane{s9Shape, s9Police} {
				pc := cells[s9Key{rtt, dir, p}]
				if pc == nil || len(pc.g1) == 0 {
					continue
				}
				ours, theirs := summarizeS9(pc), s9Summary{g1: math.NaN(), g4: math.NaN(), r1: math.NaN(), loadP99: math.NaN(), idle: math.NaN()}
				if base != nil && len(base.g1) > 0 {
					theirs = summarizeS9(base)
				}
				pre := fmt.Sprintf("s9.%s.%s.rtt=%dms.", p, dir, rtt.Milliseconds())
				r.AddMetric(
					report.NewMetric(pre+"goodput_1flow", "% of rate", report.HigherIsBetter, ours.g1, theirs.g1, "Kube-OVN v1.16.2 nat-gateway.sh, same run"),
					report.NewMetric(pre+fmt.Sprintf("goodput_%dflows", s9Flows), "% of rate", report.HigherIsBetter, ours.g4, theirs.g4, "Kube-OVN v1.16.2 nat-gateway.sh, same run"),
					report.NewMetric(pre+"retransmits_1flow", "% of segments", report.LowerIsBetter, ours.r1, theirs.r1, "Kube-OVN v1.16.2 nat-gateway.sh, same run"),
					report.NewMetric(pre+"ping_under_load_p99", "ms", report.LowerIsBetter, ours.loadP99, theirs.loadP99, "Kube-OVN v1.16.2 nat-gateway.sh, same run"),
				)
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
	sec.Notes = append(sec.Notes, fmt.Sprintf("%d RTT(s) × %d directions × %d planes × %d run(s) in %v.", len(plan.RTTs), len(dirs), len(planes), plan.Runs, took.Round(time.Second)))
}

// s9Targets checks one shape cell against bench/README.md's targets.
func s9Targets(name string, s s9Summary) []report.Target {
	lo, hi := 100*(1-s9GoodputTol), 100*(1+s9GoodputTol)
	in := func(x float64) bool { return x >= lo && x <= hi }
	added := s.loadP99 - s.idle
	g := report.Target{Name: name + ": goodput of 1 / " + strconv.Itoa(s9Flows) + " flows", Want: fmt.Sprintf("%.0f–%.0f%% of the rate", lo, hi),
		Got: fmt.Sprintf("%.1f%% / %.1f%%", s.g1, s.g4), Pass: in(s.g1) && in(s.g4)}
	if !g.Pass {
		g.Reason = "goodput counts payload; HTB counts whole frames (~4% headers)"
	}
	l := report.Target{Name: name + ": ping p99 under load − idle", Want: fmt.Sprintf("≤ %d ms", s9AddedP99.Milliseconds()),
		Got: fmt.Sprintf("%.1f ms (p99 %.1f, idle %.1f)", added, s.loadP99, s.idle), Pass: added <= float64(s9AddedP99.Milliseconds())}
	if math.IsNaN(added) {
		l.Got, l.Pass, l.Reason = "no pings answered", false, "every ping under load was lost"
	} else if !l.Pass {
		l.Reason = "the class's leaf queue (pfifo, no fq_codel in this kernel) fills up to the flow's window"
	}
	rt := report.Target{Name: name + ": retransmits, 1 / " + strconv.Itoa(s9Flows) + " flows", Want: fmt.Sprintf("≤ %.0f%% of segments", s9RetransBound),
		Got: fmt.Sprintf("%.2f%% / %.2f%%", s.r1, s.r4), Pass: s.r1 <= s9RetransBound && s.r4 <= s9RetransBound}
	return []report.Target{g, l, rt}
}
