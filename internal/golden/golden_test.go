package golden

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	failed []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Errorf(f string, a ...any) { r.failed = append(r.failed, f) }
func (r *recorder) Fatalf(f string, a ...any) { r.failed = append(r.failed, f) }
func (r *recorder) Fatal(a ...any)            { r.failed = append(r.failed, "fatal") }

func TestCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "x.golden")
	for _, tc := range []struct {
		name   string
		got    string
		update bool
		fails  bool
	}{
		{"missing", "a\n", false, true},
		{"update creates", "a\n", true, false},
		{"same", "a\n", false, false},
		{"differs", "b\n", false, true},
		{"update rewrites", "b\n", true, false},
		{"same after rewrite", "b\n", false, false},
	} {
		r := &recorder{TB: t}
		Check(r, path, tc.got, tc.update)
		if failed := len(r.failed) > 0; failed != tc.fails {
			t.Errorf("%s: failed=%v (%s), want %v", tc.name, failed, strings.Join(r.failed, "; "), tc.fails)
		}
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "b\n" {
		t.Errorf("file %q, %v; want the last update", b, err)
	}
}

func TestTranscript(t *testing.T) {
	got := Transcript([]string{"add table t\n", "flush table t\n"}, []string{"table t {\n}\n", ""}, "step")
	want := "# transaction 1\nadd table t\n# transaction 2\nflush table t\n" +
		"\n# after step 1\ntable t {\n}\n\n# after step 2\n"
	if got != want {
		t.Errorf("Transcript:\n%q\nwant\n%q", got, want)
	}
	if got := Transcript(nil, nil, "step"); got != "" {
		t.Errorf("Transcript of nothing = %q, want empty", got)
	}
}
