package framework

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/internal/procfs"
)

// ControllerOptions configure the natgw-controller process.
type ControllerOptions struct {
	// Dataplane is --dataplane (nftables or iptables).
	Dataplane string
	// SweepPeriod and DriftPeriod are the controller's periods (default 2s).
	SweepPeriod, DriftPeriod time.Duration
	// Workers is --workers (natgw-controller's default: reconciler.DefaultWorkers).
	Workers int
	// Verbosity is -v (default: $E2E_CONTROLLER_V, else 0).
	Verbosity int
	// LeaderElect runs the controller with leader election (a Lease in
	// namespace default); off by default.
	LeaderElect bool
}

// Controller is a natgw-controller child process (with the local
// transport: its `natgw serve` agents are its children, in its process
// group). Restart starts a new one with the same configuration.
type Controller struct {
	t       testing.TB
	bin     Binaries
	args    []string
	logPath string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	starts int
	log    *os.File
}

// StartController writes the gateway configuration and starts the
// controller; t.Cleanup kills it and its agents.
func StartController(t testing.TB, bin Binaries, api *APIServer, gws []gwconfig.Entry, o ControllerOptions) *Controller {
	t.Helper()
	if o.SweepPeriod == 0 {
		o.SweepPeriod = 2 * time.Second
	}
	if o.DriftPeriod == 0 {
		o.DriftPeriod = 2 * time.Second
	}
	if o.Workers == 0 {
		o.Workers = reconciler.DefaultWorkers
	}
	if o.Verbosity == 0 {
		o.Verbosity, _ = strconv.Atoi(os.Getenv("E2E_CONTROLLER_V"))
	}
	dir := t.TempDir()
	cfg := gwconfig.Config{Defaults: gwconfig.Entry{ExternalPrefixLen: 24}, Gateways: gws}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "gateways.yaml")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		t.Fatal(err)
	}
	c := &Controller{t: t, bin: bin, logPath: filepath.Join(dir, "controller.log")}
	c.args = []string{
		"--kubeconfig", api.KubeconfigPath,
		"--transport", "local",
		"--natgw-binary", bin.Natgw,
		"--gateway-config", cfgPath,
		"--dataplane", o.Dataplane,
		"--sweep-period", o.SweepPeriod.String(),
		"--drift-period", o.DriftPeriod.String(),
		"--workers", strconv.Itoa(o.Workers),
		"--leader-elect=" + strconv.FormatBool(o.LeaderElect),
		"--leader-election-namespace", "default",
		"--metrics-bind-address", "0",
		"--health-probe-bind-address", "0",
		"--log-json=false",
		"-v", strconv.Itoa(o.Verbosity),
	}
	t.Cleanup(func() {
		c.Kill()
		if t.Failed() {
			c.dumpLog()
		}
		c.closeLog()
	})
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	return c
}

// Start starts the controller process (if none runs).
func (c *Controller) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		return errors.New("natgw-controller already running")
	}
	if c.log == nil {
		f, err := os.Create(c.logPath)
		if err != nil {
			return err
		}
		c.log = f
	}
	c.starts++
	fmt.Fprintf(c.log, "=== e2e: start #%d of natgw-controller at %s\n", c.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.bin.Controller, c.args...)
	cmd.Stdout, cmd.Stderr = c.log, c.log
	// Its own process group: its agents (children) are in it too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start natgw-controller: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	c.cmd, c.exited = cmd, exited
	return nil
}

// Pid returns the running controller's pid (0 when none).
func (c *Controller) Pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0
	}
	return c.cmd.Process.Pid
}

// take returns the running controller's command and the channel closed
// when it exits, and forgets them (so one stop acts on it); cmd is nil
// when none runs.
func (c *Controller) take() (cmd *exec.Cmd, exited chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd, exited = c.cmd, c.exited
	c.cmd = nil
	return cmd, exited
}

