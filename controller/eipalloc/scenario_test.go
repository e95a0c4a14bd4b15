package eipalloc

// The same scenarios run against controller-runtime's fake client (always)
// and against a real kube-apiserver + etcd (envtest, when its assets are
// there) with upstream Kube-OVN v1.16.2's Vip and Subnet CRDs and natgw's
// IptablesEIP CRD.
//
// The test itself plays Kube-OVN's vip controller: it writes the Vip's
// spec and status as createOrUpdateVipCR does (vip.go:404-435) and removes
// Kube-OVN's finalizer as handleUpdateVirtualIP does after releasing the
// address (vip.go:189-220). That proves natgw's side of the contract only
// (logic-only); the proof with Kube-OVN's real controller and IPAM is a
// cluster test still to come.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/testlog"
)

// kubeOVNFinalizer is Kube-OVN's finalizer (pkg/util/const.go:17).
const kubeOVNFinalizer = "kubeovn.io/kube-ovn-controller"

func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := apiextv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return s
}

// world is one API (fake or envtest) with a client and the test's log.
type world struct {
	t   *testing.T
	ctx context.Context
	c   client.Client
	log logr.Logger
	// prefix keeps the objects of one run apart.
	prefix string
}

func (w *world) subnet(name, cidr, gw string) {
	w.t.Helper()
	u := kubeovn.NewSubnet()
	u.SetName(name)
	u.Object["spec"] = map[string]any{"cidrBlock": cidr, "gateway": gw, "protocol": "IPv4"}
	if err := w.c.Create(w.ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
		w.t.Fatalf("create subnet %s: %v", name, err)
	}
}

// eip creates an IptablesEIP and returns it as read back (with its UID).
func (w *world) eip(name, v4, subnet string) *v1.IptablesEIP {
	w.t.Helper()
	// The fake client keeps a given UID; the API server replaces it.
	e := eip(w.prefix+name, "fake-uid-"+w.prefix+name, v4, subnet)
	if err := w.c.Create(w.ctx, e); err != nil {
		w.t.Fatalf("create iptables eip %s: %v", e.Name, err)
	}
	if e.UID == "" {
		w.t.Fatalf("iptables eip %s has no uid after create", e.Name)
	}
	return e
}

// kubeOVNAllocated creates an IptablesEIP as Kube-OVN's handler leaves it
// with its feature on: spec.v4ip and status.ip the allocated address, its
// finalizer.
func (w *world) kubeOVNAllocated(name, v4 string) *v1.IptablesEIP {
	w.t.Helper()
	e := eip(w.prefix+name, "fake-uid-"+w.prefix+name, v4, "ext-a")
	e.Finalizers = []string{kubeOVNFinalizer}
	if err := w.c.Create(w.ctx, e); err != nil {
		w.t.Fatalf("create iptables eip %s: %v", e.Name, err)
	}
	e.Status.IP, e.Status.Ready = v4, true
	if err := w.c.Status().Update(w.ctx, e); err != nil {
		w.t.Fatalf("kube-ovn: status of iptables eip %s: %v", e.Name, err)
	}
	return e
}

func (w *world) vip(name string) (*unstructured.Unstructured, bool) {
	w.t.Helper()
	u := newUnstructured(VipGVK)
	err := w.c.Get(w.ctx, client.ObjectKey{Name: name}, u)
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		w.t.Fatalf("get vip %s: %v", name, err)
	}
	return u, true
}

// kubeOVNReserve plays Kube-OVN's createOrUpdateVipCR: one Update with
// spec.v4ip, status.v4ip/mac, its labels and its finalizer.
func (w *world) kubeOVNReserve(name, v4, mac string) {
	w.t.Helper()
	u, ok := w.vip(name)
	if !ok {
		w.t.Fatalf("kube-ovn: vip %s not found", name)
	}
	if sv4, _, _ := unstructured.NestedString(u.Object, "spec", "v4ip"); sv4 != "" && sv4 != v4 {
		w.t.Fatalf("kube-ovn: vip %s requests %s, test reserves %s", name, sv4, v4)
	}
	sub, _, _ := unstructured.NestedString(u.Object, "spec", "subnet")
	labels := u.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	labels["ovn.kubernetes.io/subnet"] = sub
	labels["ovn.kubernetes.io/ip_reserved"] = ""
	u.SetLabels(labels)
	_ = unstructured.SetNestedField(u.Object, v4, "spec", "v4ip")
	_ = unstructured.SetNestedField(u.Object, mac, "spec", "macAddress")
	_ = unstructured.SetNestedField(u.Object, map[string]any{"v4ip": v4, "v6ip": "", "mac": mac, "type": ""}, "status")
	u.SetFinalizers(append(u.GetFinalizers(), kubeOVNFinalizer))
	if err := w.c.Update(w.ctx, u); err != nil {
		w.t.Fatalf("kube-ovn: update vip %s: %v", name, err)
	}
	w.log.Info("kube-ovn (played by the test) reserved", "vip", name, "v4ip", v4)
}

