package testsummary

import (
	"os"
	"path/filepath"
	"testing"
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
