package scenario

import (
	"fmt"
	"math"
	"strconv"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/bench/stats"
)

// reportS6GW reports the second part of scenario 6.
func reportS6GW(e *Env, sec *report.Section, r *s6Result, runErr error) {
	x := r.gw
	p, m := x.plan, r.mix
	sec.Text = append(sec.Text,
		fmt.Sprintf("The same machinery as scenario 6 above (natgw-controller as its own process with `--transport=local`, %d workers; a real kube-apiserver + etcd with natgw's CRDs and admission policy; "+
			"each gateway a network namespace of this run with its own `natgw serve`, started by the controller), shaped as many small gateways: "+
			"%d gateways × %d rules (%d FIPs each with its own EIP, %d DNATs on %d EIPs, %d SNATs sharing one EIP: %d EIPs per gateway; gateways 250 apart reuse the same internal addresses, as VPCs may). ",
			p.Workers, p.Gateways, p.rulesOn(0), m.FIPs, m.DNATs, m.DNATEIPs, m.SNATs, m.EIPs())+
			fmt.Sprintf("Steps: every gateway's VpcNatGateway and %d EIPs for paced FIPs; **paced, ~0 objects**: %d FIPs one at a time (create, Ready, delete, gone); **load** as above; "+
				"**paced, idle**: the same paced FIPs with every object in place and nothing else happening; "+
				"**paced, under churn**: the same while a background churn creates %d DNATs per second round-robin over the gateways (each create on a gateway also deletes that gateway's previous churn DNAT: %d API writes/s, at most one churn object per gateway), "+
				"started %s before the paced FIPs (one round over every gateway, 5 s to 1 min); then the churn's DNATs deleted and gone, the queues drained; "+
				"**cold start** with every object in place and the kernel check as above. "+
				"**One change under load ÷ idle** is the paced FIP's create→Ready p50 (and p99) under churn divided by the same percentile idle, both with every object in place, in the same run. "+
				"The agents' memory is the sum over the controller's process group without the controller (its `natgw serve` children): VmRSS, and Pss (shared pages split between the processes that map them).",
				p.Paced+1, p.Paced, p.ChurnPerS, 2*p.ChurnPerS, s6ChurnWarmup(p)))
	s6ReportCommon(sec, r, runErr)
	agents := report.Table{Caption: "**the `natgw serve` agents' memory** (the controller's process group without the controller)",
		Header: []string{"when", "agents", "VmRSS, all agents", "largest agent's VmRSS", "Pss, all agents"}}
	for _, a := range []struct {
		when string
		a    *s6Agents
	}{{"gateways connected, before the load", x.agentsIdle}, {"every object Ready", x.agentsReady}, {"after the cold start, queues drained", x.agentsCold}} {
		if a.a != nil {
			agents.Rows = append(agents.Rows, []string{a.when, strconv.Itoa(a.a.n), report.Bytes(a.a.rss), report.Bytes(a.a.maxRSS), report.Bytes(a.a.pss)})
		}
	}
	if len(agents.Rows) > 0 {
		sec.Tables = append(sec.Tables, agents)
	}
	if c := x.churnStats; c.creates > 0 {
		sec.Tables = append(sec.Tables, report.Table{Caption: "**the churn**",
			Header: []string{"rate (creates/s)", "creates / deletes", "gateways changed", "ran for (creates/s achieved)", "creates during the paced FIPs (gateways changed)"},
			Rows: [][]string{{strconv.Itoa(c.perS), fmt.Sprintf("%d / %d", c.creates, c.deletes), strconv.Itoa(c.gateways),
				fmt.Sprintf("%s (%s/s)", report.Seconds(c.span.Seconds()), report.Count(float64(c.creates)/c.span.Seconds())),
				fmt.Sprintf("%d (%d)", c.pacedCreates, c.pacedGateways)}}})
	}
	total := 0
	for _, n := range r.counts {
		total += n
	}
	s6LatencyTable(sec, []s6PacedRow{
		{fmt.Sprintf("~0 (%d gateways, %d EIPs)", p.Gateways, p.Paced+1), r.base},
		{report.SizeLabel(total) + ", idle", x.idle},
		{report.SizeLabel(total) + fmt.Sprintf(", under churn (%d creates/s)", p.ChurnPerS), x.churn},
	})
	for _, h := range x.heapTop {
		sec.Tables = append(sec.Tables, report.Table{Caption: fmt.Sprintf("**natgw-controller heap profile** `%s` (inuse_space after a forced GC; `go tool pprof -top`, first %d lines)", h.profile, s6HeapTopLines),
			Header: []string{"flat", "flat%", "sum%", "cum", "cum%", "function"}, Rows: h.rows})
	}
	if x.heapTopError != "" {
		sec.Notes = append(sec.Notes, "Heap profile tops: "+x.heapTopError)
	}
	sec.Targets = append(sec.Targets, s6GWTargets(r)...)
	s6GWMetrics(e, r)
	sec.Notes = append(sec.Notes,
		"The controller, the agents, kube-apiserver, etcd and the benchmark's clients share the machine's CPUs (see CPUs and load average above).")
}

