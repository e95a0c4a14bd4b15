package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/internal/procfs"
)

// ColdListOptions configure RunColdList: the cold start's list, measured
// alone. A control plane (envtest) is loaded once with scenario 6's
// objects (reconciled shape: natgw's finalizer, a Ready status), then the
// natgw-controller binary (the same code as in a cluster: its cache
// options, scheme, indexes, controllers and handlers) is started Rounds
// times per variant, alternating the variants, and timed from exec until
// every controller started its workers (its caches synced). The
// controller runs as a read-only user: its workers' writes are refused,
// so every start sees the same objects.
type ColdListOptions struct {
	// Assets is the envtest binaries' directory, CRDDir natgw's CRDs.
	Assets, CRDDir string
	// Controller is the natgw-controller binary.
	Controller string
	// Dir receives the controllers' logs and the profiles.
	Dir string
	// Gateways and Rules size the load as scenario 6 does (s6Objects:
	// per gateway a tenth FIPs, a tenth SNATs, the rest DNATs, and their
	// EIPs), plus one VpcNatGateway per gateway.
	Gateways, Rules int
	// Creators are the parallel API clients that load the objects.
	Creators int
	// Variants are the controller's configurations compared (at least
	// one); Rounds the starts of each (alternating).
	Variants []ColdListVariant
	Rounds   int
	// ProfileSeconds > 0 takes a CPU profile of the controller and of
	// kube-apiserver that long from the start of each variant's first
	// round (files coldlist-<variant>-{controller,apiserver}.pprof).
	ProfileSeconds int
	// EtcdDir, when set, is etcd's data directory, kept after the run: a
	// later run with the same directory (and size) reuses the loaded
	// objects instead of loading them again.
	EtcdDir string
	// Controllers is how many controllers natgw-controller starts (6 in
	// replace mode without --provision-gateways: the five NAT kinds and
	// QoSPolicy); the start is synced when all of them started workers.
	Controllers int
	// Timeout bounds one start until synced.
	Timeout time.Duration
	// Printf reports progress (nil: silent).
	Printf func(format string, args ...any)
}

// ColdListVariant is one configuration of the controller: environment
// (e.g. KUBE_FEATURE_WatchListClient=false) and extra flags.
type ColdListVariant struct {
	Name string
	Env  []string
	Args []string
	// Controller, when set, is this variant's natgw-controller binary
	// (another build: an A/B of a change in the same run).
	Controller string
}

// ColdListRun is one start of the controller until its caches synced.
type ColdListRun struct {
	Variant string
	Round   int
	// FirstWorkers and Synced: exec until the first and the last
	// controller logged "Starting workers".
	FirstWorkers, Synced time.Duration
	// Controllers is how many controllers started their workers.
	Controllers int
	// CPU used from exec until Synced by the controller, kube-apiserver
	// and etcd (/proc/PID/stat utime+stime).
	ControllerCPU, APIServerCPU, EtcdCPU time.Duration
	// HWM is the controller's peak resident memory (VmHWM, MiB) at Synced.
	HWM float64
	// Load is the 1-minute load average when the run ended.
	Load float64
}

// ColdListResult is RunColdList's outcome.
type ColdListResult struct {
	// Objects counts the loaded objects by kind; Load is how long loading
	// them took.
	Objects map[string]int
	Load    time.Duration
	Runs    []ColdListRun
	// Profiles are the CPU profiles written (paths).
	Profiles []string
}

// consistencyCheckerEnv switches kube-apiserver's watch cache
// consistency checker (it inherits this process's environment).
const consistencyCheckerEnv = "KUBE_WATCHCACHE_CONSISTENCY_CHECKER"

// coldListUser is the read-only identity the measured controller uses.
const coldListUser = "natgw-coldlist-reader"

