package scenario

import (
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/clusterstack"
)

// TestReportS7: the table has one row per data plane and the exec request
// metric carries kubectl exec as its baseline, with the ratio kubectl /
// session (no cluster: the figures are made up).
func TestReportS7(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var out []time.Duration
		for _, x := range n {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	res := &clusterstack.Result{Sizes: clusterstack.Sizes{Paced: 3, Burst: 3, SessionReqs: 3, KubectlReqs: 3},
		Paced: ms(100, 110, 120), Burst: ms(200, 300, 400), BurstAll: 450 * time.Millisecond,
		SessionOpen: 150 * time.Millisecond, SessionReq: ms(1, 2, 3), KubectlReq: ms(140, 150, 160)}
	r := &report.Report{}
	sec := r.Section("s7", "Scenario 7")
	reportS7(r, sec, []s7Result{{dp: "nftables", r: res}, {dp: "iptables", r: res}}, 12*time.Second)
	if len(sec.Tables) != 1 || len(sec.Tables[0].Rows) != 2 {
		t.Fatalf("tables %+v, want one with two rows", sec.Tables)
	}
	row := sec.Tables[0].Rows[0]
	if row[0] != "nftables" || row[len(row)-1] != "75×" {
		t.Errorf("row %v: want nftables ... 75× (150 ms / 2 ms)", row)
	}
	var found bool
	for _, m := range r.Metrics {
		if !strings.HasPrefix(m.Name, "s7_") {
			t.Errorf("metric %s: want the s7_ prefix", m.Name)
		}
		if m.Name == "s7_nftables_exec_request_p50" {
			found = true
			if m.Ours == nil || *m.Ours != 2 || m.Baseline == nil || *m.Baseline != 150 || m.Ratio == nil || *m.Ratio != 75 {
				t.Errorf("exec request metric %+v: want ours 2, baseline 150, ratio 75", m)
			}
		}
	}
	if !found || len(r.Metrics) != 10 {
		t.Errorf("%d metrics (exec request found: %v), want 10", len(r.Metrics), found)
	}
}

// TestS7Missing: without its images the scenario is not run, and says
// which archive is missing (or which cluster asset, on a machine without
// them).
func TestS7Missing(t *testing.T) {
	cfg := cluster.Defaults(cluster.Config{Images: []string{"/nonexistent/natgw-image.tar"}}, t.TempDir())
	why := s7Missing(cfg)
	if why == "" {
		t.Fatal("s7Missing: nothing missing with a nonexistent image archive")
	}
	if !strings.Contains(why, "make") {
		t.Errorf("s7Missing: %q does not say what builds it", why)
	}
}
