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
HA kill -9 + pod gone   n=2 takeover p50=251ms p99=339ms | new conn to every EIP p50=262ms p99=344ms | established flows move again p50=296ms p99=1.475s (of 8)
HA net1 down            n=2 takeover p50=69ms p99=138ms | new conn to every EIP p50=75ms p99=143ms | established flows move again p50=207ms p99=209ms (of 8)
HA SIGSTOP n=2 takeover p50=bogus p99=1s | new conn to every EIP p50=1s p99=1s | established flows move again p50=1s p99=1s (of 8)
--- PASS: TestFailoverFigures (10.88s)
`)
	if _, err := parseHALines(out); err == nil {
		t.Fatal("a malformed duration was accepted")
	}
	out = out[:len(out)-len("HA SIGSTOP n=2 takeover p50=bogus p99=1s | new conn to every EIP p50=1s p99=1s | established flows move again p50=1s p99=1s (of 8)\n--- PASS: TestFailoverFigures (10.88s)\n")]
	ls, err := parseHALines(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []haLine{
		{Fault: "kill -9 + pod gone", N: 2, Flows: 8, TakeoverP50: 251 * time.Millisecond, TakeoverP99: 339 * time.Millisecond, NewConnP50: 262 * time.Millisecond, NewConnP99: 344 * time.Millisecond, EstablishedP50: 296 * time.Millisecond, EstabP99: 1475 * time.Millisecond},
		{Fault: "net1 down", N: 2, Flows: 8, TakeoverP50: 69 * time.Millisecond, TakeoverP99: 138 * time.Millisecond, NewConnP50: 75 * time.Millisecond, NewConnP99: 143 * time.Millisecond, EstablishedP50: 207 * time.Millisecond, EstabP99: 209 * time.Millisecond},
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
		t.Errorf("262/344 ms missed p50 ≤ 300, p99 ≤ 1000: %+v", g)
	}
	if g := gapTarget("x", ls[0].EstablishedP50, ls[0].EstabP99); g.Pass {
		t.Errorf("p99 1475 ms passed p99 ≤ 1000: %+v", g)
	}

	lags, err := parseLagLines([]byte(`ctsync standby entries with the DNAT binding and NAT status: 100 of 100
ctsync     paced 10000 new flows/s (offered 9980/s): lag p50=3.2ms p99=25.1ms max=40ms caught up=true; sender-measured (event→ack) p50=1ms p99=2ms; overruns=0; CPU of load+sender+receiver (one process) 80% of one core
conntrackd paced 10000 new flows/s (offered 9990/s): lag p50=120ms p99=1.2s max=2s caught up=false (40 of 200 steps); CPU of the load generator 30% of one core; CPU conntrackd active 12% standby 9% of one core
`))
	if err != nil {
		t.Fatal(err)
	}
	wantLag := []lagLine{
		{Who: "ctsync", Rate: 10000, Offered: 9980, P50: 3200 * time.Microsecond, P99: 25100 * time.Microsecond, CaughtUp: true},
		{Who: "conntrackd", Rate: 10000, Offered: 9990, P50: 120 * time.Millisecond, P99: 1200 * time.Millisecond},
	}
	if len(lags) != len(wantLag) {
		t.Fatalf("got %d lag lines, want %d: %+v", len(lags), len(wantLag), lags)
	}
	if c := lags[0]; c.CPU != 80 || !math.IsNaN(c.CPUActive) || !math.IsNaN(c.CPUStandby) {
		t.Errorf("ctsync CPU %v (active %v, standby %v), want 80 (one process, no split)", c.CPU, c.CPUActive, c.CPUStandby)
	}
	if c := lags[1]; c.CPU != 30+12+9 || c.CPUActive != 12 || c.CPUStandby != 9 {
		t.Errorf("conntrackd CPU %v (active %v, standby %v), want 51 (30 + 12 + 9)", c.CPU, c.CPUActive, c.CPUStandby)
	}
	for i := range wantLag {
		lags[i].CPU, lags[i].CPUActive, lags[i].CPUStandby = 0, 0, 0
		if lags[i] != wantLag[i] {
			t.Errorf("lag line %d: got %+v, want %+v", i, lags[i], wantLag[i])
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
			if l.Rate != 1000 || l.Offered < 500 || l.P99 <= 0 || l.P50 > l.P99 || math.IsNaN(l.CPU) || l.CPU <= 0 {
				t.Errorf("paced line %+v", l)
			}
		}
		if c := lags[1]; math.IsNaN(c.CPUActive) || math.IsNaN(c.CPUStandby) || c.CPU < c.CPUActive+c.CPUStandby {
			t.Errorf("conntrackd's CPU not split: %+v", c)
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

	t.Run("partition", func(t *testing.T) {
		e := &Env{HALab: buildLab(t, ctx, root, dir, "nat/ha"), Report: &report.Report{}}
		tg, err := s8Partition(ctx, e, "nftables")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(tg.Got, " ms") || !strings.Contains(tg.Want, "(150 ms)") || len(e.Report.Metrics) != 1 {
			t.Errorf("partition row %+v, metrics %+v", tg, e.Report.Metrics)
		}
	})
}
