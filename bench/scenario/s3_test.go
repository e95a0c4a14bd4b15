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
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	plan := QuickPlan()
	plan.S3Burst, plan.S3Paced, plan.S3Creators = 5, 3, 4
	if err := runS3(ctx, e, plan); err != nil {
		t.Fatalf("scenario 3: %v", err)
	}
	sec := e.Report.Section("s3", "")
	if sec.NotRun != "" || len(sec.Tables) != 3 {
		t.Fatalf("not run %q, %d tables, want 3 (latency, burst breakdown, set-up); notes %v", sec.NotRun, len(sec.Tables), sec.Notes)
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
	if len(sec.Targets) != 4 {
		t.Fatalf("%d targets, want p50 and p99 for burst and paced", len(sec.Targets))
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
	if len(e.Report.Metrics) != 10 {
		t.Errorf("%d metrics, want 10 (4 latencies per variant, 2 burst rates)", len(e.Report.Metrics))
	}
	for _, m := range e.Report.Metrics {
		if m.Ours == nil || m.Baseline == nil || m.Ratio == nil || *m.Ours <= 0 || math.IsNaN(*m.Ours) {
			t.Errorf("metric %s incomplete: %+v", m.Name, m)
		}
	}
	checkPlot(t, e.OutDir, sec, "s3"+report.PlotExt)
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