// RunColdList loads a control plane and measures the controller's cold
// start's list (see ColdListOptions).
func RunColdList(ctx context.Context, o ColdListOptions) (*ColdListResult, error) {
	if len(o.Variants) == 0 || o.Rounds < 1 || o.Gateways < 1 || o.Rules < o.Gateways {
		return nil, fmt.Errorf("cold list: want variants, rounds >= 1 and rules >= gateways >= 1 (got %d variants, %d rounds, %d gateways, %d rules)", len(o.Variants), o.Rounds, o.Gateways, o.Rules)
	}
	if o.Creators < 1 {
		o.Creators = 32
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Minute
	}
	printf := o.Printf
	if printf == nil {
		printf = func(string, ...any) {}
	}
	if o.Controllers < 1 {
		o.Controllers = 6
	}
	env := &Env{EnvtestAssets: o.Assets, CRDDir: o.CRDDir}
	if why := envtestReady(env); why != "" {
		return nil, errors.New(why)
	}
	// kube-apiserver's watch cache consistency check (on by default)
	// lists every object from etcd now and then: a run of it inside one
	// start and not the other would decide an A/B.
	if os.Getenv(consistencyCheckerEnv) == "" {
		if err := os.Setenv(consistencyCheckerEnv, "false"); err != nil {
			return nil, err
		}
		defer os.Unsetenv(consistencyCheckerEnv)
	}
	cp, err := startControlPlaneIn(env, o.EtcdDir)
	if err != nil {
		return nil, err
	}
	defer cp.Close()
	kubeconfig, err := coldListReader(ctx, cp, o.Dir)
	if err != nil {
		return nil, err
	}
	res := &ColdListResult{}
	t0 := time.Now()
	marker := ""
	if o.EtcdDir != "" {
		marker = filepath.Join(o.EtcdDir, fmt.Sprintf("natgw-coldlist-loaded-%d-%d.json", o.Gateways, o.Rules))
	}
	if b, err := os.ReadFile(marker); marker != "" && err == nil && json.Unmarshal(b, &res.Objects) == nil {
		printf("reusing the objects of %s: %v", marker, res.Objects)
	} else {
		if res.Objects, err = coldListLoad(ctx, cp, o, printf); err != nil {
			return nil, err
		}
		res.Load = time.Since(t0)
		printf("loaded %v in %s", res.Objects, res.Load.Round(time.Millisecond))
		if marker != "" {
			b, err := json.Marshal(res.Objects)
			if err != nil {
				return nil, err
			}
			if err := os.WriteFile(marker, b, 0o600); err != nil {
				return nil, fmt.Errorf("write %s: %w", marker, err)
			}
		}
	}
	// A warm-up start, not counted: the first list after kube-apiserver
	// started also fills its watch cache from etcd (measured: 77 CPU
	// seconds of kube-apiserver instead of 25-33 at 113k objects).
	if _, _, err := coldListStart(ctx, cp, o, o.Variants[0], 0, kubeconfig); err != nil {
		return res, fmt.Errorf("warm-up start: %w", err)
	}
	printf("warm-up start done")
	for round := 1; round <= o.Rounds; round++ {
		for _, v := range o.Variants {
			run, profs, err := coldListStart(ctx, cp, o, v, round, kubeconfig)
			if err != nil {
				return res, fmt.Errorf("variant %s round %d: %w", v.Name, round, err)
			}
			res.Runs = append(res.Runs, run)
			res.Profiles = append(res.Profiles, profs...)
			printf("%-24s round %d: first workers %6.2fs, synced %6.2fs (%d controllers); CPU controller %6.2fs, kube-apiserver %6.2fs, etcd %5.2fs; controller VmHWM %.0f MiB; load %.2f",
				v.Name, round, run.FirstWorkers.Seconds(), run.Synced.Seconds(), run.Controllers,
				run.ControllerCPU.Seconds(), run.APIServerCPU.Seconds(), run.EtcdCPU.Seconds(), run.HWM, run.Load)
		}
	}
	return res, nil
}

// coldListReader adds the read-only user (get, list, watch of every
// resource) and writes its kubeconfig into dir.
func coldListReader(ctx context.Context, cp *controlPlane, dir string) (string, error) {
	c, err := cp.client()
	if err != nil {
		return "", err
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: coldListUser},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"*"}, Resources: []string{"*"}, Verbs: []string{"get", "list", "watch"}}},
	}
	bind := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: coldListUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: coldListUser},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: coldListUser}},
	}
	for _, obj := range []client.Object{role, bind} {
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("create %T %s: %w", obj, obj.GetName(), err)
		}
	}
	u, err := cp.env.ControlPlane.AddUser(envtest.User{Name: coldListUser}, nil)
	if err != nil {
		return "", fmt.Errorf("add user %s: %w", coldListUser, err)
	}
	b, err := u.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("kubeconfig of %s: %w", coldListUser, err)
	}
	path := filepath.Join(dir, "kubeconfig-reader")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return path, nil
}

