package report

import (
	"fmt"
	"math"
	"strconv"
)

// Seconds formats a duration given in seconds with three significant digits
// and a unit that keeps the number readable: "14.2 µs", "27.1 ms", "2.31 s".
// NaN gives "—".
func Seconds(s float64) string {
	switch {
	case math.IsNaN(s):
		return "—"
	case s < 0:
		return "-" + Seconds(-s)
	case s == 0:
		return "0"
	case s < 1e-6:
		return sig(s*1e9) + " ns"
	case s < 1e-3:
		return sig(s*1e6) + " µs"
	case s < 1:
		return sig(s*1e3) + " ms"
	}
	return sig(s) + " s"
}

// Count formats a count or rate compactly: 950, "1.23k", "427k", "1.27M".
// NaN gives "—".
func Count(x float64) string {
	switch a := math.Abs(x); {
	case math.IsNaN(x):
		return "—"
	case a >= 1e6:
		return sig(x/1e6) + "M"
	case a >= 1e3:
		return sig(x/1e3) + "k"
	}
	return sig(x)
}

// Bytes formats a byte count in MiB with three significant digits.
func Bytes(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	return sig(x/(1<<20)) + " MiB"
}

// Times formats a ratio as a factor: "1,520×", "3.4×", "0.91×". NaN gives "—".
func Times(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "—"
	}
	if x >= 1000 {
		return thousands(int64(math.Round(x))) + "×"
	}
	return sig(x) + "×"
}

// sig formats x with three significant digits, without exponent and
// without trailing zeros after the point.
func sig(x float64) string {
	if x == 0 {
		return "0"
	}
	a := math.Abs(x)
	if a >= 1000 {
		return thousands(int64(math.Round(x)))
	}
	digits := 2 - int(math.Floor(math.Log10(a)))
	if digits < 0 {
		digits = 0
	}
	s := strconv.FormatFloat(x, 'f', digits, 64)
	// 9.996 rounds to "10.00": drop what the extra digit added.
	if f, err := strconv.ParseFloat(s, 64); err == nil && math.Abs(f) >= 10*math.Pow(10, float64(-digits+2)) && digits > 0 {
		s = strconv.FormatFloat(x, 'f', digits-1, 64)
	}
	for digits > 0 && len(s) > 1 && s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	if s[len(s)-1] == '.' {
		s = s[:len(s)-1]
	}
	return s
}

func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := false
	if n < 0 {
		neg, s = true, s[1:]
	}
	var out []byte
	for i, c := range []byte(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, c)
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// SizeLabel names a table size compactly: 0, 1, "1k", "10k", "100k", "1.5k".
func SizeLabel(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	if n >= 1000 {
		return Count(float64(n))
	}
	return strconv.Itoa(n)
}
