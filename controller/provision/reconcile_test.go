package provision

import (
	"context"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/testlog"
)

// kubeovnObject is a Kube-OVN object (Subnet, Vpc) as the API serves it.
func kubeovnObject(kind, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec, "status": map[string]any{
		"conditions": []any{map[string]any{"type": "Validated", "status": "True"}},
	}}}
	u.SetAPIVersion("kubeovn.io/v1")
	u.SetKind(kind)
	u.SetName(name)
	return u
}

// fakeEnv is a Reconciler over controller-runtime's fake client holding
// gateway() and the Subnets of subnets(), counting applies and status
// patches.
type fakeEnv struct {
	r               *Reconciler
	c               client.Client
	applies, status int
	// noKubeOVN: a created Vip stays without status; otherwise the fake
	// client plays Kube-OVN's vip controller and reserves spec.v4ip.
	noKubeOVN bool
}

// networkObjects are Kube-OVN's Vpc vpc1 and the Subnets of subnets().
func networkObjects() []client.Object {
	objs := []client.Object{kubeovnObject("Vpc", "vpc1", map[string]any{})}
	for _, s := range subnets() {
		objs = append(objs, kubeovnObject("Subnet", s.Name, map[string]any{
			"vpc": s.Vpc, "provider": s.Provider, "cidrBlock": s.CIDRBlock, "gateway": s.Gateway,
		}))
	}
	return objs
}

func newFakeEnv(t *testing.T, g *v1.VpcNatGateway, extra ...client.Object) *fakeEnv {
	t.Helper()
	scheme := apitest.Scheme(t)
	mapper := meta.NewDefaultRESTMapper(nil)
	for _, gvk := range []struct {
		kind string
	}{{"Subnet"}, {"Vpc"}, {"Vip"}} {
		k := kubeovn.SubnetGVK.GroupVersion().WithKind(gvk.kind)
		scheme.AddKnownTypeWithName(k, &unstructured.Unstructured{})
		scheme.AddKnownTypeWithName(k.GroupVersion().WithKind(gvk.kind+"List"), &unstructured.UnstructuredList{})
		mapper.Add(k, meta.RESTScopeRoot)
	}
	mapper.Add(v1.GroupVersion.WithKind("VpcNatGateway"), meta.RESTScopeRoot)
	mapper.Add(appsv1.SchemeGroupVersion.WithKind("StatefulSet"), meta.RESTScopeNamespace)
	mapper.Add(appsv1.SchemeGroupVersion.WithKind("ControllerRevision"), meta.RESTScopeNamespace)
	mapper.Add(corev1.SchemeGroupVersion.WithKind("Pod"), meta.RESTScopeNamespace)
	objs := append(append([]client.Object{g}, networkObjects()...), extra...)
	e := &fakeEnv{}
	e.c = fake.NewClientBuilder().WithScheme(scheme).WithRESTMapper(mapper).
		WithObjects(objs...).WithStatusSubresource(&v1.VpcNatGateway{}).
		WithInterceptorFuncs(interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
				if u, ok := obj.(*unstructured.Unstructured); ok && u.GetKind() == "Vip" && !e.noKubeOVN {
					ip, _, _ := unstructured.NestedString(u.Object, "spec", "v4ip")
					u.Object["status"] = map[string]any{"v4ip": ip, "mac": "00:00:00:00:00:01"}
				}
				return c.Create(ctx, obj, opts...)
			},
			Apply: func(ctx context.Context, c client.WithWatch, obj runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
				e.applies++
				return c.Apply(ctx, obj, opts...)
			},
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
				e.status++
				return c.SubResource(sub).Patch(ctx, obj, p, opts...)
			},
		}).Build()
	e.r = &Reconciler{client: e.c, reader: e.c, api: e.c, recorder: events.NewFakeRecorder(16),
		opts: Options{Namespace: testNS, Image: testImage, Log: testlog.New(t, 0)}}
	return e
}

// newHAFakeEnv is a fake env holding gateway() with spec.replicas and
// spec.namespace as given, its reconciler with --ha-gateways as ha and
// team-a in --gateway-namespaces.
func newHAFakeEnv(t *testing.T, replicas int32, namespace string, ha bool) (*v1.VpcNatGateway, *fakeEnv) {
	t.Helper()
	g := gateway()
	g.Spec.Replicas = ptr.To(replicas)
	g.Spec.Namespace = namespace
	e := newFakeEnv(t, g)
	e.r.opts.HA = ha
	e.r.opts.GatewayNamespaces = []string{"team-a"}
	return g, e
}

