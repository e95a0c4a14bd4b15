// Package cluster runs a real single-node Kubernetes on this machine for
// tests and for people (`make cluster-up` / `make cluster-down`): etcd and
// kube-apiserver (the envtest builds), kube-controller-manager,
// kube-scheduler, kubelet, containerd with runc and the bridge CNI, built
// by hack/cluster/build.sh into the git-ignored cache. The cluster has its
// own PKI, Node+RBAC authorization and a self-built pause image, and imports
// natgw's image archives.
//
// Everything it changes on the host (sysctls, iptables rules and chains,
// links, mounts, cgroups, fixed paths the kubelet and containerd write) is
// recorded in a state file before it is changed; Down restores it, and so
// does the next Up (or Down) after a run that was killed. One cluster per
// machine at a time: Up takes an exclusive lock that Down releases, so tests
// of several packages that need the cluster serialize.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Fixed names and paths: one cluster per machine.
const (
	// LockPath is flock(2)ed from Up to Down.
	LockPath = "/run/natgw-cluster.lock"
	// StatePath records what to restore (see HostState).
	StatePath = "/var/lib/natgw-cluster.state.json"
	// DefaultBase is the cluster's directory (etcd data, PKI, containerd
	// and kubelet roots, logs).
	DefaultBase = "/var/lib/natgw-cluster"
	// BridgeName is the pod network's bridge.
	BridgeName = "ngwcbr0"
	// NodeLink is the link that holds the node's address (one end of a
	// veth pair whose both ends stay on the host).
	NodeLink = "ngwnode0"
	// PauseImage is the self-built sandbox image (gwimage/images).
	PauseImage = "docker.io/natgw/pause:0.1.0"
	// svcChain is the nat chain that stands in for kube-proxy for the one
	// service pods need: kubernetes.default (ClusterIP -> the API server).
	svcChain = "NATGW-CLUSTER-SVC"
)

// Config says where the binaries are and how the node is addressed. Zero
// fields take the defaults of Defaults.
type Config struct {
	// BinDir holds hack/cluster/build.sh's output (and cni/ below it).
	BinDir string
	// EnvtestDir holds kube-apiserver and etcd (make envtest-assets).
	EnvtestDir string
	// Base is the cluster's own directory.
	Base string
	// Runc is the runc binary (Debian's package).
	Runc string
	// Images are image archives to import (with the pause image, which is
	// always imported). Unqualified names are tagged fully qualified.
	Images []string
	// PauseArchive is the pause image's archive.
	PauseArchive string

	NodeName     string
	NodeIP       string // on NodeLink; the API server and kubelet listen here
	PodCIDR      string
	ServiceCIDR  string
	APIServiceIP string // the kubernetes.default ClusterIP (first of ServiceCIDR)

	APIPort, EtcdPort, EtcdPeerPort, KubeletPort, ControllerManagerPort, SchedulerPort int

	// Log receives progress lines (nil: discarded).
	Log io.Writer
}

// Defaults fills the zero fields of cfg; repo is the natgw checkout (for
// the cache paths).
func Defaults(cfg Config, repo string) Config {
	set := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	seti := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	set(&cfg.BinDir, filepath.Join(repo, ".cache/cluster/bin"))
	set(&cfg.EnvtestDir, filepath.Join(repo, ".cache/envtest/bin"))
	set(&cfg.PauseArchive, filepath.Join(repo, ".cache/cluster/pause-image.tar"))
	set(&cfg.Base, DefaultBase)
	set(&cfg.Runc, "/usr/sbin/runc")
	set(&cfg.NodeName, "natgw-node")
	set(&cfg.NodeIP, "172.30.77.1")
	set(&cfg.PodCIDR, "10.244.77.0/24")
	set(&cfg.ServiceCIDR, "10.96.77.0/24")
	set(&cfg.APIServiceIP, "10.96.77.1")
	// Below the ephemeral range and away from the envtest tests (random ports).
	seti(&cfg.APIPort, 16443)
	seti(&cfg.EtcdPort, 16379)
	seti(&cfg.EtcdPeerPort, 16380)
	seti(&cfg.KubeletPort, 16250)
	seti(&cfg.ControllerManagerPort, 16257)
	seti(&cfg.SchedulerPort, 16259)
	return cfg
}

