// Package kubeovn runs Kube-OVN's own, unmodified kube-ovn-controller
// (v1.16.2, built by hack/kubeovn/build.sh) against a cluster's API server,
// with the OVN databases it needs: NB and SB ovsdb-servers from Debian's
// ovn-central package, their databases created from the schemas kube-ovn
// itself embeds (Debian's own schemas are older and are refused by its
// client). The controller runs as a host process in a private mount
// namespace (it writes /var/log/kube-ovn unconditionally; a directory of
// ours is bound on /var/log there). How it is built: hack/kubeovn/build.sh.
//
// Stop ends every process this package started and removes its directory;
// the processes also die with the test process (parent-death signal).
package kubeovn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/natgw/natgw/internal/upstream"
)

// Schema sources in kube-ovn's module tree (generated libovsdb models; each
// holds the database schema as a JSON string literal).
const (
	NBModel = "pkg/ovsdb/ovnnb/model.go"
	SBModel = "pkg/ovsdb/ovnsb/model.go"
)

// ServiceClusterIPRange is the controller's --service-cluster-ip-range
// (it routes it via the VPC subnet's gateway in a NAT gateway pod's
// annotations).
const ServiceClusterIPRange = "10.96.0.0/24"

// Config says where the controller binary is and which cluster it drives.
type Config struct {
	// Controller is the kube-ovn-controller binary (its name must be
	// kube-ovn-controller: the binary dispatches on argv[0]).
	Controller string
	// Kubeconfig is an admin kubeconfig of the cluster.
	Kubeconfig string
	// NodeName and NodeIP name the cluster's node (registered as an OVN chassis).
	NodeName, NodeIP string
	// Dir is this run's directory (databases, logs, sockets). Removed by Stop.
	Dir string
	// NBPort and SBPort are loopback TCP ports of the databases (0: 16641, 16642).
	NBPort, SBPort int
	// Log receives progress lines (nil: discarded).
	Log io.Writer
}

// Missing says what keeps Start from running ("" when nothing does).
func Missing(cfg Config) string {
	if os.Geteuid() != 0 {
		return "Kube-OVN's controller needs root (mount namespace)"
	}
	var miss []string
	for _, p := range []string{cfg.Controller, "/usr/sbin/ovsdb-server", "/usr/bin/ovsdb-tool", "/usr/bin/ovn-sbctl", "/usr/bin/ovn-nbctl", "/usr/bin/unshare"} {
		if _, err := os.Stat(p); err != nil {
			miss = append(miss, p)
		}
	}
	if len(miss) > 0 {
		return "missing " + strings.Join(miss, ", ") + " (run `make kubeovn-assets`)"
	}
	return ""
}

// KubeOVN is a running controller with its databases.
type KubeOVN struct {
	cfg   Config
	procs []*proc
	// spawn runs functions on one OS thread that stays locked and alive
	// until Stop: a child's parent-death signal fires when the thread that
	// forked it exits, and Go ends threads that other code locked (e.g.
	// netlab's namespace switches) — a child forked from such a thread
	// would be killed under the test's feet.
	spawn chan func()
	quit  chan struct{}
}

func (k *KubeOVN) startSpawner() {
	spawn, quit := make(chan func()), make(chan struct{})
	k.spawn, k.quit = spawn, quit
	go func() {
		runtime.LockOSThread() // never unlocked: the thread lives until Stop, then exits
		for {
			select {
			case f := <-spawn:
				f()
			case <-quit:
				return
			}
		}
	}()
}

