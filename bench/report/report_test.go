package report

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func sampleReport() *Report {
	r := &Report{Title: "natgw benchmarks"}
	r.Meta = Meta{
		Command: "natgw-bench -quick", Mode: "quick",
		Started:  time.Date(2026, 12, 2, 14, 0, 0, 0, time.UTC),
		Finished: time.Date(2026, 12, 2, 14, 2, 30, 0, time.UTC),
		Kernel:   "6.18.44", CPUs: 2, CPUModel: "Test CPU", Go: "go1.26.8",
		Tools: []Tool{{"nft", "nftables v1.0.6"}},
	}
	s := r.Section("s1", "Scenario 1: programming latency")
	s.Text = append(s.Text, "Latency of one FIP add.")
	s.Tables = append(s.Tables, Table{Caption: "add, median", Header: []string{"method", "N=0"}, Rows: [][]string{{"(a) a|b", "27 ms"}}})
	s.Targets = append(s.Targets,
		Target{Name: "add at 10k", Want: "≥ 1000×", Got: "1,520×", Pass: true},
		Target{Name: "delete at 10k", Want: "≥ 50×", Got: "30×", Pass: false, Reason: "conntrack dump walks the table"})
	s.Plot = "s1.svg"
	s.Notes = append(s.Notes, "5 repetitions at 100k")
	if again := r.Section("s1", "ignored"); again != s {
		panic("Section did not return the existing section")
	}
	r.Section("s3", "Scenario 3: controller path").NotRun = "controller not available"
	r.AddMetric(NewMetric("s1.add.serve.10k", "s", LowerIsBetter, 0.0001, 0.152, "(a) iptables-legacy script"))
	r.AddMetric(NewMetric("s4.flows.50k", "flows/s", HigherIsBetter, 400000, 1270, "iptables-legacy"))
	r.AddMetric(NewMetric("s5.rss.100k", "bytes", LowerIsBetter, 40<<20, math.NaN(), ""))
	return r
}

func TestWriteMarkdown(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"# natgw benchmarks\n",
		"| command | `natgw-bench -quick` |",
		"| finished | 2026-12-02T14:02:30Z (2m30s) |",
		"| CPUs | 2 × Test CPU |",
		"| nft | nftables v1.0.6 |",
		"## Targets\n",
		"| add at 10k | ≥ 1000× | 1,520× | PASS |  |",
		"| delete at 10k | ≥ 50× | 30× | **MISS** | conntrack dump walks the table |",
		"## Scenario 1: programming latency\n\nLatency of one FIP add.\n",
		"add, median\n\n| method | N=0 |\n|---|---|\n| (a) a\\|b | 27 ms |\n",
		"![Scenario 1: programming latency](s1.svg)",
		"- 5 repetitions at 100k\n",
		"## Scenario 3: controller path\n\n**Not run: controller not available.**",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q\n--- report ---\n%s", want, md)
		}
	}
	// Targets appear once in the overview and once in their section.
	if n := strings.Count(md, "| add at 10k |"); n != 2 {
		t.Errorf("target row appears %d times, want 2", n)
	}
}

func TestWriteSummary(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteSummary(&b); err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("summary is not a JSON array: %v\n%s", err, b.String())
	}
	if len(got) != 3 {
		t.Fatalf("%d metrics, want 3", len(got))
	}
	tests := []struct {
		i          int
		name       string
		ours, base any
		ratio      any
		baseName   any
	}{
		{0, "s1.add.serve.10k", 0.0001, 0.152, 1520.0, "(a) iptables-legacy script"},
		{1, "s4.flows.50k", 400000.0, 1270.0, 400000.0 / 1270, "iptables-legacy"},
		{2, "s5.rss.100k", float64(40 << 20), nil, nil, nil},
	}
	for _, tt := range tests {
		m := got[tt.i]
		if m["name"] != tt.name {
			t.Errorf("metric %d name = %v, want %s", tt.i, m["name"], tt.name)
		}
		approx := func(field string, want any) {
			g := m[field]
			if want == nil {
				if g != nil {
					t.Errorf("%s.%s = %v, want null", tt.name, field, g)
				}
				return
			}
			gf, ok1 := g.(float64)
			wf, ok2 := want.(float64)
			if ok1 && ok2 {
				if math.Abs(gf-wf) > 1e-9*math.Max(1, wf) {
					t.Errorf("%s.%s = %v, want %v", tt.name, field, gf, wf)
				}
				return
			}
			if g != want {
				t.Errorf("%s.%s = %v, want %v", tt.name, field, g, want)
			}
		}
		approx("ours_median", tt.ours)
		approx("baseline_median", tt.base)
		approx("ratio", tt.ratio)
		approx("baseline", tt.baseName)
	}
}