// Binaries are the programs Up needs, by directory kind.
var (
	NodeBinaries    = []string{"kubelet", "kube-controller-manager", "kube-scheduler", "kubectl", "containerd", "ctr", "containerd-shim-runc-v2"}
	CNIBinaries     = []string{"bridge", "host-local", "loopback", "portmap"}
	EnvtestBinaries = []string{"kube-apiserver", "etcd"}
)

// Missing says what keeps cfg from starting a cluster ("" when nothing
// does): binaries not built, not root.
func Missing(cfg Config) string {
	if os.Geteuid() != 0 {
		return "the cluster needs root (network, mounts, cgroups)"
	}
	var miss []string
	check := func(dir string, names []string) {
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
				miss = append(miss, filepath.Join(dir, n))
			}
		}
	}
	check(cfg.BinDir, NodeBinaries)
	check(filepath.Join(cfg.BinDir, "cni"), CNIBinaries)
	check(cfg.EnvtestDir, EnvtestBinaries)
	check(filepath.Dir(cfg.Runc), []string{filepath.Base(cfg.Runc)})
	check(filepath.Dir(cfg.PauseArchive), []string{filepath.Base(cfg.PauseArchive)})
	if len(miss) > 0 {
		return "missing " + strings.Join(miss, ", ") + " (run `make cluster-assets`)"
	}
	return ""
}

// Cluster is a running single-node cluster.
type Cluster struct {
	cfg   Config
	lock  *os.File
	state *HostState

	// pkiDir is this cluster's PKI directory below Base, new per Up:
	// client-go (v0.37, ClientsAllowCARotation) caches TLS transports by
	// the CA file's path and re-reads the file at most every 5 minutes, so
	// a second cluster in the same process with its CA at the same path
	// would be verified against the first one's CA ("certificate signed by
	// unknown authority") until that transport is collected.
	pkiDir string
	// startup is how long Up's steps took (without waiting for the lock).
	startup time.Duration

	mu       sync.Mutex
	down     bool
	stopSig  chan struct{}
	children []*exec.Cmd
}

// Up cleans up after a killed run if needed, records the host's state and
// starts the cluster, returning when the node is Ready and pods can be
// created. On failure everything it changed is restored. SIGINT and
// SIGTERM during the cluster's life run Down and exit.
func Up(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if why := Missing(cfg); why != "" {
		return nil, errors.New("cluster: " + why)
	}
	lock, err := acquireLock(ctx)
	if err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, lock: lock, stopSig: make(chan struct{}), pkiDir: "pki-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	if err := cleanupStale(ctx, c.logf); err != nil {
		c.unlock()
		return nil, err
	}
	st, err := captureHost(ctx, cfg.Base, []string{cfg.BinDir}, []string{BridgeName, NodeLink})
	if err != nil {
		c.unlock()
		return nil, fmt.Errorf("cluster: record host state: %w", err)
	}
	c.state = st
	if err := saveState(StatePath, st); err != nil {
		c.unlock()
		return nil, err
	}
	c.handleSignals()
	defer func() {
		if err != nil {
			tail := c.logTails()
			if derr := c.Down(context.WithoutCancel(ctx)); derr != nil {
				err = errors.Join(err, fmt.Errorf("tear-down after the failed start: %w", derr))
			}
			err = fmt.Errorf("%w\n%s", err, tail)
		}
	}()
	t0 := time.Now()
	for _, step := range []struct {
		name string
		fn   func(context.Context) error
	}{
		{"ports free", c.clearPorts},
		{"files", c.writeFiles},
		{"network", c.hostNetwork},
		{"etcd", c.startEtcd},
		{"kube-apiserver", c.startAPIServer},
		{"controllers", c.startControllers},
		{"containerd", c.startContainerd},
		{"images", c.importImages},
		{"kubelet", c.startKubelet},
		{"node ready", c.waitNodeReady},
	} {
		if err := step.fn(ctx); err != nil {
			return nil, fmt.Errorf("cluster up: %s: %w", step.name, err)
		}
		c.logf("cluster: %s done at %.1fs", step.name, time.Since(t0).Seconds())
	}
	c.startup = time.Since(t0)
	return c, nil
}