// s6GWSize names the part's size, and says when it is not the full one.
func s6GWSize(p s6GWPlan) string {
	s := fmt.Sprintf("%d gateways × %d rules", p.Gateways, p.rulesOn(0))
	if p.Gateways != s6GWFullGateways || p.Rules != s6GWFullGateways*s6GWRulesPerGW {
		s += fmt.Sprintf(" (not the full size: %d × %d)", s6GWFullGateways, s6GWRulesPerGW)
	}
	return s
}

// s6GWTargets are the second part's rows: controller RSS, cold start to
// every gateway synced, and one change under churn ÷ idle (p50, p99).
func s6GWTargets(r *s6Result) []report.Target {
	x := r.gw
	p := x.plan
	size := s6GWSize(p)
	var out []report.Target

	rss := report.Target{Name: "S6 " + size + ": natgw-controller RSS, the largest of VmRSS and peak VmHWM with every object Ready, after the cold start (its peak included) and sampled in every phase",
		Want: "≤ " + report.Bytes(s6GWTargetRSS)}
	if worst := s6WorstRSS(r); math.IsNaN(worst) || r.readyRSS <= 0 {
		rss.Got, rss.Reason = "not measured", "the run failed before every object was Ready (see the notes)"
	} else {
		rss.Got, rss.Pass = report.Bytes(worst), worst <= s6GWTargetRSS
		rss.Reason = s6RSSReason(r)
		if a := x.agentsReady; a != nil {
			rss.Reason += fmt.Sprintf("; the %d agents besides: VmRSS %s in all, Pss %s", a.n, report.Bytes(a.rss), report.Bytes(a.pss))
		}
	}
	out = append(out, rss)

	cold := math.NaN()
	if r.cold != nil {
		cold = r.cold.synced.Seconds()
	}
	ct := maxTarget("S6 "+size+": cold start, exec → every gateway synced (its \"gateway connected\" log line)", s6GWTargetCold, cold)
	if c := r.cold; c != nil {
		ct.Reason = fmt.Sprintf("caches synced after %s, first gateway synced after %s, queues drained after %s; the restart made %s API writes to natgw's objects, %d objects lost Ready; %d of %d gateways held exactly their objects",
			report.Seconds(c.workers.Seconds()), report.Seconds(c.firstSynced.Seconds()), report.Seconds(c.drained.Seconds()), report.Count(c.writes.natgw), c.lostReady, c.kernelOK, c.kernelTotal)
	}
	out = append(out, ct)

	return append(out, s6RatioRows(
		func(q string) string {
			return fmt.Sprintf("S6 %s: one change under load ÷ idle, %s: one FIP create→Ready (%d paced, one at a time, every object in place) while a churn creates %d DNATs/s and deletes as many, round-robin over every gateway ÷ the same with no other activity, same run",
				size, q, p.Paced, p.ChurnPerS)
		},
		s6GWTargetRatio, x.churn, x.idle, "under churn", "idle",
		func(get func(stats.Summary) float64) string {
			var s string
			if r.base != nil {
				s = fmt.Sprintf(", %s with ~0 objects", report.Seconds(get(r.base.ready)))
			}
			return s + fmt.Sprintf("; the churn made %d creates on %d gateways during the paced FIPs", x.churnStats.pacedCreates, x.churnStats.pacedGateways)
		})...)
}

// s6GWMetrics adds the second part's summary.json rows.
func s6GWMetrics(e *Env, r *s6Result) {
	for _, m := range s6GWMetricList(r) {
		e.Report.AddMetric(m)
	}
}

// s6GWMetricList is one summary.json row per target row (and the agents'
// memory, the other cold start times).
func s6GWMetricList(r *s6Result) []report.Metric {
	x := r.gw
	nan := math.NaN()
	var out []report.Metric
	add := func(name, unit, better string, v float64) {
		out = append(out, report.NewMetric("s6.gateways."+name, unit, better, v, nan, ""))
	}
	if worst := s6WorstRSS(r); !math.IsNaN(worst) && r.readyRSS > 0 {
		add("controller_rss", "bytes", report.LowerIsBetter, worst)
	}
	if a := x.agentsReady; a != nil {
		add("agents_rss", "bytes", report.LowerIsBetter, a.rss)
		add("agents_pss", "bytes", report.LowerIsBetter, a.pss)
	}
	if c := r.cold; c != nil {
		add("cold_start.all_synced", "s", report.LowerIsBetter, c.synced.Seconds())
		add("cold_start.first_synced", "s", report.LowerIsBetter, c.firstSynced.Seconds())
		add("cold_start.drained", "s", report.LowerIsBetter, c.drained.Seconds())
	}
	if x.idle != nil && x.churn != nil {
		const baseName = "the same paced FIPs with every object in place and no other activity"
		out = append(out,
			report.NewMetric("s6.gateways.churn.create_ready.p50", "s", report.LowerIsBetter, x.churn.ready.Median, x.idle.ready.Median, baseName),
			report.NewMetric("s6.gateways.churn.create_ready.p99", "s", report.LowerIsBetter, x.churn.ready.P99, x.idle.ready.P99, baseName))
	}
	return out
}
