package scenario

import (
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/bench/report"
)

// TestStandbyLag: the standby lag is read from natgw-controller's metrics
// for the named gateway only; a value that is not a number of seconds is
// an error naming the metric, not a zero.
func TestStandbyLag(t *testing.T) {
	const other = `# HELP natgw_gateway_standby_lag_seconds How long ...
# TYPE natgw_gateway_standby_lag_seconds gauge
natgw_gateway_standby_lag_seconds{gateway="s7ha1"} 9
`
	for _, tc := range []struct {
		name, text string
		want       time.Duration
		ok         bool
		err        string
	}{
		{"in step", other + `natgw_gateway_standby_lag_seconds{gateway="s7ha2"} 0` + "\n", 0, true, ""},
		{"lagging", other + `natgw_gateway_standby_lag_seconds{gateway="s7ha2"} 0.0125` + "\n", 12500 * time.Microsecond, true, ""},
		{"exponent", `natgw_gateway_standby_lag_seconds{gateway="s7ha2"} 1.5e-01` + "\n", 150 * time.Millisecond, true, ""},
		{"absent", other, 0, false, ""},
		{"prefix of another gateway's name", `natgw_gateway_standby_lag_seconds{gateway="s7ha20"} 3` + "\n", 0, false, ""},
		{"not a number", `natgw_gateway_standby_lag_seconds{gateway="s7ha2"} soon` + "\n", 0, false, `value "soon"`},
		{"negative", `natgw_gateway_standby_lag_seconds{gateway="s7ha2"} -1` + "\n", 0, false, `value "-1"`},
		{"NaN", `natgw_gateway_standby_lag_seconds{gateway="s7ha2"} NaN` + "\n", 0, false, `value "NaN"`},
		{"no value", `natgw_gateway_standby_lag_seconds{gateway="s7ha2"}` + "\n", 0, false, "no value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := standbyLag(strings.NewReader(tc.text), "s7ha2")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "natgw_gateway_standby_lag_seconds") {
					t.Fatalf("err %v, want one naming the metric and %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestReportS7HA: the two-replica comparison's table, target and metrics
// (made-up figures): PASS at a ratio ≤ 1.5, MISS above, not measured (with
// the reason) without a result.
func TestReportS7HA(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var out []time.Duration
		for _, x := range n {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		res       *s7HAResult
		notRun    string
		pass      bool
		got       string
		ratio     string
		metrics   int
		lagMetric bool
	}{
		{"pass", &s7HAResult{One: ms(100, 100, 120), Two: ms(140, 150, 400), Lag: 20 * time.Millisecond, LagScrapes: 12}, "", true, "1.50 (150.0 / 100.0 ms)", "1.50", 3, true},
		{"miss, lag not seen", &s7HAResult{One: ms(100, 100, 120), Two: ms(150, 151, 400)}, "", false, "1.51 (151.0 / 100.0 ms)", "1.51", 2, false},
		{"not run", nil, "kube-ovn-controller missing", false, "not measured", "", 0, false},
		{"one side empty", &s7HAResult{One: ms(100)}, "", false, "not measured", "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &report.Report{}
			sec := r.Section("s7", "Scenario 7")
			reportS7HA(r, sec, tc.res, tc.notRun)
			if len(sec.Targets) != 1 {
				t.Fatalf("targets %+v, want one", sec.Targets)
			}
			tg := sec.Targets[0]
			if tg.Pass != tc.pass || tg.Got != tc.got || tg.Want != "≤ 1.5" || tg.Reason != tc.notRun {
				t.Errorf("target %+v: want pass %v, got %q, want ≤ 1.5, reason %q", tg, tc.pass, tc.got, tc.notRun)
			}
			if len(r.Metrics) != tc.metrics {
				t.Fatalf("%d metrics %+v, want %d", len(r.Metrics), r.Metrics, tc.metrics)
			}
			if tc.metrics == 0 {
				if len(sec.Tables) != 0 {
					t.Errorf("a table without a result: %+v", sec.Tables)
				}
				return
			}
			if len(sec.Tables) != 1 || len(sec.Tables[0].Rows) != 2 {
				t.Fatalf("tables %+v, want one with two rows", sec.Tables)
			}
			if row := sec.Tables[0].Rows[1]; row[0] != "2" || row[4] != tc.ratio {
				t.Errorf("two-replica row %v: want ratio %s", row, tc.ratio)
			}
			m := r.Metrics[0]
			if m.Name != "s7_ha_fip_ready_paced_p50" || m.Ours == nil || m.Baseline == nil || *m.Baseline != 100 || m.BaselineName != "one replica" {
				t.Errorf("p50 metric %+v: want ours the two-replica p50, baseline 100 (one replica)", m)
			}
			var lag bool
			for _, m := range r.Metrics {
				if !strings.HasPrefix(m.Name, "s7_ha_") {
					t.Errorf("metric %s: want the s7_ha_ prefix", m.Name)
				}
				lag = lag || m.Name == "s7_ha_standby_lag_max"
			}
			if lag != tc.lagMetric {
				t.Errorf("standby lag metric present %v, want %v", lag, tc.lagMetric)
			}
		})
	}
}
