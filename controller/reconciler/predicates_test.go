package reconciler

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/eipalloc"
	"github.com/natgw/natgw/nat"
)

// TestVipAddrsChanged: the rules' Vip watch passes the changes of what a
// rule reads of its EIP's Vip (the reserved addresses, the owner, the
// deletion) and drops Kube-OVN's other writes.
func TestVipAddrsChanged(t *testing.T) {
	vip := func(v4, v6 string, mutate ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
		u := eipalloc.NewVipObject()
		u.SetName("natgw-eip-a")
		u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "kubeovn.io/v1", Kind: "IptablesEIP", Name: "a", UID: "u1"}})
		_ = unstructured.SetNestedField(u.Object, map[string]any{"v4ip": v4, "v6ip": v6, "mac": "00:00:00:aa:bb:cc"}, "status")
		for _, m := range mutate {
			m(u)
		}
		return u
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name     string
		old, new *unstructured.Unstructured
		want     bool
	}{
		{"nothing", vip("192.0.2.20", ""), vip("192.0.2.20", ""), false},
		{"v6ip appears", vip("192.0.2.20", ""), vip("192.0.2.20", "2001:db8:2::20"), true},
		{"v6ip changes", vip("192.0.2.20", "2001:db8:2::20"), vip("192.0.2.20", "2001:db8:2::21"), true},
		{"v6ip goes", vip("192.0.2.20", "2001:db8:2::20"), vip("192.0.2.20", ""), true},
		{"v4ip appears", vip("", ""), vip("192.0.2.20", "2001:db8:2::20"), true},
		{"deleted", vip("192.0.2.20", "2001:db8:2::20"), vip("192.0.2.20", "2001:db8:2::20", func(u *unstructured.Unstructured) { u.SetDeletionTimestamp(&now) }), true},
		{"owner changes", vip("192.0.2.20", ""), vip("192.0.2.20", "", func(u *unstructured.Unstructured) {
			u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "kubeovn.io/v1", Kind: "IptablesEIP", Name: "a", UID: "u2"}})
		}), true},
		{"Kube-OVN's labels and finalizer", vip("192.0.2.20", "2001:db8:2::20"), vip("192.0.2.20", "2001:db8:2::20", func(u *unstructured.Unstructured) {
			u.SetLabels(map[string]string{"ovn.kubernetes.io/subnet": "ext", "ovn.kubernetes.io/ip_reserved": ""})
			u.SetFinalizers([]string{"kubeovn.io/kube-ovn-controller"})
		}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := vipAddrsChanged.Update(event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new}); got != tc.want {
				t.Errorf("vipAddrsChanged = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestRuleUseChanged: the EIP's rule watches pass what can change its
// status.nat (a create, the update that makes a rule terminating, the
// delete of a rule last seen live or of unknown state) and drop the
// delete of a rule last seen terminating (its EIP was reconciled without
// it already) and status-only updates.
func TestRuleUseChanged(t *testing.T) {
	now := metav1.Now()
	live := &v1.IptablesFIPRule{ObjectMeta: metav1.ObjectMeta{Name: "f", Generation: 1, Finalizers: []string{Finalizer}}, Spec: v1.IptablesFIPRuleSpec{EIP: "e"}}
	terminating := live.DeepCopy()
	terminating.DeletionTimestamp = &now
	ready := live.DeepCopy()
	ready.Status.Ready = true
	for _, tc := range []struct {
		name string
		got  bool
		want bool
	}{
		{"create", ruleUseChanged.Create(event.CreateEvent{Object: live}), true},
		{"status only", ruleUseChanged.Update(event.UpdateEvent{ObjectOld: live, ObjectNew: ready}), false},
		{"becomes terminating", ruleUseChanged.Update(event.UpdateEvent{ObjectOld: live, ObjectNew: terminating}), true},
		{"delete of a live rule", ruleUseChanged.Delete(event.DeleteEvent{Object: live}), true},
		{"delete of a terminating rule", ruleUseChanged.Delete(event.DeleteEvent{Object: terminating}), false},
		{"delete, final state unknown", ruleUseChanged.Delete(event.DeleteEvent{Object: terminating, DeleteStateUnknown: true}), true},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: passed %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// TestUntrackedGone: a rule's own delete event is dropped only when the
// cache last saw it terminating and nothing is tracked under its name
// (finishDelete forgot it before removing the finalizer); a tracked name,
// a rule deleted while live and an unknown final state pass.
func TestUntrackedGone(t *testing.T) {
	now := metav1.Now()
	d := &Deps{}
	live := &v1.IptablesFIPRule{ObjectMeta: metav1.ObjectMeta{Name: "f", UID: "u1"}}
	terminating := live.DeepCopy()
	terminating.DeletionTimestamp = &now
	p := d.untrackedGone(nat.KindFIP)
	if !p.Delete(event.DeleteEvent{Object: live}) {
		t.Error("the delete of a rule last seen live was dropped")
	}
	if p.Delete(event.DeleteEvent{Object: terminating}) {
		t.Error("the delete of an untracked rule last seen terminating passed")
	}
	if !p.Delete(event.DeleteEvent{Object: terminating, DeleteStateUnknown: true}) {
		t.Error("a delete of unknown final state was dropped")
	}
	d.tracked().set(nat.KindFIP, "f", "u1", "gw")
	if !p.Delete(event.DeleteEvent{Object: terminating}) {
		t.Error("the delete of a tracked rule (left on a gateway) was dropped")
	}
	if !p.Update(event.UpdateEvent{ObjectOld: live, ObjectNew: terminating}) || !p.Create(event.CreateEvent{Object: live}) {
		t.Error("untrackedGone filters more than deletes")
	}
}

// TestNotInitialList: the mapping watches drop the creates of an
// informer's initial list and pass every later create, update and delete.
func TestNotInitialList(t *testing.T) {
	r := &v1.IptablesDnatRule{ObjectMeta: metav1.ObjectMeta{Name: "d"}}
	if notInitialList.Create(event.CreateEvent{Object: r, IsInInitialList: true}) {
		t.Error("a create of the initial list passed")
	}
	if !notInitialList.Create(event.CreateEvent{Object: r}) {
		t.Error("a create after the initial list was dropped")
	}
	if !notInitialList.Update(event.UpdateEvent{ObjectOld: r, ObjectNew: r}) || !notInitialList.Delete(event.DeleteEvent{Object: r}) || !notInitialList.Generic(event.GenericEvent{Object: r}) {
		t.Error("an update, delete or generic event was dropped")
	}
}