// coldListLoad creates scenario 6's objects (and the gateways), each with
// natgw's finalizer, then writes each one's status as a reconciled object
// has it (Ready, its gateway, a Ready condition), through the status
// subresource.
func coldListLoad(ctx context.Context, cp *controlPlane, o ColdListOptions, printf func(string, ...any)) (map[string]int, error) {
	c, err := cp.client()
	if err != nil {
		return nil, err
	}
	eips, rules := s6Objects(s6Plan{Gateways: o.Gateways, Rules: o.Rules})
	objs := make([]s6Obj, 0, o.Gateways+len(eips)+len(rules))
	for g := 0; g < o.Gateways; g++ {
		objs = append(objs, s6Obj{obj: &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: s6GatewayName(g)}, Spec: v1.VpcNatGatewaySpec{Vpc: "vpc1", Subnet: "subnet1"}}, kind: "gw", gw: g})
	}
	objs = append(append(objs, eips...), rules...)
	var mu sync.Mutex
	done := 0
	step := func() {
		mu.Lock()
		done++
		if done%20000 == 0 {
			printf("loading: %d of %d writes", done, 2*len(objs))
		}
		mu.Unlock()
	}
	if err := parallel(ctx, len(objs), o.Creators, func(i int) error {
		obj := objs[i].obj
		// natgw's finalizer, and upstream's on the NAT rules and EIPs
		// (natgw keeps it, see reconciler).
		obj.SetFinalizers([]string{reconciler.Finalizer})
		if objs[i].kind != "gw" {
			obj.SetFinalizers([]string{v1.Finalizer, reconciler.Finalizer})
		}
		step()
		return createObj(ctx, c, obj)
	}); err != nil {
		return nil, err
	}
	now := metav1.Now().UTC().Format(time.RFC3339)
	if err := parallel(ctx, len(objs), o.Creators, func(i int) error {
		so := objs[i]
		if so.kind == "gw" {
			step()
			return nil
		}
		st := map[string]any{
			"ready":   true,
			"natGwDp": s6GatewayName(so.gw),
			"conditions": []map[string]any{{
				"type": "Ready", "status": "True", "reason": "Programmed",
				"message": "programmed on gateway " + s6GatewayName(so.gw), "lastTransitionTime": now, "lastUpdateTime": now,
			}},
		}
		if so.kind == "eip" {
			st["ip"] = so.obj.(*v1.IptablesEIP).Spec.V4ip
			st["nat"] = "dnat"
		} else {
			st["v4ip"] = "192.0.2.1"
		}
		patch, err := json.Marshal(map[string]any{"status": st})
		if err != nil {
			return err
		}
		step()
		if err := c.Status().Patch(ctx, so.obj, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return fmt.Errorf("status of %T %s: %w", so.obj, so.obj.GetName(), err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return s6Counts(objs), nil
}

// coldListStart starts the controller once and waits until every
// controller started its workers.
func coldListStart(ctx context.Context, cp *controlPlane, o ColdListOptions, v ColdListVariant, round int, kubeconfig string) (ColdListRun, []string, error) {
	run := ColdListRun{Variant: v.Name, Round: round}
	apiPID, err := procfs.FindOne("kube-apiserver", "--cert-dir="+cp.env.ControlPlane.APIServer.CertDir)
	if err != nil {
		return run, nil, err
	}
	etcdPID, err := procfs.FindOne("etcd", "--data-dir="+cp.env.ControlPlane.Etcd.DataDir)
	if err != nil {
		return run, nil, err
	}
	api0, err := procfs.CPUTime(apiPID)
	if err != nil {
		return run, nil, err
	}
	etcd0, err := procfs.CPUTime(etcdPID)
	if err != nil {
		return run, nil, err
	}
	metricsAddr, err := freeLocalAddr()
	if err != nil {
		return run, nil, err
	}
	bin := o.Controller
	if v.Controller != "" {
		bin = v.Controller
	}
	ctl := &ctlProcess{bin: bin, logPath: filepath.Join(o.Dir, fmt.Sprintf("controller-%s-%d.log", v.Name, round)), metricsAddr: metricsAddr,
		memCap: s6MemCap(), env: v.Env, args: append([]string{
			"--kubeconfig", kubeconfig,
			"--transport", "exec",
			"--leader-elect=false",
			"--metrics-bind-address", metricsAddr,
			"--health-probe-bind-address", "0",
			"--sweep-period", "0", "--drift-period", "0",
			"--pprof",
		}, v.Args...)}
	if err := ctl.start(); err != nil {
		return run, nil, err
	}
	defer func() { _ = ctl.kill() }()
	var profs []string
	var pwg sync.WaitGroup
	perr := make(chan error, 2)
	if o.ProfileSeconds > 0 && round == 1 {
		base := filepath.Join(o.Dir, "coldlist-"+v.Name)
		profs = []string{base + "-controller.pprof", base + "-apiserver.pprof"}
		pwg.Add(2)
		go func() {
			defer pwg.Done()
			perr <- coldListProfile(ctx, http.DefaultClient, "http://"+metricsAddr, o.ProfileSeconds, profs[0])
		}()
		go func() {
			defer pwg.Done()
			hc, err := rest.HTTPClientFor(cp.cfg)
			if err != nil {
				perr <- err
				return
			}
			perr <- coldListProfile(ctx, hc, strings.TrimRight(cp.cfg.Host, "/"), o.ProfileSeconds, profs[1])
		}()
	}
	if err := coldListWait(ctx, ctl, o.Controllers, o.Timeout, &run); err != nil {
		return run, nil, err
	}
	pid := ctl.pid()
	ctlCPU, err := procfs.CPUTime(pid)
	if err != nil {
		return run, nil, err
	}
	api1, err := procfs.CPUTime(apiPID)
	if err != nil {
		return run, nil, err
	}
	etcd1, err := procfs.CPUTime(etcdPID)
	if err != nil {
		return run, nil, err
	}
	run.ControllerCPU, run.APIServerCPU, run.EtcdCPU = ctlCPU, api1-api0, etcd1-etcd0
	_, hwm, err := ctl.memory()
	if err != nil {
		return run, nil, err
	}
	run.HWM = hwm / (1 << 20)
	// The 1-minute load average, 0 when unreadable.
	run.Load, _ = procfs.LoadAverage1()
	pwg.Wait() // the profiles span the sync (the controller runs on)
	close(perr)
	for err := range perr {
		if err != nil {
			return run, nil, err
		}
	}
	return run, profs, nil
}

// coldListLine is one line of the controller's JSON log.
type coldListLine struct {
	Time       time.Time `json:"time"`
	Msg        string    `json:"msg"`
	Controller string    `json:"controller"`
}

// coldListWait polls the controller's log until n controllers logged
// "Starting workers", and fills the run's times (from exec).
func coldListWait(ctx context.Context, ctl *ctlProcess, n int, timeout time.Duration, run *ColdListRun) error {
	deadline := time.Now().Add(timeout)
	workers := map[string]time.Time{}
	var offset int64
	for {
		if err := ctl.alive(); err != nil {
			return err
		}
		f, err := os.Open(ctl.logPath)
		if err != nil {
			return fmt.Errorf("controller log: %w", err)
		}
		b, err := io.ReadAll(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("controller log: %w", err)
		}
		for len(b) > int(offset) {
			rest := b[offset:]
			i := bytes.IndexByte(rest, '\n')
			if i < 0 {
				break
			}
			offset += int64(i + 1)
			var l coldListLine
			if json.Unmarshal(rest[:i], &l) != nil || l.Controller == "" {
				continue
			}
			if l.Msg == "Starting workers" {
				workers[l.Controller] = l.Time
			}
		}
		if len(workers) >= n {
			var first, last time.Time
			for _, t := range workers {
				if first.IsZero() || t.Before(first) {
					first = t
				}
				if t.After(last) {
					last = t
				}
			}
			run.FirstWorkers, run.Synced, run.Controllers = first.Sub(ctl.started), last.Sub(ctl.started), len(workers)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d controllers started their workers within %s (log %s)", len(workers), n, timeout, ctl.logPath)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// coldListProfile saves a CPU profile of seconds from base's
// /debug/pprof/profile (retrying until the endpoint answers: the
// controller's metrics server comes up after exec).
func coldListProfile(ctx context.Context, hc *http.Client, base string, seconds int, path string) error {
	url := base + "/debug/pprof/profile?seconds=" + strconv.Itoa(seconds)
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := hc.Do(req)
		if err != nil {
			if time.Now().After(deadline) {
				return fmt.Errorf("CPU profile %s: %w", url, err)
			}
			time.Sleep(20 * time.Millisecond)
			continue
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("CPU profile %s: %s", url, resp.Status)
		}
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, resp.Body); err != nil {
			f.Close()
			return fmt.Errorf("CPU profile %s: %w", url, err)
		}
		return f.Close()
	}
}

// coldListVariants are the variants natgw-coldlist knows by name.
var coldListVariants = []ColdListVariant{
	// The binary's own default (--watch-list-client=true: client-go's watch list).
	{Name: "default"},
	// client-go's WatchListClient gate (beta, on): the informers' initial
	// list as a watch stream (sendInitialEvents) or as a LIST.
	{Name: "watchlist-off", Env: []string{"KUBE_FEATURE_WatchListClient=false"}},
	{Name: "watchlist-on", Env: []string{"KUBE_FEATURE_WatchListClient=true"}},
}

// ColdListVariantNames lists the variants ColdListVariantNamed knows.
func ColdListVariantNames() []string {
	out := make([]string, len(coldListVariants))
	for i, v := range coldListVariants {
		out[i] = v.Name
	}
	return out
}

// ColdListVariantNamed returns the variant called name.
func ColdListVariantNamed(name string) (ColdListVariant, bool) {
	for _, v := range coldListVariants {
		if v.Name == name {
			return v, true
		}
	}
	return ColdListVariant{}, false
}

// BuildController builds natgw-controller from this checkout into dir.
func BuildController(ctx context.Context, dir string) (string, error) {
	return controllerBinary(ctx, filepath.Join(dir, "natgw"), dir)
}
