package scenario

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// s6ProfileTop is the top of one saved profile (heap or CPU) of the controller.
type s6ProfileTop struct {
	profile string     // file name in the output directory
	rows    [][]string // flat, flat%, sum%, cum, cum%, function
}

// s6HeapTopLines is how many functions of each heap profile the report
// shows; s6CPUTopLines of the cold start's CPU profile (by flat and by
// cumulative time).
const (
	s6HeapTopLines = 8
	s6CPUTopLines  = 12
)

// s6HeapTops reads the top of each saved heap profile (inuse_space, as
// `go tool pprof -top` prints it); the error says why there is none (no
// output directory, no go tool).
func s6HeapTops(ctx context.Context, e *Env, names ...string) ([]s6ProfileTop, string) {
	return s6ProfileTops(ctx, e, s6HeapTopLines, []string{"-sample_index=inuse_space"}, names...)
}

// s6ProfileTops reads the top n functions of each saved profile as
// `go tool pprof -top` prints them with args (the sample index, -cum).
func s6ProfileTops(ctx context.Context, e *Env, n int, args []string, names ...string) ([]s6ProfileTop, string) {
	if e.OutDir == "" {
		return nil, "no output directory: no profile saved"
	}
	var out []s6ProfileTop
	var errs []string
	for _, name := range names {
		path := filepath.Join(e.OutDir, name)
		if _, err := os.Stat(path); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		argv := append(append([]string{"tool", "pprof", "-top"}, args...), fmt.Sprintf("-nodecount=%d", n), path)
		b, err := exec.CommandContext(cctx, "go", argv...).CombinedOutput()
		cancel()
		if err != nil {
			errs = append(errs, fmt.Sprintf("go tool pprof %s: %v: %s", name, err, lastLines(string(b), 2)))
			continue
		}
		rows := s6ParsePprofTop(string(b), n)
		if len(rows) == 0 {
			errs = append(errs, fmt.Sprintf("go tool pprof %s: no rows in %q", name, lastLines(string(b), 3)))
			continue
		}
		out = append(out, s6ProfileTop{profile: name, rows: rows})
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

// s6CPUWindow is the length of one window of the cold start's CPU
// profile: the runtime's profile endpoint profiles for a fixed time, and
// the cold start's length is what is measured, so it is profiled in
// windows until every gateway synced and the windows are merged.
const s6CPUWindow = 5 * time.Second

// s6CPURecorder profiles a controller's CPU in consecutive windows from
// the moment its --pprof endpoint answers until stopped.
type s6CPURecorder struct {
	ctl    *ctlProcess
	dir    string // the windows' profiles
	stopCh chan struct{}
	stop   func()
	done   chan struct{}
	// Set by the recording goroutine, read after done.
	windows []string
	err     error
}

// s6RecordCPU starts recording ctl's CPU (just started: its endpoint
// may not answer yet). finish stops it and writes the merged profile.
func s6RecordCPU(ctx context.Context, ctl *ctlProcess) (*s6CPURecorder, error) {
	dir, err := os.MkdirTemp("", "natgw-bench-cpu-")
	if err != nil {
		return nil, err
	}
	r := &s6CPURecorder{ctl: ctl, dir: dir, stopCh: make(chan struct{}), done: make(chan struct{})}
	r.stop = sync.OnceFunc(func() { close(r.stopCh) })
	go r.run(ctx)
	return r, nil
}

// run records windows until stopped. Until the first window, a failed
// request is the endpoint not up yet and is retried (for at most a
// minute); after it, a failure ends the recording.
func (r *s6CPURecorder) run(ctx context.Context) {
	defer close(r.done)
	query := fmt.Sprintf("profile?seconds=%d", int(s6CPUWindow/time.Second))
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case <-r.stopCh:
			return
		case <-ctx.Done():
			r.err = ctx.Err()
			return
		default:
		}
		path := filepath.Join(r.dir, fmt.Sprintf("window-%04d.pb.gz", len(r.windows)))
		err := r.ctl.profile(ctx, query, path, s6CPUWindow+30*time.Second)
		switch {
		case err == nil:
			r.windows = append(r.windows, path)
		case len(r.windows) == 0 && time.Now().Before(deadline):
			time.Sleep(20 * time.Millisecond)
		default:
			r.err = fmt.Errorf("CPU profile window %d: %w", len(r.windows), err)
			return
		}
	}
}

// discard stops the recording, waits for the window in progress and
// removes the windows (after finish: nothing left to do).
func (r *s6CPURecorder) discard() {
	r.stop()
	<-r.done
	os.RemoveAll(r.dir)
}

// finish stops the recording (the window in progress completes) and
// merges its windows into path (`go tool pprof -proto`).
func (r *s6CPURecorder) finish(ctx context.Context, path string) error {
	r.stop()
	<-r.done
	defer os.RemoveAll(r.dir)
	if len(r.windows) == 0 {
		return errors.Join(errors.New("no CPU profile window recorded"), r.err)
	}
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var stderr strings.Builder
	cmd := exec.CommandContext(cctx, "go", append([]string{"tool", "pprof", "-proto"}, r.windows...)...)
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = out, &stderr
	err = cmd.Run()
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("merge %d CPU profile windows: %w: %s", len(r.windows), err, lastLines(stderr.String(), 2))
	}
	// A window that failed after others were recorded leaves the profile
	// short of the end; say so.
	if r.err != nil {
		return fmt.Errorf("%d windows merged, then: %w", len(r.windows), r.err)
	}
	return nil
}
