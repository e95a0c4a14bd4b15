// Package report holds the results of one benchmark run and writes them as
// REPORT.md (tables, targets with PASS/MISS, notes), summary.json (one object
// per metric) and one PNG plot per scenario.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Report is one benchmark run.
type Report struct {
	Title    string
	Meta     Meta
	Intro    []string // paragraphs (Markdown) before the sections
	Sections []*Section
	Metrics  []Metric
}

// Meta records where and how the run happened.
type Meta struct {
	Command   string
	Mode      string // "full" or "quick"
	Started   time.Time
	Finished  time.Time
	Kernel    string
	CPUs      int
	CPUModel  string
	LoadStart string // /proc/loadavg when the run started
	LoadEnd   string
	Go        string
	Commit    string
	Tools     []Tool
}

// Tool is an external program and the version it reported.
type Tool struct{ Name, Version string }

// Section is one scenario.
type Section struct {
	ID    string // short id, e.g. "s1"; names the plot file
	Title string
	// NotRun, when set, says why the scenario produced no figures; the
	// section then shows only this and Text.
	NotRun  string
	Text    []string // paragraphs (Markdown)
	Tables  []Table
	Targets []Target
	Plot    string   // plot file name relative to the report, "" for none
	Notes   []string // bullet points: repetitions, caps, conditions
}

// Table is a Markdown table.
type Table struct {
	Caption string
	Header  []string
	Rows    [][]string
}

// Target is a goal from the issue checked against a measured figure.
type Target struct {
	Name   string // what is checked, e.g. "add at 10k: natgw serve vs (a)"
	Want   string // e.g. "≥ 1000×"
	Got    string // e.g. "1523×"
	Pass   bool
	Reason string // why it was missed (or a caveat); "" when none
}

// Metric is one line of summary.json.
type Metric struct {
	Name         string   `json:"name"`
	Unit         string   `json:"unit"`
	Better       string   `json:"better"` // "lower" or "higher"
	Ours         *float64 `json:"ours_median"`
	Baseline     *float64 `json:"baseline_median"`
	BaselineName string   `json:"baseline,omitempty"`
	// Ratio is how many times better ours is than the baseline:
	// baseline/ours when lower is better, ours/baseline when higher is.
	Ratio *float64 `json:"ratio"`
}

// Directions of a Metric.
const (
	LowerIsBetter  = "lower"
	HigherIsBetter = "higher"
)

func num(x float64) *float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return nil
	}
	return &x
}

// NewMetric builds a Metric from medians; a NaN baseline (none) leaves the
// baseline and the ratio null.
func NewMetric(name, unit, better string, ours, baseline float64, baselineName string) Metric {
	m := Metric{Name: name, Unit: unit, Better: better, Ours: num(ours), Baseline: num(baseline)}
	if m.Baseline != nil {
		m.BaselineName = baselineName
	}
	if m.Ours != nil && m.Baseline != nil {
		if better == HigherIsBetter {
			m.Ratio = num(Advantage(ours, baseline, true))
		} else {
			m.Ratio = num(Advantage(ours, baseline, false))
		}
	}
	return m
}

// Advantage returns how many times better ours is than baseline: baseline/ours
// for lower-is-better figures, ours/baseline otherwise; NaN when undefined.
func Advantage(ours, baseline float64, higherIsBetter bool) float64 {
	a, b := baseline, ours
	if higherIsBetter {
		a, b = ours, baseline
	}
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return math.NaN()
	}
	return a / b
}

// Section returns the section with id, adding an empty one with title when
// there is none.
func (r *Report) Section(id, title string) *Section {
	for _, s := range r.Sections {
		if s.ID == id {
			return s
		}
	}
	s := &Section{ID: id, Title: title}
	r.Sections = append(r.Sections, s)
	return s
}

// AddMetric appends metrics to summary.json.
func (r *Report) AddMetric(ms ...Metric) { r.Metrics = append(r.Metrics, ms...) }

