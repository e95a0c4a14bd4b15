package reconciler

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/internal/netlab"
)

// warningCounter counts the API server's warnings a client gets.
type warningCounter struct {
	unknown atomic.Int64
	first   atomic.Value // string
}

func (w *warningCounter) HandleWarningHeader(_ int, _ string, text string) {
	if strings.Contains(text, "unknown field") {
		w.unknown.Add(1)
		w.first.CompareAndSwap(nil, text)
	}
}

// holdFinalizer keeps a deleted test object around after natgw removed its
// own finalizer, so that what natgw's last write left can be compared.
const holdFinalizer = "natgw.test/hold"

// ownedStatus are the status fields natgw writes, per kind; every other
// field of an object must come out of the lifecycle as it went in. A
// rule's v4ip and v6ip are its EIP's addresses, both written at every
// reconcile (upstream writes v6ip from the EIP's spec.v6ip too,
// vpc_nat_gw_nat.go:266 at 1533681d7).
var ownedStatus = map[string][]string{
	"IptablesEIP":      {"ready", "ip", "nat", "qosPolicy", "conditions"},
	"IptablesFIPRule":  {"ready", "v4ip", "v6ip", "natGwDp", "internalIp", "conditions"},
	"IptablesDnatRule": {"ready", "v4ip", "v6ip", "natGwDp", "protocol", "internalIp", "internalPort", "externalPort", "conditions"},
	"IptablesSnatRule": {"ready", "v4ip", "v6ip", "natGwDp", "internalCIDR", "conditions"},
	"VpcNatGateway":    {"qosPolicy"},
	"QoSPolicy":        {"shared", "bindingType", "bandwidthLimitRules", "conditions"}, // written from the spec (qospolicy.go)
}

// TestEveryFieldKept creates one object of every kind with every field of
// upstream Kube-OVN v1.16.2's schema set (spec, status, labels and
// annotations of its own), runs the lifecycle through natgw-controller
// (Ready with real TCP through the FIP, a spec update, delete), and
// compares each object field by field, unstructured, after Ready, after
// the update and after natgw's last write of the deletion (a finalizer of
// the test's keeps it): nothing natgw does not own may change or go
// missing, and the controller's client gets no "unknown field" warning. On
// natgw's CRDs and on upstream's.
func TestEveryFieldKept(t *testing.T) {
	for _, set := range crdtest.Sets {
		t.Run(string(set), func(t *testing.T) { testEveryFieldKept(t, set) })
	}
}

