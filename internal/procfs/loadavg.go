package procfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// LoadAverage returns the 1, 5 and 15 minute load averages, the first
// three fields of /proc/loadavg as the kernel writes them, joined by single
// spaces (e.g. "0.52 0.58 0.59"): the form benchmark reports print.
func LoadAverage() (string, error) {
	f, _, err := readLoadAvg()
	if err != nil {
		return "", err
	}
	return strings.Join(f[:], " "), nil
}

// LoadAverage1 returns the 1-minute load average.
func LoadAverage1() (float64, error) {
	_, one, err := readLoadAvg()
	return one, err
}

func readLoadAvg() ([3]string, float64, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return [3]string{}, 0, err
	}
	f, one, err := parseLoadAvg(string(b))
	if err != nil {
		return [3]string{}, 0, fmt.Errorf("/proc/loadavg: %w", err)
	}
	return f, one, nil
}

// parseLoadAvg reads the three load averages of a /proc/loadavg line
// ("0.52 0.58 0.59 2/345 12345"): as written, and the first as a number.
func parseLoadAvg(s string) (f [3]string, one float64, err error) {
	fields := strings.Fields(s)
	if len(fields) < 3 {
		return f, 0, fmt.Errorf("%q: %d fields, want ≥3", s, len(fields))
	}
	for i := range f {
		v, err := strconv.ParseFloat(fields[i], 64)
		if err != nil {
			return [3]string{}, 0, fmt.Errorf("%q: %w", s, err)
		}
		if i == 0 {
			one = v
		}
		f[i] = fields[i]
	}
	return f, one, nil
}