// Write writes REPORT.md and summary.json into dir (plots are written by
// the scenarios through Figure.Save).
func (r *Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	for _, f := range []struct {
		name  string
		write func(io.Writer) error
	}{{"REPORT.md", r.WriteMarkdown}, {"summary.json", r.WriteSummary}} {
		if err := writeFile(filepath.Join(dir, f.name), f.write); err != nil {
			return err
		}
	}
	return nil
}

// writeFile writes through a temporary file so a failed run leaves the old
// file in place.
func writeFile(path string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := write(tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("report: write %s: %w", path, err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("report: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// WriteSummary writes the metrics as a JSON array.
func (r *Report) WriteSummary(w io.Writer) error {
	ms := r.Metrics
	if ms == nil {
		ms = []Metric{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(ms)
}

// WriteMarkdown writes the report as Markdown.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# %s\n\n", r.Title)
	m := r.Meta
	b.WriteString("| run | |\n|---|---|\n")
	row := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, "| %s | %s |\n", k, cell(v))
		}
	}
	row("command", "`"+m.Command+"`")
	row("mode", m.Mode)
	if !m.Started.IsZero() {
		row("started", m.Started.UTC().Format(time.RFC3339))
	}
	if !m.Finished.IsZero() && !m.Started.IsZero() {
		row("finished", fmt.Sprintf("%s (%s)", m.Finished.UTC().Format(time.RFC3339), m.Finished.Sub(m.Started).Round(time.Second)))
	}
	row("kernel", m.Kernel)
	if m.CPUs > 0 {
		row("CPUs", fmt.Sprintf("%d × %s", m.CPUs, orDash(m.CPUModel)))
	}
	row("load average (start → end)", strings.TrimSpace(m.LoadStart+" → "+m.LoadEnd))
	row("Go", m.Go)
	row("commit", m.Commit)
	for _, t := range m.Tools {
		row(t.Name, t.Version)
	}
	b.WriteString("\n")
	for _, p := range r.Intro {
		b.WriteString(p + "\n\n")
	}
	if targets := r.targets(); len(targets) > 0 {
		b.WriteString("## Targets\n\n")
		writeTargets(&b, targets)
	}
	for _, s := range r.Sections {
		fmt.Fprintf(&b, "## %s\n\n", s.Title)
		if s.NotRun != "" {
			fmt.Fprintf(&b, "**Not run: %s.**\n\n", s.NotRun)
		}
		for _, p := range s.Text {
			b.WriteString(p + "\n\n")
		}
		if s.NotRun != "" {
			continue
		}
		for _, t := range s.Tables {
			writeTable(&b, t)
		}
		if len(s.Targets) > 0 {
			writeTargets(&b, s.Targets)
		}
		if s.Plot != "" {
			fmt.Fprintf(&b, "![%s](%s)\n\n", s.Title, s.Plot)
		}
		for _, n := range s.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
		if len(s.Notes) > 0 {
			b.WriteString("\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Report) targets() []Target {
	var ts []Target
	for _, s := range r.Sections {
		ts = append(ts, s.Targets...)
	}
	return ts
}

func writeTargets(b *strings.Builder, ts []Target) {
	writeTable(b, Table{Header: []string{"target", "want", "got", "", "reason / note"}, Rows: func() [][]string {
		var rows [][]string
		for _, t := range ts {
			v := "**MISS**"
			if t.Pass {
				v = "PASS"
			}
			rows = append(rows, []string{t.Name, t.Want, t.Got, v, t.Reason})
		}
		return rows
	}()})
}

func writeTable(b *strings.Builder, t Table) {
	if t.Caption != "" {
		fmt.Fprintf(b, "%s\n\n", t.Caption)
	}
	if len(t.Header) == 0 {
		return
	}
	line := func(cells []string) {
		b.WriteString("|")
		for i := range t.Header {
			v := ""
			if i < len(cells) {
				v = cells[i]
			}
			fmt.Fprintf(b, " %s |", cell(v))
		}
		b.WriteString("\n")
	}
	line(t.Header)
	b.WriteString("|" + strings.Repeat("---|", len(t.Header)) + "\n")
	for _, r := range t.Rows {
		line(r)
	}
	b.WriteString("\n")
}

// cell makes s safe inside a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.ReplaceAll(s, "|", `\|`)
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}
