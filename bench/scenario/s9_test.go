package scenario

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
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
		{env: "", want: s9Plan{RTTs: []time.Duration{0, 20 * time.Millisecond}, Rates: []int{1, 10, 100}, Runs: 2, Warm: time.Second, Dur: 2500 * time.Millisecond}},
		{env: "20ms,10,1,4s", want: s9Plan{RTTs: []time.Duration{20 * time.Millisecond}, Rates: []int{10}, Runs: 1, Warm: time.Second, Dur: 4 * time.Second}},
		{env: "0s+80ms,1+100,2,2s", want: s9Plan{RTTs: []time.Duration{0, 80 * time.Millisecond}, Rates: []int{1, 100}, Runs: 2, Warm: time.Second, Dur: 2 * time.Second}},
		{env: "20ms,1,4s", wantErr: "want RTT"},
		{env: "20xs,10,1,4s", wantErr: `RTT "20xs"`},
		{env: "20ms,0,1,4s", wantErr: `RATE "0"`},
		{env: "20ms,10+x,1,4s", wantErr: `RATE "x"`},
		{env: "20ms,1001,1,4s", wantErr: `RATE "1001"`},
		{env: "20ms,10,0,4s", wantErr: `RUNS "0"`},
		{env: "20ms,10,1,1s", wantErr: `DURATION "1s"`},
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
			if len(got.Dirs) != 2 {
				t.Errorf("directions %v, want both", got.Dirs)
			}
			if !slices.Equal(got.RTTs, tc.want.RTTs) || !slices.Equal(got.Rates, tc.want.Rates) || got.Runs != tc.want.Runs || got.Warm != tc.want.Warm || got.Dur != tc.want.Dur {
				t.Fatalf("plan %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestReportS9: made-up figures give the table's rows, PASS/MISS against
// the targets and metrics with upstream's script as the baseline.
func TestReportS9(t *testing.T) {
	const ms20 = 20 * time.Millisecond
	plan := s9Plan{RTTs: []time.Duration{ms20}, Rates: []int{10}, Dirs: []qoslab.Dir{qoslab.Download, qoslab.Upload}, Runs: 2, Warm: time.Second, Dur: 3 * time.Second}
	planes := []s9Plane{s9Shape, s9Police, s9Upstream}
	good := func() *s9Cell {
		return &s9Cell{g1: []float64{95, 96}, g8: []float64{94, 95}, r1: []float64{0, 0}, r8: []float64{0, 0.5}, j8: []float64{0.9, 0.95},
			idle: []float64{21, 21}, loaded: []float64{60, 70, 80}, pingsSent: 4,
			udpRx: []float64{96, 97}, udpLoss: []float64{51, 52}, burst: []float64{0.95, 1.05}, burstMs: []float64{150, 170}}
	}
	// upload: each target misses once the figure it checks is off
	bad := good()
	bad.loaded, bad.pingsSent = []float64{60, 300}, 2
	bad.j8 = []float64{0.5}
	bad.udpLoss = []float64{60, math.NaN()} // NaN: not counted in the median
	bad.burst = []float64{2.2}
	bad.g8 = []float64{80, 85}
	bad.r8 = []float64{3}
	police := good()
	police.g1, police.r1 = []float64{99}, []float64{30}
	upstream := good()
	upstream.g1 = []float64{90}
	cells := map[s9Key]*s9Cell{
		{ms20, 10, qoslab.Download, s9Shape}:    good(),
		{ms20, 10, qoslab.Upload, s9Shape}:      bad,
		{ms20, 10, qoslab.Download, s9Police}:   police,
		{ms20, 10, qoslab.Download, s9Upstream}: upstream,
	}
	r := &report.Report{}
	sec := r.Section("s9", "Scenario 9")
	reportS9(r, sec, plan, planes, cells, "", time.Minute)
	if len(sec.Tables) != 1 || len(sec.Tables[0].Rows) != 6 {
		t.Fatalf("tables %+v, want one with 6 rows (2 not measured)", sec.Tables)
	}
	for _, i := range []int{4, 5} { // upload police and upstream: no cell
		if got := sec.Tables[0].Rows[i]; got[4] != "not measured: not run (see the notes)" || len(got) != len(sec.Tables[0].Header) {
			t.Errorf("row %d %q: want not measured, as wide as the header", i, got)
		}
	}
	row := sec.Tables[0].Rows[0]
	if got, want := strings.Join(row, " "), "20ms 10 Mbit/s download shape 95.5 94.5 0.925 0.00 0.25 21.0 70.0 79.8 25.0% 96.5 51.5% 1 1.00 160"; got != want {
		t.Errorf("first row\n%s\nwant\n%s", got, want)
	}
	pass := map[string]bool{}
	for _, tg := range sec.Targets {
		pass[tg.Name] = tg.Pass
	}
	want := map[string]bool{}
	for _, d := range []string{"download", "upload"} {
		ok := d == "download"
		pre := "S9 shape, RTT 20ms, 10 Mbit/s, " + d + ": "
		for _, n := range []string{"goodput of 1 / 8 flows", "fairness of 8 flows (Jain)", "ping p99 under load − idle",
			"retransmits, 1 / 8 flows", "UDP at 2×: delivered / loss", "burst of 1 MB passed above the rate"} {
			want[pre+n] = ok
		}
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
		if m.Name == "s9.shape.download.rate=10.rtt=20ms.goodput_1flow" {
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
		t.Error("no s9.shape.download.rate=10.rtt=20ms.goodput_1flow metric")
	}
}

// TestS9CellFailure: one cell's failed run (a dial timing out behind a
// saturated 1 Mbit/s limit) costs that cell only: every other cell of the
// same RTT runs all its runs and is reported with figures, the failed
// cell is not run again and its row and target say not measured with the
// error; slow dials are named in a note.
func TestS9CellFailure(t *testing.T) {
	plan := s9Plan{RTTs: []time.Duration{0}, Rates: []int{1, 10, 100}, Dirs: []qoslab.Dir{qoslab.Download, qoslab.Upload}, Runs: 2, Warm: time.Second, Dur: 2500 * time.Millisecond}
	planes := []s9Plane{s9Shape, s9Police, s9Upstream}
	bad := s9Key{0, 1, qoslab.Upload, s9Upstream}
	slow := s9Key{0, 1, qoslab.Upload, s9Shape}
	dialErr := errors.New("8 flows: qoslab: dial 7 from vm: dial tcp4 192.0.2.1:5001: i/o timeout")
	cells := map[s9Key]*s9Cell{}
	runs := map[s9Key][]int{}
	errs := s9RunCells(context.Background(), plan, planes, 0, cells, func(k s9Key, run int, c *s9Cell) error {
		runs[k] = append(runs[k], run)
		c.g1 = append(c.g1, 95) // the part before the failure ran
		if k == bad && run == 1 {
			return dialErr
		}
		c.g8, c.r1, c.r8, c.j8 = append(c.g8, 96), append(c.r1, 0), append(c.r8, 0), append(c.j8, 0.9)
		c.idle, c.loaded, c.pingsSent = append(c.idle, 0.2), append(c.loaded, 1, 2), c.pingsSent+2
		c.udpRx, c.udpLoss, c.burst, c.burstMs = append(c.udpRx, 97), append(c.udpLoss, 50), append(c.burst, 1), append(c.burstMs, 100)
		if k == slow {
			c.dialed(run, "8 flows", qoslab.TCPRun{Redials: 1, SlowestDial: 9500 * time.Millisecond})
		}
		return nil
	})
	if len(errs) != 1 || !errors.Is(errs[0], dialErr) || !strings.Contains(errs[0].Error(), "RTT 0s, 1 Mbit/s, upload, upstream: run 1: 8 flows") {
		t.Fatalf("errors %v, want the one cell's, named", errs)
	}
	if len(cells) != 3*2*3 {
		t.Fatalf("%d cells, want 18", len(cells))
	}
	for k := range cells {
		want := []int{1, 2}
		if k == bad {
			want = []int{1}
		}
		if !slices.Equal(runs[k], want) {
			t.Errorf("cell %v ran runs %v, want %v", k, runs[k], want)
		}
	}
	r := &report.Report{}
	sec := r.Section("s9", "Scenario 9")
	reportS9(r, sec, plan, planes, cells, "", time.Minute)
	rows := sec.Tables[0].Rows
	if len(rows) != 18 {
		t.Fatalf("%d rows, want 18", len(rows))
	}
	for _, row := range rows {
		isBad := row[1] == "1 Mbit/s" && row[2] == "upload" && row[3] == "upstream"
		if isBad {
			if !strings.HasPrefix(row[4], "not measured: run 1: 8 flows: qoslab: dial 7") || row[5] != "–" {
				t.Errorf("failed cell's row %q: want not measured with the error", row)
			}
			continue
		}
		if row[4] != "95.0" || row[5] != "96.0" {
			t.Errorf("row %q: want the cell's figures", row)
		}
	}
	var shapeTargets int
	for _, tg := range sec.Targets {
		if strings.Contains(tg.Got, "not measured") {
			t.Errorf("target %+v not measured; only upstream's cell failed", tg)
		}
		if strings.HasPrefix(tg.Name, "S9 shape, RTT 0s, ") {
			shapeTargets++
		}
	}
	if shapeTargets != 6*6 {
		t.Errorf("%d shape targets, want 36 (6 cells × 6)", shapeTargets)
	}
	for _, m := range r.Metrics {
		if strings.Contains(m.Name, ".upload.rate=1.") && m.Baseline != nil {
			t.Errorf("metric %s has a baseline from the failed upstream cell", m.Name)
		}
	}
	var note string
	for _, n := range sec.Notes {
		if strings.HasPrefix(n, "Flows' dials") {
			note = n
		}
	}
	if !strings.Contains(note, "RTT 0s, 1 Mbit/s, upload, shape: slowest dial 9.5s (run 1, 8 flows), 2 redial(s)") || strings.Count(note, "slowest dial") != 1 {
		t.Errorf("dial note %q: want the one slow cell (2 runs, 1 redial each)", note)
	}

	// A failed shape cell's targets say not measured with the error.
	cells[slow].err = errors.New("run 2: 1 flow: boom")
	r = &report.Report{}
	sec = r.Section("s9", "Scenario 9")
	reportS9(r, sec, plan, planes, cells, "", time.Minute)
	var found bool
	for _, tg := range sec.Targets {
		if tg.Name == "S9 shape, RTT 0s, 1 Mbit/s, upload" {
			found = tg.Got == "not measured" && tg.Reason == "not measured: run 2: 1 flow: boom"
		}
	}
	if !found {
		t.Errorf("targets %+v: want the failed shape cell's not measured, with its error", sec.Targets)
	}
}

// TestS9EIPClass: the EIP's class is the one HTB class besides
// upstream's default 1:9999; none or two are errors naming what was seen.
func TestS9EIPClass(t *testing.T) {
	const def = "class htb 1:9999 root prio 0 rate 10Gbit ceil 10Gbit burst 0b cburst 0b \n"
	for _, tc := range []struct {
		name, show, want, wantErr string
	}{
		{"one", def + "class htb 1:473b root leaf 8001: prio 0 rate 10Mbit ceil 10Mbit burst 1600b cburst 1600b \n", "1:473b", ""},
		{"none", def, "", "want one class besides 1:9999"},
		{"two", def + "class htb 1:473b root prio 0 rate 10Mbit\nclass htb 1:11 root prio 0 rate 1Mbit\n", "", `["1:473b" "1:11"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s9EIPClass(tc.show)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("s9EIPClass = %q, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("s9EIPClass = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestS9Tiny runs the scenario at one RTT (0), one rate (10 Mbit/s), one
// run of 2 s, download only (as root; 35–45 s here; both directions, 77 s):
// every plane, upstream's script included, must hold the rate for TCP
// (1 and 8 flows) and for UDP at twice it (an unlimited veth carries
// Gbit/s), and let most of the 1 MB burst through.
func TestS9Tiny(t *testing.T) {
	if reason := netlab.Unavailable(); reason != "" {
		t.Skip(reason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := &Env{Quick: true, OutDir: t.TempDir(), Report: &report.Report{Title: "test"}}
	sec := e.Report.Section("s9", "Scenario 9")
	plan := s9Plan{RTTs: []time.Duration{0}, Rates: []int{10}, Dirs: []qoslab.Dir{qoslab.Download}, Runs: 1, Warm: time.Second, Dur: 2 * time.Second}
	if err := runS9(ctx, e, sec, plan); err != nil {
		t.Fatalf("scenario 9: %v", err)
	}
	rows := sec.Tables[0].Rows
	if len(rows) != 3 {
		t.Fatalf("%d rows, want 3 (download × 3 planes): %v", len(rows), rows)
	}
	num := func(row []string, col int) float64 {
		var x float64
		if _, err := fmt.Sscan(strings.TrimSuffix(row[col], "%"), &x); err != nil {
			t.Errorf("row %v: column %d %q: %v", row, col, row[col], err)
		}
		return x
	}
	for _, row := range rows {
		for _, col := range []int{4, 5, 13} { // 1 flow, 8 flows, UDP at 2× delivered (% of the rate)
			if g := num(row, col); g < 50 || g > 150 {
				t.Errorf("row %v: column %d %q not within 50–150%% of the rate: not limited (or starved)", row, col, row[col])
			}
		}
		if b := num(row, 16); b < 0.5 { // the burst is 1 MB at 10 Mbit/s
			t.Errorf("row %v: %q MB passed above the rate, want ≥ 0.5 of the 1 MB burst", row, row[16])
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
