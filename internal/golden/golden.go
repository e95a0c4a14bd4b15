// Package golden compares a test's output with a golden file kept in the
// repository, where the layout is the contract (nft ruleset dumps).
package golden

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Check compares got with the file at path. With update it (re)writes the
// file first, creating its directory; the caller decides how update is
// asked for (a -update flag, an environment variable). A missing file or a
// difference fails the test, with how to update in the message.
func Check(t testing.TB, path, got string, update bool) {
	t.Helper()
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("golden file: %v (rewrite it with the test's update switch after checking the output)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs (rewrite it with the test's update switch after checking):\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}

// Transcript is the text of a table layout's golden file: each transaction
// applied, "# transaction N" above it, then each dump taken after a step,
// "# after STEP N" above it (both counted from 1).
func Transcript(applied, dumps []string, step string) string {
	var b strings.Builder
	for i, tx := range applied {
		fmt.Fprintf(&b, "# transaction %d\n%s", i+1, tx)
	}
	for i, d := range dumps {
		fmt.Fprintf(&b, "\n# after %s %d\n%s", step, i+1, d)
	}
	return b.String()
}
