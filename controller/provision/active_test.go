package provision

import (
	"context"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// TestReconcileActive: a two-replica gateway's ActiveAnnotation follows
// its Lease's holder, with one Event per change (ActiveChanged, NoActive
// when nobody holds it) and no write when nothing changed; a single
// gateway, or provisioning without HA, reads no Lease; a gateway with
// spec.namespace reads its Lease there, not in the configured namespace.

func TestReconcileActive(t *testing.T) {
	lease := func(ns string, holder *string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: LeaseName("gw1")}, Spec: coordinationv1.LeaseSpec{HolderIdentity: holder}}
	}
	type step struct {
		holder *string // the Lease's holder before the reconcile; nil: keep the Lease as it is
		delete bool    // delete the Lease before the reconcile
		want   string  // the annotation ("" absent)
		event  string  // substring of the one event, "" none
	}
	tests := []struct {
		name      string
		replicas  int32
		ha        bool
		namespace string // the gateway's spec.namespace
		leaseNS   string // where the Lease is (default: testNS)
		steps     []step
	}{
		{name: "two replicas", replicas: 2, ha: true, steps: []step{
			{},
			{holder: ptr.To("vpc-nat-gw-gw1-0"), want: "vpc-nat-gw-gw1-0", event: "Normal ActiveChanged pod vpc-nat-gw-gw1-0 is active (holder of Lease kube-system/vpc-nat-gw-gw1; was none)"},
			{want: "vpc-nat-gw-gw1-0"},
			{holder: ptr.To("vpc-nat-gw-gw1-1"), want: "vpc-nat-gw-gw1-1", event: "was vpc-nat-gw-gw1-0"},
			{holder: ptr.To(""), event: "Warning NoActive no replica holds Lease kube-system/vpc-nat-gw-gw1 (was vpc-nat-gw-gw1-1)"},
			{},
			{holder: ptr.To("vpc-nat-gw-gw1-0"), want: "vpc-nat-gw-gw1-0", event: "ActiveChanged"},
			{delete: true, event: "NoActive"},
		}},
		{name: "two replicas in spec.namespace", replicas: 2, ha: true, namespace: "team-a", leaseNS: "team-a", steps: []step{
			{holder: ptr.To("vpc-nat-gw-gw1-0"), want: "vpc-nat-gw-gw1-0", event: "holder of Lease team-a/vpc-nat-gw-gw1"},
		}},
		{name: "two replicas in spec.namespace, Lease in the configured one: not read", replicas: 2, ha: true, namespace: "team-a", steps: []step{
			{holder: ptr.To("vpc-nat-gw-gw1-0")},
		}},
		{name: "single gateway", replicas: 1, ha: true, steps: []step{{holder: ptr.To("vpc-nat-gw-gw1-0")}}},
		{name: "two replicas asked, HA off", replicas: 2, steps: []step{{holder: ptr.To("vpc-nat-gw-gw1-0"), event: "ReplicasUnsupported"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, e := newHAFakeEnv(t, tc.replicas, tc.namespace, tc.ha)
			leaseNS := tc.leaseNS
			if leaseNS == "" {
				leaseNS = testNS
			}
			ctx := context.Background()
			var l *coordinationv1.Lease
			for i, s := range tc.steps {
				switch {
				case s.delete:
					if err := e.c.Delete(ctx, l); err != nil {
						t.Fatal(err)
					}
				case s.holder != nil && l == nil:
					l = lease(leaseNS, s.holder)
					if err := e.c.Create(ctx, l); err != nil {
						t.Fatal(err)
					}
				case s.holder != nil:
					l.Spec.HolderIdentity = s.holder
					if err := e.c.Update(ctx, l); err != nil {
						t.Fatal(err)
					}
				}
				if err := e.reconcile(t); err != nil {
					t.Fatal(err)
				}
				got, ok := e.gateway(t).Annotations[ActiveAnnotation]
				if got != s.want || ok != (s.want != "") {
					t.Errorf("step %d: annotation %q (present %v), want %q", i, got, ok, s.want)
				}
				evs := e.events()
				if s.event == "" && len(evs) > 0 || s.event != "" && (len(evs) != 1 || !strings.Contains(evs[0], s.event)) {
					t.Errorf("step %d: events %q, want one holding %q", i, evs, s.event)
				}
			}
		})
	}
}

