package admission

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/internal/apitest"
)

// webhookDir is the checkout's controller/config/webhook.
func webhookDir() string {
	return filepath.Join(apitest.RepoRoot(), "controller", "config", "webhook")
}

// world is a real kube-apiserver with Kube-OVN v1.16.2's own CRDs and the
// ValidatingWebhookConfiguration as shipped, served by a Validator that
// reads through a cache with the controller's indexes.
type world struct {
	t     *testing.T
	ctx   context.Context
	c     client.Client
	cache cache.Cache
}

func newWorld(t *testing.T) *world { return newWorldOf(t, crdtest.Upstream) }

// newWorldOf is newWorld on the CRD set given; on natgw's own (which has no
// Kube-OVN Subnets or Vpcs) the Validator looks none up (KubeOVN false).
func newWorldOf(t *testing.T, set crdtest.Set) *world { return newWorldCRDs(t, set, false) }

// newWorldWith is newWorld; with natgwNAT, natgw's own CRDs replace
// upstream's for the NAT kinds (a superset: master's fields), beside
// Kube-OVN's Vpc, Subnet and the rest.
func newWorldWith(t *testing.T, natgwNAT bool) *world {
	return newWorldCRDs(t, crdtest.Upstream, natgwNAT)
}

// newWorldCRDs is the world on the CRD set given, with natgw's NAT CRDs in
// place of the set's when natgwNAT.
func newWorldCRDs(t *testing.T, set crdtest.Set, natgwNAT bool) *world {
	assets := apitest.RequireAssets(t)
	log.SetLogger(testr.New(t))
	dir, err := crdtest.Path(context.Background(), set, apitest.CRDDir())
	if err != nil {
		t.Fatal(err)
	}
	env := apitest.Environment(assets, dir)
	if natgwNAT {
		crds, err := crdtest.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		ours, err := crdtest.Load(apitest.CRDDir())
		if err != nil {
			t.Fatal(err)
		}
		for _, kind := range crdtest.Kinds {
			if ours[kind] == nil {
				t.Fatalf("natgw's CRDs have no %s", kind)
			}
			crds[kind] = ours[kind]
		}
		env.CRDDirectoryPaths = nil
		for _, crd := range crds {
			env.CRDs = append(env.CRDs, crd)
		}
	}
	env.WebhookInstallOptions = envtest.WebhookInstallOptions{Paths: []string{webhookDir()}}
	cfg := apitest.StartT(t, env)
	// Registered after StartT, so it runs first: the cache's watches and
	// the webhook server stop before the API server does.
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	scheme := apitest.Scheme(t)
	ca, err := cache.New(cfg, cache.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := reconciler.RegisterIndexes(ctx, ca); err != nil {
		t.Fatal(err)
	}
	go func() {
		if err := ca.Start(ctx); err != nil {
			t.Errorf("cache: %v", err)
		}
	}()
	o := env.WebhookInstallOptions
	srv := webhook.NewServer(webhook.Options{Host: o.LocalServingHost, Port: o.LocalServingPort, CertDir: o.LocalServingCertDir})
	New(ca, scheme, set == crdtest.Upstream).Register(srv)
	go func() {
		if err := srv.Start(ctx); err != nil {
			t.Errorf("webhook server: %v", err)
		}
	}()
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ctx: ctx, c: c, cache: ca}
	w.eventually("webhook server started", func() error { return srv.StartedChecker()(nil) })
	return w
}

