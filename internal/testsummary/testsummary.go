// Package testsummary records the one-line figures that tests report (e2e
// scenario summaries, latency measurements): in the test log, and appended
// to the file named by $NATGW_TEST_SUMMARY when it is set, so that `make
// test` can print them at the end although `go test ./...` shows the logs
// of passing packages to nobody.
package testsummary

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvVar names the file the lines are appended to.
const EnvVar = "NATGW_TEST_SUMMARY"

var mu sync.Mutex

// Record logs line on t and appends it to $NATGW_TEST_SUMMARY. A failure to
// write the file fails the test: a figure that was promised must not vanish.
func Record(t testing.TB, line string) {
	t.Helper()
	t.Log(line)
	path := os.Getenv(EnvVar)
	if path == "" {
		return
	}
	mu.Lock()
	defer mu.Unlock()
	// One write of a whole line with O_APPEND: lines of test binaries
	// running in parallel do not interleave.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Errorf("test summary: %v", err)
		return
	}
	if _, err := fmt.Fprintln(f, line); err != nil {
		t.Errorf("test summary: write %s: %v", path, err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("test summary: close %s: %v", path, err)
	}
}

// Scenario records one scenario's line: "PREFIX scenario=S dataplane=D
// k=v ... result=ok|FAIL" (result from t.Failed()). kv alternates keys and
// values; durations are rounded to the millisecond.
func Scenario(t testing.TB, prefix, scenario, dataplane string, kv ...any) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "%s scenario=%s dataplane=%s", prefix, scenario, dataplane)
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1]
		if d, ok := v.(time.Duration); ok {
			v = d.Round(time.Millisecond)
		}
		fmt.Fprintf(&b, " %v=%v", kv[i], v)
	}
	if t.Failed() {
		b.WriteString(" result=FAIL")
	} else {
		b.WriteString(" result=ok")
	}
	Record(t, b.String())
}

// Percentile returns the p-th percentile (0 < p ≤ 100) of d by nearest
// rank (the smallest value at or above which p % of d lie), without
// changing d; 0 for an empty d.
func Percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}