// kubeOVNRelease plays handleUpdateVirtualIP on a deleted Vip: the
// address is released, the finalizer removed.
func (w *world) kubeOVNRelease(name string) {
	w.t.Helper()
	u, ok := w.vip(name)
	if !ok {
		w.t.Fatalf("kube-ovn: vip %s not found", name)
	}
	if u.GetDeletionTimestamp() == nil {
		w.t.Fatalf("kube-ovn: vip %s is not being deleted", name)
	}
	u.SetFinalizers(slices.DeleteFunc(u.GetFinalizers(), func(f string) bool { return f == kubeOVNFinalizer }))
	if err := w.c.Update(w.ctx, u); err != nil && !apierrors.IsNotFound(err) {
		w.t.Fatalf("kube-ovn: remove finalizer of vip %s: %v", name, err)
	}
	w.log.Info("kube-ovn (played by the test) released", "vip", name)
}

func (w *world) ensure(a *Allocator, e *v1.IptablesEIP) (netip.Addr, error) {
	addr, err := a.Ensure(w.ctx, e)
	w.log.Info("Ensure", "eip", e.Name, "addr", addr, "err", err)
	return addr, err
}

func (w *world) release(a *Allocator, e *v1.IptablesEIP) (bool, error) {
	done, err := a.Release(w.ctx, e)
	w.log.Info("Release", "eip", e.Name, "done", done, "err", err)
	return done, err
}

func wantErr(t *testing.T, err, sentinel error, names ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %v naming %v", sentinel, names)
	}
	if !errors.Is(err, sentinel) {
		t.Errorf("error %v, want %v", err, sentinel)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not name %q", err, n)
		}
	}
}

