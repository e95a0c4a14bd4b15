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
