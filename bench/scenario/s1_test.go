package scenario

import (
	"context"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/internal/netlab"
)

// tinyPlan runs scenario 1 at N ∈ {0, 10} with exactly two measured
// repetitions: enough to prove every method's code path, the checks of the
// warm-up, the tables and the plot.
func tinyPlan() Plan {
	p := QuickPlan()
	p.S1Sizes = []int{0, 10}
	p.S1Warmup, p.S1MinReps, p.S1MaxReps, p.S1MaxExecReps = 1, 2, 2, 2
	p.S1Budget = time.Millisecond
	p.S1Flows = 2
	return p
}

func TestS1Tiny(t *testing.T) {
	if reason := netlab.Unavailable(); reason != "" {
		t.Skip(reason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := &Env{Quick: true, OutDir: t.TempDir(), Natgw: testAgentBinary(t), Report: &report.Report{Title: "test"}}
	methods := s1Methods(e)
	for _, want := range []string{"a", "a1", "b", "c", "d", "e", "f"} {
		if !hasMethod(methods, want) {
			t.Errorf("method (%s) is missing from scenario 1", want)
		}
	}
	plan := tinyPlan()
	if err := runS1(ctx, e, plan, methods); err != nil {
		t.Fatalf("scenario 1: %v", err)
	}
	sec := e.Report.Section("s1", "")
	if len(sec.Tables) != 8 {
		t.Fatalf("%d tables, want 8 (median, tail, speed-up for add and delete; request floor; IPv6 ÷ IPv4)", len(sec.Tables))
	}
	if floor := sec.Tables[6]; len(floor.Rows) != 3 || !strings.HasPrefix(floor.Rows[0][0], "(e)") || !strings.HasPrefix(floor.Rows[1][0], "(e6)") || !strings.Contains(floor.Rows[2][0], "idle `cat`") {
		t.Errorf("request floor table %+v, want rows for (e), (e6) and the idle-cat wake-up floor", floor)
	} else {
		for _, c := range floor.Rows[2][1:] {
			if c == "—" || strings.HasPrefix(c, "0 ") {
				t.Errorf("wake-up floor cell %q, want a measured latency", c)
			}
		}
	}
	// (d) and (e) are measured in IPv6 too, (f) is not (its backend
	// refuses IPv6): two more rows in every per-method table.
	reported := len(methods) + 2
	for _, key := range []string{"d6", "e6"} {
		found := false
		for _, r := range sec.Tables[0].Rows {
			found = found || strings.HasPrefix(r[0], "("+key+")")
		}
		if !found {
			t.Errorf("no row for (%s) in %q", key, sec.Tables[0].Caption)
		}
	}
	if v6 := sec.Tables[7]; len(v6.Rows) != 4 {
		t.Errorf("IPv6 ÷ IPv4 table has %d rows, want 4 ((d) and (e), add and delete): %+v", len(v6.Rows), v6)
	} else {
		for _, r := range v6.Rows {
			for _, c := range r[2:] {
				if c == "—" || c == "" {
					t.Errorf("IPv6 ÷ IPv4 row %v: cell %q, want a ratio", r[:2], c)
				}
			}
		}
	}
	v6Targets := 0
	for _, tg := range sec.Targets {
		if strings.HasPrefix(tg.Name, "S1 IPv6 ÷ IPv4") {
			v6Targets++
			if tg.Got == "not measured" {
				t.Errorf("target %q not measured: %s", tg.Name, tg.Reason)
			}
		}
	}
	if v6Targets != 4 {
		t.Errorf("%d IPv6 ÷ IPv4 targets, want 4", v6Targets)
	}
	for _, tb := range sec.Tables[:6] {
		if len(tb.Rows) != reported {
			t.Errorf("table %q has %d rows, want %d", tb.Caption, len(tb.Rows), reported)
		}
		for _, r := range tb.Rows {
			for _, c := range r[1:] {
				if c == "failed" || c == "not run" || c == "—" {
					t.Errorf("table %q row %q has cell %q", tb.Caption, r[0], c)
				}
			}
		}
	}
	// Tail table cells end in the repetition count.
	for _, r := range sec.Tables[1].Rows {
		for _, c := range r[1:] {
			if !strings.HasSuffix(c, " / 2") {
				t.Errorf("%s: tail cell %q, want 2 repetitions", r[0], c)
			}
		}
	}
	checkPlot(t, e.OutDir, sec, "s1"+report.PlotExt)
	// Every natgw method yields one add and one delete metric per size,
	// with (a) as baseline, and so does each IPv6 row ((d6), (e6));
	// each of (d) and (e) also one IPv6-vs-IPv4 pair per size.
	ours := 2 + 2
	for _, m := range methods {
		if m.Ours {
			ours++
		}
	}
	if got, want := len(e.Report.Metrics), ours*2*len(plan.S1Sizes); got != want {
		t.Errorf("%d metrics, want %d", got, want)
	}
	for _, m := range e.Report.Metrics {
		if m.Ours == nil || m.Baseline == nil || m.Ratio == nil || *m.Ours <= 0 {
			t.Errorf("metric %s incomplete: %+v", m.Name, m)
		}
	}
}

func hasMethod(ms []Method, key string) bool {
	for _, m := range ms {
		if m.Key == key {
			return true
		}
	}
	return false
}

// checkPlot checks that sec names the plot want and that the file in dir
// is a PNG.
func checkPlot(t *testing.T, dir string, sec *report.Section, want string) {
	t.Helper()
	if sec.Plot != want {
		t.Fatalf("plot = %q, notes: %v", sec.Plot, sec.Notes)
	}
	f, err := os.Open(filepath.Join(dir, sec.Plot))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("plot %s is not well-formed: %v", sec.Plot, err)
		}
		if el, ok := tok.(xml.StartElement); ok && root == "" {
			root = el.Name.Local
		}
	}
	if root != "svg" {
		t.Errorf("plot %s: root element %q, want svg", sec.Plot, root)
	}
}

// TestS1Budget: the budget NATGW_BENCH_S1 sets, and bad values refused
// with the variable and the value named.
func TestS1Budget(t *testing.T) {
	for _, tc := range []struct {
		env     string
		budget  time.Duration
		wantErr bool
	}{
		{env: "", budget: QuickPlan().S1Budget},
		{env: "20s", budget: 20 * time.Second},
		{env: "1ms", budget: time.Millisecond},
		{env: "soon", wantErr: true},
		{env: "0s", wantErr: true},
		{env: "2h", wantErr: true},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(s1BudgetEnv, tc.env)
			p, err := s1Budget(QuickPlan())
			if tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), s1BudgetEnv) || !strings.Contains(err.Error(), strconv.Quote(tc.env)) {
					t.Fatalf("error %v, want one naming %s and %q", err, s1BudgetEnv, tc.env)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.S1Budget != tc.budget || p.S1MaxReps != QuickPlan().S1MaxReps {
				t.Errorf("budget %v, max reps %d; want %v, %d", p.S1Budget, p.S1MaxReps, tc.budget, QuickPlan().S1MaxReps)
			}
		})
	}
}
