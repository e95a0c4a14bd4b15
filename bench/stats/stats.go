// Package stats summarises benchmark samples: medians and tail percentiles
// over the repetitions that follow a warm-up.
package stats

import (
	"math"
	"slices"
	"time"
)

// Summary describes a set of samples. Every field is NaN (and N zero) for an
// empty set.
type Summary struct {
	N                int
	Median, P90, P99 float64
	Min, Max, Mean   float64
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1) of sorted, interpolating
// linearly between the two nearest ranks (Hyndman & Fan type 7, the default
// of R and NumPy). It returns NaN for an empty slice or q out of range.
func Quantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 0 || q < 0 || q > 1 || math.IsNaN(q) {
		return math.NaN()
	}
	h := q * float64(n-1)
	lo := int(math.Floor(h))
	if lo >= n-1 {
		return sorted[n-1]
	}
	return sorted[lo] + (h-float64(lo))*(sorted[lo+1]-sorted[lo])
}

// Summarize returns the summary of xs (which it does not modify).
func Summarize(xs []float64) Summary {
	if len(xs) == 0 {
		nan := math.NaN()
		return Summary{Median: nan, P90: nan, P99: nan, Min: nan, Max: nan, Mean: nan}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	var sum float64
	for _, x := range s {
		sum += x
	}
	return Summary{
		N:      len(s),
		Median: Quantile(s, 0.5),
		P90:    Quantile(s, 0.9),
		P99:    Quantile(s, 0.99),
		Min:    s[0],
		Max:    s[len(s)-1],
		Mean:   sum / float64(len(s)),
	}
}

// Durations converts durations to seconds.
func Durations(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = d.Seconds()
	}
	return out
}

// Ratio returns a/b, or NaN when either is NaN or b is zero.
func Ratio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return math.NaN()
	}
	return a / b
}
