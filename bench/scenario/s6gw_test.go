package scenario

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/bench/stats"
	v1 "github.com/natgw/natgw/controller/api/v1"
)

func TestS6GWPlanFor(t *testing.T) {
	for _, c := range []struct {
		env            string
		quick          bool
		gws, rules, ch int
		bad            bool
	}{
		{env: "", gws: 1000, rules: 100000, ch: 20},
		{env: "", quick: true, gws: 100, rules: 10000, ch: 20},
		{env: "10,50", quick: true, gws: 10, rules: 500, ch: 20},
		{env: " 200 , 100 , 5", gws: 200, rules: 20000, ch: 5},
		{env: "1000,100,1000", gws: 1000, rules: 100000, ch: 1000},
		{env: "10", bad: true},
		{env: "10,x", bad: true},
		{env: "10,100,5,1", bad: true},
		{env: "1001,100", bad: true}, // more gateways than the plan holds
		{env: "10,2", bad: true},     // fewer than one rule of each kind
		{env: "10,100,0", bad: true}, // no churn
		{env: "0,100", bad: true},
	} {
		t.Setenv(s6GWSizeEnv, c.env)
		p, err := s6GWPlanFor(c.quick)
		switch {
		case c.bad && err == nil:
			t.Errorf("%s=%q accepted: %+v", s6GWSizeEnv, c.env, p)
		case !c.bad && err != nil:
			t.Errorf("%s=%q: %v", s6GWSizeEnv, c.env, err)
		case !c.bad && (p.Gateways != c.gws || p.Rules != c.rules || p.ChurnPerS != c.ch):
			t.Errorf("%s=%q quick %v: %d gateways, %d rules, churn %d; want %d, %d, %d", s6GWSizeEnv, c.env, c.quick, p.Gateways, p.Rules, p.ChurnPerS, c.gws, c.rules, c.ch)
		}
	}
}

func TestS6Parts(t *testing.T) {
	for _, c := range []struct {
		env        string
		rules, gws bool
		bad        bool
	}{{"", true, true, false}, {"rules", true, false, false}, {"gateways", false, true, false}, {"both", false, false, true}} {
		t.Setenv(s6PartEnv, c.env)
		r, g, err := s6Parts()
		if (err != nil) != c.bad || r != c.rules || g != c.gws {
			t.Errorf("%s=%q: rules %v, gateways %v, %v", s6PartEnv, c.env, r, g, err)
		}
	}
}

// TestS6ObjectsManyGateways: at 1,000 gateways the load still has unique
// names and EIP addresses, and gateways share internal addresses only
// 250 apart (never with the paced FIPs' net).
func TestS6ObjectsManyGateways(t *testing.T) {
	p, err := s6GWPlanFor(false)
	if err != nil {
		t.Fatal(err)
	}
	eips, rules := s6Objects(p.s6Plan)
	if len(rules) != 100000 || len(eips) != 1000*s6MixOf(100).EIPs() {
		t.Fatalf("%d rules, %d EIPs", len(rules), len(eips))
	}
	names, addrs := map[string]bool{}, map[string]bool{}
	for _, o := range append(eips, rules...) {
		if names[o.obj.GetName()] {
			t.Fatalf("name %s twice", o.obj.GetName())
		}
		names[o.obj.GetName()] = true
		if e, ok := o.obj.(*v1.IptablesEIP); ok {
			if addrs[e.Spec.V4ip] {
				t.Fatalf("EIP address %s twice", e.Spec.V4ip)
			}
			addrs[e.Spec.V4ip] = true
		}
		if f, ok := o.obj.(*v1.IptablesFIPRule); ok {
			want := s6Host(o.gw%250, 0).As4()[1]
			if got := strings.Split(f.Spec.InternalIP, ".")[1]; got != strconv.Itoa(int(want)) || got == "250" {
				t.Fatalf("FIP %s on gateway %d: internal %s", f.Name, o.gw, f.Spec.InternalIP)
			}
		}
	}
	// The churn's DNATs: on the gateway's first DNAT EIP, ports above the
	// load's, an internal host the load does not use.
	ch := newS6Churn(nil, p, s6MixOf(100))
	d := ch.dnat(1003, 3)
	if d.Spec.EIP != "eip-g003-dnat000" || d.Spec.ExternalPort != "20001" || !names[d.Spec.EIP] {
		t.Errorf("churn DNAT %+v", d.Spec)
	}
	for _, o := range rules {
		if r, ok := o.obj.(*v1.IptablesDnatRule); ok && o.gw == 3 && r.Spec.InternalIP == d.Spec.InternalIP {
			t.Fatalf("churn DNAT's internal host %s used by %s", d.Spec.InternalIP, r.Name)
		}
	}
}