// scenarios are run by TestFake and TestEnvtest.
var scenarios = []struct {
	name string
	run  func(w *world, a *Allocator)
}{
	{"pending then address", func(w *world, a *Allocator) {
		t := w.t
		w.subnet("ext-a", "172.18.0.0/16", "172.18.0.1")
		e := w.eip("random", "", "ext-a")
		addr, err := w.ensure(a, e)
		if err != nil || addr.IsValid() {
			t.Fatalf("first Ensure = %v, %v; want pending", addr, err)
		}
		vip, ok := w.vip(VipName(e.Name))
		if !ok {
			t.Fatalf("vip %s not created", VipName(e.Name))
		}
		if got := metav1.GetControllerOf(vip); got == nil || got.UID != e.UID || got.Name != e.Name || !ptr.Deref(got.BlockOwnerDeletion, false) {
			t.Errorf("vip controller %+v, want iptables eip %s uid %s", got, e.Name, e.UID)
		}
		spec, _, _ := unstructured.NestedMap(vip.Object, "spec")
		if spec["subnet"] != "ext-a" || spec["v4ip"] != nil || spec["namespace"] != nil || spec["type"] != nil {
			t.Errorf("vip spec %v, want only subnet ext-a", spec)
		}
		if st, ok := vip.Object["status"]; ok {
			t.Errorf("vip has a status before Kube-OVN wrote one: %v", st)
		}
		if addr, err := w.ensure(a, e); err != nil || addr.IsValid() {
			t.Fatalf("Ensure before Kube-OVN = %v, %v; want pending", addr, err)
		}
		w.kubeOVNReserve(VipName(e.Name), "172.18.0.20", "00:00:00:12:34:56")
		rv := mustRV(w, VipName(e.Name))
		addr, err = w.ensure(a, e)
		if err != nil || addr != netip.MustParseAddr("172.18.0.20") {
			t.Fatalf("Ensure after Kube-OVN = %v, %v; want 172.18.0.20", addr, err)
		}
		if got := mustRV(w, VipName(e.Name)); got != rv {
			t.Errorf("Ensure wrote the reserved vip: resourceVersion %s -> %s", rv, got)
		}
	}},
	{"default external subnet", func(w *world, a *Allocator) {
		w.subnet(kubeovn.DefaultExternalNetwork, "10.5.0.0/16", "10.5.0.1")
		e := w.eip("dflt", "", "")
		if _, err := w.ensure(a, e); err != nil {
			w.t.Fatal(err)
		}
		vip, ok := w.vip(VipName(e.Name))
		if sub, _, _ := unstructured.NestedString(vip.Object, "spec", "subnet"); !ok || sub != kubeovn.DefaultExternalNetwork {
			w.t.Fatalf("vip spec.subnet %q, want %q", sub, kubeovn.DefaultExternalNetwork)
		}
	}},
	{"static v4ip passed through", func(w *world, a *Allocator) {
		t := w.t
		w.subnet("ext-a", "172.18.0.0/16", "172.18.0.1")
		e := w.eip("static", "172.18.0.50", "ext-a")
		if addr, err := w.ensure(a, e); err != nil || addr.IsValid() {
			t.Fatalf("Ensure = %v, %v; want pending", addr, err)
		}
		vip, _ := w.vip(VipName(e.Name))
		if v4, _, _ := unstructured.NestedString(vip.Object, "spec", "v4ip"); v4 != "172.18.0.50" {
			t.Fatalf("vip spec.v4ip %q, want 172.18.0.50", v4)
		}
		w.kubeOVNReserve(VipName(e.Name), "172.18.0.50", "00:00:00:12:34:57")
		if addr, err := w.ensure(a, e); err != nil || addr != netip.MustParseAddr("172.18.0.50") {
			t.Fatalf("Ensure = %v, %v; want 172.18.0.50", addr, err)
		}
		// spec.v4ip changed after the reservation.
		changed := e.DeepCopy()
		changed.Spec.V4ip = "172.18.0.51"
		_, err := w.ensure(a, changed)
		wantErr(t, err, ErrConflict, "spec.v4ip", "172.18.0.51", "172.18.0.50", VipName(e.Name), "reserve eip "+e.Name)
	}},
	{"address kube-ovn allocated is adopted", func(w *world, a *Allocator) {
		// A gateway migrated from Kube-OVN's feature: its handler allocated
		// the address under the EIP's name, wrote spec.v4ip and status.ip
		// and put its finalizer on the EIP.
		t := w.t
		w.subnet("ext-a", "172.18.0.0/16", "172.18.0.1")
		e := w.kubeOVNAllocated("migrated", "172.18.0.60")
		addr, err := w.ensure(a, e)
		if err != nil || addr != netip.MustParseAddr("172.18.0.60") {
			t.Fatalf("Ensure = %v, %v; want 172.18.0.60 (Kube-OVN's own reservation)", addr, err)
		}
		if _, ok := w.vip(VipName(e.Name)); ok {
			t.Fatalf("Ensure created vip %s for an address Kube-OVN already holds under the eip's name", VipName(e.Name))
		}
		done, err := w.release(a, e)
		if err != nil || !done {
			t.Fatalf("Release = %v, %v; want done at once (Kube-OVN's own finalizer releases the address)", done, err)
		}
		// spec.v4ip edited after Kube-OVN's allocation.
		changed := e.DeepCopy()
		changed.Spec.V4ip = "172.18.0.61"
		_, err = w.ensure(a, changed)
		wantErr(t, err, ErrConflict, "spec.v4ip", "172.18.0.61", "172.18.0.60", "reserve eip "+e.Name)
		// Without status.ip Kube-OVN allocated nothing: natgw asks for it.
		fresh := e.DeepCopy()
		fresh.Status.IP = ""
		if addr, err := w.ensure(a, fresh); err != nil || addr.IsValid() {
			t.Fatalf("Ensure without status.ip = %v, %v; want pending", addr, err)
		}
		if _, ok := w.vip(VipName(e.Name)); !ok {
			t.Fatalf("no vip requested for an eip Kube-OVN gave no address")
		}
	}},
	{"request made before adoption withdrawn", func(w *world, a *Allocator) {
		// An earlier natgw asked for the migrated address with a Vip that
		// Kube-OVN's IPAM refuses as a conflict: it is withdrawn.
		t := w.t
		w.subnet("ext-a", "172.18.0.0/16", "172.18.0.1")
		e := w.kubeOVNAllocated("asked", "172.18.0.62")
		if err := w.c.Create(w.ctx, NewVip(e)); err != nil {
			t.Fatal(err)
		}
		addr, err := w.ensure(a, e)
		if err != nil || addr != netip.MustParseAddr("172.18.0.62") {
			t.Fatalf("Ensure = %v, %v; want 172.18.0.62", addr, err)
		}
		if v, ok := w.vip(VipName(e.Name)); ok && v.GetDeletionTimestamp() == nil {
			t.Fatalf("the unanswered vip %s was not withdrawn", VipName(e.Name))
		}
	}},
	{"reservation in natgw's vip wins over kube-ovn's mark", func(w *world, a *Allocator) {
		// natgw reserved the address; the feature was turned on again for
		// a while and Kube-OVN put its finalizer on the EIP: the Vip still
		// holds the address and stays.
		t := w.t
		w.subnet("ext-a", "172.18.0.0/16", "172.18.0.1")
		e := w.eip("ours", "", "ext-a")
		if _, err := w.ensure(a, e); err != nil {
			t.Fatal(err)
		}
		w.kubeOVNReserve(VipName(e.Name), "172.18.0.63", "00:00:00:12:34:63")
		marked := e.DeepCopy()
		marked.Finalizers = append(marked.Finalizers, kubeOVNFinalizer)
		marked.Status.IP = "172.18.0.63"
		if addr, err := w.ensure(a, marked); err != nil || addr != netip.MustParseAddr("172.18.0.63") {
			t.Fatalf("Ensure = %v, %v; want 172.18.0.63", addr, err)
		}
		if v, ok := w.vip(VipName(e.Name)); !ok || v.GetDeletionTimestamp() != nil {
			t.Fatalf("natgw's reserved vip %s was deleted", VipName(e.Name))
		}
	}},
	{"vip owned by another eip refused", func(w *world, a *Allocator) {
		t := w.t
		w.subnet("ext-a", "172.18.0.0/16", "172.18.0.1")
		owner := w.eip("owner", "", "ext-a")
		e := w.eip("victim", "", "ext-a")
		foreign := NewVip(owner)
		foreign.SetName(VipName(e.Name))
		if err := w.c.Create(w.ctx, foreign); err != nil {
			t.Fatal(err)
		}
		_, err := w.ensure(a, e)
		wantErr(t, err, ErrNotOwned, VipName(e.Name), owner.Name, string(owner.UID))
		done, err := w.release(a, e)
		if err != nil || !done {
			t.Fatalf("Release = %v, %v; want done (not the eip's vip)", done, err)
		}
		if v, ok := w.vip(VipName(e.Name)); !ok || v.GetDeletionTimestamp() != nil {
			t.Fatalf("Release deleted a vip the eip does not own")
		}
	}},
	{"release waits for kube-ovn's finalizer", func(w *world, a *Allocator) {
		t := w.t
		w.subnet("ext-a", "172.18.0.0/16", "172.18.0.1")
		e := w.eip("rel", "", "ext-a")
		if _, err := w.ensure(a, e); err != nil {
			t.Fatal(err)
		}
		name := VipName(e.Name)
		w.kubeOVNReserve(name, "172.18.0.30", "00:00:00:12:34:58")
		done, err := w.release(a, e)
		if err != nil || done {
			t.Fatalf("first Release = %v, %v; want not done", done, err)
		}
		vip, ok := w.vip(name)
		if !ok || vip.GetDeletionTimestamp() == nil {
			t.Fatalf("vip %s not being deleted after Release", name)
		}
		if addr, err := w.ensure(a, e); err != nil || addr.IsValid() {
			t.Fatalf("Ensure on a vip being deleted = %v, %v; want pending", addr, err)
		}
		if done, err := w.release(a, e); err != nil || done {
			t.Fatalf("Release with the finalizer on = %v, %v; want not done", done, err)
		}
		w.kubeOVNRelease(name)
		if _, ok := w.vip(name); ok {
			t.Fatalf("vip %s still there after its finalizer went", name)
		}
		if done, err := w.release(a, e); err != nil || !done {
			t.Fatalf("Release after Kube-OVN released = %v, %v; want done", done, err)
		}
		if done, err := w.release(a, e); err != nil || !done {
			t.Fatalf("Release again = %v, %v; want done", done, err)
		}
	}},
	{"release of a pending vip", func(w *world, a *Allocator) {
		w.subnet("ext-a", "172.18.0.0/16", "172.18.0.1")
		e := w.eip("relpending", "", "ext-a")
		if _, err := w.ensure(a, e); err != nil {
			w.t.Fatal(err)
		}
		if done, err := w.release(a, e); err != nil || done {
			w.t.Fatalf("Release = %v, %v; want not done (deleted, not yet confirmed)", done, err)
		}
		if done, err := w.release(a, e); err != nil || !done {
			w.t.Fatalf("Release = %v, %v; want done", done, err)
		}
	}},
	{"subnet missing", func(w *world, a *Allocator) {
		e := w.eip("nosub", "", "no-such-subnet")
		_, err := w.ensure(a, e)
		wantErr(w.t, err, ErrSubnet, "spec.externalSubnet", "no-such-subnet", "reserve eip "+e.Name)
		if _, ok := w.vip(VipName(e.Name)); ok {
			w.t.Fatalf("vip created for a missing subnet")
		}
	}},
	{"static v4ip outside the subnet", func(w *world, a *Allocator) {
		w.subnet("ext-a", "172.18.0.0/16", "172.18.0.1")
		e := w.eip("outside", "10.9.9.9", "ext-a")
		_, err := w.ensure(a, e)
		wantErr(w.t, err, ErrSubnet, "spec.v4ip", "10.9.9.9", "172.18.0.0/16")
		if _, ok := w.vip(VipName(e.Name)); ok {
			w.t.Fatalf("vip created for an address outside the subnet")
		}
	}},
	{"bad input named", func(w *world, a *Allocator) {
		// Not stored: natgw's CRD refuses it (CEL rule on spec.v4ip);
		// upstream's CRD would not.
		e := eip(w.prefix+"bad", "uid-bad", "fd00::10", "ext-a")
		_, err := w.ensure(a, e)
		wantErr(w.t, err, ErrInvalid, "spec.v4ip", "fd00::10", "reserve eip "+e.Name)
		if _, ok := w.vip(VipName(e.Name)); ok {
			w.t.Fatalf("vip created for bad input")
		}
	}},
}