// Attach returns the cluster a `natgw-cluster up` left running (for the
// matching down). It takes the lock.
func Attach(ctx context.Context, cfg Config) (*Cluster, error) {
	lock, err := acquireLock(ctx)
	if err != nil {
		return nil, err
	}
	st, err := loadState(StatePath)
	if err != nil {
		_ = lock.Close()
		return nil, err
	}
	return &Cluster{cfg: cfg, lock: lock, state: st, stopSig: make(chan struct{})}, nil
}

// Detach releases the lock and leaves the cluster running (`make
// cluster-up`); the state file stays for Down.
func (c *Cluster) Detach() {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(c.stopSig)
	c.down = true
	c.unlock()
}

// Down stops the cluster, restores the host and checks that the recorded
// sysctls and iptables rules are as they were before Up. It is idempotent.
func (c *Cluster) Down(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down {
		return nil
	}
	c.down = true
	close(c.stopSig)
	var err error
	if c.state != nil {
		err = restoreHost(ctx, c.state)
		if err == nil {
			err = verifyRestored(ctx, c.state)
		}
	}
	if err == nil {
		if rerr := os.Remove(StatePath); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = rerr
		}
	}
	for _, cmd := range c.children {
		_ = cmd.Process.Release()
	}
	c.unlock()
	if err != nil {
		return fmt.Errorf("cluster down (state kept in %s for the next run): %w", StatePath, err)
	}
	return nil
}

// cleanupStale restores the host after a run that died without Down.
func cleanupStale(ctx context.Context, logf func(string, ...any)) error {
	st, err := loadState(StatePath)
	if err != nil || st == nil {
		return err
	}
	logf("cluster: a previous run left %s: restoring the host first", StatePath)
	if err := restoreHost(ctx, st); err != nil {
		return fmt.Errorf("cluster: clean up after the previous run: %w", err)
	}
	if err := verifyRestored(ctx, st); err != nil {
		return fmt.Errorf("cluster: clean up after the previous run: %w", err)
	}
	if err := os.Remove(StatePath); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return nil
}

// LockFDEnv names the environment variable holding an inherited file
// descriptor of LockPath whose open file already holds the lock: a parent
// that keeps the cluster across several natgw-cluster runs (e2e/firstrun
// around `make cluster-up` ... `make cluster-down`, during which no other
// run may take the cluster) passes it, and Up and Attach use it instead of
// waiting for the lock their parent holds.
const LockFDEnv = "NATGW_CLUSTER_LOCK_FD"

// Lock takes LockPath exclusively, waiting while another cluster user
// holds it (as Up does), for a caller that hands it to natgw-cluster runs
// through LockFDEnv. Closing the file releases it.
func Lock(ctx context.Context) (*os.File, error) { return acquireLock(ctx) }

