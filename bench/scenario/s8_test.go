package scenario

import (
	"testing"
	"time"
)

// TestParseLabLines: scenario 8 reads the lines the labs' figure tests
// print (nat/ha failover_test.go, nat/ha/ctsync figures_test.go); a line
// whose shape changed must not be read as zero.
func TestParseLabLines(t *testing.T) {
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
conntrackd paced 10000 new flows/s (offered 9990/s): lag p50=120ms p99=1.2s max=2s caught up=false (40 of 200 steps); CPU of the load generator 30% of one core (conntrackd's own not counted)
`))
	if err != nil {
		t.Fatal(err)
	}
	wantLag := []lagLine{
		{Who: "ctsync", Rate: 10000, P50: 3200 * time.Microsecond, P99: 25100 * time.Microsecond, CaughtUp: true},
		{Who: "conntrackd", Rate: 10000, P50: 120 * time.Millisecond, P99: 1200 * time.Millisecond},
	}
	if len(lags) != len(wantLag) {
		t.Fatalf("got %d lag lines, want %d: %+v", len(lags), len(wantLag), lags)
	}
	for i := range wantLag {
		if lags[i] != wantLag[i] {
			t.Errorf("lag line %d: got %+v, want %+v", i, lags[i], wantLag[i])
		}
	}
}