// TestS6GWTargets: the rows pass and miss on their bounds, say what was
// found, and have a summary.json metric each.
func TestS6GWTargets(t *testing.T) {
	paced := func(p50, p99 float64) *s6Paced {
		return &s6Paced{ready: stats.Summary{N: 30, Median: p50, P99: p99}}
	}
	full := s6GWPlan{s6Plan: s6Plan{Gateways: 1000, Rules: 100000, Paced: 30, Creators: 16, Workers: 4}, ChurnPerS: 20}
	result := func(ready, hwm, coldHWM float64, synced time.Duration, idle, churn *s6Paced) *s6Result {
		r := &s6Result{plan: full.s6Plan, mix: s6MixOf(100), readyRSS: ready, readyHWM: hwm, idleRSS: 50 << 20,
			peaks: []s6PhasePeak{{"load: rules created until Ready", hwm}},
			gw:    &s6GW{plan: full, idle: idle, churn: churn, agentsReady: &s6Agents{n: 1000, rss: 9 << 30, pss: 4 << 30}, churnStats: s6ChurnStats{pacedCreates: 60, pacedGateways: 60}}}
		if synced > 0 {
			r.cold = &s6Cold{synced: synced, firstSynced: synced / 4, drained: 2 * synced, rss: ready, hwm: coldHWM, kernelOK: 1000, kernelTotal: 1000}
		}
		return r
	}
	for _, c := range []struct {
		name   string
		r      *s6Result
		pass   [4]bool
		got    [4]string
		reason [4]string
	}{
		{"all pass", result(100<<20, 200<<20, 250<<20, 8*time.Second, paced(0.02, 0.05), paced(0.03, 0.09)),
			[4]bool{true, true, true, true}, [4]string{"250 MiB", "8 s", "1.50×", "1.80×"},
			[4]string{"after the cold start 100 MiB, its peak 250 MiB", "first gateway synced after 2 s", "30 ms under churn, 20 ms idle", "creates on 60 gateways"}},
		{"cold start's peak misses RSS, slow cold start, churn 3×", result(100<<20, 200<<20, 300<<20, 12*time.Second, paced(0.02, 0.05), paced(0.06, 0.2)),
			[4]bool{false, false, false, false}, [4]string{"300 MiB", "12 s", "3.00×", "4.00×"},
			[4]string{"1000 agents besides", "queues drained after 24 s", "60 ms under churn", "200 ms under churn, 50 ms idle"}},
		{"failed before Ready", result(0, 0, 0, 0, nil, nil),
			[4]bool{}, [4]string{"not measured", "not measured", "not measured", "not measured"},
			[4]string{"failed before every object was Ready", "failed", "before both paced phases", "before both paced phases"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts := s6GWTargets(c.r)
			if len(ts) != 4 {
				t.Fatalf("%d rows, want 4", len(ts))
			}
			for i, tg := range ts {
				if tg.Pass != c.pass[i] || tg.Got != c.got[i] || !strings.Contains(tg.Reason, c.reason[i]) || !strings.Contains(tg.Name, "1000 gateways × 100 rules") {
					t.Errorf("row %d: %+v; want pass %v, got %q, reason with %q", i, tg, c.pass[i], c.got[i], c.reason[i])
				}
			}
			names := map[string]report.Metric{}
			for _, m := range s6GWMetricList(c.r) {
				names[m.Name] = m
			}
			want := []string{"s6.gateways.controller_rss", "s6.gateways.cold_start.all_synced", "s6.gateways.cold_start.first_synced", "s6.gateways.cold_start.drained",
				"s6.gateways.churn.create_ready.p50", "s6.gateways.churn.create_ready.p99", "s6.gateways.agents_rss"}
			if c.r.readyRSS == 0 {
				want = []string{"s6.gateways.agents_rss"}
				if len(names) != 2 {
					t.Errorf("metrics of a failed run: %v", names)
				}
			}
			for _, n := range want {
				if _, ok := names[n]; !ok {
					t.Errorf("no metric %s in %v", n, names)
				}
			}
			if m, ok := names["s6.gateways.controller_rss"]; ok && (m.Ours == nil || math.Abs(*m.Ours-s6WorstRSS(c.r)) > 0) {
				t.Errorf("controller_rss metric %+v", m)
			}
		})
	}
	if !strings.Contains(s6GWSize(s6GWPlan{s6Plan: s6Plan{Gateways: 100, Rules: 10000}}), "not the full size") {
		t.Error("the quick size is not named as such")
	}
}

func TestS6ParsePprofTop(t *testing.T) {
	out := `File: natgw-controller
Type: inuse_space
Showing nodes accounting for 100MB, 90% of 111MB total
Dropped 50 nodes (cum <= 0.5MB)
Showing top 3 nodes out of 120
      flat  flat%   sum%        cum   cum%
   40.50MB 36.49% 36.49%    40.50MB 36.49%  k8s.io/apimachinery/pkg/apis/meta/v1.(*ObjectMeta).Unmarshal
      20MB 18.02% 54.50%       30MB 27.03%  github.com/natgw/natgw/nat.(*Set).Insert (inline)
   10.25kB  0.01% 54.51%    10.25kB  0.01%  runtime.malg
`
	rows := s6ParsePprofTop(out, 2)
	if len(rows) != 2 || rows[0][0] != "40.50MB" || rows[1][5] != "github.com/natgw/natgw/nat.(*Set).Insert (inline)" || rows[1][4] != "27.03%" {
		t.Errorf("rows %q", rows)
	}
	if rows := s6ParsePprofTop("no header\n 1MB 1% 1% 1MB 1% f\n", 5); len(rows) != 0 {
		t.Errorf("rows without a header: %q", rows)
	}
}

func TestS6Pss(t *testing.T) {
	if p := s6Pss("Rss:  100 kB\nPss:   40 kB\nPss_Anon: 3 kB\n"); p != 40*1024 {
		t.Errorf("Pss %v", p)
	}
	if p := s6Pss("Rss: 1 kB\n"); p != 0 {
		t.Errorf("Pss without a line: %v", p)
	}
}

func TestS6ChurnWarmup(t *testing.T) {
	for _, c := range []struct {
		gws, rate int
		want      time.Duration
	}{{1000, 20, 50 * time.Second}, {100, 20, 5 * time.Second}, {1000, 5, time.Minute}, {300, 20, 15 * time.Second}} {
		if got := s6ChurnWarmup(s6GWPlan{s6Plan: s6Plan{Gateways: c.gws}, ChurnPerS: c.rate}); got != c.want {
			t.Errorf("%d gateways at %d/s: %v, want %v", c.gws, c.rate, got, c.want)
		}
	}
}
