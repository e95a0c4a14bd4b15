package report

import (
	"fmt"
	"image/color"
	"math"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Figure is one PNG: one or more panels side by side.
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
var palette = []color.Color{
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // red
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, // orange
	color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}, // brown
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // green
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, // purple
	color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}, // grey
	color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff}, // cyan
}

// SavePNG renders the figure to path.
func (f Figure) SavePNG(path string) error {
	if len(f.Panels) == 0 {
		return fmt.Errorf("plot %s: no panels", path)
	}
	const panelW, h = 6.5 * vg.Inch, 5.5 * vg.Inch
	img := vgimg.New(panelW*vg.Length(len(f.Panels)), h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(f.Panels), PadX: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 2}
	for i, p := range f.Panels {
		pl, err := p.plot()
		if err != nil {
			return fmt.Errorf("plot %s: panel %q: %w", path, p.Title, err)
		}
		pl.Draw(tiles.At(dc, i, 0))
	}
	out, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(out); err != nil {
		out.Close()
		return fmt.Errorf("plot %s: %w", path, err)
	}
	return out.Close()
}

func (p Panel) plot() (*plot.Plot, error) {
	pl := plot.New()
	pl.Title.Text = p.Title
	pl.X.Label.Text = p.XLabel
	pl.Y.Label.Text = p.YLabel
	pl.Legend.Top = true
	pl.Legend.Left = true
	var ticks []plot.Tick
	for i, c := range p.Categories {
		ticks = append(ticks, plot.Tick{Value: float64(i), Label: c})
	}
	pl.X.Tick.Marker = plot.ConstantTicks(ticks)
	pl.X.Min, pl.X.Max = -0.2, float64(len(p.Categories))-0.8
	lo, hi := math.Inf(1), math.Inf(-1)
	for si, s := range p.Series {
		var pts plotter.XYs
		for i, y := range s.Y {
			if i >= len(p.Categories) || math.IsNaN(y) || math.IsInf(y, 0) || (p.LogY && y <= 0) {
				continue
			}
			pts = append(pts, plotter.XY{X: float64(i), Y: y})
			lo, hi = math.Min(lo, y), math.Max(hi, y)
		}
		if len(pts) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, err
		}
		c := palette[si%len(palette)]
		line.Color, points.Color = c, c
		line.Width = vg.Points(1.5)
		if s.Dashed {
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			points.Shape = draw.TriangleGlyph{}
		} else {
			points.Shape = draw.CircleGlyph{}
		}
		pl.Add(line, points)
		pl.Legend.Add(s.Label, line, points)
	}
	// Leave room above the data for the legend (top left): it takes
	// about legendLine of the plot's height per series.
	const legendLine = 0.048
	free := 1 - math.Min(0.6, 0.04+legendLine*float64(len(p.Series)))
	if p.LogY && !math.IsInf(lo, 0) {
		pl.Y.Scale = plot.LogScale{}
		pl.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		bottom := math.Floor(math.Log10(lo))
		top := math.Log10(hi) + 0.1
		pl.Y.Min = math.Pow(10, bottom) * 0.999
		pl.Y.Max = math.Pow(10, bottom+(top-bottom)/free)
	} else if !math.IsInf(lo, 0) {
		pl.Y.Min = 0
		pl.Y.Max = hi * 1.05 / free
	}
	pl.Add(plotter.NewGrid())
	return pl, nil
}
