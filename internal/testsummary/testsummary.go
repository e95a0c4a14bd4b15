// Package testsummary records the one-line figures that tests report (e2e
// scenario summaries, latency measurements): in the test log, and appended
// to the file named by $NATGW_TEST_SUMMARY when it is set, so that `make
// test` can print them at the end although `go test ./...` shows the logs
// of passing packages to nobody.
package testsummary

import (
	"fmt"
	"os"
	"sync"
	"testing"
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