func (w *world) eventually(what string, f func() error) {
	w.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cached waits until the webhook's cache has obj as the API server has it
// now (an admission webhook reads what its cache has seen, as upstream's).
func (w *world) cached(obj client.Object) {
	w.t.Helper()
	want := obj.GetResourceVersion()
	got := obj.DeepCopyObject().(client.Object)
	w.eventually("cache has "+obj.GetName(), func() error {
		if err := w.cache.Get(w.ctx, types.NamespacedName{Name: obj.GetName()}, got); err != nil {
			return err
		}
		if got.GetResourceVersion() != want {
			return errors.New("older version " + got.GetResourceVersion())
		}
		return nil
	})
}

// gone waits until the webhook's cache no longer has obj.
func (w *world) gone(obj client.Object) {
	w.t.Helper()
	w.eventually("cache lost "+obj.GetName(), func() error {
		err := w.cache.Get(w.ctx, types.NamespacedName{Name: obj.GetName()}, obj.DeepCopyObject().(client.Object))
		if apierrors.IsNotFound(err) {
			return nil
		}
		return errors.New("still cached")
	})
}

func kubeOVN(kind, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetGroupVersionKind(kubeovn.SubnetGVK.GroupVersion().WithKind(kind))
	u.SetName(name)
	return u
}

func om(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }

func gw(name string, mut func(*v1.VpcNatGatewaySpec)) *v1.VpcNatGateway {
	g := &v1.VpcNatGateway{ObjectMeta: om(name), Spec: v1.VpcNatGatewaySpec{Vpc: "vpc1", Subnet: "vpc1-net", LanIP: "10.0.1.254"}}
	if mut != nil {
		mut(&g.Spec)
	}
	return g
}

func eip(name, v4 string, mut func(*v1.IptablesEIPSpec)) *v1.IptablesEIP {
	e := &v1.IptablesEIP{ObjectMeta: om(name), Spec: v1.IptablesEIPSpec{NatGwDp: "gw1", V4ip: v4}}
	if mut != nil {
		mut(&e.Spec)
	}
	return e
}

func fip(name, e, in string) *v1.IptablesFIPRule {
	return &v1.IptablesFIPRule{ObjectMeta: om(name), Spec: v1.IptablesFIPRuleSpec{EIP: e, InternalIP: in}}
}

func dnat(name, e, proto, ext string) *v1.IptablesDnatRule {
	return &v1.IptablesDnatRule{ObjectMeta: om(name), Spec: v1.IptablesDnatRuleSpec{EIP: e, Protocol: proto, ExternalPort: ext, InternalIP: "10.0.1.7", InternalPort: "8080"}}
}

func snat(name, e, cidr string) *v1.IptablesSnatRule {
	return &v1.IptablesSnatRule{ObjectMeta: om(name), Spec: v1.IptablesSnatRuleSpec{EIP: e, InternalCIDR: cidr}}
}

// check asserts a write's outcome: allowed (want empty), or refused with
// an error that holds every string of want.
func check(t *testing.T, what string, err error, want ...string) {
	t.Helper()
	switch {
	case len(want) == 0 && err != nil:
		t.Errorf("%s: refused: %v", what, err)
	case len(want) > 0 && err == nil:
		t.Errorf("%s: admitted, want refused with %q", what, want)
	case len(want) > 0:
		for _, s := range want {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q does not hold %q", what, err, s)
			}
		}
	}
}

