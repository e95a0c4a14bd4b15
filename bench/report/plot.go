package report

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
)

// PlotExt is the file name extension of the plots Figure.Save writes.
const PlotExt = ".svg"

// Figure is one plot file: one or more panels side by side.
type Figure struct {
	Panels []Panel
}

// Panel is a line plot over categorical X positions (e.g. table sizes
// "0", "1k", "10k", "100k"), each Series giving one Y per category; a NaN Y
// leaves a gap.
type Panel struct {
	Title      string
	XLabel     string
	YLabel     string
	LogY       bool
	Categories []string
	Series     []Series
}

// Series is one line of a Panel.
type Series struct {
	Label  string
	Y      []float64
	Dashed bool
}

// palette: distinguishable colours, one per series index.
var palette = []string{"#d62728", "#ff7f0e", "#8c564b", "#1f77b4", "#2ca02c", "#9467bd", "#7f7f7f", "#17becf"}

// Geometry of one panel, in SVG user units (pixels).
const (
	panelW, panelH           = 640.0, 520.0
	marginL, marginR         = 78.0, 20.0
	marginT, marginB         = 40.0, 56.0
	legendLine, legendIndent = 17.0, 12.0
)

// Save renders the figure as SVG to path (the plots are written by hand, so
// the benchmark report needs no plotting library).
func (f Figure) Save(path string) error {
	if len(f.Panels) == 0 {
		return fmt.Errorf("plot %s: no panels", path)
	}
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	w := bufio.NewWriter(out)
	f.write(w)
	if err := w.Flush(); err != nil {
		out.Close()
		return fmt.Errorf("plot %s: %w", path, err)
	}
	return out.Close()
}

