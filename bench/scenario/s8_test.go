package scenario

import (
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/bench/report"
)

// TestS8ParseLabLines: scenario 8 reads the lines the labs' figure tests
// print (nat/ha failover_test.go, nat/ha/ctsync figures_test.go); a line
// whose shape changed must not be read as zero.
func TestS8ParseLabLines(t *testing.T) {
	out := []byte(`=== RUN   TestFailoverFigures
HA kill -9 + pod gone   n=3 takeover p50=148ms p99=175ms | new conn to every EIP p50=160ms p99=177ms | established flows move again p50=216ms p99=1.475s (of 12) | rules lost 0 of 21
HA net1 down            n=3 takeover p50=22ms p99=69ms | new conn to every EIP p50=27ms p99=78ms | established flows move again p50=209ms p99=214ms (of 12) | rules lost 2 of 21
HA old-shape            n=2 takeover p50=69ms p99=138ms | new conn to every EIP p50=75ms p99=143ms | established flows move again p50=207ms p99=209ms (of 8)
HA SIGSTOP n=2 takeover p50=bogus p99=1s | new conn to every EIP p50=1s p99=1s | established flows move again p50=1s p99=1s (of 8) | rules lost 0 of 14
--- PASS: TestFailoverFigures (10.88s)
`)
	if _, err := parseHALines(out); err == nil {
		t.Fatal("a malformed duration was accepted")
	}
	out = out[:len(out)-len("HA SIGSTOP n=2 takeover p50=bogus p99=1s | new conn to every EIP p50=1s p99=1s | established flows move again p50=1s p99=1s (of 8) | rules lost 0 of 14\n--- PASS: TestFailoverFigures (10.88s)\n")]
	ls, err := parseHALines(out)
	if err != nil {
		t.Fatal(err)
	}
	// The line without "rules lost" (the old shape) is no figure line.
	want := []haLine{
		{Fault: "kill -9 + pod gone", N: 3, Flows: 12, TakeoverP50: 148 * time.Millisecond, TakeoverP99: 175 * time.Millisecond, NewConnP50: 160 * time.Millisecond, NewConnP99: 177 * time.Millisecond, EstablishedP50: 216 * time.Millisecond, EstabP99: 1475 * time.Millisecond, RulesChecked: 21},
		{Fault: "net1 down", N: 3, Flows: 12, TakeoverP50: 22 * time.Millisecond, TakeoverP99: 69 * time.Millisecond, NewConnP50: 27 * time.Millisecond, NewConnP99: 78 * time.Millisecond, EstablishedP50: 209 * time.Millisecond, EstabP99: 214 * time.Millisecond, RulesLost: 2, RulesChecked: 21},
	}
	if len(ls) != len(want) {
		t.Fatalf("got %d lines, want %d: %+v", len(ls), len(want), ls)
	}
	for i := range want {
		if ls[i] != want[i] {
			t.Errorf("line %d: got %+v, want %+v", i, ls[i], want[i])
		}
	}
	if g := gapTarget("x", ls[0].NewConnP50, ls[0].NewConnP99); !g.Pass {
		t.Errorf("160/177 ms missed p50 ≤ 300, p99 ≤ 1000: %+v", g)
	}
	if g := gapTarget("x", ls[0].EstablishedP50, ls[0].EstabP99); g.Pass {
		t.Errorf("p99 1475 ms passed p99 ≤ 1000: %+v", g)
	}
	for _, tc := range []struct {
		l    haLine
		pass bool
	}{
		{ls[0], true},
		{ls[1], false},                         // 2 lost
		{haLine{N: 3, RulesChecked: 0}, false}, // nothing checked is no 0
	} {
		if g := rulesLostTarget("x", tc.l); g.Pass != tc.pass {
			t.Errorf("rules lost %d of %d: pass %t, want %t (%+v)", tc.l.RulesLost, tc.l.RulesChecked, g.Pass, tc.pass, g)
		}
	}

	lags, err := parseLagLines([]byte(`ctsync standby entries with the DNAT binding and NAT status: 100 of 100
ctsync     paced 10000 new flows/s (offered 9996/s): lag p50=3.7ms p99=12.5ms max=28.3ms caught up=true; sender-measured (event→ack) p50=3.8ms p99=12.9ms; overruns=0; CPU of the load generator 24% of one core; CPU ctsync active 18% standby 13% of one core
conntrackd paced 10000 new flows/s (offered 9990/s): lag p50=120ms p99=1.2s max=2s caught up=false (40 of 200 steps); CPU of the load generator 30% of one core; CPU conntrackd active 12% standby 9% of one core
ctsync     paced 50000 new flows/s (offered 49000/s): lag p50=3ms p99=20ms max=30ms caught up=true; sender-measured (event→ack) p50=1ms p99=2ms; overruns=0; CPU of load+sender+receiver (one process) 80% of one core
ctsync     paced 20000 new flows/s (offered 19000/s): lag p50=3ms p99=20ms max=30ms caught up=true; CPU of the load generator 30% of one core; CPU conntrackd active 12% standby 9% of one core
`))
	if err != nil {
		t.Fatal(err)
	}
	// The last two: the old one-process CPU text and another replicator's
	// CPU part are no CPU figure (NaN), not a wrong one.
	nan := math.NaN()
	wantLag := []lagLine{
		{Who: "ctsync", Rate: 10000, Offered: 9996, P50: 3700 * time.Microsecond, P99: 12500 * time.Microsecond, CaughtUp: true, CPULoad: 24, CPUActive: 18, CPUStandby: 13},
		{Who: "conntrackd", Rate: 10000, Offered: 9990, P50: 120 * time.Millisecond, P99: 1200 * time.Millisecond, CPULoad: 30, CPUActive: 12, CPUStandby: 9},
		{Who: "ctsync", Rate: 50000, Offered: 49000, P50: 3 * time.Millisecond, P99: 20 * time.Millisecond, CaughtUp: true, CPULoad: nan, CPUActive: nan, CPUStandby: nan},
		{Who: "ctsync", Rate: 20000, Offered: 19000, P50: 3 * time.Millisecond, P99: 20 * time.Millisecond, CaughtUp: true, CPULoad: nan, CPUActive: nan, CPUStandby: nan},
	}
	if len(lags) != len(wantLag) {
		t.Fatalf("got %d lag lines, want %d: %+v", len(lags), len(wantLag), lags)
	}
	same := func(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }
	for i, w := range wantLag {
		g := lags[i]
		if !same(g.CPULoad, w.CPULoad) || !same(g.CPUActive, w.CPUActive) || !same(g.CPUStandby, w.CPUStandby) {
			t.Errorf("lag line %d: CPU load %v active %v standby %v, want %v %v %v", i, g.CPULoad, g.CPUActive, g.CPUStandby, w.CPULoad, w.CPUActive, w.CPUStandby)
		}
		g.CPULoad, g.CPUActive, g.CPUStandby, w.CPULoad, w.CPUActive, w.CPUStandby = 0, 0, 0, 0, 0, 0
		if g != w {
			t.Errorf("lag line %d: got %+v, want %+v", i, g, w)
		}
	}
}