// newReconciledEnv is a fake env of gateway() as gw leaves it (nil: as
// is), its reconciler's options as opts leaves them, reconciled once.
func newReconciledEnv(t *testing.T, gw func(*v1.VpcNatGateway), opts func(*Options)) *fakeEnv {
	t.Helper()
	g := gateway()
	if gw != nil {
		gw(g)
	}
	e := newFakeEnv(t, g)
	opts(&e.r.opts)
	if err := e.reconcile(t); err != nil {
		t.Fatal(err)
	}
	return e
}

// changeGateway drains the events and zeroes the applies so far, updates
// the gateway as change leaves it and reconciles again.
func (e *fakeEnv) changeGateway(t *testing.T, change func(*v1.VpcNatGateway)) {
	t.Helper()
	e.events()
	e.applies = 0
	g := e.gateway(t)
	change(g)
	if err := e.c.Update(context.Background(), g); err != nil {
		t.Fatal(err)
	}
	if err := e.reconcile(t); err != nil {
		t.Fatal(err)
	}
}

func (e *fakeEnv) reconcile(t *testing.T) error {
	t.Helper()
	_, err := e.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: "gw1"}})
	return err
}

func (e *fakeEnv) gateway(t *testing.T) *v1.VpcNatGateway {
	t.Helper()
	g := &v1.VpcNatGateway{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Name: "gw1"}, g); err != nil {
		t.Fatal(err)
	}
	return g
}

