package provision

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// TestReconcileNamespace: where the provisioner puts a gateway's
// StatefulSet (GatewayNamespace), what it refuses (a namespace not allowed,
// a move of a live gateway) and where it releases a gone gateway's.
func TestReconcileNamespace(t *testing.T) {
	ctx := context.Background()
	get := func(e *fakeEnv, ns string) (*appsv1.StatefulSet, error) {
		s := &appsv1.StatefulSet{}
		return s, e.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: StatefulSetName("gw1")}, s)
	}
	setNS := func(ns string) func(*v1.VpcNatGateway) {
		return func(g *v1.VpcNatGateway) { g.Spec.Namespace = ns }
	}
	tests := []struct {
		name    string
		gw      func(*v1.VpcNatGateway) // at creation
		change  func(*v1.VpcNatGateway) // after the first reconcile; the second is checked
		wantNS  string                  // where the StatefulSet is ("" nowhere)
		notIn   string                  // a namespace that must not hold one
		applies int                     // of the checked reconcile
		event   string                  // substring of one event ("" none)
	}{
		{name: "unset: configured", wantNS: testNS, notIn: "team-a", applies: 1},
		{name: "spec.namespace allowed", gw: setNS("team-a"), wantNS: "team-a", notIn: testNS, applies: 1},
		{name: "spec.namespace = configured", gw: setNS(testNS), wantNS: testNS, notIn: "team-a", applies: 1},
		{name: "not allowed: not provisioned", gw: setNS("team-x"), notIn: "team-x",
			event: `Warning NamespaceNotAllowed spec.namespace "team-x": natgw-controller provisions gateways in "` + testNS + `" and in --gateway-namespaces ["team-a"] only`},
		{name: "live gateway moved: refused, kept", change: setNS("team-a"), wantNS: testNS, notIn: "team-a",
			event: `Warning NamespaceChangeRefused spec.namespace: Forbidden: the gateway's workload namespace "` + testNS + `" cannot change to "team-a"`},
		{name: "live gateway moved back: refused", gw: setNS("team-a"), change: setNS(""), wantNS: "team-a", notIn: testNS,
			event: `cannot change to "` + testNS + `"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newReconciledEnv(t, tc.gw, func(o *Options) { o.GatewayNamespaces = []string{"team-a"} })
			if tc.change != nil {
				e.changeGateway(t, tc.change)
			}
			if e.applies != tc.applies {
				t.Errorf("%d applies, want %d", e.applies, tc.applies)
			}
			if tc.wantNS != "" {
				s, err := get(e, tc.wantNS)
				if err != nil {
					t.Fatalf("StatefulSet in %s: %v", tc.wantNS, err)
				}
				if !controllerutil.ContainsFinalizer(s, StatefulSetFinalizer) {
					t.Errorf("StatefulSet in %s without finalizer %s", tc.wantNS, StatefulSetFinalizer)
				}
			}
			if _, err := get(e, tc.notIn); !apierrors.IsNotFound(err) {
				t.Errorf("StatefulSet in %s: %v, want not found", tc.notIn, err)
			}
			evs := e.events()
			if tc.event == "" && len(evs) > 0 {
				t.Errorf("events %q, want none", evs)
			}
			if tc.event != "" && !strings.Contains(strings.Join(evs, "\n"), tc.event) {
				t.Errorf("events %q, want one with %q", evs, tc.event)
			}
			if tc.wantNS == "" {
				return
			}
			// Gone: the StatefulSet where it is loses natgw's finalizer.
			if err := e.c.Delete(ctx, e.gateway(t)); err != nil {
				t.Fatal(err)
			}
			if err := e.reconcile(t); err != nil {
				t.Fatal(err)
			}
			s, err := get(e, tc.wantNS)
			if err != nil {
				t.Fatal(err)
			}
			if controllerutil.ContainsFinalizer(s, StatefulSetFinalizer) {
				t.Errorf("the gone gateway's StatefulSet in %s kept finalizer %s", tc.wantNS, StatefulSetFinalizer)
			}
		})
	}
}
