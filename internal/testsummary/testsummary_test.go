package testsummary

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "summary.txt")
	t.Setenv(EnvVar, path)
	Record(t, "A x=1")
	Record(t, "B y=2")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), "A x=1\nB y=2\n"; got != want {
		t.Errorf("file holds %q, want %q", got, want)
	}
	t.Setenv(EnvVar, "")
	Record(t, "C only in the log") // no file: nothing to check but no error
}

func TestScenario(t *testing.T) {
	path := filepath.Join(t.TempDir(), "summary.txt")
	t.Setenv(EnvVar, path)
	Scenario(t, "E2E-SUMMARY", "1-lifecycle", "nftables", "ready_in", 1234567*time.Microsecond, "leaked", 0, "odd")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The key without a value is left out; durations are rounded to ms.
	if got, want := string(b), "E2E-SUMMARY scenario=1-lifecycle dataplane=nftables ready_in=1.235s leaked=0 result=ok\n"; got != want {
		t.Errorf("file holds %q, want %q", got, want)
	}
}

func TestPercentile(t *testing.T) {
	const ms = time.Millisecond
	d := []time.Duration{5 * ms, ms, 4 * ms, 2 * ms, 3 * ms, 10 * ms, 9 * ms, 8 * ms, 7 * ms, 6 * ms}
	for _, tc := range []struct {
		p    int
		want time.Duration
	}{{50, 5 * time.Millisecond}, {99, 10 * time.Millisecond}, {100, 10 * time.Millisecond}, {10, time.Millisecond}, {1, time.Millisecond}, {91, 10 * time.Millisecond}, {90, 9 * time.Millisecond}} {
		if got := Percentile(d, tc.p); got != tc.want {
			t.Errorf("Percentile(1..10 ms, %d) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if d[0] != 5*time.Millisecond {
		t.Error("Percentile sorted its argument")
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("Percentile(nil) = %v, want 0", got)
	}
}
