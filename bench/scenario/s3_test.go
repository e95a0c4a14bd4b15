package scenario

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/netlab"
)

// TestS3Tiny runs scenario 3 with 5 burst and 3 paced FIPs on both data
// planes against a real kube-apiserver + etcd: the figures, targets,
// metrics and plot must all be produced.
func TestS3Tiny(t *testing.T) {
	e := controlPlaneEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	plan := QuickPlan()
	plan.S3Burst, plan.S3Paced, plan.S3Creators = 5, 3, 4
	var ours *s3Result
	s3Observe = func(r *s3Result) {
		if r.dp == s3Dataplanes[0] {
			ours = r
		}
	}
	defer func() { s3Observe = nil }()
	if err := runS3(ctx, e, plan); err != nil {
		t.Fatalf("scenario 3: %v", err)
	}
	sec := e.Report.Section("s3", "")
	if sec.NotRun != "" || len(sec.Tables) != 4 {
		t.Fatalf("not run %q, %d tables, want 4 (latency, burst breakdown, writes and floor, set-up); notes %v", sec.NotRun, len(sec.Tables), sec.Notes)
	}
	lat := sec.Tables[0]
	if len(lat.Rows) != 2*len(s3Dataplanes) {
		t.Fatalf("latency table has %d rows, want paced and burst per data plane: %v", len(lat.Rows), lat.Rows)
	}
	for _, r := range lat.Rows {
		for _, c := range r[2:] {
			if c == "failed" || c == "—" || c == "" {
				t.Errorf("latency row %v has cell %q", r, c)
			}
		}
		if want := map[string]string{"paced": "3", "burst": "5"}[r[1]]; r[2] != want {
			t.Errorf("row %v: %s FIPs, want %s", r, r[2], want)
		}
	}
	if got := len(sec.Tables[1].Rows); got != len(s3Dataplanes) {
		t.Errorf("burst breakdown has %d rows, want %d", got, len(s3Dataplanes))
	}
	if got := len(sec.Tables[2].Rows); got != len(s3Dataplanes) {
		t.Errorf("writes table has %d rows, want %d", got, len(s3Dataplanes))
	}
	for _, r := range sec.Tables[2].Rows {
		for _, c := range r {
			if c == "" || strings.Contains(c, "NaN") || strings.Contains(c, "Inf") {
				t.Errorf("writes row %v has cell %q", r, c)
			}
		}
	}
	// The new figures, from the nftables run: computed and sane.
	if ours == nil || ours.burst == nil {
		t.Fatal("no nftables burst")
	}
	w := s3WriteFigures(ours.burst)
	// At least the FIP's status write, and not a write storm; the
	// admission policy gave the finalizer, so no metadata patch of FIPs.
	if w.perFIP < 1 || w.perFIP > 4 || w.onFIPs < 1 || w.onFIPs > w.perFIP {
		t.Errorf("writes per FIP %v, on the FIPs %v: want 1 ≤ on FIPs ≤ per FIP ≤ 4 (breakdown %v)", w.perFIP, w.onFIPs, w.breakdown)
	}
	if n := ours.burst.createByKey[writeKey{verb: "PATCH", group: "kubeovn.io", resource: "iptables-fip-rules"}]; n != 0 {
		t.Errorf("%v metadata patches of FIPs in the burst: the admission policy should have given the finalizer (breakdown %v)", n, w.breakdown)
	}
	if n := ours.burst.createByKey[writeKey{verb: "POST", group: "kubeovn.io", resource: "iptables-fip-rules"}]; n != float64(ours.burst.n) {
		t.Errorf("%v FIP creates counted in the burst, want %d", n, ours.burst.n)
	}
	if !(w.plainRate > 0) || w.floor <= 0 || !(w.ratio > 0) || math.IsInf(w.ratio, 0) {
		t.Errorf("plain create rate %v, floor %v, ratio %v: want all > 0 and finite", w.plainRate, w.floor, w.ratio)
	}
	if len(sec.Targets) != 4 {
		t.Fatalf("%d targets, want writes per FIP, burst ratio, paced p50 and p99: %+v", len(sec.Targets), sec.Targets)
	}
	for i, want := range []string{"writes per FIP", "floor", "p50", "p99"} {
		if !strings.Contains(sec.Targets[i].Name, want) {
			t.Errorf("target %d %q does not name %q", i, sec.Targets[i].Name, want)
		}
	}
	for _, tg := range sec.Targets {
		if tg.Got == "not measured" || (!tg.Pass && tg.Reason == "") {
			t.Errorf("target %+v: not measured, or missed without a reason", tg)
		}
		if !strings.Contains(tg.Name, "nftables") {
			t.Errorf("target %q does not name the data plane", tg.Name)
		}
	}
	for _, dp := range s3Dataplanes {
		found := false
		for _, n := range sec.Notes {
			found = found || (strings.HasPrefix(n, dp+", paced: reconciles per create+delete cycle") && strings.Contains(n, "iptables-fip-rule"))
		}
		if !found {
			t.Errorf("no note of the %s controller's reconciles per paced FIP: %v", dp, sec.Notes)
		}
	}
	if len(e.Report.Metrics) != 12 {
		t.Errorf("%d metrics, want 12 (4 latencies per variant, 2 burst rates, the burst's writes per FIP and ratio to the floor)", len(e.Report.Metrics))
	}
	for _, m := range e.Report.Metrics {
		if m.Name == "s3.burst.controller_writes_per_fip" || m.Name == "s3.burst.last_ready_vs_api_floor" {
			// No baseline: the figure is a count, or already a ratio.
			if m.Ours == nil || *m.Ours <= 0 || m.Baseline != nil {
				t.Errorf("metric %s: %+v", m.Name, m)
			}
			continue
		}
		if m.Ours == nil || m.Baseline == nil || m.Ratio == nil || *m.Ours <= 0 || math.IsNaN(*m.Ours) {
			t.Errorf("metric %s incomplete: %+v", m.Name, m)
		}
	}
	checkPlot(t, e.OutDir, sec, "s3"+report.PlotExt)
}

