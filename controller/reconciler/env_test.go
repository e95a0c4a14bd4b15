package reconciler

// Test harness: one real kube-apiserver + etcd (envtest) for the package,
// the real natgw binary built once, and per test a netlab gateway topology
// with a controller manager whose cache sees only that test's objects.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/controller/eipalloc"
	"github.com/natgw/natgw/controller/gateway"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testlog"
	"github.com/natgw/natgw/nat"
)

var (
	natgwBin   string
	testScheme *runtime.Scheme
)

// apiEnv is one envtest API server, started on first use.
type apiEnv struct {
	once sync.Once
	env  *envtest.Environment
	cfg  *rest.Config
	err  error
}

// apiEnvs are the package's API servers: one with natgw's CRDs, one with
// upstream Kube-OVN v1.16.2's (a cluster with Kube-OVN).
var apiEnvs = map[crdtest.Set]*apiEnv{crdtest.Natgw: {}, crdtest.Upstream: {}}

func init() {
	s, err := v1.NewScheme()
	if err != nil {
		panic(err)
	}
	testScheme = s
}

func TestMain(m *testing.M) {
	code := m.Run()
	for set, a := range apiEnvs {
		if a.env != nil {
			if err := a.env.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "stop envtest (%s CRDs): %v\n", set, err)
			}
		}
	}
	if natgwBin != "" {
		os.RemoveAll(filepath.Dir(natgwBin))
	}
	os.Exit(code)
}

// apiServer starts the package's envtest API server with natgw's CRDs once.
func apiServer(t *testing.T) *rest.Config { return apiServerFor(t, crdtest.Natgw) }

// apiServerFor starts the package's envtest API server with set's CRDs
// once. Without the assets it skips, except as root in CI (make test builds
// them first).
func apiServerFor(t *testing.T, set crdtest.Set) *rest.Config {
	t.Helper()
	a := apiEnvs[set]
	assets := apitest.RequireAssets(t)
	a.once.Do(func() {
		dir, err := crdtest.Path(context.Background(), set, crdDir())
		if err != nil {
			a.err = err
			return
		}
		a.env = apitest.Environment(assets, dir)
		a.cfg, a.err = apitest.Start(a.env)
		if a.err != nil {
			a.env = nil
		}
	})
	if a.err != nil {
		t.Fatalf("start envtest with %s CRDs: %v", set, a.err)
	}
	return a.cfg
}

var buildOnce sync.Once
var buildErr error

// natgwBinary builds gwimage/cmd/natgw once.
func natgwBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "natgw-bin-")
		if err != nil {
			buildErr = err
			return
		}
		natgwBin = filepath.Join(dir, "natgw")
		out, err := exec.Command("go", "build", "-o", natgwBin, "github.com/natgw/natgw/gwimage/cmd/natgw").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build natgw: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return natgwBin
}

// testLabel selects the objects of one test for its manager's cache.
const testLabel = "natgw.test/case"

// env is one test's world: a gateway topology, a running controller and a
// client.
type env struct {
	t         *testing.T
	ctx       context.Context
	c         client.Client // direct (uncached) client
	cfg       *rest.Config
	lab       *netlab.Lab
	gw        *netlab.Gateway
	gwName    string
	case_     string
	dataplane nat.DataplaneName
	reg       *gateway.Registry
	tr        *recordingTransport
	cancel    context.CancelFunc
}

type envOptions struct {
	dataplane   nat.DataplaneName
	sweepPeriod time.Duration
	driftPeriod time.Duration
	workers     int
	noManager   bool
	// crds is the CRD set of the API server (default natgw's).
	crds crdtest.Set
	// warnings, when set, gets the API server's warnings to the
	// controller's client.
	warnings rest.WarningHandler
	// admission installs controller/config/admission's policy with a
	// binding limited to the test's objects: they are created with natgw's
	// finalizer.
	admission bool
	// ruleLabels is the controller's --rule-labels.
	ruleLabels bool
	// kubeOVNNetwork is the controller's --network-source=kube-ovn (needs
	// the upstream CRD set).
	kubeOVNNetwork bool
	// wrapTransport, when set, wraps the controller's HTTP transport to
	// the API server (a test counts its requests).
	wrapTransport func(http.RoundTripper) http.RoundTripper
}