// acquireLock takes LockPath exclusively, waiting while another cluster
// user holds it; with LockFDEnv set, on the inherited descriptor (which
// takes at once when its open file holds the lock).
func acquireLock(ctx context.Context) (*os.File, error) {
	f, err := lockFile()
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("cluster lock %s: %w", LockPath, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("cluster lock %s: held by another run: %w", LockPath, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// lockFile opens LockPath, or takes the descriptor LockFDEnv names after
// checking that it is LockPath.
func lockFile() (*os.File, error) {
	v := os.Getenv(LockFDEnv)
	if v == "" {
		f, err := os.OpenFile(LockPath, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("cluster lock: %w", err)
		}
		return f, nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: want an inherited file descriptor number (3 or more)", LockFDEnv, v)
	}
	var got, want syscall.Stat_t
	if err := syscall.Fstat(fd, &got); err != nil {
		return nil, fmt.Errorf("%s=%d: %w", LockFDEnv, fd, err)
	}
	if err := syscall.Stat(LockPath, &want); err != nil {
		return nil, fmt.Errorf("%s=%d: cluster lock: %w", LockFDEnv, fd, err)
	}
	if got.Dev != want.Dev || got.Ino != want.Ino {
		return nil, fmt.Errorf("%s=%d: not %s", LockFDEnv, fd, LockPath)
	}
	return os.NewFile(uintptr(fd), LockPath), nil
}

func (c *Cluster) unlock() {
	if c.lock != nil {
		_ = c.lock.Close() // closing the last descriptor releases the flock
		c.lock = nil
	}
}

func (c *Cluster) handleSignals() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		defer signal.Stop(ch)
		select {
		case s := <-ch:
			fmt.Fprintf(os.Stderr, "cluster: %v: tearing the cluster down\n", s)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			if err := c.Down(ctx); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
			cancel()
			os.Exit(130)
		case <-c.stopSig:
		}
	}()
}

func (c *Cluster) logf(format string, args ...any) {
	if c.cfg.Log != nil {
		fmt.Fprintf(c.cfg.Log, format+"\n", args...)
	}
}

func (c *Cluster) path(p string) string { return filepath.Join(c.cfg.Base, p) }

// Before returns what Up recorded of the host before changing it (under
// the lock, after any clean-up of a killed run): what Down restores and
// checks.
func (c *Cluster) Before() HostState {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == nil {
		return HostState{}
	}
	return *c.state
}

// Startup is how long Up took to start the cluster once it held the lock
// (a run waiting for another run's cluster is not counted).
func (c *Cluster) Startup() time.Duration { return c.startup }

// Config returns the cluster's configuration.
func (c *Cluster) Config() Config { return c.cfg }

// Server is the API server's URL.
func (c *Cluster) Server() string { return fmt.Sprintf("https://%s:%d", c.cfg.NodeIP, c.cfg.APIPort) }

// Kubeconfig is the admin kubeconfig's path.
func (c *Cluster) Kubeconfig() string { return c.path("admin.kubeconfig") }

// ContainerdSocket is containerd's gRPC socket.
func (c *Cluster) ContainerdSocket() string { return c.path("containerd/containerd.sock") }

// LogPath is where daemon name writes its log.
func (c *Cluster) LogPath(name string) string { return c.path("log/" + name + ".log") }

// RESTConfig is the admin's client configuration.
func (c *Cluster) RESTConfig() (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return nil, fmt.Errorf("cluster: admin kubeconfig: %w", err)
	}
	return cfg, nil
}