// TestS3WriteFigures: writes per FIP exclude the benchmark's creates and
// count only kubeovn.io objects; the floor and the ratio follow from the
// plain create rate.
func TestS3WriteFigures(t *testing.T) {
	kov := "kubeovn.io"
	for _, tc := range []struct {
		name                   string
		byKey                  writeCounts
		wantPerFIP, wantOnFIPs float64
		wantFloor              time.Duration
		wantRatio              float64
		wantFirst              string
	}{
		{"status only", writeCounts{
			{"POST", kov, "iptables-fip-rules", ""}:        10,
			{"PATCH", kov, "iptables-fip-rules", "status"}: 10,
			{"PUT", "coordination.k8s.io", "leases", ""}:   3,
		}, 1, 1, 2 * time.Second, 2, "PATCH iptables-fip-rules/status 1"},
		{"finalizer and EIP status", writeCounts{
			{"POST", kov, "iptables-fip-rules", ""}:        10,
			{"PATCH", kov, "iptables-fip-rules", ""}:       10,
			{"PATCH", kov, "iptables-fip-rules", "status"}: 10,
			{"PATCH", kov, "iptables-eips", "status"}:      20,
		}, 4, 2, 5 * time.Second, 0.8, "PATCH iptables-eips/status 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// 10 FIPs; plain creates at 10/s; last Ready after 4 s.
			p := &s3Phase{n: 10, createByKey: tc.byKey, plainN: 10, plainSpan: time.Second, readySpan: 4 * time.Second}
			w := s3WriteFigures(p)
			if w.perFIP != tc.wantPerFIP || w.onFIPs != tc.wantOnFIPs || w.floor != tc.wantFloor || math.Abs(w.ratio-tc.wantRatio) > 1e-9 {
				t.Errorf("got per FIP %v, on FIPs %v, floor %v, ratio %v; want %v, %v, %v, %v", w.perFIP, w.onFIPs, w.floor, w.ratio, tc.wantPerFIP, tc.wantOnFIPs, tc.wantFloor, tc.wantRatio)
			}
			if len(w.breakdown) != len(tc.byKey) || !strings.HasPrefix(w.breakdown[0], tc.wantFirst) {
				t.Errorf("breakdown %v, want %d entries starting with %q", w.breakdown, len(tc.byKey), tc.wantFirst)
			}
		})
	}
	if w := s3WriteFigures(nil); !math.IsNaN(w.perFIP) || !math.IsNaN(w.ratio) {
		t.Errorf("no burst: %+v, want NaN figures", w)
	}
}

