package provision

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/testlog"
)

// envClient starts env (stopped when the test ends) and returns a client
// of it that knows the core kinds and natgw's.
func envClient(t *testing.T, env *envtest.Environment) client.Client {
	t.Helper()
	cfg := apitest.StartT(t, env)
	c, err := client.New(cfg, client.Options{Scheme: apitest.Scheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// envWithCRDs starts a kube-apiserver (stopped when the test ends) that
// holds the CRDs of sets, a later set's CRD of a kind replacing an earlier
// one's, and returns a client of it.
func envWithCRDs(ctx context.Context, t *testing.T, sets ...crdtest.Set) client.Client {
	t.Helper()
	assets := apitest.RequireAssets(t)
	byName := map[string]*apiextv1.CustomResourceDefinition{}
	for _, set := range sets {
		crds, err := crdtest.LoadSet(ctx, set, apitest.CRDDir())
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(byName, crds)
	}
	env := apitest.Environment(assets, "")
	env.CRDDirectoryPaths, env.ErrorIfCRDPathMissing = nil, false
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		env.CRDs = append(env.CRDs, byName[name])
	}
	return envClient(t, env)
}

// envReconciler is a reconciler over c with opts (its events in rec), and
// a call that reconciles the gateway named, failing t on an error.
func envReconciler(ctx context.Context, t *testing.T, c client.Client, rec events.EventRecorder, opts Options) func(name string) {
	r := &Reconciler{client: c, reader: c, api: c, recorder: rec, opts: opts}
	return func(name string) {
		t.Helper()
		if _, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: name}}); err != nil {
			t.Fatalf("reconcile %s: %v", name, err)
		}
	}
}

// createWithNetwork creates Kube-OVN's Vpc vpc1 and the Subnets of
// subnets(), then objs in their order.
func createWithNetwork(ctx context.Context, t *testing.T, c client.Client, objs ...client.Object) {
	t.Helper()
	for _, o := range append(networkObjects(), objs...) {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %s: %v", o.GetName(), err)
		}
	}
}

// TestEnvTwoReplicas: on a real kube-apiserver with Kube-OVN v1.16.2's
// CRDs (which prune spec.replicas: the annotation asks), the provisioner
// with --ha-gateways server-side applies a two-replica StatefulSet that the
// API server accepts as built (two replicas, the anti-affinity, the
// ServiceAccount, no static eth0 address); the annotation changed to 1
// leaves it at 2 with a Warning; a single gateway beside it is today's;
// the Lease's holder becomes the annotation naming the active pod.
func TestEnvTwoReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := envWithCRDs(ctx, t, crdtest.Upstream)
	ha, single := gateway(), gateway()
	ha.Annotations = map[string]string{ReplicasAnnotation: "2"}
	single.Name, single.UID = "gw2", ""
	ha.UID = ""
	createWithNetwork(ctx, t, c, ha, single)
	rec := events.NewFakeRecorder(16)
	reconcile := envReconciler(ctx, t, c, rec, Options{Namespace: "kube-system", Image: testImage, HA: true, Log: testlog.New(t, 0)})
	sts := func(name string) *appsv1.StatefulSet {
		t.Helper()
		s := &appsv1.StatefulSet{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: "kube-system", Name: StatefulSetName(name)}, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// The lanIp's Vip first; the pods wait until Kube-OVN reserved it.
	reconcile("gw1")
	if err := c.Get(ctx, types.NamespacedName{Namespace: "kube-system", Name: StatefulSetName("gw1")}, &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
		t.Fatalf("gw1's StatefulSet before Kube-OVN reserved the lanIp: %v, want not found", err)
	}
	vip := NewLanVip(ha, "kube-system")
	if err := c.Get(ctx, types.NamespacedName{Name: vip.GetName()}, vip); err != nil {
		t.Fatalf("gw1's lanIp Vip: %v", err)
	}
	// Kube-OVN's vip controller reserves it (its CRD has no status
	// subresource: a merge patch of the object).
	if err := c.Patch(ctx, vip, client.RawPatch(types.MergePatchType, []byte(`{"status":{"v4ip":"`+ha.Spec.LanIP+`","mac":"00:00:00:00:00:01"}}`))); err != nil {
		t.Fatal(err)
	}
	reconcile("gw1")
	reconcile("gw2")

	s := sts("gw1")
	if *s.Spec.Replicas != 2 {
		t.Errorf("gw1: %d replicas, want 2", *s.Spec.Replicas)
	}
	p := s.Spec.Template.Spec
	if p.ServiceAccountName != GatewayServiceAccount {
		t.Errorf("gw1: serviceAccountName %q", p.ServiceAccountName)
	}
	anti := p.Affinity.PodAntiAffinity
	if anti == nil || len(anti.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		anti.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != corev1.LabelHostname ||
		anti.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector.MatchLabels["app"] != "vpc-nat-gw-gw1" {
		t.Errorf("gw1: pod anti-affinity %+v", anti)
	}
	if a, ok := s.Spec.Template.Annotations["ovn.kubernetes.io/ip_address"]; ok {
		t.Errorf("gw1: static eth0 address %q in a two-replica template", a)
	}
	if ProvisionedReplicas(s.Spec.Template.Annotations) != 2 {
		t.Errorf("gw1: template annotations %v", s.Spec.Template.Annotations)
	}

	s2 := sts("gw2")
	if *s2.Spec.Replicas != 1 || s2.Spec.Template.Spec.ServiceAccountName != "" || s2.Spec.Template.Spec.Affinity.PodAntiAffinity != nil ||
		s2.Spec.Template.Annotations["ovn.kubernetes.io/ip_address"] != "10.0.1.254" || ProvisionedReplicas(s2.Spec.Template.Annotations) != 1 {
		t.Errorf("gw2 (single): replicas %d, template %+v %v", *s2.Spec.Replicas, s2.Spec.Template.Spec, s2.Spec.Template.Annotations)
	}

	// 2 -> 1 on the live gateway: refused, kept.
	g := &v1.VpcNatGateway{}
	if err := c.Get(ctx, types.NamespacedName{Name: "gw1"}, g); err != nil {
		t.Fatal(err)
	}
	g.Annotations[ReplicasAnnotation] = "1"
	if err := c.Update(ctx, g); err != nil {
		t.Fatal(err)
	}
	for len(rec.Events) > 0 {
		<-rec.Events
	}
	reconcile("gw1")
	if n := *sts("gw1").Spec.Replicas; n != 2 {
		t.Errorf("gw1 after the annotation said 1: %d replicas, want 2", n)
	}
	select {
	case ev := <-rec.Events:
		if !strings.Contains(ev, ReasonReplicasChangeRefused) || !strings.Contains(ev, "cannot change to 1") {
			t.Errorf("event %q", ev)
		}
	default:
		t.Error("no event for the refused change")
	}

	// The active pod from the Lease's holder (the fence `natgw ha` keeps).
	holder := "vpc-nat-gw-gw1-1"
	if err := c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: LeaseName("gw1")}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}); err != nil {
		t.Fatal(err)
	}
	reconcile("gw1")
	if err := c.Get(ctx, types.NamespacedName{Name: "gw1"}, g); err != nil {
		t.Fatal(err)
	}
	if got := g.Annotations[ActiveAnnotation]; got != holder {
		t.Errorf("annotation %s = %q, want %q", ActiveAnnotation, got, holder)
	}
	if g.Annotations[ReplicasAnnotation] != "1" {
		t.Errorf("the active's patch changed other annotations: %v", g.Annotations)
	}
}