func (e *fakeEnv) sts(t *testing.T) *appsv1.StatefulSet {
	t.Helper()
	s := &appsv1.StatefulSet{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: testNS, Name: "vpc-nat-gw-gw1"}, s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestReconcileRule: when the StatefulSet is applied and the status
// written (upstream's create, then its isVpcNatGwChanged rule, plus natgw's
// image and ownership checks), and when nothing is written.
func TestReconcileRule(t *testing.T) {
	tests := []struct {
		name string
		// change is done after a first reconcile created everything.
		change                func(t *testing.T, e *fakeEnv)
		wantApply, wantStatus int
		check                 func(t *testing.T, e *fakeEnv)
	}{
		{name: "steady: nothing written", change: func(*testing.T, *fakeEnv) {}},
		{
			name: "routes change: no rebuild (programmed live, as upstream)",
			change: func(t *testing.T, e *fakeEnv) {
				g := e.gateway(t)
				g.Spec.Routes = []v1.Route{{CIDR: "172.16.0.0/16", NextHopIP: "10.0.1.1"}}
				if err := e.c.Update(context.Background(), g); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "selector change: rebuild and status",
			change: func(t *testing.T, e *fakeEnv) {
				g := e.gateway(t)
				g.Spec.Selector = []string{"zone: b"}
				if err := e.c.Update(context.Background(), g); err != nil {
					t.Fatal(err)
				}
			},
			wantApply: 1, wantStatus: 1,
			check: func(t *testing.T, e *fakeEnv) {
				if got := e.sts(t).Spec.Template.Spec.NodeSelector["zone"]; got != "b" {
					t.Errorf("node selector zone=%q, want b", got)
				}
				if got := e.gateway(t).Status.Selector; len(got) != 1 || got[0] != "zone: b" {
					t.Errorf("status.selector %v", got)
				}
			},
		},
		{
			name: "image changed (natgw upgrade): rebuild, no status",
			change: func(_ *testing.T, e *fakeEnv) {
				e.r.opts.Image = "docker.io/natgw/natgw:next"
			},
			wantApply: 1,
			check: func(t *testing.T, e *fakeEnv) {
				if got := imageOf(e.sts(t)); got != "docker.io/natgw/natgw:next" {
					t.Errorf("image %q", got)
				}
			},
		},
		{
			name: "StatefulSet gone: re-created",
			change: func(t *testing.T, e *fakeEnv) {
				s := e.sts(t)
				s.Finalizers = nil // as if released
				if err := e.c.Update(context.Background(), s); err != nil {
					t.Fatal(err)
				}
				if err := e.c.Delete(context.Background(), s); err != nil {
					t.Fatal(err)
				}
			},
			wantApply: 1,
		},
		{
			name: "terminating VpcNatGateway: StatefulSet kept, nothing written",
			change: func(t *testing.T, e *fakeEnv) {
				g := e.gateway(t)
				g.Spec.Selector = []string{"zone: c"}
				if err := e.c.Update(context.Background(), g); err != nil {
					t.Fatal(err)
				}
				if err := e.c.Delete(context.Background(), g); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, e *fakeEnv) { e.sts(t) },
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := gateway()
			g.Spec.ExternalSubnets = []string{kubeovn.DefaultExternalNetwork}
			g.Finalizers = []string{"natgw.kubeovn.io/finalizer"}
			e := newFakeEnv(t, g)
			if err := e.reconcile(t); err != nil {
				t.Fatal(err)
			}
			// Created: one apply, one status write (upstream: Create, then patchNatGwStatus).
			if e.applies != 1 || e.status != 1 {
				t.Fatalf("first reconcile: %d applies, %d status patches, want 1 and 1", e.applies, e.status)
			}
			s, g2 := e.sts(t), e.gateway(t)
			if !metav1.IsControlledBy(s, g2) {
				t.Errorf("StatefulSet owners %v, want controlled by the VpcNatGateway", s.OwnerReferences)
			}
			if got := g2.Status.ExternalSubnets; len(got) != 1 || got[0] != kubeovn.DefaultExternalNetwork {
				t.Errorf("status.externalSubnets %v", got)
			}
			e.applies, e.status = 0, 0
			tc.change(t, e)
			if err := e.reconcile(t); err != nil {
				t.Fatal(err)
			}
			if e.applies != tc.wantApply || e.status != tc.wantStatus {
				t.Errorf("%d applies, %d status patches, want %d and %d", e.applies, e.status, tc.wantApply, tc.wantStatus)
			}
			if tc.check != nil {
				tc.check(t, e)
			}
		})
	}
}

// TestReconcileRefused: a gateway that cannot be built gets a Warning
// event and an error (retried), and nothing is written.
func TestReconcileRefused(t *testing.T) {
	tests := []struct {
		name string
		gw   func(*v1.VpcNatGateway)
		want string
	}{
		{"vpc missing", func(g *v1.VpcNatGateway) { g.Spec.Vpc = "nope" }, `vpc "nope"`},
		{"external subnet missing", func(g *v1.VpcNatGateway) { g.Spec.ExternalSubnets = []string{"nope"} }, `external subnet "nope"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g := gateway()
			tc.gw(g)
			e := newFakeEnv(t, g)
			err := e.reconcile(t)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Reconcile: %v, want an error naming %s", err, tc.want)
			}
			if e.applies != 0 || e.status != 0 {
				t.Errorf("%d applies, %d status patches, want none", e.applies, e.status)
			}
			select {
			case ev := <-e.r.recorder.(*events.FakeRecorder).Events:
				if !strings.Contains(ev, corev1.EventTypeWarning+" "+ReasonProvisionFailed) {
					t.Errorf("event %q", ev)
				}
			default:
				t.Error("no event")
			}
		})
	}
}

// TestReconcileKubeOVNFeature: natgw provisions only while Kube-OVN's own
// VPC NAT gateway feature is off (its ConfigMap absent, or not "true").
func TestReconcileKubeOVNFeature(t *testing.T) {
	tests := []struct {
		name      string
		cm        map[string]string // nil: no ConfigMap
		provision bool
	}{
		{"no ConfigMap", nil, true},
		{"feature off", map[string]string{FeatureKey: "false"}, true},
		{"feature on", map[string]string{FeatureKey: "true"}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var extra []client.Object
			if tc.cm != nil {
				extra = append(extra, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: FeatureConfigMap}, Data: tc.cm})
			}
			e := newFakeEnv(t, gateway(), extra...)
			res, err := e.r.Reconcile(context.Background(), ctrl.Request{NamespacedName: types.NamespacedName{Name: "gw1"}})
			if err != nil {
				t.Fatal(err)
			}
			if got := e.applies == 1; got != tc.provision {
				t.Errorf("%d applies, want provisioned=%v", e.applies, tc.provision)
			}
			if tc.provision {
				return
			}
			if e.status != 0 || res.RequeueAfter != featureRetry {
				t.Errorf("%d status patches, requeue after %v; want none and %v", e.status, res.RequeueAfter, featureRetry)
			}
			select {
			case ev := <-e.r.recorder.(*events.FakeRecorder).Events:
				if !strings.Contains(ev, ReasonKubeOVNFeatureOn) {
					t.Errorf("event %q", ev)
				}
			default:
				t.Error("no event")
			}
		})
	}
}

// TestReconcileHeldStatefulSet: the StatefulSet natgw applies carries
// natgw's finalizer; deleted by someone else (Kube-OVN's cleanup) while the
// VpcNatGateway lives, its pod is orphaned (kept running), the finalizer
// removed, and once the StatefulSet and its ControllerRevisions are gone it
// is applied again; deleting the VpcNatGateway releases the StatefulSet.
// Logic only (fake client: no garbage collector, no StatefulSet
// controller); e2e/kubeovn's TestMigration restarts Kube-OVN's own
// controller against a real cluster.
func TestReconcileHeldStatefulSet(t *testing.T) {
	ctx := context.Background()
	e := newFakeEnv(t, gateway())
	if err := e.reconcile(t); err != nil {
		t.Fatal(err)
	}
	sts := e.sts(t)
	if !slices.Contains(sts.Finalizers, StatefulSetFinalizer) {
		t.Fatalf("StatefulSet finalizers %v, want %s", sts.Finalizers, StatefulSetFinalizer)
	}
	isController := true
	owned := func(kind, name string, uid types.UID) []metav1.OwnerReference {
		return []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: kind, Name: name, UID: uid, Controller: &isController}}
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: sts.Name + "-0", Labels: Labels("gw1"),
		OwnerReferences: owned("StatefulSet", sts.Name, sts.UID)}}
	other := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "not-the-gateway", Labels: map[string]string{"app": "x"},
		OwnerReferences: owned("StatefulSet", sts.Name, sts.UID)}}
	rev := &appsv1.ControllerRevision{ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: sts.Name + "-abc", Labels: Labels("gw1"),
		OwnerReferences: owned("StatefulSet", sts.Name, sts.UID)}}
	for _, o := range []client.Object{pod, other, rev} {
		if err := e.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	// Kube-OVN's cleanup deletes it: held, then rescued.
	if err := e.c.Delete(ctx, sts); err != nil {
		t.Fatal(err)
	}
	applies := e.applies
	if err := e.reconcile(t); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
		t.Fatal(err)
	}
	if len(pod.OwnerReferences) != 0 {
		t.Errorf("gateway pod owner references %v, want none (orphaned)", pod.OwnerReferences)
	}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(other), other); err != nil || len(other.OwnerReferences) != 1 {
		t.Errorf("a pod outside the gateway's labels was touched: %v, %v", other.OwnerReferences, err)
	}
	if err := e.c.Get(ctx, client.ObjectKeyFromObject(sts), &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
		t.Fatalf("StatefulSet after the rescue: %v, want gone (finalizer removed)", err)
	}
	// The old StatefulSet's revision is still there: not applied yet.
	if err := e.reconcile(t); err != nil {
		t.Fatal(err)
	}
	if e.applies != applies {
		t.Fatalf("applied while the old StatefulSet's ControllerRevision was left (%d applies)", e.applies-applies)
	}
	if err := e.c.Delete(ctx, rev); err != nil { // the garbage collector's part
		t.Fatal(err)
	}
	if err := e.reconcile(t); err != nil {
		t.Fatal(err)
	}
	if e.applies != applies+1 || !slices.Contains(e.sts(t).Finalizers, StatefulSetFinalizer) {
		t.Fatalf("after the revisions went: %d applies, finalizers %v; want one apply with the finalizer", e.applies-applies, e.sts(t).Finalizers)
	}

	// The VpcNatGateway deleted: the StatefulSet is released.
	if err := e.c.Delete(ctx, e.gateway(t)); err != nil {
		t.Fatal(err)
	}
	if err := e.reconcile(t); err != nil {
		t.Fatal(err)
	}
	if f := e.sts(t).Finalizers; slices.Contains(f, StatefulSetFinalizer) {
		t.Errorf("StatefulSet of a deleted VpcNatGateway still held: %v", f)
	}
}
