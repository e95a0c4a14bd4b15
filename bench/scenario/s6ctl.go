package scenario

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/natgw/natgw/internal/procfs"
)

// controllerBinary returns the natgw-controller binary: the one next to
// the natgw binary (make bench-build puts both in .cache/bin), else one
// built now from the source tree into dir.
func controllerBinary(ctx context.Context, natgw, dir string) (string, error) {
	next := filepath.Join(filepath.Dir(natgw), "natgw-controller")
	if st, err := os.Stat(next); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return next, nil
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", fmt.Errorf("natgw-controller not next to %s, and it cannot be built: %w", natgw, err)
	}
	bin := filepath.Join(dir, "natgw-controller")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./controller/cmd/natgw-controller")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build natgw-controller: %w: %s", err, lastLines(string(out), 5))
	}
	return bin, nil
}

// freeLocalAddr returns a 127.0.0.1 address with a port free right now.
func freeLocalAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// ctlProcess is a natgw-controller process (the binary, not this
// process's packages), its log appended to a file. With the local
// transport its `natgw serve` agents are its children, in its process
// group.
type ctlProcess struct {
	bin, logPath, metricsAddr string
	args                      []string
	// env is added to this process's environment (nil: inherited as is).
	env []string

	// memCap, when set, bounds the controller's VmRSS: above it the
	// benchmark kills the controller (and says so) rather than let it take
	// the memory of a shared machine.
	memCap float64

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	killed  string  // why the benchmark killed it over memCap
	peak    float64 // largest VmRSS sampled since takePeak
	started time.Time
}

// s6MemCap is the controller's memory bound: half of what the machine has
// available now, at most 8 GiB.
func s6MemCap() float64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 8 << 30
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "MemAvailable:" {
			if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
				return min(8<<30, kb*1024/2)
			}
		}
	}
	return 8 << 30
}

// takePeak returns the largest VmRSS sampled (every 500 ms) since the
// last call, and starts a new span.
// A span shorter than the sampling period gets a sample now.
func (p *ctlProcess) takePeak() float64 {
	p.mu.Lock()
	v := p.peak
	p.peak = 0
	p.mu.Unlock()
	if v == 0 {
		if rss, _, err := p.memory(); err == nil {
			v = rss
		}
	}
	return v
}

// guard samples the controller's VmRSS (see takePeak) and kills the
// controller when it exceeds memCap.
func (p *ctlProcess) guard(pid int, exited chan struct{}) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-exited:
			return
		case <-t.C:
		}
		rss, _, err := procfs.Memory(pid)
		if err != nil {
			continue
		}
		p.mu.Lock()
		p.peak = max(p.peak, rss)
		p.mu.Unlock()
		if p.memCap <= 0 || rss <= p.memCap {
			continue
		}
		p.mu.Lock()
		p.killed = fmt.Sprintf("killed by the benchmark: VmRSS %.0f MiB over the bound of %.0f MiB (half the machine's available memory, at most 8 GiB)", rss/(1<<20), p.memCap/(1<<20))
		p.mu.Unlock()
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return
	}
}

// start execs the controller. It is forked from a goroutine locked to its
// own OS thread that lives until the controller exits: the controller's
// parent-death signal (SIGKILL, so that a killed benchmark leaves no
// controller behind) fires when the forking thread ends, and Go ends
// threads other code left locked (namespace switches).
func (p *ctlProcess) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return errors.New("natgw-controller already running")
	}
	log, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("controller log: %w", err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = log, log
	if p.env != nil {
		cmd.Env = append(os.Environ(), p.env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	exited, started := make(chan struct{}), make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends after the controller
		defer close(exited)
		defer log.Close()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
	}()
	t0 := time.Now()
	if err := <-started; err != nil {
		return fmt.Errorf("start natgw-controller: %w", err)
	}
	p.cmd, p.exited, p.started = cmd, exited, t0
	go p.guard(cmd.Process.Pid, exited)
	return nil
}

// pid returns the running controller's pid (0 when none).
func (p *ctlProcess) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// alive says why the controller is not running ("" when it is).
func (p *ctlProcess) alive() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return errors.New("natgw-controller not started")
	}
	select {
	case <-p.exited:
		if p.killed != "" {
			return fmt.Errorf("natgw-controller %s", p.killed)
		}
		return fmt.Errorf("natgw-controller exited: %v (log: %s)", p.waitErr, p.tail())
	default:
		return nil
	}
}

// tail returns the last lines of the log.
func (p *ctlProcess) tail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	return lastLines(string(b), 5)
}

// stop sends SIGTERM to the controller (it closes its agents' sessions
// itself) and waits up to timeout for it to exit; then SIGKILL to the
// process group. It returns how long the exit took.
func (p *ctlProcess) stop(timeout time.Duration) (time.Duration, error) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return 0, nil
	}
	t0 := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return 0, fmt.Errorf("SIGTERM natgw-controller pid %d: %w", cmd.Process.Pid, err)
	}
	var err error
	select {
	case <-exited:
	case <-time.After(timeout):
		err = fmt.Errorf("natgw-controller pid %d did not exit within %v of SIGTERM; killed", cmd.Process.Pid, timeout)
	}
	took := time.Since(t0)
	if kerr := p.kill(); err == nil {
		err = kerr
	}
	return took, err
}