// TestWebhook: Kube-OVN's webhook checks, and natgw's conflicts, are made
// by a real API server calling the webhook as shipped
// (controller/config/webhook), on Kube-OVN v1.16.2's own CRDs; each refusal
// names the field and the value, and an admitted object is stored.
func TestWebhook(t *testing.T) {
	w := newWorld(t)
	for _, o := range []client.Object{
		kubeOVN("Vpc", "vpc1", map[string]any{}),
		kubeOVN("Subnet", "vpc1-net", map[string]any{"cidrBlock": "10.0.1.0/24", "gateway": "10.0.1.1", "vpc": "vpc1", "protocol": "IPv4"}),
		kubeOVN("Subnet", kubeovn.DefaultExternalNetwork, map[string]any{"cidrBlock": "192.0.2.0/24", "gateway": "192.0.2.1", "protocol": "IPv4", "provider": "ovn-vpc-external-network.kube-system"}),
		&v1.QoSPolicy{ObjectMeta: om("qos1"), Spec: v1.QoSPolicySpec{BindingType: "EIP"}},
	} {
		if err := w.c.Create(w.ctx, o); err != nil {
			t.Fatalf("create %s: %v", o.GetName(), err)
		}
	}

	// Creations, in order: an admitted object is waited for in the cache,
	// as later steps check against it.
	long := strings.Repeat("g", 42) // vpc-nat-gw- + 42 = 53 characters
	creates := []struct {
		name string
		obj  client.Object
		want []string // empty: admitted
	}{
		{"gateway", gw("gw1", nil), nil},
		{"gateway lanIp outside its subnet", gw("gw-lan", func(s *v1.VpcNatGatewaySpec) { s.LanIP = "10.0.9.9" }), []string{"spec.lanIp", "10.0.9.9", `not in subnet "vpc1-net"`}},
		{"gateway lanIp not an address", gw("gw-lan2", func(s *v1.VpcNatGatewaySpec) { s.LanIP = "10.0.1" }), []string{"spec.lanIp", "10.0.1"}},
		{"gateway VPC missing", gw("gw-vpc", func(s *v1.VpcNatGatewaySpec) { s.Vpc = "nope" }), []string{"spec.vpc", "nope", "Not found"}},
		{"gateway subnet empty", gw("gw-sub", func(s *v1.VpcNatGatewaySpec) { s.Subnet = "" }), []string{"spec.subnet", "Required"}},
		{"gateway subnet missing", gw("gw-sub2", func(s *v1.VpcNatGatewaySpec) { s.Subnet = "nope" }), []string{"spec.subnet", "nope"}},
		{"gateway toleration operator", gw("gw-tol", func(s *v1.VpcNatGatewaySpec) {
			s.Tolerations = []corev1.Toleration{{Key: "k", Operator: "Bogus", Effect: corev1.TaintEffectNoSchedule}}
		}), []string{"spec.tolerations[0].operator", "Bogus"}},
		{"gateway toleration effect", gw("gw-tol2", func(s *v1.VpcNatGatewaySpec) {
			s.Tolerations = []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}}
		}), []string{"spec.tolerations[0].effect"}},
		{"gateway QoSPolicy missing", gw("gw-qos", func(s *v1.VpcNatGatewaySpec) { s.QoSPolicy = "missing" }), []string{"spec.qosPolicy", "missing"}},
		{"gateway name too long", gw(long, nil), []string{"metadata.name", "more than 52"}},
		{"eip", eip("eip1", "192.0.2.10", nil), nil},
		{"eip without address", eip("eip0", "", nil), nil},
		{"eip address taken", eip("eip-dup", "192.0.2.10", nil), []string{"spec.v4ip", "192.0.2.10", `already used by IptablesEIP "eip1"`}},
		{"eip address invalid", eip("eip-bad", "192.0.2.300", nil), []string{"spec.v4ip", "192.0.2.300"}},
		{"eip address outside the external subnet", eip("eip-out", "198.51.100.5", nil), []string{"spec.v4ip", "198.51.100.5", "outside subnet"}},
		{"eip address is the subnet's gateway", eip("eip-gw", "192.0.2.1", nil), []string{"spec.v4ip", "gateway"}},
		{"eip external subnet missing", eip("eip-ext", "192.0.2.12", func(s *v1.IptablesEIPSpec) { s.ExternalSubnet = "nope" }), []string{"spec.externalSubnet", "nope"}},
		{"eip gateway empty", eip("eip-dp", "192.0.2.13", func(s *v1.IptablesEIPSpec) { s.NatGwDp = "" }), []string{"spec.natGwDp", "Required"}},
		{"eip2", eip("eip2", "192.0.2.11", nil), nil},
		{"fip", fip("fip1", "eip1", "10.0.1.5"), nil},
		{"second fip on the eip", fip("fip2", "eip1", "10.0.1.6"), []string{"spec.eip", `already used by IptablesFIPRule "fip1"`}},
		{"fip eip missing", fip("fip3", "nope", "10.0.1.6"), []string{"spec.eip", "nope"}},
		{"fip internalIp invalid", fip("fip4", "eip0", "10.0.1.x"), []string{"spec.internalIp", "10.0.1.x"}},
		{"dnat on a fip's eip", dnat("dnat0", "eip1", "tcp", "80"), []string{"spec.eip", `already used by IptablesFIPRule "fip1"`}},
		{"dnat", dnat("dnat1", "eip2", "tcp", "80"), nil},
		{"dnat same port, protocol in capitals", dnat("dnat2", "eip2", "TCP", "80"), []string{"spec.externalPort", "80", `IptablesDnatRule "dnat1"`}},
		{"dnat same port, no protocol (tcp)", dnat("dnat3", "eip2", "", "80"), []string{"spec.externalPort", `IptablesDnatRule "dnat1"`}},
		{"dnat same port, udp", dnat("dnat4", "eip2", "udp", "80"), nil},
		{"dnat protocol", dnat("dnat5", "eip2", "icmp", "81"), []string{"spec.protocol", "icmp"}},
		{"dnat port", dnat("dnat6", "eip2", "tcp", "70000"), []string{"spec.externalPort", "70000"}},
		{"fip on a dnat's eip", fip("fip5", "eip2", "10.0.1.8"), []string{"spec.eip", `already used by IptablesDnatRule`}},
		{"snat cidr", snat("snat0", "eip2", "10.0.1.0/33"), []string{"spec.internalCIDR", "10.0.1.0/33"}},
		{"snat", snat("snat1", "eip2", "10.0.1.0/24"), nil},
	}
	objs := map[string]client.Object{}
	for _, tc := range creates {
		err := w.c.Create(w.ctx, tc.obj)
		check(t, "create: "+tc.name, err, tc.want...)
		if err == nil {
			if len(tc.want) > 0 {
				continue
			}
			w.cached(tc.obj)
			objs[tc.obj.GetName()] = tc.obj
		} else if len(tc.want) > 0 && !apierrors.IsInvalid(err) {
			t.Errorf("create: %s: %v is not a 422 Invalid", tc.name, err)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Updates.
	eip1 := objs["eip1"].(*v1.IptablesEIP)
	upd := func(obj client.Object, mut func()) error {
		if err := w.c.Get(w.ctx, types.NamespacedName{Name: obj.GetName()}, obj); err != nil {
			t.Fatal(err)
		}
		mut()
		return w.c.Update(w.ctx, obj)
	}
	check(t, "update: eip natGwDp", upd(eip1, func() { eip1.Spec.NatGwDp = "gw2" }), "spec.natGwDp", "immutable")
	check(t, "update: eip v4ip before ready", upd(eip1, func() { eip1.Spec.V4ip = "192.0.2.20" }))
	eip1.Status.Ready, eip1.Status.IP = true, "192.0.2.20"
	if err := w.c.Status().Update(w.ctx, eip1); err != nil {
		t.Fatal(err)
	}
	w.cached(eip1)
	check(t, "update: ready eip v4ip", upd(eip1, func() { eip1.Spec.V4ip = "192.0.2.21" }), "spec", "ready")
	check(t, "update: ready eip qosPolicy", upd(eip1, func() { eip1.Spec.QoSPolicy = "qos1" }))
	d1 := objs["dnat1"].(*v1.IptablesDnatRule)
	check(t, "update: dnat label only", upd(d1, func() { d1.Labels = map[string]string{"a": "b"} }))
	check(t, "update: dnat to udp port of dnat4", upd(d1, func() { d1.Spec.Protocol = "udp" }), "spec.externalPort", `IptablesDnatRule "dnat4"`)
	w.cached(eip1)

	// Deletions.
	g1 := objs["gw1"]
	check(t, "delete: gateway with eips", w.c.Delete(w.ctx, g1), `VpcNatGateway "gw1" is still used by IptablesEIP`)
	check(t, "delete: ready eip with a fip", w.c.Delete(w.ctx, eip1), `IptablesEIP "eip1" is still used by IptablesFIPRule "fip1"`)
	check(t, "delete: eip not ready with rules", w.c.Delete(w.ctx, objs["eip2"]))
	check(t, "delete: eip not ready", w.c.Delete(w.ctx, objs["eip0"]))
	check(t, "delete: fip", w.c.Delete(w.ctx, objs["fip1"]))
	w.gone(objs["fip1"])
	check(t, "delete: eip, its fip gone", w.c.Delete(w.ctx, eip1))
	for _, n := range []string{"eip0", "eip1", "eip2"} {
		w.gone(objs[n])
	}
	check(t, "delete: gateway without eips", w.c.Delete(w.ctx, g1))
}
