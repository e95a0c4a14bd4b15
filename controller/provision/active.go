package provision

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/transport"
)

// ActiveAnnotation on a two-replica VpcNatGateway names its active pod:
// the holder of the gateway's Lease (LeaseName; `natgw ha --id` is the
// pod's name), absent while nobody holds it. An annotation, as the Ready
// condition's (v1.ReadyAnnotation): Kube-OVN v1.16.2's VpcNatGateway
// status has no such field, and the API server prunes status fields its
// schema lacks. Written by the provisioner only (Options.HA), by a merge
// patch of this one key.
const ActiveAnnotation = "natgw.kubeovn.io/active"

// Role-change events on a two-replica VpcNatGateway.
const (
	// ReasonActiveChanged (Normal): another pod holds the gateway's Lease.
	ReasonActiveChanged = "ActiveChanged"
	// ReasonNoActive (Warning): nobody holds the gateway's Lease (it was
	// released, or removed).
	ReasonNoActive = "NoActive"
)

// holderOf is l's holder ("" for none).
func holderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// holderChanged passes a Lease's creation, deletion and the updates that
// change its holder (not the renewals, one per heartbeat interval).
var holderChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*coordinationv1.Lease)
		n, ok2 := e.ObjectNew.(*coordinationv1.Lease)
		return !ok1 || !ok2 || holderOf(o) != holderOf(n)
	},
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// gatewayOfLease maps a Lease of a gateway namespace (AllowedNamespace)
// named like a gateway StatefulSet (LeaseName) to its VpcNatGateway.
func (r *Reconciler) gatewayOfLease(_ context.Context, o client.Object) []reconcile.Request {
	if !AllowedNamespace(o.GetNamespace(), r.opts.Namespace, r.opts.GatewayNamespaces) {
		return nil
	}
	name, ok := strings.CutPrefix(o.GetName(), transport.GatewayAppPrefix)
	if !ok || name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: name}}}
}

// active records in g's ActiveAnnotation the holder of g's Lease when it
// changed, with an Event (ReasonActiveChanged, or ReasonNoActive when
// nobody holds it).
func (r *Reconciler) active(ctx context.Context, log logr.Logger, g *v1.VpcNatGateway) error {
	lease := LeaseName(g.Name)
	ns := GatewayNamespace(g, r.opts.Namespace)
	l := &coordinationv1.Lease{}
	holder := ""
	err := r.reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: lease}, l)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fmt.Errorf("get Lease %s/%s: %w", ns, lease, err)
	default:
		holder = holderOf(l)
	}
	prev, had := g.Annotations[ActiveAnnotation]
	if prev == holder && (had || holder == "") {
		return nil
	}
	var val any // null removes the key
	if holder != "" {
		val = holder
	}
	if gone, err := r.patchAnnotation(ctx, g, ActiveAnnotation, val); gone || err != nil {
		return err
	}
	was := prev
	if was == "" {
		was = "none"
	}
	log.Info("active replica changed", "active", holder, "was", was, "lease", lease)
	if holder == "" {
		r.recorder.Eventf(g, nil, corev1.EventTypeWarning, ReasonNoActive, "HA", "no replica holds Lease %s/%s (was %s)", ns, lease, was)
		return nil
	}
	r.recorder.Eventf(g, nil, corev1.EventTypeNormal, ReasonActiveChanged, "HA", "pod %s is active (holder of Lease %s/%s; was %s)", holder, ns, lease, was)
	return nil
}

// StandbyAnnotation on a two-replica VpcNatGateway is the standby's
// condition as natgw-controller programs it (Options.StandbyLag, from the
// exec transport): "InStep" while every running replica holds what the
// active holds, "Behind since <RFC 3339 time>" while a standby misses
// changes (it failed one, or could not be reached; the transport brings it
// in step when it reconnects). An annotation for the reason
// ActiveAnnotation is one. The lag itself, in seconds, is the gauge
// natgw_gateway_standby_lag_seconds.
const StandbyAnnotation = "natgw.kubeovn.io/standby"

// StandbyPoll is how often the provisioner reads a two-replica gateway's
// standby lag (Options.StandbyLag).
const StandbyPoll = 5 * time.Second

// Standby events on a two-replica VpcNatGateway.
const (
	// ReasonStandbyBehind (Warning): a standby misses changes.
	ReasonStandbyBehind = "StandbyBehind"
	// ReasonStandbyInStep (Normal): the standby holds what the active
	// holds again.
	ReasonStandbyInStep = "StandbyInStep"
)

// standbyValue is StandbyAnnotation's value for a lag at now; the time is
// rounded to seconds so that the value stays the same while behind.
func standbyValue(lag time.Duration, now time.Time) string {
	if lag <= 0 {
		return "InStep"
	}
	return "Behind since " + now.Add(-lag).UTC().Truncate(time.Second).Format(time.RFC3339)
}

// standby records g's standby condition (StandbyAnnotation) when it
// changed, with an Event at each change between in step and behind.
func (r *Reconciler) standby(ctx context.Context, log logr.Logger, g *v1.VpcNatGateway) error {
	lag := r.opts.StandbyLag(g.Name)
	want := standbyValue(lag, time.Now())
	prev := g.Annotations[StandbyAnnotation]
	// While behind, the start time read now may differ from the one
	// written by a second of rounding: keep the written one.
	if prev == want || (lag > 0 && strings.HasPrefix(prev, "Behind since ")) {
		return nil
	}
	if gone, err := r.patchAnnotation(ctx, g, StandbyAnnotation, want); gone || err != nil {
		return err
	}
	log.Info("standby replica", "condition", want, "was", prev)
	if lag > 0 {
		r.recorder.Eventf(g, nil, corev1.EventTypeWarning, ReasonStandbyBehind, "HA", "a standby replica misses changes the active holds (%s, for %s)", want, lag.Round(time.Second))
		return nil
	}
	if prev != "" {
		r.recorder.Eventf(g, nil, corev1.EventTypeNormal, ReasonStandbyInStep, "HA", "every running replica holds what the active holds (was: %s)", prev)
	}
	return nil
}

// patchAnnotation merge-patches annotation key of g to val (nil removes
// it); gone: g no longer exists (not an error).
func (r *Reconciler) patchAnnotation(ctx context.Context, g *v1.VpcNatGateway, key string, val any) (gone bool, err error) {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: val}}})
	if err != nil {
		return false, fmt.Errorf("encode the %s annotation: %w", key, err)
	}
	if err := r.client.Patch(ctx, g, client.RawPatch(types.MergePatchType, body)); err != nil {
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, fmt.Errorf("write the %s annotation of VpcNatGateway %s: %w", key, g.Name, err)
	}
	return false, nil
}
