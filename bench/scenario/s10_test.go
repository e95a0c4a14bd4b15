package scenario

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// TestS10Plan: the size NATGW_BENCH_S10 sets, and bad values refused with
// the part named.
func TestS10Plan(t *testing.T) {
	for _, tc := range []struct {
		env         string
		quick       bool
		n, conns    int
		wantErr     string
		wantSpread  int
		wantBackend string
	}{
		{env: "", quick: false, n: 0, conns: 0, wantSpread: 2, wantBackend: "iptables"},
		{env: "", quick: true, n: 0, conns: 2000, wantSpread: 1},
		{env: "1000,500", quick: true, n: 1000, conns: 500, wantSpread: 1},
		{env: "1000", wantErr: "want SHARE_N,CONNS"},
		{env: "0,500", wantErr: `SHARE_N "0"`},
		{env: "200000,500", wantErr: `SHARE_N "200000"`},
		{env: "1000,99", wantErr: `CONNS "99"`},
		{env: "1000,many", wantErr: `CONNS "many"`},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(s10SizeEnv, tc.env)
			p, err := s10PlanFor(tc.quick)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), s10SizeEnv) {
					t.Fatalf("error %v, want one naming %s and %q", err, s10SizeEnv, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.ShareN != tc.n || p.Conns != tc.conns || len(p.Spread) != tc.wantSpread || p.Env != tc.env {
				t.Errorf("plan %+v, want N %d, conns %d, %d spread backends, env %q", p, tc.n, tc.conns, tc.wantSpread, tc.env)
			}
			if _, ok := p.BenchTime[tc.wantBackend]; tc.wantBackend != "" && !ok {
				t.Errorf("plan %+v has no benchtime for %s", p, tc.wantBackend)
			}
		})
	}
}

func TestParseShareDNATBench(t *testing.T) {
	out := "goos: linux\nBenchmarkShareDNAT-2   \t     200\t    812345 ns/op\t        41.5 µs-plain/op\t        63.2 µs-share/op\t         1.523 share/plain\nPASS\n"
	ls := parseBenchLines(out)
	if len(ls) != 1 || ls[0].Name != "ShareDNAT" || ls[0].N != 200 {
		t.Fatalf("parsed %+v", ls)
	}
	for k, want := range map[string]float64{"µs-plain/op": 41.5, "µs-share/op": 63.2, "share/plain": 1.523, "ns/op": 812345} {
		if got, ok := ls[0].Metrics[k]; !ok || got != want {
			t.Errorf("%s = %v (%v), want %v", k, got, ok, want)
		}
	}
}

func TestParseShareSpread(t *testing.T) {
	out := `=== RUN   TestConformance/ShareDNAT/Spread
    share.go:197: SHARE-SPREAD nftables IPv4 backends=1 conns=10000 even=10000.0 min=10000 max=10000 tolerance=±1000.0 within-10%=true
    share.go:197: SHARE-SPREAD nftables IPv4 backends=64 conns=10000 even=156.2 min=120 max=190 tolerance=±62.0 within-10%=false
--- PASS: TestConformance/ShareDNAT/Spread (12.00s)
`
	ls := parseShareSpread(out)
	if len(ls) != 2 {
		t.Fatalf("parsed %d lines, want 2: %+v", len(ls), ls)
	}
	if d := ls[0].maxDeviation(); d != 0 {
		t.Errorf("1 backend: deviation %v, want 0", d)
	}
	l := ls[1]
	if l.Backends != 64 || l.Conns != 10000 || l.Min != 120 || l.Max != 190 {
		t.Errorf("line %+v", l)
	}
	// max(156.2−120, 190−156.2) / 156.2
	if d, want := l.maxDeviation(), (156.2-120)/156.2; math.Abs(d-want) > 1e-9 {
		t.Errorf("64 backends: deviation %v, want %v", d, want)
	}
	if s := l.sigma(); s < 0.07 || s > 0.09 {
		t.Errorf("64 backends at 10,000: σ %v of even, want ≈0.079", s)
	}
	if ls := parseShareSpread("PASS\n"); len(ls) != 0 {
		t.Errorf("parsed %d lines from output without any", len(ls))
	}
}

// TestShareSpreadOutput runs the spread case scenario 10 reads (a few
// hundred connections per backend count) and parses its real output, so
// the SHARE-SPREAD line nattest writes and the parser here cannot drift
// apart unseen (they did once: the family token added to the line made
// every full-size spread row "failed").
func TestShareSpreadOutput(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the spread case builds network namespaces")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	root, err := moduleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err := goTest(ctx, root, 10*time.Minute, []string{shareConnsEnv + "=1000"},
		"-count", "1", "-v", "-run", "^TestConformance$/^ShareDNAT$/^Spread$", s10Packages["nftables"])
	if err != nil {
		t.Fatal(err)
	}
	ls := parseShareSpread(out)
	if len(ls) != 4 { // backend counts 1, 2, 8, 64
		t.Fatalf("parsed %d SHARE-SPREAD lines, want 4: %s", len(ls), lastLines(out, 8))
	}
	for _, l := range ls {
		if l.Conns != 1000 || l.Backends < 1 || l.Min > l.Max {
			t.Errorf("line %+v", l)
		}
	}
}
