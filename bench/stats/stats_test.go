package stats

import (
	"math"
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	one := []float64{7}
	ten := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(i + 1)
	}
	tests := []struct {
		name   string
		sorted []float64
		q      float64
		want   float64
	}{
		{"single median", one, 0.5, 7},
		{"single p99", one, 0.99, 7},
		{"ten min", ten, 0, 1},
		{"ten max", ten, 1, 10},
		{"ten median interpolates", ten, 0.5, 5.5},
		{"ten p90", ten, 0.9, 9.1},
		{"ten p99", ten, 0.99, 9.91},
		{"hundred p90", hundred, 0.9, 90.1},
		{"hundred p99", hundred, 0.99, 99.01},
		{"odd median is middle", []float64{1, 2, 100}, 0.5, 2},
		{"two p50", []float64{1, 3}, 0.5, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Quantile(tt.sorted, tt.q); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("Quantile(%v, %v) = %v, want %v", tt.sorted, tt.q, got, tt.want)
			}
		})
	}
}

func TestQuantileInvalid(t *testing.T) {
	for _, c := range []struct {
		xs []float64
		q  float64
	}{{nil, 0.5}, {[]float64{1}, -0.1}, {[]float64{1}, 1.1}, {[]float64{1}, math.NaN()}} {
		if got := Quantile(c.xs, c.q); !math.IsNaN(got) {
			t.Errorf("Quantile(%v, %v) = %v, want NaN", c.xs, c.q, got)
		}
	}
}

func TestSummarize(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3} // unsorted on purpose
	s := Summarize(xs)
	want := Summary{N: 5, Median: 3, P90: 4.6, P99: 4.96, Min: 1, Max: 5, Mean: 3}
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"median", s.Median, want.Median}, {"p90", s.P90, want.P90}, {"p99", s.P99, want.P99},
		{"min", s.Min, want.Min}, {"max", s.Max, want.Max}, {"mean", s.Mean, want.Mean},
	} {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if s.N != 5 {
		t.Errorf("N = %d, want 5", s.N)
	}
	if xs[0] != 5 || xs[1] != 1 {
		t.Errorf("Summarize modified its input: %v", xs)
	}
	empty := Summarize(nil)
	if empty.N != 0 || !math.IsNaN(empty.Median) || !math.IsNaN(empty.P99) {
		t.Errorf("Summarize(nil) = %+v, want N=0 and NaNs", empty)
	}
}

func TestDurationsAndRatio(t *testing.T) {
	got := Durations([]time.Duration{time.Millisecond, 1500 * time.Microsecond})
	if len(got) != 2 || got[0] != 0.001 || math.Abs(got[1]-0.0015) > 1e-12 {
		t.Errorf("Durations = %v", got)
	}
	if r := Ratio(10, 4); r != 2.5 {
		t.Errorf("Ratio(10,4) = %v", r)
	}
	for _, r := range []float64{Ratio(1, 0), Ratio(math.NaN(), 1), Ratio(1, math.NaN())} {
		if !math.IsNaN(r) {
			t.Errorf("Ratio with zero/NaN = %v, want NaN", r)
		}
	}
}
