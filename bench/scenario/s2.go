package scenario

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/bench/stats"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
)

// s2SizeEnv names the variable that sets scenario 2's bulk size for
// development: SIZE,REPS (e.g. "100000,3"): the one size of the bulk load,
// the resync and the agent's start-up (1..MaxFillers), and the
// repetitions of each. The one-at-a-time part keeps the mode's counts.
const s2SizeEnv = "NATGW_BENCH_S2"

// s2Size returns p with the size s2SizeEnv sets, or p when it is unset.
func s2Size(p Plan) (Plan, error) {
	v := os.Getenv(s2SizeEnv)
	if v == "" {
		return p, nil
	}
	f := strings.Split(v, ",")
	if len(f) != 2 {
		return p, fmt.Errorf("%s %q: want SIZE,REPS", s2SizeEnv, v)
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 1 || n > MaxFillers {
		return p, fmt.Errorf("%s %q: SIZE %q: want 1..%d", s2SizeEnv, v, f[0], MaxFillers)
	}
	reps, err := strconv.Atoi(f[1])
	if err != nil || reps < 1 {
		return p, fmt.Errorf("%s %q: REPS %q: want a count ≥ 1", s2SizeEnv, v, f[1])
	}
	p.S2SyncSizes, p.S2ResyncSizes, p.S2StartupSize, p.S2Reps, p.S2Env = []int{n}, []int{n}, n, reps, v
	return p, nil
}

// RunS2 measures bulk programming (N FIPs one request at a time vs one
// Sync), the resync of a gateway whose table was lost, and the agent's
// start-up on a big table (rebuilding its UID index from the kernel).
func RunS2(ctx context.Context, e *Env) error {
	plan, err := s2Size(e.plan())
	if err != nil {
		return err
	}
	e.Progress.Scenario("scenario 2: bulk programming and restart")
	sec := e.Report.Section("s2", "Scenario 2: bulk programming and restart")
	if plan.S2Env != "" {
		sec.Notes = append(sec.Notes, fmt.Sprintf("Size set by %s=%s (development size, not the mode's).", s2SizeEnv, plan.S2Env))
	}
	if e.Natgw == "" {
		sec.NotRun = "the natgw binary was not given (-natgw), and this scenario measures `natgw serve`"
		return nil
	}
	sec.Text = append(sec.Text,
		"natgw is driven through `natgw serve` (nftables data plane) over its pipe protocol, as the controller drives it; every size gets a fresh gateway namespace. "+
			"Baselines: Kube-OVN v1.16.2's own script (a) of scenario 1, one exec per FIP as its controller makes them, and one `iptables-legacy-restore` of all N FIPs — the fastest way iptables-legacy can load them (upstream has no bulk path).")
	var errs []error
	note := func(what string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
			sec.Notes = append(sec.Notes, fmt.Sprintf("%s failed: %v", what, err))
			e.Progress.Printf("%s: FAILED: %v", what, err)
		}
	}

	// One at a time.
	var agentOne, scriptOne time.Duration
	note("natgw serve, FIPs one at a time", withGateway(ctx, func(gw *netlab.Gateway) error {
		a, err := startAgentReady(ctx, e, gw.GW)
		if err != nil {
			return err
		}
		defer a.Close()
		start := time.Now()
		for i := 0; i < plan.S2OneByOne; i++ {
			e.Progress.Step(i+1, plan.S2OneByOne, "natgw serve: FIPs one request each")
			if err := a.Apply(ctx, Filler(i).Object()); err != nil {
				return a.wrap(err)
			}
		}
		agentOne = time.Since(start)
		return checkCount(ctx, a, plan.S2OneByOne)
	}))
	note("(a) upstream script, FIPs one at a time", withGateway(ctx, func(gw *netlab.Gateway) error {
		p, err := openUpstream(ctx, e, gw)
		if err != nil {
			return err
		}
		defer p.Close()
		if err := p.Preload(ctx, nil); err != nil {
			return err
		}
		start := time.Now()
		for i := 0; i < plan.S2ScriptOneByOne; i++ {
			e.Progress.Step(i+1, plan.S2ScriptOneByOne, "(a) upstream script: FIPs one exec each")
			if err := p.Add(ctx, Filler(i)); err != nil {
				return err
			}
		}
		scriptOne = time.Since(start)
		return nil
	}))
	one := report.Table{Caption: "**FIPs added one at a time**, starting from an empty gateway (one measurement each)",
		Header: []string{"method", "FIPs", "total", "per FIP (mean)"}}
	if agentOne > 0 {
		one.Rows = append(one.Rows, []string{"natgw serve, one apply request per FIP", fmt.Sprint(plan.S2OneByOne), report.Seconds(agentOne.Seconds()), report.Seconds(agentOne.Seconds() / float64(plan.S2OneByOne))})
	}
	if scriptOne > 0 {
		one.Rows = append(one.Rows, []string{"(a) upstream script, one exec per FIP", fmt.Sprint(plan.S2ScriptOneByOne), report.Seconds(scriptOne.Seconds()), report.Seconds(scriptOne.Seconds() / float64(plan.S2ScriptOneByOne))})
	}
	if agentOne > 0 && scriptOne > 0 {
		sec.Notes = append(sec.Notes, fmt.Sprintf("(a) adds fewer FIPs one at a time (%d) because its cost per FIP grows with the table; "+
			"compare the per-FIP means, and note (a)'s mean is over a smaller table, which favours (a).", plan.S2ScriptOneByOne))
		e.Report.AddMetric(report.NewMetric("s2.one_at_a_time.per_fip", "s", report.LowerIsBetter,
			agentOne.Seconds()/float64(plan.S2OneByOne), scriptOne.Seconds()/float64(plan.S2ScriptOneByOne), "(a) Kube-OVN v1.16.2 nat-gateway.sh, iptables-legacy"))
	}
	sec.Tables = append(sec.Tables, one)

	// One Sync vs one restore.
	bulk := report.Table{Caption: fmt.Sprintf("**bulk load of N FIPs into an empty gateway**, median of %d (min / max)", plan.S2Reps),
		Header: []string{"N", "natgw serve, one sync request", "natgw nftables backend in-process, one Sync", "iptables-legacy-restore (one exec)", "restore / serve sync"}}
	syncMed, restoreMed, inprocMed := map[int]float64{}, map[int]float64{}, map[int]float64{}
	for _, n := range plan.S2SyncSizes {
		var syncs, inproc, restores []float64
		note(fmt.Sprintf("bulk load at N=%s", report.SizeLabel(n)), withGateway(ctx, func(gw *netlab.Gateway) error {
			a, err := startAgentReady(ctx, e, gw.GW)
			if err != nil {
				return err
			}
			defer a.Close()
			objs := Objects(Fillers(false, n))
			for r := 0; r < plan.S2Reps+1; r++ {
				e.Progress.Step(r+1, plan.S2Reps+1, "natgw serve: one sync of %s FIPs (first is warm-up)", report.SizeLabel(n))
				if err := a.Sync(ctx, []nat.Object{}); err != nil {
					return a.wrap(err)
				}
				start := time.Now()
				if err := a.Sync(ctx, objs); err != nil {
					return a.wrap(err)
				}
				if r > 0 {
					syncs = append(syncs, since(start))
				}
			}
			return checkCount(ctx, a, n)
		}))
		note(fmt.Sprintf("in-process Sync at N=%s", report.SizeLabel(n)), withGateway(ctx, func(gw *netlab.Gateway) error {
			dp, err := openNftables(ctx, gw.Config())
			if err != nil {
				return err
			}
			defer dp.Close()
			objs := Objects(Fillers(false, n))
			for r := 0; r < plan.S2Reps+1; r++ {
				e.Progress.Step(r+1, plan.S2Reps+1, "nftables backend in-process: one Sync of %s FIPs (first is warm-up)", report.SizeLabel(n))
				if err := dp.Sync(ctx, []nat.Object{}); err != nil {
					return err
				}
				start := time.Now()
				if err := dp.Sync(ctx, objs); err != nil {
					return err
				}
				if r > 0 {
					inproc = append(inproc, since(start))
				}
			}
			return nil
		}))
		note(fmt.Sprintf("iptables-legacy-restore at N=%s", report.SizeLabel(n)), withGateway(ctx, func(gw *netlab.Gateway) error {
			p, err := openScript(legacyScript)(ctx, e, gw)
			if err != nil {
				return err
			}
			defer p.Close()
			fips := Fillers(false, n)
			for r := 0; r < plan.S2Reps+1; r++ {
				e.Progress.Step(r+1, plan.S2Reps+1, "iptables-legacy-restore of %s FIPs (first is warm-up)", report.SizeLabel(n))
				if err := p.Preload(ctx, nil); err != nil {
					return err
				}
				start := time.Now()
				if err := p.Preload(ctx, fips); err != nil {
					return err
				}
				if r > 0 {
					restores = append(restores, since(start))
				}
			}
			return nil
		}))
		s, ip, r := stats.Summarize(syncs), stats.Summarize(inproc), stats.Summarize(restores)
		syncMed[n], restoreMed[n], inprocMed[n] = s.Median, r.Median, ip.Median
		bulk.Rows = append(bulk.Rows, []string{report.SizeLabel(n), spread(s), spread(ip), spread(r), report.Times(report.Advantage(s.Median, r.Median, false))})
		e.Report.AddMetric(report.NewMetric("s2.bulk_load.N="+report.SizeLabel(n), "s", report.LowerIsBetter, s.Median, r.Median, "iptables-legacy-restore"))
		e.Progress.Printf("bulk N=%s: sync %s, restore %s", report.SizeLabel(n), report.Seconds(s.Median), report.Seconds(r.Median))
	}
	sec.Tables = append(sec.Tables, bulk)
	big := plan.S2SyncSizes[len(plan.S2SyncSizes)-1]
	st := maxTarget(fmt.Sprintf("S2 one Sync of %s FIPs through natgw serve%s", report.SizeLabel(big), quickNote(big, 100000)), s2TargetSync, syncMed[big])
	if !math.IsNaN(syncMed[big]) {
		st.Reason = fmt.Sprintf("in-process Sync of the same N: %s, so the agent's pipe and JSON cost %s", report.Seconds(inprocMed[big]), report.Seconds(syncMed[big]-inprocMed[big]))
	}
	sec.Targets = append(sec.Targets, st)

	// Resync after the table was lost.
	resync := report.Table{Caption: fmt.Sprintf("**resync after the table was lost** (`nft delete table ip %s` behind the agent's back), median of %d (min / max)", nftconn.MainTable, plan.S2Reps),
		Header: []string{"N", "info with fresh=true (re-read the kernel, new boot id)", "sync of all N", "total"}}
	for _, n := range plan.S2ResyncSizes {
		var infos, syncs, totals []float64
		note(fmt.Sprintf("resync at N=%s", report.SizeLabel(n)), withGateway(ctx, func(gw *netlab.Gateway) error {
			a, err := startAgentReady(ctx, e, gw.GW)
			if err != nil {
				return err
			}
			defer a.Close()
			ns, err := netns.Open(gw.GW)
			if err != nil {
				return err
			}
			defer ns.Close()
			objs := Objects(Fillers(false, n))
			for r := 0; r < plan.S2Reps; r++ {
				e.Progress.Step(r+1, plan.S2Reps, "resync of %s FIPs after the table was lost", report.SizeLabel(n))
				if err := a.Sync(ctx, objs); err != nil {
					return a.wrap(err)
				}
				before, err := a.Info(ctx)
				if err != nil {
					return a.wrap(err)
				}
				if _, err := run(ctx, ns, nil, nil, "nft", "delete", "table", "inet", string(nftconn.MainTable)); err != nil {
					return err
				}
				start := time.Now()
				resp, err := a.Do(ctx, agentapi.Request{Op: agentapi.OpInfo, Fresh: true})
				if err != nil {
					return a.wrap(err)
				}
				mid := time.Now()
				if resp.Info == nil || resp.Info.BootID == before.BootID {
					return fmt.Errorf("the agent did not report a new boot id after its table was deleted")
				}
				if err := a.Sync(ctx, objs); err != nil {
					return a.wrap(err)
				}
				end := time.Now()
				infos, syncs, totals = append(infos, mid.Sub(start).Seconds()), append(syncs, end.Sub(mid).Seconds()), append(totals, end.Sub(start).Seconds())
				if err := checkCount(ctx, a, n); err != nil {
					return err
				}
			}
			return nil
		}))
		t := stats.Summarize(totals)
		resync.Rows = append(resync.Rows, []string{report.SizeLabel(n), spread(stats.Summarize(infos)), spread(stats.Summarize(syncs)), spread(t)})
		e.Report.AddMetric(report.NewMetric("s2.resync_after_table_loss.N="+report.SizeLabel(n), "s", report.LowerIsBetter, t.Median, math.NaN(), ""))
	}
	sec.Tables = append(sec.Tables, resync)

	// Agent start-up on an empty and on a big table, and the in-process
	// load of the big table (the index rebuild alone).
	n := plan.S2StartupSize
	startup := report.Table{
		Caption: fmt.Sprintf("**agent start-up** on a gateway holding N FIPs: from exec of `natgw serve` until its first info answer, median of %d (min / max); "+
			"the agents have an index directory as in the gateway image (`NATGW_INDEX_DIR`), so a start after a clean stop takes the FIPs from the verified index snapshot instead of dumping the FIP maps (nat/README.md); "+
			"the in-process column is nftables.New alone without a snapshot (read the whole table back, build the index); "+
			"the CPU column is the agent process's user + system time over its life (start, the info request, stop on end of input), what each gateway's agent costs its node when a controller restarts", plan.S2Reps),
		Header: []string{"N", "natgw serve start-up", "nftables.New in-process", "natgw serve CPU"},
	}
	startMed := map[int]float64{}
	for _, size := range []int{0, n} {
		var starts, loads, cpus []float64
		note(fmt.Sprintf("agent start-up at N=%s", report.SizeLabel(size)), withGateway(ctx, func(gw *netlab.Gateway) error {
			// As in the gateway image (imagebuild.IndexDir): the agents
			// of this gateway share an index directory, here a temporary
			// one of this run.
			dir, err := os.MkdirTemp("", "natgw-bench-index-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			indexEnv := "NATGW_INDEX_DIR=" + dir
			a, err := startAgentReady(ctx, e, gw.GW, indexEnv)
			if err != nil {
				return err
			}
			if err := a.Sync(ctx, Objects(Fillers(false, size))); err != nil {
				a.Close()
				return a.wrap(err)
			}
			if err := a.Close(); err != nil {
				return err
			}
			for r := 0; r < plan.S2Reps+1; r++ {
				e.Progress.Step(r+1, plan.S2Reps+1, "agent start-up on %s FIPs (first is warm-up)", report.SizeLabel(size))
				start := time.Now()
				a, err := startAgent(e.Natgw, gw.GW, "nftables", indexEnv)
				if err != nil {
					return err
				}
				info, err := a.Info(ctx)
				d := since(start)
				cerr := a.Close()
				if err != nil {
					return a.wrap(err)
				}
				if cerr != nil {
					return cerr
				}
				if got := info.Counts[nat.KindFIP]; got != size {
					return fmt.Errorf("agent started with %d FIPs in its index, want %d", got, size)
				}
				start = time.Now()
				dp, err := openNftables(ctx, gw.Config())
				if err != nil {
					return err
				}
				ld := since(start)
				if err := dp.Close(); err != nil {
					return err
				}
				if r > 0 {
					starts, loads, cpus = append(starts, d), append(loads, ld), append(cpus, a.cpu().Seconds())
				}
			}
			return nil
		}))
		st, ld, cpu := stats.Summarize(starts), stats.Summarize(loads), stats.Summarize(cpus)
		startMed[size] = st.Median
		startup.Rows = append(startup.Rows, []string{report.SizeLabel(size), spread(st), spread(ld), spread(cpu)})
		e.Report.AddMetric(report.NewMetric("s2.agent_start_cpu.N="+report.SizeLabel(size), "s", report.LowerIsBetter, cpu.Median, math.NaN(), ""))
		if size == n {
			e.Report.AddMetric(report.NewMetric("s2.agent_startup.N="+report.SizeLabel(n), "s", report.LowerIsBetter, st.Median, math.NaN(), ""))
			t := maxTarget(fmt.Sprintf("S2 agent start-up (index rebuild) at %s%s", report.SizeLabel(n), quickNote(n, 100000)), s2TargetStartup, st.Median)
			if !math.IsNaN(st.Median) {
				t.Reason = fmt.Sprintf("start-up on an empty table: %s (process exec, Go runtime, netlink sockets); index rebuild in-process: %s", report.Seconds(startMed[0]), report.Seconds(ld.Median))
			}
			sec.Targets = append(sec.Targets, t)
		}
	}
	sec.Tables = append(sec.Tables, startup)
	s2Plot(e, plan, sec, syncMed, restoreMed)
	return errors.Join(errs...)
}

// withGateway runs fn on a fresh standard gateway topology with one VM.
func withGateway(ctx context.Context, fn func(gw *netlab.Gateway) error) error {
	return withLab(ctx, func(l *netlab.Lab) error {
		gw, err := l.Gateway(netlab.GatewayOptions{VMs: 1})
		if err != nil {
			return err
		}
		return fn(gw)
	})
}

// startAgentReady starts natgw serve (nftables) in ns and waits for its
// first answer.
func startAgentReady(ctx context.Context, e *Env, ns string, env ...string) (*agent, error) {
	a, err := startAgent(e.Natgw, ns, "nftables", env...)
	if err != nil {
		return nil, err
	}
	if _, err := a.Info(ctx); err != nil {
		a.Close()
		return nil, a.wrap(fmt.Errorf("agent info: %w", err))
	}
	return a, nil
}

// checkCount proves the agent holds n FIPs after re-reading the kernel.
func checkCount(ctx context.Context, a *agent, n int) error {
	resp, err := a.Do(ctx, agentapi.Request{Op: agentapi.OpInfo, Fresh: true})
	if err != nil {
		return a.wrap(err)
	}
	if resp.Info == nil || resp.Info.Counts[nat.KindFIP] != n {
		return fmt.Errorf("the kernel holds %v FIPs after the operation, want %d", resp.Info, n)
	}
	return nil
}

func spread(s stats.Summary) string {
	if s.N == 0 {
		return "—"
	}
	return fmt.Sprintf("%s (%s / %s)", report.Seconds(s.Median), report.Seconds(s.Min), report.Seconds(s.Max))
}

func quickNote(n, full int) string {
	if n == full {
		return ""
	}
	return fmt.Sprintf(" (quick mode: %s instead of %s)", report.SizeLabel(n), report.SizeLabel(full))
}

// maxTarget checks a median duration against a bound.
// Targets of scenario 2 at 100k FIPs (raised from 1 s and
// 0.5 s): one Sync through `natgw serve`, and the agent's start-up (its
// index rebuilt from the kernel).
const (
	s2TargetSync    = 700 * time.Millisecond
	s2TargetStartup = 300 * time.Millisecond
)

func maxTarget(name string, bound time.Duration, got float64) report.Target {
	t := report.Target{Name: name, Want: "≤ " + report.Seconds(bound.Seconds()), Got: report.Seconds(got), Pass: !math.IsNaN(got) && got <= bound.Seconds()}
	if math.IsNaN(got) {
		t.Got, t.Reason = "not measured", "the measurement failed (see the notes)"
	}
	return t
}

func s2Plot(e *Env, plan Plan, sec *report.Section, syncMed, restoreMed map[int]float64) {
	var cats []string
	var ys, rs []float64
	for _, n := range plan.S2SyncSizes {
		cats = append(cats, report.SizeLabel(n))
		ys, rs = append(ys, syncMed[n]), append(rs, restoreMed[n])
	}
	p := report.Panel{Title: "bulk load of N FIPs into an empty gateway", XLabel: "FIPs (N)", YLabel: "median (s), log scale", LogY: true, Categories: cats,
		Series: []report.Series{{Label: "iptables-legacy-restore (one exec)", Y: rs, Dashed: true}, {Label: "natgw serve, one sync request", Y: ys}}}
	path, name := e.plotPath("s2")
	if err := (report.Figure{Panels: []report.Panel{p}}).Save(path); err != nil {
		sec.Notes = append(sec.Notes, "plot failed: "+err.Error())
		return
	}
	sec.Plot = name
}