// onSpawner runs f on the spawner thread.
func (k *KubeOVN) onSpawner(f func() error) error {
	done := make(chan error, 1)
	k.spawn <- func() { done <- f() }
	return <-done
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// NBAddr and SBAddr are the databases' addresses as OVN tools take them.
func (k *KubeOVN) NBAddr() string { return fmt.Sprintf("tcp:127.0.0.1:%d", k.cfg.NBPort) }
func (k *KubeOVN) SBAddr() string { return fmt.Sprintf("tcp:127.0.0.1:%d", k.cfg.SBPort) }

// LogPath is the controller's log file (what it writes to /var/log/kube-ovn).
func (k *KubeOVN) LogPath() string {
	return filepath.Join(k.cfg.Dir, "varlog", "kube-ovn", "kube-ovn-controller.log")
}

// OutputPath is the file the controller's stdout and stderr go to (its
// klog lines).
func (k *KubeOVN) OutputPath() string {
	return filepath.Join(k.cfg.Dir, "kube-ovn-controller.out")
}

func (k *KubeOVN) logf(format string, args ...any) {
	if k.cfg.Log != nil {
		fmt.Fprintf(k.cfg.Log, "kubeovn: "+format+"\n", args...)
	}
}

// Start creates the databases, serves them, registers the node as a chassis
// and starts kube-ovn-controller. The cluster objects the controller needs
// are the caller's (see Objects). On error everything started is stopped.
func Start(ctx context.Context, cfg Config) (_ *KubeOVN, err error) {
	if cfg.NBPort == 0 {
		cfg.NBPort = 16641
	}
	if cfg.SBPort == 0 {
		cfg.SBPort = 16642
	}
	if why := Missing(cfg); why != "" {
		return nil, errors.New("kubeovn: " + why)
	}
	if err := os.RemoveAll(cfg.Dir); err != nil {
		return nil, fmt.Errorf("kubeovn: clear %s: %w", cfg.Dir, err)
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "varlog", "kube-ovn"), 0o755); err != nil {
		return nil, fmt.Errorf("kubeovn: %w", err)
	}
	k := &KubeOVN{cfg: cfg}
	k.startSpawner()
	defer func() {
		if err != nil {
			_ = k.Stop(context.Background())
		}
	}()
	for _, db := range []struct {
		name, model string
		port        int
	}{{"nb", NBModel, cfg.NBPort}, {"sb", SBModel, cfg.SBPort}} {
		if err := k.startDB(ctx, db.name, db.model, db.port); err != nil {
			return nil, err
		}
	}
	// The global rows ovn-northd's deployment would create (the controller
	// reads NB_Global and exits without it).
	if _, err := run(ctx, "ovn-nbctl", "--db="+k.NBAddr(), "--timeout=10", "init"); err != nil {
		return nil, err
	}
	if _, err := run(ctx, "ovn-sbctl", "--db="+k.SBAddr(), "--timeout=10", "init"); err != nil {
		return nil, err
	}
	// Without a chassis for the node the controller loops on "failed to get Chassis".
	if _, err := run(ctx, "ovn-sbctl", "--db="+k.SBAddr(), "--timeout=10", "chassis-add", cfg.NodeName, "geneve", cfg.NodeIP,
		"--", "set", "chassis", cfg.NodeName, "hostname="+cfg.NodeName); err != nil {
		return nil, err
	}
	if err := k.startController(); err != nil {
		return nil, err
	}
	return k, nil
}

// schemaOf returns the database schema embedded in kube-ovn's model file.
func schemaOf(ctx context.Context, model string) ([]byte, error) {
	b, err := upstream.ReadFile(ctx, model)
	if err != nil {
		return nil, err
	}
	s := string(b)
	const open = "var schema = `"
	i := strings.Index(s, open)
	if i < 0 {
		return nil, fmt.Errorf("kubeovn: no %q in %s", open, model)
	}
	s = s[i+len(open):]
	j := strings.IndexByte(s, '`')
	if j < 0 {
		return nil, fmt.Errorf("kubeovn: unterminated schema in %s", model)
	}
	return []byte(s[:j]), nil
}

func (k *KubeOVN) startDB(ctx context.Context, name, model string, port int) error {
	schema, err := schemaOf(ctx, model)
	if err != nil {
		return err
	}
	dir := k.cfg.Dir
	sp := filepath.Join(dir, name+".ovsschema")
	if err := os.WriteFile(sp, schema, 0o644); err != nil {
		return fmt.Errorf("kubeovn: %w", err)
	}
	db := filepath.Join(dir, name+".db")
	if _, err := run(ctx, "ovsdb-tool", "create", db, sp); err != nil {
		return err
	}
	if err := portFree(port); err != nil {
		return err
	}
	cmd := exec.Command("/usr/sbin/ovsdb-server", db,
		"--remote=ptcp:"+strconv.Itoa(port)+":127.0.0.1",
		"--unixctl="+filepath.Join(dir, name+".ctl"),
		"--log-file="+filepath.Join(dir, name+".log"),
		"--no-chdir")
	if err := k.start(name+"-ovsdb-server", cmd); err != nil {
		return err
	}
	return waitTCP(ctx, fmt.Sprintf("127.0.0.1:%d", port), 10*time.Second)
}

