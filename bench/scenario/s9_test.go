package scenario

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/qoslab"
)

// TestS9Plan: the size NATGW_BENCH_S9 sets, and bad values refused with
// the field named.
func TestS9Plan(t *testing.T) {
	for _, tc := range []struct {
		env     string
		want    s9Plan
		wantErr string
	}{
		{env: "", want: s9Plan{RTTs: []time.Duration{0, 20 * time.Millisecond, 80 * time.Millisecond}, Runs: 3, Warm: 2 * time.Second, Dur: 6 * time.Second}},
		{env: "20ms,1,4s", want: s9Plan{RTTs: []time.Duration{20 * time.Millisecond}, Runs: 1, Warm: 2 * time.Second, Dur: 4 * time.Second}},
		{env: "0s+80ms,2,3s", want: s9Plan{RTTs: []time.Duration{0, 80 * time.Millisecond}, Runs: 2, Warm: 1500 * time.Millisecond, Dur: 3 * time.Second}},
		{env: "20ms,1", wantErr: "want RTT"},
		{env: "20xs,1,4s", wantErr: `RTT "20xs"`},
		{env: "20ms,0,4s", wantErr: `RUNS "0"`},
		{env: "20ms,1,1s", wantErr: `DURATION "1s"`},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv("NATGW_BENCH_S9", tc.env)
			got, err := s9PlanFor(false)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got.RTTs) != len(tc.want.RTTs) || got.Runs != tc.want.Runs || got.Warm != tc.want.Warm || got.Dur != tc.want.Dur {
				t.Fatalf("plan %+v, want %+v", got, tc.want)
			}
			for i := range got.RTTs {
				if got.RTTs[i] != tc.want.RTTs[i] {
					t.Errorf("RTT %d: %v, want %v", i, got.RTTs[i], tc.want.RTTs[i])
				}
			}
		})
	}
}

// TestReportS9: made-up figures give the table's rows, PASS/MISS against
// the targets and metrics with upstream's script as the baseline.
func TestReportS9(t *testing.T) {
	plan := s9Plan{RTTs: []time.Duration{20 * time.Millisecond}, Runs: 2, Warm: time.Second, Dur: 3 * time.Second}
	planes := []s9Plane{s9Shape, s9Police, s9Upstream}
	cells := map[s9Key]*s9Cell{
		{20 * time.Millisecond, qoslab.Download, s9Shape}: {g1: []float64{95, 96}, g4: []float64{94, 95}, r1: []float64{0, 0}, r4: []float64{0, 0.5}, j4: []float64{0.9, 0.95},
			idle: []float64{21, 21}, loaded: []float64{60, 70, 80}, pingsSent: 4},
		// upload: the shaper's latency misses
		{20 * time.Millisecond, qoslab.Upload, s9Shape}: {g1: []float64{95}, g4: []float64{95}, r1: []float64{0}, r4: []float64{0}, j4: []float64{0.9},
			idle: []float64{21}, loaded: []float64{60, 300}, pingsSent: 2},
		{20 * time.Millisecond, qoslab.Download, s9Police}: {g1: []float64{99}, g4: []float64{98}, r1: []float64{30}, r4: []float64{40}, j4: []float64{0.5},
			idle: []float64{21}, loaded: []float64{21}, pingsSent: 1},
		{20 * time.Millisecond, qoslab.Download, s9Upstream}: {g1: []float64{90}, g4: []float64{95}, r1: []float64{0}, r4: []float64{0}, j4: []float64{0.9},
			idle: []float64{21}, loaded: []float64{100}, pingsSent: 1},
	}
	r := &report.Report{}
	sec := r.Section("s9", "Scenario 9")
	reportS9(r, sec, plan, planes, cells, "", time.Minute)
	if len(sec.Tables) != 1 || len(sec.Tables[0].Rows) != 4 {
		t.Fatalf("tables %+v, want one with 4 rows", sec.Tables)
	}
	if row := sec.Tables[0].Rows[0]; strings.Join(row[:5], " ") != "20ms download shape 95.5 94.5" || row[11] != "25.0%" {
		t.Errorf("first row %v: want 20ms download shape 95.5 94.5 ... 25.0%% lost (3 of 4 answered)", row)
	}
	pass := map[string]bool{}
	for _, tg := range sec.Targets {
		pass[tg.Name] = tg.Pass
	}
	want := map[string]bool{
		"S9 shape, RTT 20ms, download: goodput of 1 / 4 flows":     true,
		"S9 shape, RTT 20ms, download: ping p99 under load − idle": true,
		"S9 shape, RTT 20ms, download: retransmits, 1 / 4 flows":   true,
		"S9 shape, RTT 20ms, upload: goodput of 1 / 4 flows":       true,
		"S9 shape, RTT 20ms, upload: ping p99 under load − idle":   false,
		"S9 shape, RTT 20ms, upload: retransmits, 1 / 4 flows":     true,
	}
	if len(pass) != len(want) {
		t.Errorf("targets %v, want %v", pass, want)
	}
	for n, w := range want {
		if got, ok := pass[n]; !ok || got != w {
			t.Errorf("target %q: pass %v (present %v), want %v", n, got, ok, w)
		}
	}
	var found bool
	for _, m := range r.Metrics {
		if m.Name == "s9.shape.download.rtt=20ms.goodput_1flow" {
			found = true
			if m.Ours == nil || *m.Ours != 95.5 || m.Baseline == nil || *m.Baseline != 90 {
				t.Errorf("metric %+v: want ours 95.5, baseline 90 (upstream)", m)
			}
		}
		if strings.Contains(m.Name, ".upload.") && m.Baseline != nil {
			t.Errorf("metric %s has a baseline, but upstream has no upload cell", m.Name)
		}
	}
	if !found {
		t.Error("no s9.shape.download.rtt=20ms.goodput_1flow metric")
	}
}

// TestS9Tiny runs the scenario at one RTT (0), one run of 2 s (as root):
// every plane, upstream's script included, must hold both directions near
// the rate (an unlimited veth carries Gbit/s).
func TestS9Tiny(t *testing.T) {
	if reason := netlab.Unavailable(); reason != "" {
		t.Skip(reason)
	}
	t.Setenv("NATGW_BENCH_S9", "0s,1,2s")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := &Env{Quick: true, OutDir: t.TempDir(), Report: &report.Report{Title: "test"}}
	if err := RunS9(ctx, e); err != nil {
		t.Fatalf("scenario 9: %v", err)
	}
	sec := e.Report.Section("s9", "")
	if sec.NotRun != "" {
		t.Fatalf("not run: %s", sec.NotRun)
	}
	rows := sec.Tables[0].Rows
	if len(rows) != 6 {
		t.Fatalf("%d rows, want 6 (2 directions × 3 planes): %v", len(rows), rows)
	}
	for _, row := range rows {
		for _, col := range []int{3, 4} { // 1 flow, 4 flows (% of the rate)
			var g float64
			if _, err := fmt.Sscan(row[col], &g); err != nil || g < 50 || g > 150 {
				t.Errorf("row %v: goodput %q not within 50–150%% of the rate: not limited (or starved)", row, row[col])
			}
		}
	}
	var note bool
	for _, n := range sec.Notes {
		note = note || strings.Contains(n, "Upstream's script as it is, on this kernel")
	}
	if !note {
		t.Errorf("notes %v: none says what upstream's script does unmodified", sec.Notes)
	}
}