// TestLeaseMapping: Leases map to the gateway they fence, renewals pass
// no event.
func TestLeaseMapping(t *testing.T) {
	r := &Reconciler{opts: Options{Namespace: testNS, GatewayNamespaces: []string{"team-a"}}}
	for _, tc := range []struct {
		ns, name, want string
	}{
		{testNS, "vpc-nat-gw-gw1", "gw1"},
		{"team-a", "vpc-nat-gw-gw1", "gw1"},
		{testNS, "kube-scheduler", ""},
		{testNS, "vpc-nat-gw-", ""},
		{"other", "vpc-nat-gw-gw1", ""},
	} {
		reqs := r.gatewayOfLease(context.Background(), &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: tc.ns, Name: tc.name}})
		got := ""
		if len(reqs) == 1 {
			got = reqs[0].Name
		}
		if got != tc.want || len(reqs) > 1 {
			t.Errorf("%s/%s: %v, want %q", tc.ns, tc.name, reqs, tc.want)
		}
	}
	l := func(holder string, rv string) client.Object {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "vpc-nat-gw-gw1", ResourceVersion: rv}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
	}
	if holderChanged.Update(event.UpdateEvent{ObjectOld: l("a", "1"), ObjectNew: l("a", "2")}) {
		t.Error("a renewal passes")
	}
	if !holderChanged.Update(event.UpdateEvent{ObjectOld: l("a", "1"), ObjectNew: l("b", "2")}) {
		t.Error("a holder change does not pass")
	}
	if !holderChanged.Create(event.CreateEvent{Object: l("a", "1")}) || !holderChanged.Delete(event.DeleteEvent{Object: l("a", "1")}) {
		t.Error("creation or deletion does not pass")
	}
}

// TestReconcileStandby: with Options.StandbyLag, a two-replica gateway's
// StandbyAnnotation follows the transport's lag (InStep, then "Behind
// since T" kept while behind, then InStep again) with an Event at each
// change, and the reconcile comes back every StandbyPoll; a single
// gateway gets neither.
func TestReconcileStandby(t *testing.T) {
	type step struct {
		lag   time.Duration
		want  string // prefix of the annotation
		event string // substring of the one event, "" none
	}
	for _, tc := range []struct {
		name     string
		replicas int32
		steps    []step
	}{
		{name: "two replicas", replicas: 2, steps: []step{
			{want: "InStep"},
			{lag: 3 * time.Second, want: "Behind since ", event: "Warning StandbyBehind a standby replica misses changes"},
			{lag: 9 * time.Second, want: "Behind since "},
			{want: "InStep", event: "Normal StandbyInStep every running replica holds what the active holds (was: Behind since "},
			{want: "InStep"},
		}},
		{name: "single gateway", replicas: 1, steps: []step{{lag: time.Second}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := gateway()
			g.Spec.Replicas = ptr.To(tc.replicas)
			e := newFakeEnv(t, g)
			e.r.opts.HA = true
			var lag time.Duration
			e.r.opts.StandbyLag = func(gw string) time.Duration {
				if gw != "gw1" {
					t.Errorf("StandbyLag(%q), want gw1", gw)
				}
				return lag
			}
			first := ""
			for i, s := range tc.steps {
				lag = s.lag
				res, err := e.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: "gw1"}})
				if err != nil {
					t.Fatal(err)
				}
				if want := tc.replicas == 2; (res.RequeueAfter == StandbyPoll) != want {
					t.Errorf("step %d: requeue after %s, want the standby poll: %t", i, res.RequeueAfter, want)
				}
				got, ok := e.gateway(t).Annotations[StandbyAnnotation]
				if s.want == "" && ok || !strings.HasPrefix(got, s.want) {
					t.Errorf("step %d: annotation %q (present %v), want prefix %q", i, got, ok, s.want)
				}
				if strings.HasPrefix(got, "Behind") {
					if first == "" {
						first = got
					} else if got != first {
						t.Errorf("step %d: %q rewritten while behind (was %q)", i, got, first)
					}
				}
				var evs []string
				for _, ev := range e.events() {
					if strings.Contains(ev, "Standby") {
						evs = append(evs, ev)
					}
				}
				if s.event == "" && len(evs) > 0 || s.event != "" && (len(evs) != 1 || !strings.Contains(evs[0], s.event)) {
					t.Errorf("step %d: events %q, want one holding %q", i, evs, s.event)
				}
			}
		})
	}
}
