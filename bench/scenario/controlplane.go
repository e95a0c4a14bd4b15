package scenario

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/natgw/natgw/controller/gateway"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/procfs"
	"github.com/natgw/natgw/nat"
)

// controlPlane is a kube-apiserver + etcd pair (controller-runtime envtest)
// with natgw's CRDs installed.
type controlPlane struct {
	env *envtest.Environment
	// cfg is the admin user's REST config with client-side rate limiting
	// off (as natgw-controller runs in a cluster: ctrl.GetConfig leaves it
	// to the API server's priority and fairness).
	cfg *rest.Config
}

// envtestReady says why the control plane cannot start ("" when it can).
func envtestReady(e *Env) string {
	if why := apitest.Missing(e.EnvtestAssets); why != "" {
		return why
	}
	if _, err := os.Stat(e.CRDDir); err != nil {
		return fmt.Sprintf("CRD directory %q: %v", e.CRDDir, err)
	}
	return ""
}

// startControlPlane starts kube-apiserver and etcd from e.EnvtestAssets
// and installs the CRDs of e.CRDDir.
func startControlPlane(e *Env) (*controlPlane, error) {
	return startControlPlaneIn(e, "")
}

// startControlPlaneIn is startControlPlane with etcd's data in etcdDir
// when set (created if missing, kept after Close: a later start finds the
// objects again).
func startControlPlaneIn(e *Env, etcdDir string) (*controlPlane, error) {
	env := apitest.Environment(e.EnvtestAssets, e.CRDDir)
	if etcdDir != "" {
		if err := os.MkdirAll(etcdDir, 0o700); err != nil {
			return nil, fmt.Errorf("etcd data directory: %w", err)
		}
		env.ControlPlane.Etcd = &envtest.Etcd{DataDir: etcdDir}
	}
	cfg, err := apitest.Start(env)
	if err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	return &controlPlane{env: env, cfg: cfg}, nil
}

// installAdmission installs the admission policy of dir (a user's
// `kubectl apply -k controller/config` installs controller/config/admission
// with the CRDs) and waits until the API server enforces it.
func (cp *controlPlane) installAdmission(ctx context.Context, dir string) error {
	return apitest.InstallAdmission(ctx, cp.cfg, apitest.AdmissionOptions{Dir: dir})
}

// apiLoad is what the control plane has served so far: mutating requests
// (see writes), by kind of request, and the CPU time of kube-apiserver and
// etcd (see cpu).
type apiLoad struct {
	writes float64
	byKey  writeCounts
	cpu    time.Duration
}

// load reads writes and cpu together, for differences over a span.
func (cp *controlPlane) load(ctx context.Context) (apiLoad, error) {
	w, err := cp.writeCounts(ctx)
	if err != nil {
		return apiLoad{}, err
	}
	c, err := cp.cpu()
	if err != nil {
		return apiLoad{}, err
	}
	return apiLoad{writes: w.total(), byKey: w, cpu: c}, nil
}

// writeKey is one kind of mutating request: verb, API group, resource
// and subresource (apiserver_request_total's labels).
type writeKey struct {
	verb, group, resource, subresource string
}

func (k writeKey) String() string {
	s := k.verb + " " + k.resource
	if k.subresource != "" {
		s += "/" + k.subresource
	}
	return s
}

// writeCounts are mutating requests served, by kind.
type writeCounts map[writeKey]float64

func (w writeCounts) total() float64 {
	var t float64
	for _, v := range w {
		t += v
	}
	return t
}