// Kubectl runs kubectl as the admin and returns its standard output.
func (c *Cluster) Kubectl(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.cfg.BinDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
	cmd.Stdin = stdin
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// Ctr runs containerd's ctr in the CRI's namespace.
func (c *Cluster) Ctr(ctx context.Context, args ...string) (string, error) {
	return output(ctx, filepath.Join(c.cfg.BinDir, "ctr"), append([]string{"--address", c.ContainerdSocket(), "-n", "k8s.io"}, args...)...)
}

func (c *Cluster) writeFiles(ctx context.Context) error {
	for _, d := range []string{c.pkiDir, "etcd", "log/pods", "kubelet", "kubelet-plugins/volume", "controller-manager/flex", "containerd/root", "containerd/state", "cni/net.d", "cni/ipam"} {
		if err := os.MkdirAll(c.path(d), 0o755); err != nil {
			return err
		}
	}
	if err := makePKI(ctx, c.path(c.pkiDir), c.pkiCerts()); err != nil {
		return err
	}
	files := map[string]string{
		"admin.kubeconfig":              c.kubeconfig("admin"),
		"controller-manager.kubeconfig": c.kubeconfig("controller-manager"),
		"scheduler.kubeconfig":          c.kubeconfig("scheduler"),
		"kubelet.kubeconfig":            c.kubeconfig("node"),
		"containerd/config.toml":        c.containerdConfig(),
		"cni/net.d/10-natgw.conflist":   c.cniConfig(),
		"kubelet/config.yaml":           c.kubeletConfig(),
	}
	for name, content := range files {
		if err := os.WriteFile(c.path(name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// hostNetwork adds the node's address (on a veth pair of the host's own,
// so the node's traffic stays on this host) and the kubernetes.default service's DNAT (no
// kube-proxy: in-cluster clients reach the API server through it).
func (c *Cluster) hostNetwork(ctx context.Context) error {
	steps := [][]string{
		{"ip", "link", "add", NodeLink, "type", "veth", "peer", "name", NodeLink + "p"}, // no dummy module on every VM kernel
		{"ip", "link", "set", NodeLink + "p", "up"},
		{"ip", "addr", "add", c.cfg.NodeIP + "/32", "dev", NodeLink},
		{"ip", "link", "set", NodeLink, "up"},
		{"iptables", "-t", "nat", "-N", svcChain},
		{"iptables", "-t", "nat", "-A", svcChain, "-d", c.cfg.APIServiceIP + "/32", "-p", "tcp", "--dport", "443",
			"-j", "DNAT", "--to-destination", fmt.Sprintf("%s:%d", c.cfg.NodeIP, c.cfg.APIPort)},
		{"iptables", "-t", "nat", "-I", "PREROUTING", "-j", svcChain},
		{"iptables", "-t", "nat", "-I", "OUTPUT", "-j", svcChain},
	}
	for _, s := range steps {
		if err := run(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// start launches a daemon in its own session, its output in its log file,
// and records it in the state file.
func (c *Cluster) start(name, bin string, args ...string) error {
	logf, err := os.OpenFile(c.LogPath(name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.cfg.Base
	cmd.Env = append(os.Environ(), "PATH="+os.Getenv("PATH")+":/usr/sbin:/sbin")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	c.children = append(c.children, cmd)
	go func() { _ = cmd.Wait() }() // reap it when it ends
	exe, err := filepath.EvalSymlinks(bin)
	if err != nil {
		exe = bin
	}
	c.state.Procs = append(c.state.Procs, Proc{Name: name, Pid: cmd.Process.Pid, Exe: exe})
	return saveState(StatePath, c.state)
}

// Restart stops daemon name (SIGTERM, SIGKILL after 10 s) and starts it
// again with the same arguments (fault tests: an API server restart, the
// kubelet's exec streams cut). It returns when the new process runs.
func (c *Cluster) Restart(ctx context.Context, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range c.state.Procs {
		if p.Name != name {
			continue
		}
		var cmd *exec.Cmd
		for _, ch := range c.children {
			if ch.Process.Pid == p.Pid {
				cmd = ch
			}
		}
		if cmd == nil {
			return fmt.Errorf("cluster: %s was not started by this process", name)
		}
		_ = syscall.Kill(p.Pid, syscall.SIGTERM)
		waitGone(ctx, []int{p.Pid}, 10*time.Second)
		_ = syscall.Kill(p.Pid, syscall.SIGKILL)
		waitGone(ctx, []int{p.Pid}, 5*time.Second)
		c.state.Procs = append(c.state.Procs[:i:i], c.state.Procs[i+1:]...)
		return c.start(name, cmd.Path, cmd.Args[1:]...)
	}
	return fmt.Errorf("cluster: no daemon %s", name)
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	client := fmt.Sprintf("http://127.0.0.1:%d", c.cfg.EtcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", c.cfg.EtcdPeerPort)
	if err := c.start("etcd", filepath.Join(c.cfg.EnvtestDir, "etcd"), flags(
		"name", "natgw", "data-dir", c.path("etcd"),
		"listen-client-urls", client, "advertise-client-urls", client,
		"listen-peer-urls", peer, "initial-advertise-peer-urls", peer,
		"initial-cluster", "natgw="+peer, "unsafe-no-fsync", "true", "log-level", "warn")...); err != nil {
		return err
	}
	return waitHTTP(ctx, http.DefaultClient, client+"/health", time.Minute)
}

func (c *Cluster) startAPIServer(ctx context.Context) error {
	pki := c.path(c.pkiDir)
	if err := c.start("kube-apiserver", filepath.Join(c.cfg.EnvtestDir, "kube-apiserver"), flags(
		"etcd-servers", fmt.Sprintf("http://127.0.0.1:%d", c.cfg.EtcdPort),
		"bind-address", c.cfg.NodeIP, "advertise-address", c.cfg.NodeIP, "secure-port", fmt.Sprint(c.cfg.APIPort),
		"client-ca-file", pki+"/ca.crt", "tls-cert-file", pki+"/apiserver.crt", "tls-private-key-file", pki+"/apiserver.key",
		"service-account-key-file", pki+"/sa.pub", "service-account-signing-key-file", pki+"/sa.key",
		"service-account-issuer", "https://kubernetes.default.svc",
		"service-cluster-ip-range", c.cfg.ServiceCIDR,
		"authorization-mode", "Node,RBAC", "enable-admission-plugins", "NodeRestriction",
		"allow-privileged", "true",
		"kubelet-client-certificate", pki+"/apiserver-kubelet-client.crt", "kubelet-client-key", pki+"/apiserver-kubelet-client.key",
		"kubelet-certificate-authority", pki+"/ca.crt", "kubelet-preferred-address-types", "InternalIP",
		"cert-dir", c.path(c.pkiDir+"/apiserver-generated"), "profiling", "false", "v", "1")...); err != nil {
		return err
	}
	if err := c.waitAPI(ctx, 2*time.Minute); err != nil {
		ls, _ := listeners([]int{c.cfg.APIPort})
		return fmt.Errorf("%w (listening on port %d: %v)", err, c.cfg.APIPort, ls)
	}
	return nil
}

// waitAPI waits for the API server's /readyz as the admin.
func (c *Cluster) waitAPI(ctx context.Context, limit time.Duration) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return err
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return err
	}
	return waitHTTP(ctx, hc, c.Server()+"/readyz", limit)
}

// WaitAPI waits until the API server answers /readyz (after a restart).
func (c *Cluster) WaitAPI(ctx context.Context, limit time.Duration) error {
	return c.waitAPI(ctx, limit)
}

func (c *Cluster) startControllers(ctx context.Context) error {
	pki := c.path(c.pkiDir)
	cm := c.path("controller-manager.kubeconfig")
	if err := c.start("kube-controller-manager", filepath.Join(c.cfg.BinDir, "kube-controller-manager"), flags(
		"kubeconfig", cm, "authentication-kubeconfig", cm, "authorization-kubeconfig", cm,
		"bind-address", "127.0.0.1", "secure-port", fmt.Sprint(c.cfg.ControllerManagerPort),
		"service-account-private-key-file", pki+"/sa.key", "root-ca-file", pki+"/ca.crt",
		"use-service-account-credentials", "true", "leader-elect", "false",
		"service-cluster-ip-range", c.cfg.ServiceCIDR,
		"flex-volume-plugin-dir", c.path("controller-manager/flex"), "v", "1")...); err != nil {
		return err
	}
	sc := c.path("scheduler.kubeconfig")
	return c.start("kube-scheduler", filepath.Join(c.cfg.BinDir, "kube-scheduler"), flags(
		"kubeconfig", sc, "authentication-kubeconfig", sc, "authorization-kubeconfig", sc,
		"bind-address", "127.0.0.1", "secure-port", fmt.Sprint(c.cfg.SchedulerPort), "leader-elect", "false", "v", "1")...)
}

func (c *Cluster) startContainerd(ctx context.Context) error {
	if err := c.start("containerd", filepath.Join(c.cfg.BinDir, "containerd"), "--config", c.path("containerd/config.toml")); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := c.Ctr(ctx, "version"); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("containerd not answering: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// importImages imports the pause image and cfg.Images, tagging each name
// fully qualified (the CRI looks images up by their normalized name).
func (c *Cluster) importImages(ctx context.Context) error {
	for _, archive := range append([]string{c.cfg.PauseArchive}, c.cfg.Images...) {
		if err := c.ImportImage(ctx, archive); err != nil {
			return err
		}
	}
	return nil
}

// ImportImage imports an image archive into the CRI's namespace and tags
// its names fully qualified.
func (c *Cluster) ImportImage(ctx context.Context, archive string) error {
	before, err := c.imageNames(ctx)
	if err != nil {
		return err
	}
	if _, err := c.Ctr(ctx, "images", "import", archive); err != nil {
		return fmt.Errorf("import %s: %w", archive, err)
	}
	after, err := c.imageNames(ctx)
	if err != nil {
		return err
	}
	for n := range after {
		if before[n] || strings.HasPrefix(n, "sha256:") {
			continue
		}
		if q := QualifiedImage(n); q != n {
			if _, err := c.Ctr(ctx, "images", "tag", "--force", n, q); err != nil {
				return fmt.Errorf("tag %s: %w", n, err)
			}
		}
	}
	return nil
}

func (c *Cluster) imageNames(ctx context.Context) (map[string]bool, error) {
	out, err := c.Ctr(ctx, "images", "ls", "-q")
	if err != nil {
		return nil, err
	}
	return parseImageNames(out), nil
}

// imageRef is what `ctr images ls -q` prints for an image: a lowercase
// reference or digest. Anything else on its output (a log line of ctr's,
// seen in CI as `time="..." level=...`) is not an image name.
var imageRef = regexp.MustCompile(`^[a-z0-9][a-z0-9._/:@-]*$`)

// parseImageNames returns the image names of `ctr images ls -q` output.
func parseImageNames(out string) map[string]bool {
	m := map[string]bool{}
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimSpace(l); imageRef.MatchString(l) {
			m[l] = true
		}
	}
	return m
}

func (c *Cluster) startKubelet(ctx context.Context) error {
	return c.start("kubelet", filepath.Join(c.cfg.BinDir, "kubelet"), flags(
		"config", c.path("kubelet/config.yaml"), "kubeconfig", c.path("kubelet.kubeconfig"),
		"root-dir", c.path("kubelet"), "cert-dir", c.path("kubelet/pki"),
		"node-ip", c.cfg.NodeIP, "hostname-override", c.cfg.NodeName, "v", "1")...)
}

// waitNodeReady waits for the node's Ready condition and the default
// namespace's service account (pods can be created from then on).
func (c *Cluster) waitNodeReady(ctx context.Context) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	for {
		n, err := cs.CoreV1().Nodes().Get(ctx, c.cfg.NodeName, metav1.GetOptions{})
		ready := false
		if err == nil {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready = true
				}
			}
		}
		if ready {
			_, err = cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
			if err == nil {
				return nil
			}
		}
		if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
			c.logf("cluster: waiting for the node: %v", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready with a default service account: %w", c.cfg.NodeName, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Clientset is an admin clientset.
func (c *Cluster) Clientset() (kubernetes.Interface, error) {
	cfg, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func waitHTTP(ctx context.Context, hc *http.Client, url string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("%s: %s", url, resp.Status)
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v)", url, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// logTails returns the last lines of every daemon's log (for errors).
func (c *Cluster) logTails() string {
	var b strings.Builder
	if c.state == nil {
		return ""
	}
	for _, p := range c.state.Procs {
		data, err := os.ReadFile(c.LogPath(p.Name))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "--- %s log (last %d lines)\n%s\n", p.Name, len(lines), strings.Join(lines, "\n"))
	}
	return b.String()
}