func (f Figure) write(w io.Writer) {
	width := panelW * float64(len(f.Panels))
	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="sans-serif" font-size="13">`+"\n",
		px(width), px(panelH), px(width), px(panelH))
	fmt.Fprintf(w, `<rect width="%s" height="%s" fill="white"/>`+"\n", px(width), px(panelH))
	for i, p := range f.Panels {
		fmt.Fprintf(w, `<g class="panel" transform="translate(%s,0)">`+"\n", px(panelW*float64(i)))
		p.write(w)
		fmt.Fprintln(w, "</g>")
	}
	fmt.Fprintln(w, "</svg>")
}

// yAxis maps data values to the panel's vertical pixels.
type yAxis struct {
	log    bool
	lo, hi float64 // in data units (log: exponents)
}

func (a yAxis) scale(v float64) float64 {
	if a.log {
		v = math.Log10(v)
	}
	top, bottom := marginT, panelH-marginB
	return bottom - (v-a.lo)/(a.hi-a.lo)*(bottom-top)
}

// ticks returns the Y tick values: decades on a log axis, about six round
// steps on a linear one.
func (a yAxis) ticks() []float64 {
	var out []float64
	if a.log {
		for e := math.Ceil(a.lo); e <= a.hi; e++ {
			out = append(out, math.Pow(10, e))
		}
		return out
	}
	step := niceStep((a.hi - a.lo) / 6)
	for v := math.Ceil(a.lo/step) * step; v <= a.hi+step*1e-9; v += step {
		out = append(out, v)
	}
	return out
}

// niceStep rounds x up to 1, 2 or 5 times a power of ten.
func niceStep(x float64) float64 {
	if x <= 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

// axis fits the Y axis to the data and leaves room above it for the
// legend (top left): about legendShare of the height per series.
func (p Panel) axis() yAxis {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range p.Series {
		for i, y := range s.Y {
			if p.usable(i, y) {
				lo, hi = math.Min(lo, y), math.Max(hi, y)
			}
		}
	}
	const legendShare = 0.048
	free := 1 - math.Min(0.6, 0.04+legendShare*float64(len(p.Series)))
	switch {
	case math.IsInf(lo, 0):
		return yAxis{log: false, lo: 0, hi: 1}
	case p.LogY:
		bottom := math.Floor(math.Log10(lo))
		top := math.Log10(hi) + 0.1
		return yAxis{log: true, lo: bottom, hi: bottom + (top-bottom)/free}
	}
	if hi <= 0 {
		hi = 1
	}
	return yAxis{lo: 0, hi: hi * 1.05 / free}
}

// usable reports whether Y value y at category i can be drawn.
func (p Panel) usable(i int, y float64) bool {
	return i < len(p.Categories) && !math.IsNaN(y) && !math.IsInf(y, 0) && (!p.LogY || y > 0)
}

func (p Panel) x(i int) float64 {
	n := float64(len(p.Categories))
	left, right := marginL, panelW-marginR
	return left + (float64(i)+0.3)/(n-0.4)*(right-left)
}

func (p Panel) write(w io.Writer) {
	a := p.axis()
	left, right, top, bottom := marginL, panelW-marginR, marginT, panelH-marginB
	fmt.Fprintf(w, `<text x="%s" y="22" text-anchor="middle" font-size="15">%s</text>`+"\n", px((left+right)/2), esc(p.Title))
	for _, t := range a.ticks() {
		y := a.scale(t)
		fmt.Fprintf(w, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#ddd"/>`+"\n", px(left), px(y), px(right), px(y))
		fmt.Fprintf(w, `<text x="%s" y="%s" text-anchor="end">%s</text>`+"\n", px(left-6), px(y+4), tickLabel(t))
	}
	for i, c := range p.Categories {
		x := p.x(i)
		fmt.Fprintf(w, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#ddd"/>`+"\n", px(x), px(top), px(x), px(bottom))
		fmt.Fprintf(w, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", px(x), px(bottom+18), esc(c))
	}
	fmt.Fprintf(w, `<rect x="%s" y="%s" width="%s" height="%s" fill="none" stroke="black"/>`+"\n", px(left), px(top), px(right-left), px(bottom-top))
	fmt.Fprintf(w, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", px((left+right)/2), px(panelH-12), esc(p.XLabel))
	fmt.Fprintf(w, `<text transform="translate(18,%s) rotate(-90)" text-anchor="middle">%s</text>`+"\n", px((top+bottom)/2), esc(p.YLabel))
	for si, s := range p.Series {
		colour := palette[si%len(palette)]
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="7,4"`
		}
		// One polyline per run of usable points: a gap breaks the line.
		var run []string
		flush := func() {
			if len(run) > 1 {
				fmt.Fprintf(w, `<polyline class="series" points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(run, " "), colour, dash)
			}
			run = run[:0]
		}
		for i, y := range s.Y {
			if !p.usable(i, y) {
				flush()
				continue
			}
			cx, cy := p.x(i), a.scale(y)
			run = append(run, px(cx)+","+px(cy))
			marker(w, s.Dashed, cx, cy, colour)
		}
		flush()
		ly := top + 16 + legendLine*float64(si)
		fmt.Fprintf(w, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"%s/>`+"\n",
			px(left+legendIndent), px(ly-4), px(left+legendIndent+28), px(ly-4), colour, dash)
		marker(w, s.Dashed, left+legendIndent+14, ly-4, colour)
		fmt.Fprintf(w, `<text x="%s" y="%s">%s</text>`+"\n", px(left+legendIndent+36), px(ly), esc(s.Label))
	}
}

// marker draws a data point: a circle on solid lines, a triangle on dashed
// ones (the baselines), so the two read apart also without colour.
func marker(w io.Writer, triangle bool, x, y float64, colour string) {
	if triangle {
		fmt.Fprintf(w, `<polygon points="%s,%s %s,%s %s,%s" fill="%s"/>`+"\n", px(x), px(y-5), px(x-4.5), px(y+3.5), px(x+4.5), px(y+3.5), colour)
		return
	}
	fmt.Fprintf(w, `<circle cx="%s" cy="%s" r="3.5" fill="%s"/>`+"\n", px(x), px(y), colour)
}

// tickLabel writes a tick value compactly: 1e-05, 0.001, 20, 1e+06.
func tickLabel(v float64) string {
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func px(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func esc(s string) string { return html.EscapeString(s) }