func (k *KubeOVN) startController() error {
	c := k.cfg
	args := []string{
		"--kubeconfig=" + c.Kubeconfig,
		"--ovn-nb-addr=" + k.NBAddr(),
		"--ovn-sb-addr=" + k.SBAddr(),
		"--default-cidr=10.16.0.0/16",
		"--node-switch-cidr=100.64.0.0/16",
		"--service-cluster-ip-range=" + ServiceClusterIPRange,
		"--enable-lb=false",
		"--enable-np=false",
		"--gc-interval=0",
		"--log_file=" + filepath.Join(c.Dir, "controller.klog"),
		"--logtostderr=false",
		"--alsologtostderr=true",
		"--v=3",
	}
	// A private mount namespace whose /var/log is our directory; then the
	// controller itself (exec: the same process, so signals reach it).
	script := `mount --make-rprivate / && mount --bind "$1" /var/log && shift && exec "$@"`
	cmd := exec.Command("/usr/bin/unshare", append([]string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh",
		filepath.Join(c.Dir, "varlog"), c.Controller}, args...)...)
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+c.Kubeconfig,
		"POD_NAME=kube-ovn-controller-natgw-test",
		"POD_NAMESPACE=kube-system",
		"NODE_NAME="+c.NodeName,
		"ENABLE_BIND_LOCAL_IP=true",
		"POD_IPS=127.0.0.1",
	)
	return k.start("kube-ovn-controller", cmd)
}

// start runs cmd with its output in <dir>/<name>.out, in its own process
// group, killed when the test process dies.
func (k *KubeOVN) start(name string, cmd *exec.Cmd) error {
	out, err := os.OpenFile(filepath.Join(k.cfg.Dir, name+".out"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("kubeovn: %w", err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := k.onSpawner(cmd.Start); err != nil {
		out.Close()
		return fmt.Errorf("kubeovn: start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	k.procs = append(k.procs, p)
	k.logf("started %s (pid %d)", name, cmd.Process.Pid)
	return nil
}

// RestartController stops kube-ovn-controller and starts it again with the
// same arguments, its output appended to the same file: what a rollout, a
// crash or a node failover does to it.
func (k *KubeOVN) RestartController(ctx context.Context) error {
	for i, p := range k.procs {
		if p.name != "kube-ovn-controller" {
			continue
		}
		if err := p.stop(ctx); err != nil {
			return err
		}
		k.procs = append(k.procs[:i:i], k.procs[i+1:]...)
		return k.startController()
	}
	return errors.New("kubeovn: kube-ovn-controller is not running")
}

// stop ends p's process group: SIGTERM, SIGKILL after 10 s (or when ctx
// ends), and waits up to 5 s more for it to exit.
func (p *proc) stop(ctx context.Context) error {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-p.done:
			return nil
		case <-time.After(5 * time.Second):
			return fmt.Errorf("kubeovn: %s (pid %d) did not exit", p.name, p.cmd.Process.Pid)
		}
	case <-ctx.Done():
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		return fmt.Errorf("kubeovn: stop %s: %w", p.name, ctx.Err())
	}
}

// Alive reports an error when a process of ours has exited.
func (k *KubeOVN) Alive() error {
	for _, p := range k.procs {
		select {
		case <-p.done:
			return fmt.Errorf("kubeovn: %s exited: %v (output in %s)", p.name, p.err, filepath.Join(k.cfg.Dir, p.name+".out"))
		default:
		}
	}
	return nil
}

// Stop ends the controller, then the databases (SIGTERM, SIGKILL after 10 s),
// and removes the run's directory unless keep is set by NATGW_KEEP_KUBEOVN=1.
func (k *KubeOVN) Stop(ctx context.Context) error {
	var errs []error
	for i := len(k.procs) - 1; i >= 0; i-- {
		if err := k.procs[i].stop(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	k.procs = nil
	if k.quit != nil {
		close(k.quit)
		k.quit = nil
	}
	if os.Getenv("NATGW_KEEP_KUBEOVN") != "1" {
		if err := os.RemoveAll(k.cfg.Dir); err != nil {
			errs = append(errs, fmt.Errorf("kubeovn: %w", err))
		}
	}
	return errors.Join(errs...)
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubeovn: %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func portFree(port int) error {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return fmt.Errorf("kubeovn: port %d in use (a leftover ovsdb-server?): %w", port, err)
	}
	return l.Close()
}

func waitTCP(ctx context.Context, addr string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubeovn: %s not listening after %v: %w", addr, limit, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubeovn: wait for %s: %w", addr, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