// kill sends SIGKILL to the controller's process group (the controller and
// its agents) and waits for the controller to be reaped.
func (p *ctlProcess) kill() error {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	pgid := cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("natgw-controller pid %d not reaped 10s after SIGKILL", pgid)
	}
	// Agents that were still exiting: gone when the group is empty.
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(-pgid, 0) == nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("process group %d of natgw-controller not empty 10s after SIGKILL", pgid)
		}
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// memory reads the controller's VmRSS and VmHWM.
func (p *ctlProcess) memory() (rss, hwm float64, err error) {
	pid := p.pid()
	if pid == 0 {
		return 0, 0, errors.New("natgw-controller not running")
	}
	rss, hwm, err = procfs.Memory(pid)
	if err != nil {
		return 0, 0, fmt.Errorf("natgw-controller memory: %w", err)
	}
	return rss, hwm, nil
}

// metrics scrapes the controller's Prometheus endpoint.
func (p *ctlProcess) metrics(ctx context.Context) (promSamples, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metricsAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("natgw-controller metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("natgw-controller metrics: %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("natgw-controller metrics: %w", err)
	}
	return parseProm(string(b))
}

// heapProfile saves the controller's heap profile (pprof format, from its
// --pprof endpoint) to path, after a forced GC (debug/pprof/heap?gc=1), so
// `go tool pprof -top path` names what holds the memory at that point.
func (p *ctlProcess) heapProfile(ctx context.Context, path string) error {
	return p.profile(ctx, "heap?gc=1", path, 30*time.Second)
}

// profile saves one of the controller's runtime profiles from its --pprof
// endpoint (query: the part of the URL after /debug/pprof/) to path.
func (p *ctlProcess) profile(ctx context.Context, query, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	what := "natgw-controller profile " + query
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metricsAddr+"/debug/pprof/"+query, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", what, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", what, err)
	}
	return f.Close()
}

// ctlLogLine is one line of the controller's JSON log.
type ctlLogLine struct {
	Time    time.Time `json:"time"`
	Msg     string    `json:"msg"`
	Gateway string    `json:"gateway"`
	Objects *int      `json:"objects"`
}

// readLog parses the controller's JSON log lines from byte offset on
// (lines that are not JSON, e.g. a panic, are skipped) and returns the
// offset after the last complete line.
func (p *ctlProcess) readLog(offset int64) ([]ctlLogLine, int64, error) {
	f, err := os.Open(p.logPath)
	if err != nil {
		return nil, offset, fmt.Errorf("controller log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, offset, fmt.Errorf("controller log: %w", err)
	}
	r := bufio.NewReaderSize(f, 1<<16)
	var out []ctlLogLine
	for {
		line, err := r.ReadBytes('\n')
		if err != nil { // an incomplete last line is read again next time
			break
		}
		offset += int64(len(line))
		var l ctlLogLine
		if json.Unmarshal(line, &l) == nil && l.Msg != "" {
			out = append(out, l)
		}
	}
	return out, offset, nil
}

// logSize is the log's current length (where a restart's lines begin).
func (p *ctlProcess) logSize() int64 {
	st, err := os.Stat(p.logPath)
	if err != nil {
		return 0
	}
	return st.Size()
}

// promSample is one sample of a Prometheus text exposition.
type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

type promSamples []promSample

// parseProm parses the samples of a Prometheus text exposition (comments
// and blank lines skipped; an optional timestamp after the value ignored).
func parseProm(text string) (promSamples, error) {
	var out promSamples
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		s := promSample{labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i < 0 {
			return nil, fmt.Errorf("metrics: malformed sample %q", line)
		} else {
			s.name, rest = line[:i], line[i:]
		}
		if strings.HasPrefix(rest, "{") {
			rest = rest[1:]
			for {
				rest = strings.TrimLeft(rest, ", ")
				if strings.HasPrefix(rest, "}") {
					rest = rest[1:]
					break
				}
				eq := strings.Index(rest, `="`)
				if eq < 0 {
					return nil, fmt.Errorf("metrics: malformed labels in %q", line)
				}
				key := rest[:eq]
				rest = rest[eq+2:]
				var val strings.Builder
				closed := false
				for i := 0; i < len(rest); i++ {
					if rest[i] == '\\' && i+1 < len(rest) {
						i++
						switch rest[i] {
						case 'n':
							val.WriteByte('\n')
						default:
							val.WriteByte(rest[i])
						}
						continue
					}
					if rest[i] == '"' {
						rest, closed = rest[i+1:], true
						break
					}
					val.WriteByte(rest[i])
				}
				if !closed {
					return nil, fmt.Errorf("metrics: unterminated label value in %q", line)
				}
				s.labels[key] = val.String()
			}
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics: value of %q: %w", line, err)
		}
		s.value = v
		out = append(out, s)
	}
	return out, nil
}

// sum adds the samples of metric name whose labels include every pair of
// match.
func (ps promSamples) sum(name string, match map[string]string) float64 {
	var total float64
next:
	for _, s := range ps {
		if s.name != name {
			continue
		}
		for k, v := range match {
			if s.labels[k] != v {
				continue next
			}
		}
		total += s.value
	}
	return total
}

// apiWrites splits the mutating requests an API server's /metrics counts
// (apiserver_request_total, verbs POST, PUT, PATCH, DELETE) into those on
// natgw's objects (group kubeovn.io, subresources included), Events, and
// all.
type apiWrites struct{ natgw, events, all float64 }

func (ps promSamples) apiWrites() apiWrites {
	var w apiWrites
	for _, s := range ps {
		if s.name != "apiserver_request_total" {
			continue
		}
		switch s.labels["verb"] {
		case "POST", "PUT", "PATCH", "DELETE":
		default:
			continue
		}
		w.all += s.value
		switch {
		case s.labels["group"] == "kubeovn.io":
			w.natgw += s.value
		case s.labels["resource"] == "events":
			w.events += s.value
		}
	}
	return w
}

func (w apiWrites) sub(o apiWrites) apiWrites {
	return apiWrites{natgw: w.natgw - o.natgw, events: w.events - o.events, all: w.all - o.all}
}
