package scenario

import (
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/bench/stats"
)

// TestS6TargetRows: the first part's rows pass and miss on their bounds.
// The RSS row counts the VmRSS sampled in every phase (the same figure as
// the second part's row), and the two paced ratios name both phases.
func TestS6TargetRows(t *testing.T) {
	paced := func(p50, p99 float64) *s6Paced {
		return &s6Paced{ready: stats.Summary{N: 30, Median: p50, P99: p99}}
	}
	result := func(ready, hwm, coldHWM, peak float64, base, loaded *s6Paced) *s6Result {
		r := &s6Result{plan: s6Plan{Gateways: s6FullGateways, Rules: s6FullRules, Paced: 30}, readyRSS: ready, readyHWM: hwm,
			peaks: []s6PhasePeak{{"paced, every object in place", peak}}, base: base, loaded: loaded}
		if coldHWM > 0 {
			r.cold = &s6Cold{synced: 5 * time.Second, drained: 9 * time.Second, rss: ready, hwm: coldHWM}
		}
		return r
	}
	for _, c := range []struct {
		name   string
		r      *s6Result
		pass   [3]bool
		got    [3]string
		reason [3]string
	}{
		{"all pass", result(100<<20, 200<<20, 220<<20, 150<<20, paced(0.02, 0.05), paced(0.03, 0.09)),
			[3]bool{true, true, true}, [3]string{"220 MiB", "1.50×", "1.80×"},
			[3]string{"after the cold start 100 MiB, its peak 220 MiB", "30 ms with everything in place, 20 ms with ~0 objects", "90 ms with everything in place, 50 ms with ~0 objects"}},
		{"a phase sample above the Ready and cold-start reads misses", result(100<<20, 200<<20, 220<<20, 300<<20, paced(0.02, 0.05), paced(0.06, 0.2)),
			[3]bool{false, false, false}, [3]string{"300 MiB", "3.00×", "4.00×"},
			[3]string{`the largest sample (300 MiB) in the phase "paced, every object in place"`, "60 ms with everything in place", "200 ms with everything in place, 50 ms with ~0 objects"}},
		{"failed before Ready", result(0, 0, 0, 0, paced(0.02, 0.05), nil),
			[3]bool{}, [3]string{"not measured", "not measured", "not measured"},
			[3]string{"failed before every object was Ready", "before both paced phases", "before both paced phases"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sec := &report.Section{}
			s6TargetRows(sec, c.r)
			var rows []report.Target
			for _, tg := range sec.Targets {
				if strings.Contains(tg.Name, "RSS") || strings.Contains(tg.Name, "÷") {
					rows = append(rows, tg)
				}
			}
			if len(rows) != 3 {
				t.Fatalf("%d RSS and ratio rows, want 3: %+v", len(rows), sec.Targets)
			}
			for i, tg := range rows {
				if tg.Pass != c.pass[i] || tg.Got != c.got[i] || !strings.Contains(tg.Reason, c.reason[i]) {
					t.Errorf("row %d: %+v; want pass %v, got %q, reason with %q", i, tg, c.pass[i], c.got[i], c.reason[i])
				}
			}
			if !strings.Contains(rows[1].Name, "p50") || !strings.Contains(rows[2].Name, "p99") {
				t.Errorf("ratio rows %q, %q: want p50 then p99", rows[1].Name, rows[2].Name)
			}
		})
	}
}
