package provision

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// events drains the fake recorder.
func (e *fakeEnv) events() []string {
	var out []string
	for {
		select {
		case ev := <-e.r.recorder.(*events.FakeRecorder).Events:
			out = append(out, ev)
		default:
			return out
		}
	}
}

// TestReconcileReplicas: what the provisioner makes of the number of
// replicas (Replicas, ReplicasChange) with two-replica provisioning on and
// off: the StatefulSet's replicas and template, the applies, the events.
func TestReconcileReplicas(t *testing.T) {
	setReplicas := func(n int32) func(*v1.VpcNatGateway) {
		return func(g *v1.VpcNatGateway) { g.Spec.Replicas = ptr.To(n) }
	}
	setAnnotation := func(v string) func(*v1.VpcNatGateway) {
		return func(g *v1.VpcNatGateway) { g.Annotations = map[string]string{ReplicasAnnotation: v} }
	}
	tests := []struct {
		name string
		ha   bool
		gw   func(*v1.VpcNatGateway) // at creation
		// change, when set, is made after the first reconcile; the
		// second reconcile's outcome is checked.
		change       func(*v1.VpcNatGateway)
		wantApplies  int // of the checked reconcile
		wantReplicas int32
		wantEvent    string // a substring of one event ("" none)
		haOffAfter   bool   // two-replica provisioning switched off before the change
	}{
		{name: "unset", ha: true, wantApplies: 1, wantReplicas: 1},
		{name: "2, HA", ha: true, gw: setReplicas(2), wantApplies: 1, wantReplicas: 2},
		{name: "annotation 2, HA", ha: true, gw: setAnnotation("2"), wantApplies: 1, wantReplicas: 2},
		{name: "2, HA off: one pod", gw: setReplicas(2), wantApplies: 1, wantReplicas: 1, wantEvent: "Warning ReplicasUnsupported 2 replicas asked for: natgw provisions one gateway pod"},
		{name: "3: not provisioned", ha: true, gw: setReplicas(3), wantEvent: "Warning ReplicasInvalid spec.replicas: Invalid value: 3"},
		{name: "annotation 0: not provisioned", ha: true, gw: setAnnotation("0"), wantEvent: `Warning ReplicasInvalid metadata.annotations[natgw.kubeovn.io/replicas]: Invalid value: "0"`},
		{name: "live 1 -> 2: refused, kept at 1", ha: true, change: setReplicas(2), wantReplicas: 1, wantEvent: "Warning ReplicasChangeRefused spec.replicas: Forbidden: the gateway runs 1 replica(s) and cannot change to 2"},
		{name: "live 2 -> 1 by annotation: refused, kept at 2", ha: true, gw: setAnnotation("2"), change: setAnnotation("1"), wantReplicas: 2, wantEvent: "cannot change to 1"},
		{name: "live 2, HA switched off: kept at 2", ha: true, gw: setReplicas(2), change: func(*v1.VpcNatGateway) {}, haOffAfter: true, wantReplicas: 2, wantEvent: "ReplicasUnsupported"},
		{name: "live 1 -> 3: refused, StatefulSet left", ha: true, change: setReplicas(3), wantReplicas: 1, wantEvent: "ReplicasInvalid"},
		{name: "live 1 -> 2 with a selector change: rebuilt with 1", ha: true, change: func(g *v1.VpcNatGateway) { g.Spec.Replicas = ptr.To[int32](2); g.Spec.Selector = []string{"zone: b"} }, wantApplies: 1, wantReplicas: 1, wantEvent: "cannot change to 2"},
		{name: "live 2 -> 1 with a selector change: rebuilt with 2", ha: true, gw: setReplicas(2), change: func(g *v1.VpcNatGateway) { g.Spec.Replicas = ptr.To[int32](1); g.Spec.Selector = []string{"zone: b"} }, wantApplies: 1, wantReplicas: 2, wantEvent: "cannot change to 1"},
		{name: "live 2, selector change: rebuilt with 2", ha: true, gw: setReplicas(2), change: func(g *v1.VpcNatGateway) { g.Spec.Selector = []string{"zone: b"} }, wantApplies: 1, wantReplicas: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newReconciledEnv(t, tc.gw, func(o *Options) { o.HA = tc.ha })
			if tc.change != nil {
				if e.applies != 1 {
					t.Fatalf("first reconcile: %d applies, want 1", e.applies)
				}
				if tc.haOffAfter {
					e.r.opts.HA = false
				}
				e.changeGateway(t, tc.change)
			}
			if e.applies != tc.wantApplies {
				t.Errorf("%d applies, want %d", e.applies, tc.wantApplies)
			}
			evs := e.events()
			found := tc.wantEvent == ""
			for _, ev := range evs {
				if tc.wantEvent != "" && strings.Contains(ev, tc.wantEvent) {
					found = true
				}
			}
			if !found || tc.wantEvent == "" && len(evs) > 0 {
				t.Errorf("events %q, want one holding %q", evs, tc.wantEvent)
			}
			if tc.wantReplicas == 0 {
				err := e.c.Get(context.Background(), types.NamespacedName{Namespace: testNS, Name: "vpc-nat-gw-gw1"}, &appsv1.StatefulSet{})
				if !apierrors.IsNotFound(err) {
					t.Errorf("StatefulSet: %v, want not found", err)
				}
				return
			}
			s := e.sts(t)
			if got := ptr.Deref(s.Spec.Replicas, 0); got != tc.wantReplicas {
				t.Errorf("StatefulSet replicas %d, want %d", got, tc.wantReplicas)
			}
			if got := ProvisionedReplicas(s.Spec.Template.Annotations); got != tc.wantReplicas {
				t.Errorf("template built for %d replicas, want %d", got, tc.wantReplicas)
			}
			_, static := s.Spec.Template.Annotations["ovn.kubernetes.io/ip_address"]
			if static != (tc.wantReplicas == 1) {
				t.Errorf("static eth0 address in the template: %v, want %v", static, tc.wantReplicas == 1)
			}
		})
	}
}

// TestReconcileReplicasAdopted: a StatefulSet natgw did not make (Kube-OVN
// v1.16.2's single gateway, taken over by natgw's apply) is a single
// gateway: a VpcNatGateway asking for 2 is applied with 1 and told why.
func TestReconcileReplicasAdopted(t *testing.T) {
	g := gateway()
	g.Spec.Replicas = ptr.To[int32](2)
	up := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: testNS, Name: "vpc-nat-gw-gw1", Labels: Labels("gw1")},
		Spec: appsv1.StatefulSetSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: Labels("gw1")},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: Labels("gw1"), Annotations: map[string]string{"ovn.kubernetes.io/ip_address": "10.0.1.254"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vpc-nat-gw", Image: testImage}}},
			},
		},
	}
	e := newFakeEnv(t, g, up)
	e.r.opts.HA = true
	if err := e.reconcile(t); err != nil {
		t.Fatal(err)
	}
	if e.applies != 1 {
		t.Errorf("%d applies, want 1 (taken over)", e.applies)
	}
	s := e.sts(t)
	if n := ptr.Deref(s.Spec.Replicas, 0); n != 1 || ProvisionedReplicas(s.Spec.Template.Annotations) != 1 {
		t.Errorf("replicas %d, template %v: want a single gateway", n, s.Spec.Template.Annotations)
	}
	evs := e.events()
	if len(evs) != 1 || !strings.Contains(evs[0], "ReplicasChangeRefused") {
		t.Errorf("events %q, want one ReplicasChangeRefused", evs)
	}
}
