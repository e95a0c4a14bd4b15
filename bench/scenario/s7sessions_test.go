package scenario

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/bench/report"
)

func TestPerSession(t *testing.T) {
	for _, tc := range []struct {
		name          string
		with, without float64
		n             int
		want          float64
	}{
		{"cost", 150, 50, 100, 1},
		{"less with sessions (noise)", 40, 50, 10, -1},
		{"one", 3, 1, 1, 2},
		{"no sessions", 150, 50, 0, math.NaN()},
		{"negative n", 150, 50, -2, math.NaN()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := perSession(tc.with, tc.without, tc.n)
			if math.IsNaN(tc.want) != math.IsNaN(got) || (!math.IsNaN(tc.want) && got != tc.want) {
				t.Errorf("perSession(%v, %v, %d) = %v, want %v", tc.with, tc.without, tc.n, got, tc.want)
			}
		})
	}
}

func TestCPUCores(t *testing.T) {
	for _, tc := range []struct {
		name                string
		before, after, wall time.Duration
		want                float64
	}{
		{"half a core", time.Second, 6 * time.Second, 10 * time.Second, 0.5},
		{"two cores", 0, 20 * time.Second, 10 * time.Second, 2},
		{"idle", time.Second, time.Second, 10 * time.Second, 0},
		{"process replaced", 5 * time.Second, time.Second, 10 * time.Second, math.NaN()},
		{"no wall time", 0, time.Second, 0, math.NaN()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := cpuCores(tc.before, tc.after, tc.wall)
			if math.IsNaN(tc.want) != math.IsNaN(got) || (!math.IsNaN(tc.want) && math.Abs(got-tc.want) > 1e-9) {
				t.Errorf("cpuCores = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestS7ParseProc(t *testing.T) {
	const expo = `# HELP natgw_gateway_connected 1 while a session to the gateway's agent is open.
# TYPE natgw_gateway_connected gauge
natgw_gateway_connected{dataplane="nftables",gateway="s7s000"} 1
natgw_gateway_connected{dataplane="iptables",gateway="s7s000"} 0
natgw_gateway_connected{dataplane="nftables",gateway="s7s001"} 0
natgw_resyncs_total{gateway="s7s000",reason="bootid"} 1
natgw_resyncs_total{gateway="s7s000",reason="connect"} 2
natgw_resyncs_total{gateway="s7s001",reason="drift"} 1e+00
natgw_transport_reconnects_total{gateway="s7s001"} 3
natgw_gateway_objects{gateway="s7s000",kind="fip"} 2
natgw_gateway_connectedness{gateway="s7s000"} 9
process_start_time_seconds 1.7649e+09
controller_runtime_reconcile_total{controller="fip",result="success"} 12
`
	connected, pr, err := s7ParseProc(expo)
	if err != nil {
		t.Fatal(err)
	}
	if connected["s7s000"] != 1 || connected["s7s001"] != 0 || len(connected) != 2 {
		t.Errorf("connected = %v, want s7s000 1, s7s001 0", connected)
	}
	if pr.start != 1.7649e+09 {
		t.Errorf("start = %v", pr.start)
	}
	for k, want := range map[[2]string]float64{{"s7s000", "bootid"}: 1, {"s7s000", "connect"}: 2, {"s7s001", "drift"}: 1} {
		if pr.resyncs[k] != want {
			t.Errorf("resyncs%v = %v, want %v", k, pr.resyncs[k], want)
		}
	}
	if len(pr.resyncs) != 3 || pr.reconnects["s7s001"] != 3 || len(pr.reconnects) != 1 {
		t.Errorf("resyncs %v, reconnects %v", pr.resyncs, pr.reconnects)
	}
	for _, bad := range []string{
		"natgw_resyncs_total{gateway=\"a\",reason=\"x\"} many\n",
		"natgw_resyncs_total{gateway=\"a\",reason=\"x\" 1\n",
	} {
		if _, _, err := s7ParseProc(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestS7CounterDeltas(t *testing.T) {
	proc := func(start float64, bootid, connect, reconnects float64) s7Proc {
		return s7Proc{start: start,
			resyncs:    map[[2]string]float64{{"g0", "bootid"}: bootid, {"g0", "connect"}: connect, {"other", "bootid"}: 7},
			reconnects: map[string]float64{"g0": reconnects, "other": 5}}
	}
	before := s7Snapshot{procs: map[string]s7Proc{"10.0.0.1": proc(100, 1, 0, 0), "10.0.0.2": proc(100, 0, 0, 0)}}
	after := s7Snapshot{procs: map[string]s7Proc{
		// The old leader's container restarted: a new process, counters from 0.
		"10.0.0.1": proc(200, 0, 0, 0),
		// The standby, same process, became the leader: bootid 1, one reconnect.
		"10.0.0.2": proc(100, 1, 2, 1),
		// A pod not scraped before: all of it counts.
		"10.0.0.3": proc(300, 1, 0, 0),
	}}
	resyncs, reconnects := s7CounterDeltas(before, after, []string{"g0"})
	if resyncs["bootid"] != 2 || resyncs["connect"] != 2 || len(resyncs) != 2 {
		t.Errorf("resyncs = %v, want bootid 2, connect 2 (a restarted process's counters are not subtracted from)", resyncs)
	}
	if reconnects != 1 {
		t.Errorf("reconnects = %v, want 1", reconnects)
	}
	// The same process throughout: plain differences.
	same := s7Snapshot{procs: map[string]s7Proc{"10.0.0.1": proc(100, 1, 3, 2)}}
	resyncs, reconnects = s7CounterDeltas(s7Snapshot{procs: map[string]s7Proc{"10.0.0.1": proc(100, 1, 1, 0)}}, same, []string{"g0"})
	if resyncs["connect"] != 2 || resyncs["bootid"] != 0 || reconnects != 2 {
		t.Errorf("same process: resyncs %v, reconnects %v; want connect 2, reconnects 2", resyncs, reconnects)
	}
}

func TestS7ResyncsText(t *testing.T) {
	if got := s7ResyncsText(12, map[string]float64{"connect": 2, "bootid": 10}); got != "12 (bootid 10, connect 2)" {
		t.Errorf("got %q", got)
	}
	if got := s7ResyncsText(0, nil); got != "0" {
		t.Errorf("got %q", got)
	}
}

func TestLinesLost(t *testing.T) {
	const base = "table ip natgw {\n\tchain pre {\n\t\tip daddr 192.0.2.10 dnat to 10.0.0.1\n\t\tip daddr 192.0.2.10 dnat to 10.0.0.1\n\t}\n}\n"
	for _, tc := range []struct {
		name, before, after string
		want                int
	}{
		{"same", base, base, 0},
		{"indentation only", base, strings.ReplaceAll(base, "\t", "  "), 0},
		{"one of two equal lines gone", base, strings.Replace(base, "\t\tip daddr 192.0.2.10 dnat to 10.0.0.1\n", "", 1), 1},
		{"table gone", base, "", 6},
		{"added only", base, base + "table ip other {\n}\n", 0},
		{"nothing before", "", base, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := linesLost(tc.before, tc.after); got != tc.want {
				t.Errorf("linesLost = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestChangedVersions(t *testing.T) {
	before := map[string]string{"eip/a": "1", "fip/b": "2", "gw/c": "3"}
	for _, tc := range []struct {
		name  string
		after map[string]string
		want  int
	}{
		{"none", map[string]string{"eip/a": "1", "fip/b": "2", "gw/c": "3"}, 0},
		{"one written", map[string]string{"eip/a": "1", "fip/b": "7", "gw/c": "3"}, 1},
		{"one gone", map[string]string{"eip/a": "1", "fip/b": "2"}, 1},
		{"new object only", map[string]string{"eip/a": "1", "fip/b": "2", "gw/c": "3", "fip/z": "9"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := changedVersions(before, tc.after); got != tc.want {
				t.Errorf("changedVersions = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestReportS7Sessions(t *testing.T) {
	mib := float64(1 << 20)
	ok := &s7SessResult{N: 50, FIPs: 2, Window: 30 * time.Second,
		Pods:      s7Load{APIServer: procUse{CPU: 0.10, RSS: 300 * mib}, Kubelet: procUse{CPU: 0.05, RSS: 80 * mib}},
		Held:      s7Load{APIServer: procUse{CPU: 0.15, RSS: 350 * mib}, Kubelet: procUse{CPU: 0.10, RSS: 100 * mib}},
		Reconnect: 3 * time.Second}
	for _, tc := range []struct {
		name   string
		res    *s7SessResult
		pass   bool
		reason string
	}{
		{"pass", ok, true, ""},
		{"slow", func() *s7SessResult { r := *ok; r.Reconnect = 12 * time.Second; return &r }(), false, "took 12.00 s"},
		{"not all", func() *s7SessResult { r := *ok; r.ReconnectErr = "3 of 50 gateways not connected"; return &r }(), false, "3 of 50"},
		{"rule lost", func() *s7SessResult { r := *ok; r.Lost = 2; return &r }(), false, "2 rule lines lost"},
		{"resync", func() *s7SessResult { r := *ok; r.Resyncs = 1; return &r }(), false, "1 resyncs"},
		{"resync reasons", func() *s7SessResult {
			r := *ok
			r.Resyncs, r.ResyncReasons = 50, map[string]float64{"bootid": 50}
			return &r
		}(), false, "50 (bootid 50) resyncs"},
		{"leader changed", func() *s7SessResult { r := *ok; r.LeaderBefore, r.LeaderAfter = "a_1", "b_2"; return &r }(), true, "leader changed"},
		{"quick size", func() *s7SessResult { r := *ok; r.N = 10; return &r }(), true, "quick size"},
		{"quick size and slow", func() *s7SessResult { r := *ok; r.N = 10; r.Reconnect = 11 * time.Second; return &r }(), false, "took 11.00 s"},
		{"not measured", nil, false, "no cluster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &report.Report{}
			sec := &report.Section{}
			reportS7Sessions(r, sec, tc.res, "no cluster")
			if len(sec.Targets) != 1 {
				t.Fatalf("%d targets, want 1", len(sec.Targets))
			}
			tg := sec.Targets[0]
			if tg.Pass != tc.pass || !strings.Contains(tg.Reason, tc.reason) {
				t.Errorf("target %+v, want pass %v and a reason with %q", tg, tc.pass, tc.reason)
			}
			if tc.res == nil {
				if len(r.Metrics) != 0 {
					t.Errorf("metrics without a result: %v", r.Metrics)
				}
				return
			}
			m := map[string]float64{}
			for _, x := range r.Metrics {
				if x.Ours != nil {
					m[x.Name] = *x.Ours
				}
			}
			// (0.15 − 0.10) cores ÷ N (50: 0.1 % of a core); (350 − 300) MiB ÷ N (50: 1024 KiB).
			n := float64(tc.res.N)
			for name, want := range map[string]float64{
				"s7_sessions_apiserver_cpu_per_session": 5 / n,
				"s7_sessions_apiserver_rss_per_session": 50 * 1024 / n,
				"s7_sessions_kubelet_cpu_per_session":   5 / n,
				"s7_sessions_kubelet_rss_per_session":   20 * 1024 / n,
			} {
				if got, ok := m[name]; !ok || math.Abs(got-want) > 1e-9*want {
					t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
				}
			}
			if _, has := m["s7_sessions_reconnect_all"]; has != (tc.res.ReconnectErr == "") {
				t.Errorf("s7_sessions_reconnect_all present %v with ReconnectErr %q", has, tc.res.ReconnectErr)
			}
		})
	}
}