// newEnv builds the topology and starts a controller for it.
func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	if o.crds == "" {
		o.crds = crdtest.Natgw
	}
	cfg := apiServerFor(t, o.crds)
	lab := netlab.ForTest(t)
	bin := natgwBinary(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if o.dataplane == "" {
		o.dataplane = nat.DataplaneNftables
	}
	if o.workers == 0 {
		o.workers = 4
	}
	c, err := client.New(cfg, client.Options{Scheme: testScheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 40 {
		name = name[:40]
	}
	name = strings.Trim(name, "-") + "-" + lab.ID()[len(lab.ID())-4:]
	e := &env{t: t, ctx: ctx, c: c, cfg: cfg, lab: lab, gw: gw, gwName: "gw-" + name, case_: name, dataplane: o.dataplane}
	e.tr = &recordingTransport{inner: &transport.Local{Binary: bin, Log: testLog(t).WithName("agent"), StopGrace: 5 * time.Second}}
	t.Cleanup(func() {
		e.cleanupObjects()
		cancel()
	})
	e.cancel = cancel
	if o.admission {
		e.installAdmission()
	}
	if !o.noManager {
		e.startManager(cfg, o)
	}
	return e
}

// startManager starts the controller (its Registry connects the gateway).
func (e *env) startManager(cfg *rest.Config, o envOptions) {
	t, ctx, cancel, name := e.t, e.ctx, e.cancel, e.case_
	gcfg := gwconfigFor(e)
	sel := labels.SelectorFromSet(labels.Set{testLabel: name})
	if o.warnings != nil || o.wrapTransport != nil {
		cfg = rest.CopyConfig(cfg)
		if o.warnings != nil {
			cfg.WarningHandler = o.warnings
		}
		if o.wrapTransport != nil {
			cfg.Wrap(o.wrapTransport)
		}
	}
	copts := cache.Options{DefaultLabelSelector: sel}
	if o.kubeOVNNetwork {
		// natgw's Vips carry no test label (the owner reference tells
		// whose they are).
		copts.ByObject = map[client.Object]cache.ByObject{eipalloc.NewVipObject(): {Label: labels.Everything()}}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 testScheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
		Cache:                  copts,
		Logger:                 testLog(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.reg, err = Setup(ctx, mgr, Config{
		Workers:                   o.workers,
		RemoveUpstreamFinalizer:   true,
		RuleLabels:                o.ruleLabels,
		KubeOVNNetwork:            o.kubeOVNNetwork,
		SkipNameValidationForTest: true,
		Gateway: gateway.Options{
			Transport: e.tr, Config: gcfg, DefaultDataplane: o.dataplane,
			SweepPeriod: o.sweepPeriod, DriftPeriod: o.driftPeriod,
			Log: testLog(t).WithName("gateway"),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("manager: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("manager did not stop")
		}
	})
	// The manager connects once the gateway is first used.
	if _, err := e.reg.Get(e.gwName); err != nil {
		t.Fatal(err)
	}
}

// installAdmission installs the admission policy as shipped with a binding
// of the test's own that matches only the test's objects (the API server is
// shared by the package's tests); t.Cleanup removes the binding.
func (e *env) installAdmission() {
	e.t.Helper()
	err := apitest.InstallAdmission(e.ctx, e.cfg, apitest.AdmissionOptions{BindingSuffix: e.case_, Selector: map[string]string{testLabel: e.case_}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		b := &admissionregistrationv1.MutatingAdmissionPolicyBinding{}
		b.Name = "natgw-finalizer-" + e.case_
		if err := e.c.Delete(context.Background(), b); err != nil && !apierrors.IsNotFound(err) {
			e.t.Errorf("delete the test's admission policy binding: %v", err)
		}
	})
}

// meta returns ObjectMeta for a test object.
// indexedClient returns a client that reads from an informer cache with
// the controller's indexes (RegisterIndexes), as the binary's does: the
// Source lists a gateway's objects by index, which a direct client cannot.
// The cache runs until the test ends.
func (e *env) indexedClient() client.Client {
	e.t.Helper()
	ca, err := cache.New(e.cfg, cache.Options{Scheme: testScheme})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := RegisterIndexes(e.ctx, ca); err != nil {
		e.t.Fatal(err)
	}
	go func() { _ = ca.Start(e.ctx) }()
	c, err := client.New(e.cfg, client.Options{Scheme: testScheme, Cache: &client.CacheOptions{Reader: ca}})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// programmedEIP creates an IptablesEIP as a controller that programmed it
// left it: with natgw's finalizer and a Ready status naming its address.
func (e *env) programmedEIP(name string, addr netip.Addr) *v1.IptablesEIP {
	e.t.Helper()
	eip := e.eip(name, addr)
	eip.Finalizers = []string{Finalizer}
	e.create(eip)
	e.updateStatus(eip, func() { eip.Status = v1.IptablesEIPStatus{Ready: true, IP: addr.String()} })
	return eip
}

// readyFIP creates the EIP "eip" at addr and the FIP "fip" on it to the
// first VM, and waits until the FIP is Ready.
func (e *env) readyFIP(addr netip.Addr) *v1.IptablesFIPRule {
	e.t.Helper()
	e.create(e.eip("eip", addr))
	f := e.fip("fip", "eip", e.gw.VMs[0].Addr)
	e.create(f)
	e.waitReady(f)
	return f
}

// startRegistry starts reg (as the manager would, until the test ends)
// and returns the test gateway's manager.
func (e *env) startRegistry(reg *gateway.Registry) *gateway.Manager {
	e.t.Helper()
	go func() { _ = reg.Start(e.ctx) }()
	gw, err := reg.Get(e.gwName)
	if err != nil {
		e.t.Fatal(err)
	}
	return gw
}

// watchFIPs watches the test's FIP rules (its own client, so the watch
// sees what the API server sends, not the controller's cache). Stopped at
// the test's end.
func (e *env) watchFIPs() watch.Interface {
	e.t.Helper()
	wc, err := client.NewWithWatch(e.cfg, client.Options{Scheme: testScheme})
	if err != nil {
		e.t.Fatal(err)
	}
	w, err := wc.Watch(e.ctx, &v1.IptablesFIPRuleList{}, client.MatchingLabels{testLabel: e.case_})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(w.Stop)
	return w
}

func (e *env) meta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: e.case_ + "-" + name, Labels: map[string]string{testLabel: e.case_}}
}

func (e *env) create(obj client.Object) {
	e.t.Helper()
	if err := e.c.Create(e.ctx, obj); err != nil {
		e.t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

func (e *env) gatewayObj() *v1.VpcNatGateway {
	g := &v1.VpcNatGateway{ObjectMeta: e.meta("x"), Spec: v1.VpcNatGatewaySpec{Vpc: "vpc1", Subnet: "net1"}}
	g.Name = e.gwName
	return g
}

func (e *env) eip(name string, addr netip.Addr) *v1.IptablesEIP {
	return &v1.IptablesEIP{ObjectMeta: e.meta(name), Spec: v1.IptablesEIPSpec{V4ip: addr.String(), NatGwDp: e.gwName}}
}

func (e *env) fip(name, eip string, internal netip.Addr) *v1.IptablesFIPRule {
	return &v1.IptablesFIPRule{ObjectMeta: e.meta(name), Spec: v1.IptablesFIPRuleSpec{EIP: e.case_ + "-" + eip, InternalIP: internal.String()}}
}

// update reads obj again, applies mutate and writes it, again while the
// write conflicts: the controller writes the same objects (finalizer,
// status) whenever it reconciles them, so the test's copy may be stale.
func (e *env) update(obj client.Object, mutate func()) {
	e.t.Helper()
	if err := e.retryWrite(obj, mutate, func(obj client.Object) error { return e.c.Update(e.ctx, obj) }); err != nil {
		e.t.Fatalf("update %s: %v", obj.GetName(), err)
	}
}

// retryWrite reads obj again, applies mutate and writes it with write,
// again while the write conflicts.
func (e *env) retryWrite(obj client.Object, mutate func(), write func(client.Object) error) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		mutate()
		return write(obj)
	})
}

// updateStatus is update through the status subresource: what Kube-OVN's
// controller (played by the test) writes into an object the controller
// may have written to already.
func (e *env) updateStatus(obj client.Object, mutate func()) {
	e.t.Helper()
	if err := e.retryWrite(obj, mutate, func(obj client.Object) error { return e.c.Status().Update(e.ctx, obj) }); err != nil {
		e.t.Fatalf("update status of %s: %v", obj.GetName(), err)
	}
}

// eventually polls cond until it returns nil or the timeout passes.
func (e *env) eventually(timeout time.Duration, what string, cond func() error) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = cond(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readyCond returns the Ready condition of obj's status (nil if none).
func readyOf(obj client.Object) (bool, *v1.Condition, int64) {
	st, _ := v1.SummaryOf(obj)
	c := st.ReadyCondition()
	if c == nil {
		return false, nil, 0
	}
	return st.Ready && c.Status == metav1.ConditionTrue, c, c.ObservedGeneration
}

// waitCondition waits until obj's Ready condition has reason (True for
// Programmed) and returns the object.
func (e *env) waitReason(obj client.Object, reason string, timeout time.Duration) {
	e.t.Helper()
	e.eventually(timeout, fmt.Sprintf("%T %s reason %s", obj, obj.GetName(), reason), func() error {
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return err
		}
		ready, c, gen := readyOf(obj)
		if c == nil {
			return fmt.Errorf("no Ready condition yet")
		}
		if c.Reason != reason {
			return fmt.Errorf("reason %s (%s)", c.Reason, c.Message)
		}
		if reason == v1.ReasonProgrammed && !ready {
			return fmt.Errorf("programmed but status not ready")
		}
		if gen != obj.GetGeneration() {
			return fmt.Errorf("observedGeneration %d, generation %d", gen, obj.GetGeneration())
		}
		return nil
	})
}

func (e *env) waitReady(obj client.Object) {
	e.t.Helper()
	e.waitReason(obj, v1.ReasonProgrammed, 60*time.Second)
}

// waitGone waits until obj no longer exists.
func (e *env) waitGone(obj client.Object, timeout time.Duration) {
	e.t.Helper()
	e.eventually(timeout, fmt.Sprintf("%T %s gone", obj, obj.GetName()), func() error {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(obj), obj)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("still there (finalizers %v, deleting %v)", obj.GetFinalizers(), obj.GetDeletionTimestamp() != nil)
	})
}

// kernelObjects lists the gateway's objects as a fresh agent reads them
// from the kernel (`natgw list -o json`), independent of the controller's
// session.
func (e *env) kernelObjects(dataplane nat.DataplaneName) []nat.Object {
	e.t.Helper()
	out, err := exec.Command(natgwBin, "--netns", e.gw.GW, "--dataplane", string(dataplane), "list", "-o", "json").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		e.t.Fatalf("natgw list: %v\n%s", err, stderr)
	}
	var objs []nat.Object
	if err := json.Unmarshal(out, &objs); err != nil {
		e.t.Fatalf("natgw list output: %v\n%s", err, out)
	}
	return objs
}

func hasUID(objs []nat.Object, uid types.UID) (nat.Object, bool) {
	for _, o := range objs {
		if o.UID == string(uid) {
			return o, true
		}
	}
	return nat.Object{}, false
}

func countKind(objs []nat.Object, k nat.Kind) int {
	n := 0
	for _, o := range objs {
		if o.Kind == k {
			n++
		}
	}
	return n
}

// cleanupObjects deletes the test's objects and waits for them to go (the
// controller still runs), so that the shared API server stays clean.
func (e *env) cleanupObjects() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sel := client.MatchingLabels{testLabel: e.case_}
	lists := []client.ObjectList{&v1.IptablesFIPRuleList{}, &v1.IptablesDnatRuleList{}, &v1.IptablesSnatRuleList{}, &v1.IptablesEIPList{}, &v1.VpcNatGatewayList{}, &v1.QoSPolicyList{}}
	for _, l := range lists {
		obj := listItemType(l)
		_ = e.c.DeleteAllOf(ctx, obj, sel)
	}
	// Whatever the controller could not finish (e.g. it was stopped) is
	// released by hand.
	deadline := time.Now().Add(20 * time.Second)
	for _, l := range lists {
		for {
			if err := e.c.List(ctx, l, sel); err != nil {
				break
			}
			items := itemsOf(l)
			if len(items) == 0 {
				break
			}
			if time.Now().After(deadline) {
				for _, it := range items {
					it.SetFinalizers(nil)
					_ = e.c.Update(ctx, it)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func listItemType(l client.ObjectList) client.Object {
	switch l.(type) {
	case *v1.IptablesFIPRuleList:
		return &v1.IptablesFIPRule{}
	case *v1.IptablesDnatRuleList:
		return &v1.IptablesDnatRule{}
	case *v1.IptablesSnatRuleList:
		return &v1.IptablesSnatRule{}
	case *v1.IptablesEIPList:
		return &v1.IptablesEIP{}
	case *v1.VpcNatGatewayList:
		return &v1.VpcNatGateway{}
	case *v1.QoSPolicyList:
		return &v1.QoSPolicy{}
	}
	panic(fmt.Sprintf("unknown list %T", l))
}

// itemsOf returns pointers to l's items.
func itemsOf(l client.ObjectList) []client.Object {
	objs, err := meta.ExtractList(l)
	if err != nil {
		panic(fmt.Sprintf("items of %T: %v", l, err))
	}
	out := make([]client.Object, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(client.Object))
	}
	return out
}

// recordingTransport keeps the sessions it opened so that tests can break
// them.
type recordingTransport struct {
	inner transport.Transport
	mu    sync.Mutex
	open  []transport.Session
	count int
}

func (r *recordingTransport) Open(ctx context.Context, gw transport.Endpoint) (transport.Session, error) {
	s, err := r.inner.Open(ctx, gw)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.open = append(r.open, s)
	r.count++
	r.mu.Unlock()
	return s, nil
}

// opened returns how many sessions were opened.
func (r *recordingTransport) opened() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// breakAll closes every session (the agents exit).
func (r *recordingTransport) breakAll() {
	r.mu.Lock()
	open := r.open
	r.open = nil
	r.mu.Unlock()
	for _, s := range open {
		_ = s.Close()
	}
}

type ctrlRequest = ctrl.Request

// testLog logs to t at the verbosity in NATGW_TEST_V (default 0), and to
// standard error once t ended (agents and managers stop after their test).
func testLog(t *testing.T) logr.Logger {
	v, _ := strconv.Atoi(os.Getenv("NATGW_TEST_V"))
	return testlog.New(t, v)
}

// gwconfigFor is the gateway configuration of e's topology.
func gwconfigFor(e *env) *gwconfig.Config {
	return &gwconfig.Config{Gateways: []gwconfig.Entry{{
		Name: e.gwName, NetNS: e.gw.GW, ExternalPrefixLen: netlab.ExtNet.Bits(), ExternalGateway: netlab.ExtAddr.String(),
	}}}
}

func jsonMarshal(v any) ([]byte, error) { return json.Marshal(v) }

func typesUID(s string) types.UID { return types.UID(s) }

// crdDir is controller/config/crd; NATGW_TEST_CRD_DIR overrides it (to try
// CRD changes).
func crdDir() string {
	if d := os.Getenv("NATGW_TEST_CRD_DIR"); d != "" {
		return d
	}
	return apitest.CRDDir()
}
