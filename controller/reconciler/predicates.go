package reconciler

import (
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/nat"
)

// updateChanged passes the updates of T for which changed says the old
// and the new object differ, and any update of another type.
func updateChanged[T client.Object](changed func(o, n T) bool) predicate.Funcs {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(T)
			n, ok2 := e.ObjectNew.(T)
			if !ok1 || !ok2 {
				return true
			}
			return changed(o, n)
		},
	}
}

// notInitialList drops the create events of an informer's initial list
// (a start's, also a cold start's) on the watches that map one object to
// others (a rule to its EIP, an EIP to its rules, a rule to the rules
// waiting on its EIP): every object of the initial list gets its own
// create event on its own controller, whose workers start only once every
// informer and handler synced, so the mapped requests add nothing but
// their cost (at 113k objects a tenth of the controller's CPU until
// synced, bench/README.md "Scenario 6: the cold start's list"). Creates
// after the initial list, updates and deletes pass.
var notInitialList = predicate.Funcs{
	CreateFunc: func(e event.CreateEvent) bool { return !e.IsInInitialList },
}

// specOrMetaChanged drops update events that change nothing a reconcile
// reads from the object itself: status-only updates (our own status
// patches) would otherwise reconcile every object once more.
var specOrMetaChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld, e.ObjectNew
		return o.GetGeneration() != n.GetGeneration() ||
			!equality.Semantic.DeepEqual(o.GetDeletionTimestamp(), n.GetDeletionTimestamp()) ||
			!slices.Equal(o.GetFinalizers(), n.GetFinalizers()) ||
			!equality.Semantic.DeepEqual(o.GetLabels(), n.GetLabels()) ||
			!equality.Semantic.DeepEqual(o.GetAnnotations(), n.GetAnnotations())
	},
}

// ruleUseChanged passes the rule events that can change what an EIP's
// status.nat says (natUsers counts the rules on it that are not
// terminating): creates, the updates specOrMetaChanged passes (spec.eip,
// deletion), and the deletes of rules that were not terminating when last
// seen. The delete of a rule seen terminating changes nothing there: the
// update that made it terminating passed and reconciled the EIP without it
// (its finalizer's removal deletes the object without another update).
// Deletes of unknown final state pass.
var ruleUseChanged = predicate.Funcs{
	UpdateFunc: specOrMetaChanged.UpdateFunc,
	DeleteFunc: func(e event.DeleteEvent) bool {
		return e.DeleteStateUnknown || e.Object == nil || e.Object.GetDeletionTimestamp().IsZero()
	},
}

// untrackedGone drops the delete of an object of kind the cache last saw
// terminating when this process tracks nothing under its name: its
// reconcile would find it gone and nothing to reap (reapVanished). The
// update that made it terminating passed (specOrMetaChanged) and its
// reconcile deleted it on the gateways (finishDelete forgets it before the
// finalizer goes); a reconcile that read it live and programmed it since
// runs again for that update and reaps it. Deletes of objects last seen
// live, of unknown final state, or of a name still tracked (natgw's
// finalizer removed by someone else while another one held the object)
// pass.
func (d *Deps) untrackedGone(kind nat.Kind) predicate.Funcs {
	return predicate.Funcs{
		DeleteFunc: func(e event.DeleteEvent) bool {
			if e.DeleteStateUnknown || e.Object == nil || e.Object.GetDeletionTimestamp().IsZero() {
				return true
			}
			_, tracked := d.tracked().get(kind, e.Object.GetName())
			return tracked
		},
	}
}

// eipChangedForRules passes EIP updates that matter to its rules: spec,
// deletion, readiness or address (not status.nat, which the rules change).
var eipChangedForRules = updateChanged(func(o, n *v1.IptablesEIP) bool {
	return o.Generation != n.Generation ||
		!equality.Semantic.DeepEqual(o.DeletionTimestamp, n.DeletionTimestamp) ||
		o.Status.Ready != n.Status.Ready || o.Status.IP != n.Status.IP ||
		readyReason(o.Status.Conditions) != readyReason(n.Status.Conditions)
})

// readyReason is the reason of the Ready condition ("" when none): a rule
// reports GatewayNotReady while its EIP does, EIPNotReady otherwise.
func readyReason(conds []v1.Condition) string {
	if c := v1.FindCondition(conds, v1.ConditionReady); c != nil {
		return c.Reason
	}
	return ""
}

// subnetChanged passes Subnet updates that change what natgw reads of it
// (kubeovn.SubnetFrom): Kube-OVN rewrites a Subnet's status on every
// address it hands out, which must not reconcile every EIP of the subnet.
var subnetChanged = updateChanged(func(o, n *unstructured.Unstructured) bool {
	return kubeovn.SubnetFrom(o) != kubeovn.SubnetFrom(n)
})

// vipAddrsChanged passes updates of natgw's Vip that change what a rule
// reads of it (eipalloc.Allocator.ReservedV6: status.v4ip, status.v6ip,
// the owner, deletion); Kube-OVN's label and finalizer writes pass only
// with such a change.
var vipAddrsChanged = updateChanged(func(o, n *unstructured.Unstructured) bool {
	str := func(u *unstructured.Unstructured, path ...string) string {
		s, _, _ := unstructured.NestedString(u.Object, path...)
		return s
	}
	return str(o, "status", "v4ip") != str(n, "status", "v4ip") ||
		str(o, "status", "v6ip") != str(n, "status", "v6ip") ||
		!equality.Semantic.DeepEqual(o.GetDeletionTimestamp(), n.GetDeletionTimestamp()) ||
		!equality.Semantic.DeepEqual(o.GetOwnerReferences(), n.GetOwnerReferences())
})