func TestWriteFilesAndPlot(t *testing.T) {
	dir := t.TempDir()
	r := sampleReport()
	if err := r.Write(dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"REPORT.md", "summary.json"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	fig := Figure{Panels: []Panel{
		{Title: "add <a&b>", YLabel: "latency (s)", LogY: true, Categories: []string{"0", "1k", "10k", "100k"},
			Series: []Series{{Label: "a", Y: []float64{0.027, 0.037, 0.126, 1.2}}, {Label: "d", Y: []float64{14e-6, math.NaN(), 15e-6, 16e-6}, Dashed: true}}},
		{Title: "rate", Categories: []string{"1", "50k"}, Series: []Series{{Label: "x", Y: []float64{4e5, 3.9e5}}}},
	}}
	path := filepath.Join(dir, "s1"+PlotExt)
	if err := fig.Save(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// Walk the SVG as XML: it must parse, hold one group per panel and
	// one polyline per run of drawable points (the NaN breaks d's line
	// into a lone point, not drawn as a line, and a run of two).
	var panels, lines, dashed int
	var texts []string
	dec := xml.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("plot is not well-formed SVG: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			attr := map[string]string{}
			for _, a := range el.Attr {
				attr[a.Name.Local] = a.Value
			}
			switch {
			case el.Name.Local == "g" && attr["class"] == "panel":
				panels++
			case el.Name.Local == "polyline" && attr["class"] == "series":
				lines++
				if attr["stroke-dasharray"] != "" {
					dashed++
				}
			}
		case xml.CharData:
			texts = append(texts, string(el))
		}
	}
	if panels != 2 || lines != 3 || dashed != 1 {
		t.Errorf("panels=%d series lines=%d dashed=%d, want 2, 3 (a, d after its gap, x), 1", panels, lines, dashed)
	}
	all := strings.Join(texts, "|")
	for _, want := range []string{"add <a&b>", "100k", "latency (s)", "0.001", "50k"} {
		if !strings.Contains(all, want) {
			t.Errorf("plot text lacks %q: %s", want, all)
		}
	}
	if err := (Figure{}).Save(filepath.Join(dir, "empty"+PlotExt)); err == nil {
		t.Error("a figure without panels was accepted")
	}
}

func TestNiceStep(t *testing.T) {
	for _, tt := range []struct{ in, want float64 }{{0.7, 1}, {1.3, 2}, {3, 5}, {7, 10}, {130, 200}, {0, 1}} {
		if got := niceStep(tt.in); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("niceStep(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestFormat(t *testing.T) {
	tests := []struct {
		got, want string
	}{
		{Seconds(0.0271), "27.1 ms"},
		{Seconds(14.2e-6), "14.2 µs"},
		{Seconds(2.314), "2.31 s"},
		{Seconds(0.000999), "999 µs"},
		{Seconds(0.0099996), "10 ms"},
		{Seconds(512e-9), "512 ns"},
		{Seconds(math.NaN()), "—"},
		{Seconds(0), "0"},
		{Count(427000), "427k"},
		{Count(1270), "1.27k"},
		{Count(950), "950"},
		{Count(1.27e6), "1.27M"},
		{Times(1520.4), "1,520×"},
		{Times(3.44), "3.44×"},
		{Times(0.912), "0.912×"},
		{Times(math.Inf(1)), "—"},
		{Bytes(40 << 20), "40 MiB"},
		{SizeLabel(0), "0"},
		{SizeLabel(10000), "10k"},
		{SizeLabel(100000), "100k"},
		{SizeLabel(1500), "1.5k"},
		{SizeLabel(10), "10"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestAdvantage(t *testing.T) {
	if a := Advantage(2, 10, false); a != 5 {
		t.Errorf("lower is better: %v, want 5", a)
	}
	if a := Advantage(10, 2, true); a != 5 {
		t.Errorf("higher is better: %v, want 5", a)
	}
	if a := Advantage(0, 10, false); !math.IsNaN(a) {
		t.Errorf("zero ours: %v, want NaN", a)
	}
}