// sub returns w - o (the requests served between two reads), without
// the kinds that did not change.
func (w writeCounts) sub(o writeCounts) writeCounts {
	out := writeCounts{}
	for k, v := range w {
		if d := v - o[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// cpu returns the CPU time kube-apiserver and etcd have used so far.
func (cp *controlPlane) cpu() (time.Duration, error) {
	cpl := cp.env.ControlPlane
	if cpl.APIServer == nil || cpl.Etcd == nil {
		return 0, errors.New("control plane not started")
	}
	var sum time.Duration
	for _, p := range []struct{ name, arg string }{
		{"kube-apiserver", "--cert-dir=" + cpl.APIServer.CertDir},
		{"etcd", "--data-dir=" + cpl.Etcd.DataDir},
	} {
		pid, err := procfs.FindOne(p.name, p.arg)
		if err != nil {
			return 0, err
		}
		t, err := procfs.CPUTime(pid)
		if err != nil {
			return 0, fmt.Errorf("%s CPU time: %w", p.name, err)
		}
		sum += t
	}
	return sum, nil
}

// Close stops kube-apiserver and etcd.
func (cp *controlPlane) Close() error {
	if err := cp.env.Stop(); err != nil {
		return fmt.Errorf("stop kube-apiserver + etcd: %w", err)
	}
	return nil
}

// client returns a direct (uncached) client that can also watch.
func (cp *controlPlane) client() (client.WithWatch, error) {
	c, err := client.NewWithWatch(cp.cfg, client.Options{Scheme: framework.Scheme})
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	return c, nil
}

// controllerOptions configure an in-process natgw-controller.
type controllerOptions struct {
	// Natgw is the natgw binary the local transport runs as `natgw serve`.
	Natgw string
	// Dataplane is the controller's --dataplane.
	Dataplane nat.DataplaneName
	// Workers is --workers.
	Workers int
	// Gateways maps gateway names to namespaces.
	Gateways gwconfig.Config
	// LogPath receives the controller's log (text, level 0).
	LogPath string
}

// runningController is natgw-controller's manager running in this process:
// the same packages and wiring as the natgw-controller binary with
// --transport=local.
type runningController struct {
	cancel context.CancelFunc
	done   chan error
	log    *os.File
}

// startController builds a controller-runtime manager on cp with
// reconciler.Setup and starts it. The periodic sweep and drift check are
// off (they also run on every connect; a run is shorter than their
// default periods).
func startController(ctx context.Context, cp *controlPlane, o controllerOptions) (*runningController, error) {
	if err := o.Gateways.Validate(); err != nil {
		return nil, err
	}
	f, err := os.Create(o.LogPath)
	if err != nil {
		return nil, fmt.Errorf("controller log: %w", err)
	}
	log := logr.FromSlogHandler(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelInfo})).WithName("natgw-controller")
	mgr, err := ctrl.NewManager(cp.cfg, ctrl.Options{
		Scheme:                 framework.Scheme,
		Logger:                 log,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
	})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("controller manager: %w", err)
	}
	_, err = reconciler.Setup(ctx, mgr, reconciler.Config{
		Workers:                 o.Workers,
		RemoveUpstreamFinalizer: true,
		// One process runs a controller per data plane, one after the other.
		SkipNameValidationForTest: true,
		Gateway: gateway.Options{
			Transport:        &transport.Local{Binary: o.Natgw, Log: log.WithName("agent")},
			Config:           &o.Gateways,
			DefaultDataplane: o.Dataplane,
			Log:              log.WithName("gateway"),
		},
	})
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("controller setup: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	rc := &runningController{cancel: cancel, done: make(chan error, 1), log: f}
	go func() { rc.done <- mgr.Start(ctx) }()
	return rc, nil
}

// Stop stops the manager (and with it the agents' sessions) and waits for
// it, at most 30 s.
func (rc *runningController) Stop() error {
	rc.cancel()
	var err error
	select {
	case err = <-rc.done:
		if err != nil {
			err = fmt.Errorf("controller manager: %w", err)
		}
	case <-time.After(30 * time.Second):
		err = errors.New("controller manager did not stop within 30s")
	}
	if cerr := rc.log.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

// writeCounts returns the mutating requests (POST, PUT, PATCH, DELETE;
// every resource, subresources included) the API server has served so
// far, by kind, from its apiserver_request_total counter.
func (cp *controlPlane) writeCounts(ctx context.Context) (writeCounts, error) {
	cs, err := kubernetes.NewForConfig(cp.cfg)
	if err != nil {
		return nil, fmt.Errorf("API clientset: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	b, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics of kube-apiserver: %w", err)
	}
	return parseWrites(string(b))
}

// countWrites sums the apiserver_request_total samples of mutating verbs
// in a Prometheus text exposition.
func countWrites(metrics string) (float64, error) {
	w, err := parseWrites(metrics)
	return w.total(), err
}

// parseWrites sums the apiserver_request_total samples of mutating verbs
// in a Prometheus text exposition by verb, group, resource and
// subresource (over response codes and the other labels).
func parseWrites(metrics string) (writeCounts, error) {
	const name = "apiserver_request_total{"
	out := writeCounts{}
	seen := false
	for _, line := range strings.Split(metrics, "\n") {
		if !strings.HasPrefix(line, name) {
			continue
		}
		end := strings.LastIndexByte(line, '}')
		if end < 0 {
			return nil, fmt.Errorf("apiserver_request_total: malformed sample %q", line)
		}
		labels, value := line[len(name):end], strings.TrimSpace(line[end+1:])
		var key writeKey
		for _, l := range strings.Split(labels, ",") {
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				continue
			}
			v = strings.Trim(v, `"`)
			switch k {
			case "verb":
				key.verb = v
			case "group":
				key.group = v
			case "resource":
				key.resource = v
			case "subresource":
				key.subresource = v
			}
		}
		switch key.verb {
		case "POST", "PUT", "PATCH", "DELETE":
		default:
			continue
		}
		// A sample may carry a timestamp after its value.
		if f := strings.Fields(value); len(f) > 0 {
			value = f[0]
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return nil, fmt.Errorf("apiserver_request_total: value of %q: %w", line, err)
		}
		out[key] += v
		seen = true
	}
	if !seen {
		return nil, errors.New("kube-apiserver /metrics has no apiserver_request_total sample of a mutating verb")
	}
	return out, nil
}

// reconcileStats is what controller-runtime's metrics say about one
// controller's reconciles.
type reconcileStats struct {
	Count   uint64
	Seconds float64 // summed duration
}

// sub returns s − o (the reconciles between two readings).
func (s reconcileStats) sub(o reconcileStats) reconcileStats {
	return reconcileStats{Count: s.Count - o.Count, Seconds: s.Seconds - o.Seconds}
}

// reconciles reads controller_runtime_reconcile_time_seconds of the
// in-process controllers from controller-runtime's metrics registry, by
// controller name (e.g. "iptables-fip-rule"). The registry is global, so
// compare readings (sub) taken around a phase.
func reconciles() (map[string]reconcileStats, error) {
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		return nil, fmt.Errorf("gather controller-runtime metrics: %w", err)
	}
	out := map[string]reconcileStats{}
	for _, mf := range mfs {
		if mf.GetName() != "controller_runtime_reconcile_time_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" {
					h := m.GetHistogram()
					s := out[l.GetValue()]
					s.Count += h.GetSampleCount()
					s.Seconds += h.GetSampleSum()
					out[l.GetValue()] = s
				}
			}
		}
	}
	return out, nil
}