// TestS8CatchUpMiss: the lines a standby that did not catch up prints are
// rows with what it had, not zeros or a parse error.
func TestS8CatchUpMiss(t *testing.T) {
	ls, err := parseCatchUpLines([]byte(`conntrackd burst of 100000 new flows (created in 1.2s): standby has 73000 of them after 1m1.2s: not caught up
conntrackd full dump of 100000 concurrent flows to a reconnecting standby: has 0 of them after 1m0.001s: not caught up
ctsync burst of 100000 new flows (created in 1s): standby has them all after 2s: 50000 entries/s (events sent 1, overruns 0 → full dumps; receiver applied 1 failed 0)
ctsync full dump of 100000 concurrent flows to a reconnecting standby: 4s (25000 entries/s)
ctsync full dump of 100000 concurrent flows to a reconnecting standby: bogus (25000 entries/s)
`))
	if err == nil {
		t.Fatalf("a malformed duration was accepted: %+v", ls)
	}
	ls, err = parseCatchUpLines([]byte(`conntrackd burst of 100000 new flows (created in 1.2s): standby has 73000 of them after 1m1.2s: not caught up
conntrackd full dump of 100000 concurrent flows to a reconnecting standby: has 0 of them after 1m0.001s: not caught up
ctsync burst of 100000 new flows (created in 1s): standby has them all after 2s: 50000 entries/s (events sent 1, overruns 0 → full dumps; receiver applied 1 failed 0)
ctsync full dump of 100000 concurrent flows to a reconnecting standby: 4s (25000 entries/s)
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []catchUpLine{
		{Who: "conntrackd", Kind: "burst", Flows: 100000, After: 61200 * time.Millisecond, Has: 73000},
		{Who: "conntrackd", Kind: "full dump", Flows: 100000, After: 60001 * time.Millisecond},
		{Who: "ctsync", Kind: "burst", Flows: 100000, CaughtUp: true, After: 2 * time.Second, Has: 100000},
		{Who: "ctsync", Kind: "full dump", Flows: 100000, CaughtUp: true, After: 4 * time.Second, Has: 100000},
	}
	if len(ls) != len(want) {
		t.Fatalf("got %d lines, want %d: %+v", len(ls), len(want), ls)
	}
	for i := range want {
		if ls[i] != want[i] {
			t.Errorf("line %d: got %+v, want %+v", i, ls[i], want[i])
		}
	}
	if r := ls[2].Rate(); r != 50000 {
		t.Errorf("burst rate %v, want 50000", r)
	}
	if r := ls[0].Rate(); !math.IsNaN(r) {
		t.Errorf("a burst that did not catch up has rate %v, want NaN", r)
	}
	if _, err := parsePartition([]byte("HA-PARTITION two actives=bogus detection interval=150ms cut=2s\n")); err == nil {
		t.Error("a malformed partition line was accepted")
	}
	if _, err := parsePartition([]byte("--- PASS: TestPartition\n")); !errors.Is(err, errNoFigures) {
		t.Errorf("output without the line: %v, want errNoFigures", err)
	}
}

// buildLab compiles pkg's tests (as make bench-build does) into dir.
func buildLab(t *testing.T, ctx context.Context, root, dir, pkg string) string {
	t.Helper()
	bin := filepath.Join(dir, filepath.Base(pkg)+".test")
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, "./"+pkg)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go test -c ./%s: %v\n%s", pkg, err, out)
	}
	return bin
}

// TestS8LabOutput runs the labs' figure modes at a tiny size through the
// same runLab scenario 8 uses and parses their real output, so the lines
// the labs print and the parsers here cannot drift apart unseen.
func TestS8LabOutput(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the labs build network namespaces")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := moduleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()

	t.Run("replication", func(t *testing.T) {
		if _, err := exec.LookPath("conntrackd"); err != nil {
			t.Skip("conntrackd not installed (apt conntrackd): the lab skips its half")
		}
		bin := buildLab(t, ctx, root, dir, "nat/ha/ctsync")
		out, err := runLab(ctx, bin, "nat/ha/ctsync", "TestReplicationFigures|TestConntrackdFigures", 5*time.Minute,
			"NATGW_CTSYNC_FIGURES=1", "NATGW_CTSYNC_RATES=1000", "NATGW_CTSYNC_FLOWS=2000")
		if err != nil {
			t.Fatal(err)
		}
		lags, err := parseLagLines(out)
		if err != nil {
			t.Fatal(err)
		}
		if len(lags) != 2 || lags[0].Who != "ctsync" || lags[1].Who != "conntrackd" {
			t.Fatalf("paced lines %+v, want ctsync's and conntrackd's at 1000/s:\n%s", lags, lastLines(string(out), 20))
		}
		for _, l := range lags {
			if l.Rate != 1000 || l.Offered < 500 || l.P99 <= 0 || l.P50 > l.P99 {
				t.Errorf("paced line %+v", l)
			}
			// Both sides of both replicators are measured apart; the
			// load generator too (it always uses some CPU).
			if math.IsNaN(l.CPUActive) || math.IsNaN(l.CPUStandby) || math.IsNaN(l.CPULoad) || l.CPULoad <= 0 {
				t.Errorf("%s's CPU not split into load generator, active and standby: %+v", l.Who, l)
			}
		}
		cus, err := parseCatchUpLines(out)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, c := range cus {
			seen[c.Who+" "+c.Kind] = true
			if c.Flows != 2000 || !c.CaughtUp || c.After <= 0 || math.IsNaN(c.Rate()) {
				t.Errorf("catch-up line %+v", c)
			}
		}
		for _, k := range []string{"ctsync burst", "ctsync full dump", "conntrackd burst", "conntrackd full dump"} {
			if !seen[k] {
				t.Errorf("no %s line in:\n%s", k, lastLines(string(out), 20))
			}
		}
	})

	haLab := buildLab(t, ctx, root, dir, "nat/ha")
	t.Run("failover", func(t *testing.T) {
		out, err := runLab(ctx, haLab, "nat/ha", "TestFailoverFigures", 5*time.Minute, "NATGW_HA_FIGURES=1", "NATGW_HA_PLANE=nftables")
		if err != nil {
			t.Fatal(err)
		}
		ls, err := parseHALines(out)
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) != 3 {
			t.Fatalf("HA lines %+v, want one per fault:\n%s", ls, lastLines(string(out), 20))
		}
		for _, l := range ls {
			if l.N != 1 || l.Flows == 0 || l.NewConnP50 <= 0 || l.RulesChecked == 0 || l.RulesLost != 0 {
				t.Errorf("HA line %+v", l)
			}
		}
	})

	t.Run("partition", func(t *testing.T) {
		e := &Env{HALab: haLab, Report: &report.Report{}}
		tg, err := s8Partition(ctx, e, "nftables")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(tg.Got, " ms") || !strings.Contains(tg.Want, "(150 ms)") || len(e.Report.Metrics) != 1 {
			t.Errorf("partition row %+v, metrics %+v", tg, e.Report.Metrics)
		}
	})
}

// TestTestLines: a failed lab's error keeps what its tests wrote (the
// failure) even when a daemon's log fills its last lines.
func TestTestLines(t *testing.T) {
	for _, tc := range []struct{ name, out, want string }{
		{"fatal before a daemon log", "=== RUN   TestX\n    roles_test.go:174: the sender process ended without its counters: <nil>\n--- FAIL: TestX (1.00s)\n    figures_test.go:441: conntrackd sb log:\n        [Sat] (pid=1) [notice] started\nFAIL\n",
			"roles_test.go:174: the sender process ended without its counters: <nil> | --- FAIL: TestX (1.00s) | figures_test.go:441: conntrackd sb log:"},
		{"nothing written", "=== RUN   TestX\n--- PASS: TestX\nPASS\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := testLines([]byte(tc.out)); got != tc.want {
				t.Errorf("testLines = %q, want %q", got, tc.want)
			}
		})
	}
}