// Kill9 sends SIGKILL to the controller alone (not its agents, which see
// the end of their input and exit by themselves) and waits for it to die.
func (c *Controller) Kill9() error {
	cmd, exited := c.take()
	if cmd == nil {
		return nil
	}
	pgid := cmd.Process.Pid
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill -9 natgw-controller: %w", err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		return errors.New("natgw-controller did not die within 10s of SIGKILL")
	}
	// Its agents exit at end of input; wait for the group to empty,
	// then kill what is left (bounded).
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(-pgid, 0) == nil {
		if time.Now().After(deadline) {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			return fmt.Errorf("agents of the killed natgw-controller (process group %d) still running after 10s; killed", pgid)
		}
		time.Sleep(Poll)
	}
	return nil
}

// SetDataplane changes --dataplane for the next Start.
func (c *Controller) SetDataplane(dp string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.args {
		if c.args[i] == "--dataplane" && i+1 < len(c.args) {
			c.args[i+1] = dp
		}
	}
}

// Stop stops the controller cleanly (SIGTERM to the controller alone: it
// closes its agents' sessions itself) and waits up to timeout for it to
// exit.
func (c *Controller) Stop(timeout time.Duration) error {
	cmd, exited := c.take()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM natgw-controller pid %d: %w", cmd.Process.Pid, err)
	}
	select {
	case <-exited:
		return nil
	case <-time.After(timeout):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		return fmt.Errorf("natgw-controller pid %d did not exit within %v of SIGTERM", cmd.Process.Pid, timeout)
	}
}

// Restart kills the controller with SIGKILL and starts a new one.
func (c *Controller) Restart() error {
	if err := c.Kill9(); err != nil {
		return err
	}
	return c.Start()
}

// Kill stops the controller and its agents (SIGKILL to the process group).
func (c *Controller) Kill() {
	cmd, exited := c.take()
	if cmd != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			c.t.Errorf("natgw-controller pid %d did not exit after SIGKILL", cmd.Process.Pid)
		}
	}
}

// Log returns the controller's log so far (stdout and stderr of every
// start, with its agents' stderr).
func (c *Controller) Log() string {
	b, _ := os.ReadFile(c.logPath)
	return string(b)
}

func (c *Controller) closeLog() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.log != nil {
		c.log.Close()
		c.log = nil
	}
}

// LogDir is where the whole controller log of a failed test is kept:
// $E2E_LOG_DIR, or natgw-e2e-logs in the temporary directory.
func LogDir() string {
	if d := os.Getenv("E2E_LOG_DIR"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "natgw-e2e-logs")
}

// dumpLog keeps the whole log in LogDir and writes its end to the test log.
func (c *Controller) dumpLog() {
	b := []byte(c.Log())
	kept := filepath.Join(LogDir(), strings.NewReplacer("/", "_", " ", "_").Replace(c.t.Name())+"-controller.log")
	if err := os.MkdirAll(LogDir(), 0o755); err == nil {
		if err := os.WriteFile(kept, b, 0o644); err == nil {
			c.t.Logf("whole natgw-controller log kept in %s", kept)
		}
	}
	const max = 16 << 10
	if len(b) > max {
		b = b[len(b)-max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	c.t.Logf("natgw-controller log (%s, last %d bytes):\n%s", c.logPath, len(b), b)
}

// AgentPIDs returns the pids of the natgw serve processes of this test's
// natgw binary running for network namespace ns.
func (c *Controller) AgentPIDs(ns string) ([]int, error) {
	return procfs.Find(func(argv []string) bool {
		if len(argv) < 2 || argv[0] != c.bin.Natgw || argv[1] != "serve" {
			return false
		}
		for i := 0; i+1 < len(argv); i++ {
			if argv[i] == "--netns" && argv[i+1] == ns {
				return true
			}
		}
		return false
	})
}

// KillAgents sends SIGKILL to the agents serving ns and returns how many
// there were.
func (c *Controller) KillAgents(ns string) (int, error) {
	pids, err := c.AgentPIDs(ns)
	if err != nil {
		return 0, err
	}
	for _, p := range pids {
		if err := syscall.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return 0, fmt.Errorf("kill -9 natgw serve pid %d: %w", p, err)
		}
	}
	return len(pids), nil
}
