package scenario

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// s6HeapTop is the top of one saved heap profile of the controller.
type s6HeapTop struct {
	profile string     // file name in the output directory
	rows    [][]string // flat, flat%, sum%, cum, cum%, function
}

// s6HeapTopLines is how many functions of each profile the report shows.
const s6HeapTopLines = 8

// s6HeapTops reads the top of each saved heap profile (inuse_space, as
// `go tool pprof -top` prints it); the error says why there is none (no
// output directory, no go tool).
func s6HeapTops(ctx context.Context, e *Env, names ...string) ([]s6HeapTop, string) {
	if e.OutDir == "" {
		return nil, "no output directory: no heap profile saved"
	}
	var out []s6HeapTop
	var errs []string
	for _, n := range names {
		path := filepath.Join(e.OutDir, n)
		if _, err := os.Stat(path); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", n, err))
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		b, err := exec.CommandContext(cctx, "go", "tool", "pprof", "-top", "-sample_index=inuse_space",
			fmt.Sprintf("-nodecount=%d", s6HeapTopLines), path).CombinedOutput()
		cancel()
		if err != nil {
			errs = append(errs, fmt.Sprintf("go tool pprof %s: %v: %s", n, err, lastLines(string(b), 2)))
			continue
		}
		rows := s6ParsePprofTop(string(b), s6HeapTopLines)
		if len(rows) == 0 {
			errs = append(errs, fmt.Sprintf("go tool pprof %s: no rows in %q", n, lastLines(string(b), 3)))
			continue
		}
		out = append(out, s6HeapTop{profile: n, rows: rows})
	}
	return out, strings.Join(errs, "; ")
}

// s6ParsePprofTop returns up to n rows of `go tool pprof -top` output: the
// lines after its "flat  flat%  sum%  cum  cum%" header, each as flat,
// flat%, sum%, cum, cum% and the function (which may hold spaces).
func s6ParsePprofTop(out string, n int) [][]string {
	var rows [][]string
	header := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if !header {
			header = len(f) >= 5 && f[0] == "flat" && f[1] == "flat%"
			continue
		}
		if len(f) < 6 || !strings.HasSuffix(f[1], "%") || !strings.HasSuffix(f[4], "%") {
			continue
		}
		rows = append(rows, append(f[:5:5], strings.Join(f[5:], " ")))
		if len(rows) == n {
			break
		}
	}
	return rows
}