func mustRV(w *world, name string) string {
	u, ok := w.vip(name)
	if !ok {
		w.t.Fatalf("vip %s gone", name)
	}
	return u.GetResourceVersion()
}

// runScenarios runs every scenario against c.
func runScenarios(t *testing.T, ctx context.Context, c client.Client, prefix string) {
	for i, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			w := &world{t: t, ctx: ctx, c: c, log: testlog.New(t, 1), prefix: fmt.Sprintf("%s%d-", prefix, i)}
			sc.run(w, &Allocator{Client: c, APIReader: c})
		})
	}
}

// TestFake runs the scenarios against controller-runtime's fake client.
func TestFake(t *testing.T) {
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(VipGVK, meta.RESTScopeRoot)
	mapper.Add(kubeovn.SubnetGVK, meta.RESTScopeRoot)
	mapper.Add(eipGVK, meta.RESTScopeRoot)
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithRESTMapper(mapper).WithStatusSubresource(&v1.IptablesEIP{}).Build()
	runScenarios(t, context.Background(), c, "fake-")
}

// TestEnvtest runs the scenarios against a real kube-apiserver + etcd with
// upstream's Vip and Subnet CRDs and natgw's IptablesEIP CRD.
func TestEnvtest(t *testing.T) {
	assets := apitest.RequireAssets(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	up, err := crdtest.LoadSet(ctx, crdtest.Upstream, "")
	if err != nil {
		t.Fatalf("load upstream v1.16.2 CRDs: %v", err)
	}
	env := apitest.Environment(assets, apitest.CRDDir())
	for _, kind := range []string{"Vip", "Subnet"} {
		crd, ok := up[kind]
		if !ok {
			t.Fatalf("upstream CRDs have no %s", kind)
		}
		env.CRDs = append(env.CRDs, crd.DeepCopy())
	}
	cfg := apitest.StartT(t, env)
	c, err := client.New(cfg, client.Options{Scheme: testScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	// The CRDs installed are the ones meant: upstream's Vip (no status
	// subresource) and natgw's IptablesEIP.
	vipCRD := &apiextv1.CustomResourceDefinition{}
	if err := c.Get(ctx, types.NamespacedName{Name: "vips.kubeovn.io"}, vipCRD); err != nil {
		t.Fatalf("vip CRD: %v", err)
	}
	if vipCRD.Spec.Scope != apiextv1.ClusterScoped || vipCRD.Spec.Versions[0].Subresources != nil && vipCRD.Spec.Versions[0].Subresources.Status != nil {
		t.Fatalf("vip CRD is not upstream's: scope %s, subresources %+v", vipCRD.Spec.Scope, vipCRD.Spec.Versions[0].Subresources)
	}
	runScenarios(t, ctx, c, "env-")
}
