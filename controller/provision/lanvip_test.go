package provision

import (
	"context"
	"reflect"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/natgw/natgw/controller/eipalloc"
)

// TestReconcileLanVip: a two-replica gateway gets its lanIp Vip (owner the
// VpcNatGateway, spec namespace/subnet/v4ip/selector), an existing one of
// someone else's is an error and left as it is, one of natgw's with another
// lanIp is deleted (requeue) so that Kube-OVN releases the old address, and
// one that matches keeps what Kube-OVN wrote (status, finalizer); a single
// gateway, or HA off, gets no Vip.
func TestReconcileLanVip(t *testing.T) {
	g := gateway()
	vip := func(mut func(u *unstructured.Unstructured)) *unstructured.Unstructured {
		u := NewLanVip(g, testNS)
		u.SetFinalizers([]string{"kube-ovn-controller"})
		u.Object["status"] = map[string]any{"v4ip": g.Spec.LanIP, "mac": "00:00:00:aa:bb:cc"}
		if mut != nil {
			mut(u)
		}
		return u
	}
	wantSpec := map[string]any{"namespace": testNS, "subnet": "net1", "v4ip": "10.0.1.254", "selector": []any{"app:vpc-nat-gw-gw1"}}
	tests := []struct {
		name     string
		replicas int32
		ha       bool
		live     *unstructured.Unstructured // the Vip before the reconcile
		err      string                     // substring of Reconcile's error
		requeue  bool
		noSts    bool           // no StatefulSet applied
		gone     bool           // no Vip after the reconcile
		spec     map[string]any // the Vip's spec after it (when not gone)
		status   bool           // Kube-OVN's status and finalizer kept
		ns       string         // the gateway's spec.namespace
	}{
		{name: "spec.namespace: the Vip's parents are there", replicas: 2, ha: true, ns: "team-a", requeue: true, noSts: true,
			spec: map[string]any{"namespace": "team-a", "subnet": "net1", "v4ip": "10.0.1.254", "selector": []any{"app:vpc-nat-gw-gw1"}}},
		{name: "created, the StatefulSet waits for the reservation", replicas: 2, ha: true, requeue: true, noSts: true, spec: wantSpec},
		{name: "kept with Kube-OVN's status", replicas: 2, ha: true, live: vip(nil), spec: wantSpec, status: true},
		{name: "someone else's", replicas: 2, ha: true, live: vip(func(u *unstructured.Unstructured) {
			u.SetOwnerReferences(nil)
			u.Object["spec"] = map[string]any{"subnet": "net1", "v4ip": "10.0.1.254"}
		}), err: "not controlled by VpcNatGateway gw1", spec: map[string]any{"subnet": "net1", "v4ip": "10.0.1.254"}, status: true},
		{name: "other lanIp: deleted", replicas: 2, ha: true, live: vip(func(u *unstructured.Unstructured) {
			u.SetFinalizers(nil)
			_ = unstructured.SetNestedField(u.Object, "10.0.1.200", "spec", "v4ip")
		}), requeue: true, noSts: true, gone: true},
		{name: "single gateway", replicas: 1, ha: true, gone: true},
		{name: "HA off", replicas: 2, gone: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			g, e := newHAFakeEnv(t, tc.replicas, tc.ns, tc.ha)
			e.noKubeOVN = tc.noSts
			ctx := context.Background()
			if tc.live != nil {
				if err := e.c.Create(ctx, tc.live.DeepCopy()); err != nil {
					t.Fatal(err)
				}
			}
			res, err := e.r.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: "gw1"}})
			switch {
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("Reconcile: %v, want an error holding %q", err, tc.err)
			case tc.err == "" && err != nil:
				t.Fatalf("Reconcile: %v", err)
			}
			if got := res.RequeueAfter > 0; tc.err == "" && got != tc.requeue {
				t.Errorf("requeue %v, want %v", res, tc.requeue)
			}
			if tc.err == "" && (e.applies == 0) != tc.noSts {
				t.Errorf("%d StatefulSet applies, want none: %v", e.applies, tc.noSts)
			}
			live := eipalloc.NewVipObject()
			err = e.c.Get(ctx, types.NamespacedName{Name: LanVipName("gw1")}, live)
			if tc.gone {
				if !apierrors.IsNotFound(err) {
					t.Fatalf("Vip after the reconcile: %v (%v), want none", live.Object["spec"], err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if spec := live.Object["spec"]; !reflect.DeepEqual(spec, tc.spec) {
				t.Errorf("Vip spec %v, want %v", spec, tc.spec)
			}
			if tc.err == "" && !metav1.IsControlledBy(live, g) {
				t.Errorf("Vip owner references %+v, want gw1 as controller", live.GetOwnerReferences())
			}
			if tc.status {
				if st, _, _ := unstructured.NestedString(live.Object, "status", "mac"); st == "" || len(live.GetFinalizers()) != 1 {
					t.Errorf("Kube-OVN's status %v or finalizers %v dropped", live.Object["status"], live.GetFinalizers())
				}
			}
		})
	}
}