func TestParseWrites(t *testing.T) {
	got, err := parseWrites(`apiserver_request_total{code="201",group="kubeovn.io",resource="iptables-fip-rules",subresource="",verb="POST",version="v1"} 5
apiserver_request_total{code="409",group="kubeovn.io",resource="iptables-fip-rules",subresource="",verb="POST",version="v1"} 1
apiserver_request_total{code="200",group="kubeovn.io",resource="iptables-eips",subresource="status",verb="PATCH",version="v1"} 2
apiserver_request_total{code="200",group="kubeovn.io",resource="iptables-eips",subresource="status",verb="GET",version="v1"} 9
`)
	if err != nil {
		t.Fatal(err)
	}
	want := writeCounts{{"POST", "kubeovn.io", "iptables-fip-rules", ""}: 6, {"PATCH", "kubeovn.io", "iptables-eips", "status"}: 2}
	if len(got) != len(want) {
		t.Fatalf("parseWrites = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%v = %v, want %v", k, got[k], v)
		}
	}
}

func TestCountWrites(t *testing.T) {
	cases := []struct {
		name    string
		in      string
		want    float64
		wantErr bool
	}{
		{"mutating verbs only", `# HELP apiserver_request_total x
apiserver_request_total{code="201",resource="iptables-fip-rules",verb="POST"} 12
apiserver_request_total{code="200",resource="iptables-fip-rules",subresource="status",verb="PUT"} 3
apiserver_request_total{code="200",resource="iptables-fip-rules",verb="PATCH"} 2.5e+01
apiserver_request_total{code="200",resource="iptables-fip-rules",verb="DELETE"} 4 1700000000000
apiserver_request_total{code="200",resource="iptables-fip-rules",verb="LIST"} 100
apiserver_request_total{code="200",resource="iptables-fip-rules",verb="WATCH"} 7
apiserver_request_total_other{verb="POST"} 1000
`, 44, false},
		{"no sample", "apiserver_request_total{verb=\"GET\"} 3\n", 0, true},
		{"bad value", "apiserver_request_total{verb=\"POST\"} x\n", 0, true},
		{"no closing brace", "apiserver_request_total{verb=\"POST\" 3\n", 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := countWrites(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("countWrites = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// controlPlaneEnv is the Env of the control-plane scenarios' tests (3 and
// 6): quick, a temporary report, the envtest assets (required as root in
// CI, else the test skips) and the natgw agent built for the test.
func controlPlaneEnv(t *testing.T) *Env {
	t.Helper()
	if reason := netlab.Unavailable(); reason != "" {
		t.Skip(reason)
	}
	e := &Env{Quick: true, OutDir: t.TempDir(), Report: &report.Report{Title: "test"}, EnvtestAssets: apitest.Assets(), CRDDir: apitest.CRDDir()}
	if why := envtestReady(e); why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s (required as root in CI)", why)
		}
		t.Skip("SKIP: " + why)
	}
	e.Natgw = testAgentBinary(t)
	return e
}