func testEveryFieldKept(t *testing.T, set crdtest.Set) {
	warnings := &warningCounter{}
	e := newEnv(t, envOptions{crds: set, warnings: warnings})
	up, err := crdtest.LoadSet(e.ctx, crdtest.Upstream, "")
	if err != nil {
		t.Fatal(err)
	}
	name := func(s string) string { return e.case_ + "-" + s }
	vm := func(i int) string { return e.gw.VMs[i].Addr.String() }
	specs := []struct {
		kind, name string
		vals       map[string]any
	}{
		{"QoSPolicy", name("qos"), map[string]any{".spec.bandwidthLimitRules[].matchValue": ""}},
		// The gateway's: shared, NATGW, a rule with a match (vpcnatgateway_qos.go).
		{"QoSPolicy", name("gwqos"), map[string]any{".spec.shared": true, ".spec.bindingType": "NATGW",
			".spec.bandwidthLimitRules[].matchType": "ip", ".spec.bandwidthLimitRules[].matchValue": "dst 10.9.0.0/16"}},
		{"VpcNatGateway", e.gwName, map[string]any{
			".spec.routes[].cidr": "10.2.0.0/16", ".spec.routes[].nextHopIP": vm(2), ".spec.qosPolicy": name("gwqos")}},
		{"IptablesEIP", name("eip1"), map[string]any{
			".spec.v4ip": netlab.EIP(30).String(), ".spec.v6ip": netlab.EIP6(30).String(), ".spec.natGwDp": e.gwName, ".spec.qosPolicy": name("qos")}},
		{"IptablesEIP", name("eip2"), map[string]any{
			".spec.v4ip": netlab.EIP(31).String(), ".spec.v6ip": netlab.EIP6(31).String(), ".spec.natGwDp": e.gwName, ".spec.qosPolicy": name("qos")}},
		{"IptablesFIPRule", name("fip"), map[string]any{".spec.eip": name("eip1"), ".spec.internalIp": vm(0)}},
		{"IptablesDnatRule", name("dnat"), map[string]any{".spec.eip": name("eip2"), ".spec.internalIp": vm(1),
			".spec.externalPort": "8081", ".spec.internalPort": "8080", ".spec.protocol": "tcp"}},
		{"IptablesSnatRule", name("snat"), map[string]any{".spec.eip": name("eip2"), ".spec.internalCIDR": "198.51.100.0/24"}},
	}
	type tracked struct {
		kind string
		orig *unstructured.Unstructured
	}
	var objs []tracked
	for _, s := range specs {
		u := crdtest.Object(up[s.kind], s.name, crdtest.With(s.vals, crdtest.Valid))
		status := u.Object["status"]
		delete(u.Object, "status")
		u.SetLabels(map[string]string{"user.example/label": "kept"})
		u.SetAnnotations(map[string]string{"user.example/annotation": "kept"})
		u.SetFinalizers([]string{holdFinalizer})
		if err := e.c.Create(e.ctx, u); err != nil {
			t.Fatalf("create %s %s: %v", s.kind, s.name, err)
		}
		// Every status field, before natgw sees the object (its cache
		// selects the test label, added next).
		u.Object["status"] = status
		if err := e.c.Status().Update(e.ctx, u); err != nil {
			t.Fatalf("status of %s %s: %v", s.kind, s.name, err)
		}
		orig := u.DeepCopy()
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, testLabel, e.case_)
		if err := e.c.Patch(e.ctx, u, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, tracked{s.kind, orig})
	}
	t.Cleanup(func() {
		for _, o := range objs {
			_ = e.c.Patch(e.ctx, o.orig.DeepCopy(), client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`)))
		}
	})

	get := func(o tracked) *unstructured.Unstructured {
		t.Helper()
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(o.orig.GroupVersionKind())
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(o.orig), u); err != nil {
			t.Fatalf("get %s %s: %v", o.kind, o.orig.GetName(), err)
		}
		return u
	}
	waitReady := func(what string) {
		t.Helper()
		for _, o := range objs {
			if o.kind == "QoSPolicy" {
				continue
			}
			typed := listItemFor(o.kind)
			typed.SetName(o.orig.GetName())
			e.waitReady(typed)
		}
		t.Logf("%s: every object Ready", what)
	}
	// compare checks every leaf of o's original outside what natgw owns
	// (and what the test changed: changed).
	compare := func(when string, changed map[string]any) {
		t.Helper()
		for _, o := range objs {
			got := get(o)
			want := crdtest.Leaves(o.orig.Object)
			have := crdtest.Leaves(got.Object)
			for k := range want {
				if skipLeaf(o.kind, k) {
					delete(want, k)
				}
			}
			for k, v := range changed {
				if strings.HasPrefix(k, o.orig.GetName()+":") {
					want[strings.TrimPrefix(k, o.orig.GetName()+":")] = v
				}
			}
			for _, d := range crdtest.DiffLeaves(want, have) {
				t.Errorf("%s: %s %s: %s", when, o.kind, o.orig.GetName(), d)
			}
		}
	}

	waitReady("created")
	if got, err := e.probe(e.gw.VMs[0], netlab.EIP(30)); err != nil || !strings.Contains(got, e.gw.VMs[0].NS) {
		t.Errorf("TCP through the FIP: %q, %v", got, err)
	}
	compare("after Ready", nil)

	// Update: the FIP moves to another host (merge patch of one field).
	fip := objs[5].orig
	if err := e.c.Patch(e.ctx, fip.DeepCopy(), client.RawPatch(types.MergePatchType,
		[]byte(fmt.Sprintf(`{"spec":{"internalIp":%q}}`, vm(2))))); err != nil {
		t.Fatal(err)
	}
	waitReady("updated")
	if got, err := e.probe(e.gw.VMs[2], netlab.EIP(30)); err != nil || !strings.Contains(got, e.gw.VMs[2].NS) {
		t.Errorf("TCP through the moved FIP: %q, %v", got, err)
	}
	changed := map[string]any{fip.GetName() + ":.spec.internalIp": vm(2)}
	compare("after the update", changed)

	// Delete: natgw removes the rules and its finalizer; the test's keeps
	// the objects for the comparison of natgw's last write.
	for i := len(objs) - 1; i >= 0; i-- {
		if err := e.c.Delete(e.ctx, objs[i].orig.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	e.eventually(time.Minute, "natgw's finalizers removed", func() error {
		for _, o := range objs {
			if fins := get(o).GetFinalizers(); len(fins) != 1 || fins[0] != holdFinalizer {
				return fmt.Errorf("%s %s finalizers %v", o.kind, o.orig.GetName(), fins)
			}
		}
		return nil
	})
	compare("after the deletion", changed)
	if objs := e.kernelObjects(e.dataplane); len(objs) != 0 {
		t.Errorf("%d objects left on the gateway after the deletion: %v", len(objs), objs)
	}
	e.unreachable(netlab.EIP(30))
	if n := warnings.unknown.Load(); n > 0 {
		t.Errorf("the controller got %d \"unknown field\" warnings, e.g. %v", n, warnings.first.Load())
	}
}

// skipLeaf reports whether leaf path k of a kind's object is natgw's (or
// the API server's) to change: metadata the server manages, natgw's
// finalizer, labels and annotations (its own keys only: the user's must
// stay), and the status fields natgw owns.
func skipLeaf(kind, k string) bool {
	if strings.HasPrefix(k, ".metadata.") {
		return !strings.HasPrefix(k, ".metadata.labels.user.example") &&
			!strings.HasPrefix(k, ".metadata.annotations.user.example") &&
			k != ".metadata.name"
	}
	for _, f := range ownedStatus[kind] {
		if k == ".status."+f || strings.HasPrefix(k, ".status."+f+"[") || strings.HasPrefix(k, ".status."+f+".") {
			return true
		}
	}
	return false
}

// listItemFor returns an empty typed object of kind.
func listItemFor(kind string) client.Object {
	switch kind {
	case "VpcNatGateway":
		return &v1.VpcNatGateway{}
	case "IptablesEIP":
		return &v1.IptablesEIP{}
	case "IptablesFIPRule":
		return &v1.IptablesFIPRule{}
	case "IptablesDnatRule":
		return &v1.IptablesDnatRule{}
	case "IptablesSnatRule":
		return &v1.IptablesSnatRule{}
	}
	return &v1.QoSPolicy{}
}
