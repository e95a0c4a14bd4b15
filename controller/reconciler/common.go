package reconciler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/natgw/natgw/agentapi"
	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/eipalloc"
	"github.com/natgw/natgw/controller/gateway"
	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/nat"
)

// Finalizer is natgw-controller's finalizer. It is not upstream's
// kubeovn.io/kube-ovn-controller: that one belongs to kube-ovn-controller,
// which removes it after its own cleanup; sharing it would let either
// controller release an object whose rule the other still holds on a
// gateway. With our own name the object stays until natgw confirmed the
// delete, whatever else runs.
const Finalizer = "natgw.kubeovn.io/finalizer"

// DataplaneAnnotation on a VpcNatGateway overrides the data plane its agent
// runs (nftables or iptables).
const DataplaneAnnotation = "natgw.kubeovn.io/dataplane"

// Requeue delays.
const (
	gatewayRetry  = 2 * time.Second        // gateway not connected
	conflictRetry = 10 * time.Second       // EIP in use: retried also on rule events
	staleRetry    = 100 * time.Millisecond // update conflict: the cache lags
)

// Deps are what every reconciler needs.
type Deps struct {
	// Client reads from the cache and writes to the API server.
	Client client.Client
	// Informers, when set (Setup: the manager's cache, whose client is
	// Client), is read by the watches' map functions through the
	// informers' field indexes directly (eachIndexed); nil: they list
	// through Client.
	Informers cache.Informers
	// APIReader reads the API server directly (orphan confirmation).
	APIReader client.Reader
	Registry  *gateway.Registry
	Recorder  events.EventRecorder
	// RemoveUpstreamFinalizer also removes kubeovn.io/kube-ovn-controller
	// when natgw completes an object's deletion. natgw replaces
	// kube-ovn-controller's handling of these objects (its VPC NAT gateway
	// feature must be off, or both would program the gateways), so nothing
	// else would ever remove upstream's finalizer from objects created
	// before the switch and they would stay terminating forever. Only
	// objects that carry natgw's finalizer are touched, and never an
	// IptablesEIP whose address Kube-OVN allocated: Kube-OVN v1.16.2
	// removes its finalizer from the four kinds itself with its feature
	// off, and for such an EIP it first releases the address in its IPAM
	// (see upstreamReleases).
	RemoveUpstreamFinalizer bool
	// RuleLabels also writes upstream's labels ovn.kubernetes.io/eip_v4_ip
	// and ovn.kubernetes.io/vpc-nat-gw-name on rules (and the latter on
	// EIPs) before programming, as kube-ovn-controller does (its own in-use
	// index). natgw does not need them: one more write per object.
	RuleLabels bool
	// Subnets, when set, is where gateways' networks come from (replace
	// mode, --network-source=kube-ovn): Kube-OVN's Subnets read through it
	// (the cache) give each EIP's prefix length, each gateway's external
	// gateway and its VPC subnet routes (package kubeovn). Nil: the
	// gateway config file's.
	Subnets client.Reader
	// Alloc, when set (with Subnets), reserves EIP addresses in Kube-OVN's
	// IPAM through Vips (package eipalloc): an EIP is programmed only once
	// its address is reserved, and released after its delete.
	Alloc *eipalloc.Allocator
	Log   logr.Logger

	track     *tracker
	trackOnce sync.Once
}

// tracked returns the Deps' tracker, creating it on first use.
func (d *Deps) tracked() *tracker {
	d.trackOnce.Do(func() {
		if d.track == nil {
			d.track = newTracker()
		}
	})
	return d.track
}

// reapVanished handles a name the cache no longer has: if this process
// programmed an object under that name, its UID is deleted on the gateway
// (the object is gone, so its UID will never be used again).
func (d *Deps) reapVanished(ctx context.Context, kind nat.Kind, name string, uids func(trackVal) ([]string, error)) (ctrl.Result, error) {
	v, ok := d.tracked().get(kind, name)
	if !ok {
		return ctrl.Result{}, nil
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("uid", v.uid)
	list, err := uids(v)
	if err == nil {
		for _, u := range list {
			if err = d.unprogram(ctx, log, kind, u, []string{v.gateway}, ""); err != nil {
				break
			}
		}
	}
	if err != nil {
		log.Error(err, "deleting a vanished object's rule failed; retrying")
		return ctrl.Result{RequeueAfter: gatewayRetry}, nil
	}
	d.tracked().forget(kind, name, v.uid)
	metrics.VanishedReaped.WithLabelValues(string(kind)).Inc()
	log.Info("object vanished without natgw's deletion (deleted while its finalizer was being added); deleted its rule on the gateway", "gateway", v.gateway)
	return ctrl.Result{}, nil
}

// reapReplaced deletes the rule of an earlier object with the same name
// (deleted and recreated while this process did not look).
func (d *Deps) reapReplaced(ctx context.Context, log logr.Logger, kind nat.Kind, name, uid string) error {
	v, ok := d.tracked().get(kind, name)
	if !ok || v.uid == uid {
		return nil
	}
	if err := d.unprogram(ctx, log, kind, v.uid, []string{v.gateway}, ""); err != nil {
		return err
	}
	d.tracked().forget(kind, name, v.uid)
	return nil
}

// failure is a reconcile outcome that is not Ready.
type failure struct {
	reason       string
	msg          string
	requeueAfter time.Duration
	err          error // returned to controller-runtime (backoff) when set
	// quiet: the outcome says nothing about the object (its gateway's
	// first connect since the controller started has not ended, or its
	// session broke while the path to the agents was down and no
	// reconnect has ended since, or its status write was refused as made from a stale read), so its status
	// stays as it is, no Event is emitted, and it runs again after
	// requeueAfter.
	quiet bool
}

func (f *failure) Error() string { return f.reason + ": " + f.msg }

func fail(reason, format string, args ...any) *failure {
	return &failure{reason: reason, msg: fmt.Sprintf(format, args...)}
}

// classify turns a gateway call error into a failure.
func classify(gw string, err error) *failure {
	var pe *agentapi.Error
	switch {
	case errors.Is(err, gateway.ErrConnecting):
		f := fail(v1.ReasonGatewayNotReady, "%v", err)
		f.requeueAfter, f.quiet = gatewayRetry, true
		return f
	case errors.Is(err, gateway.ErrUnknownGateway):
		return fail(v1.ReasonGatewayNotFound, "gateway %s is not configured in natgw-controller's gateway config", gw)
	case errors.Is(err, gateway.ErrNotReady):
		f := fail(v1.ReasonGatewayNotReady, "%v", err)
		f.requeueAfter = gatewayRetry
		return f
	case errors.As(err, &pe) && pe.Code == agentapi.CodeConflict:
		f := fail(v1.ReasonEIPInUse, "gateway %s refused: %s", gw, pe.Message)
		f.requeueAfter = conflictRetry
		return f
	case errors.As(err, &pe) && (pe.Code == agentapi.CodeInvalid || pe.Code == agentapi.CodeBadRequest):
		return fail(v1.ReasonInvalid, "gateway %s refused: %s", gw, pe.Message)
	}
	f := fail(v1.ReasonProgramFailed, "gateway %s: %v", gw, err)
	f.err = err
	return f
}

// quietResult is the outcome of a quiet failure (see failure.quiet), ok
// when f is one.
func quietResult(log logr.Logger, f *failure) (ctrl.Result, bool) {
	if !f.quiet {
		return ctrl.Result{}, false
	}
	log.V(1).Info("outcome says nothing about the object yet; status left as it is", "message", f.msg, "retry", f.requeueAfter)
	return ctrl.Result{RequeueAfter: f.requeueAfter}, true
}

// result is what Reconcile returns for a failure.
func (f *failure) result() (ctrl.Result, error) {
	if f.err != nil {
		return ctrl.Result{}, f.err
	}
	return ctrl.Result{RequeueAfter: f.requeueAfter}, nil
}

func readyCondition(gw string) v1.Condition {
	return v1.Condition{Status: metav1.ConditionTrue, Reason: v1.ReasonProgrammed, Message: "programmed on gateway " + gw}
}

func (f *failure) condition() v1.Condition {
	return v1.Condition{Status: metav1.ConditionFalse, Reason: f.reason, Message: f.msg}
}

// event records a Warning Event for a failure.
func (d *Deps) event(obj client.Object, f *failure) {
	if d.Recorder != nil {
		d.Recorder.Eventf(obj, nil, corev1.EventTypeWarning, f.reason, "Program", "%s", f.msg)
	}
}

// patchStatusFresh writes obj's status if it differs from before's, as a
// merge patch carrying before's resourceVersion (every status writer of
// the package: rules, EIPs, QoSPolicies, VpcNatGateways): a status computed from a
// cached object older than the stored one (the cache had not yet seen this
// controller's own last status write) is refused with a conflict instead of
// replacing the stored conditions with fresh timestamps (a second status
// write per rule: TestWritesPerRule); the reconcile then runs again after
// staleRetry, with no error (the watch event of the stored object is
// status-only and filtered out: nothing else would enqueue it).
func (d *Deps) patchStatusFresh(ctx context.Context, obj, before client.Object) (ctrl.Result, error) {
	if equality.Semantic.DeepEqual(before, obj) {
		return ctrl.Result{}, nil
	}
	err := d.Client.Status().Patch(ctx, obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	switch {
	case err == nil, apierrors.IsNotFound(err):
		return ctrl.Result{}, nil
	case apierrors.IsConflict(err):
		return ctrl.Result{RequeueAfter: staleRetry}, nil
	}
	return ctrl.Result{}, fmt.Errorf("patch status: %w", err)
}

// patchMeta writes obj's metadata changes since before (finalizers,
// labels, annotations) as one JSON merge patch carrying before's
// resourceVersion: the API server refuses it with a conflict when the
// object changed meanwhile (a finalizer list is replaced whole), and
// nothing else of the object is sent, so fields natgw's types do not know
// stay as they are.
func (d *Deps) patchMeta(ctx context.Context, obj, before client.Object) error {
	return d.Client.Patch(ctx, obj, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
}

// ensureMeta makes sure obj carries the finalizer and the labels (none
// unless RuleLabels), in one metadata patch (patchMeta); no write when they
// are there already (the admission policy adds the finalizer at creation). ok false means: stop, program nothing (the object is gone or
// terminating, or the update conflicted and the result says to requeue).
func (d *Deps) ensureMeta(ctx context.Context, log logr.Logger, obj client.Object, labels map[string]string) (ok bool, res ctrl.Result, err error) {
	before := obj.DeepCopyObject().(client.Object)
	changed := controllerutil.AddFinalizer(obj, Finalizer)
	added := changed
	cur := obj.GetLabels()
	for k, v := range labels {
		if cur[k] != v {
			if cur == nil {
				cur = map[string]string{}
			}
			cur[k] = v
			changed = true
		}
	}
	if !changed {
		return true, ctrl.Result{}, nil
	}
	obj.SetLabels(cur)
	err = d.patchMeta(ctx, obj, before)
	switch {
	case err == nil:
		if added {
			log.V(1).Info("finalizer added")
		}
		return true, ctrl.Result{}, nil
	case apierrors.IsNotFound(err):
		log.V(1).Info("object gone before its finalizer was added; nothing programmed")
		return false, ctrl.Result{}, nil
	case apierrors.IsConflict(err):
		log.V(1).Info("finalizer/labels update conflicted; nothing programmed, retrying")
		return false, ctrl.Result{RequeueAfter: staleRetry}, nil
	case apierrors.IsForbidden(err) || apierrors.IsInvalid(err):
		// A terminating object takes no new finalizer; its deletion
		// is reconciled when the event arrives. (Also: a label value
		// the API refuses, e.g. a gateway name over 63 characters.)
		log.Info("finalizer/labels refused; nothing programmed", "error", err.Error())
		return false, ctrl.Result{}, nil
	}
	return false, ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
}

// programmedOn lists the gateways an object may be programmed on: those
// named (a rule's status.natGwDp, written with Ready; an EIP's
// spec.natGwDp), the one its vpc-nat-gw-name label names (written before
// programming with RuleLabels, and always by earlier natgw-controllers), and every gateway
// whose agent holds its UID as far as this process knows
// (gateway.Registry.Holders): that covers a controller that died between
// programming and its status write, which left neither label nor status.
func (d *Deps) programmedOn(obj client.Object, named ...string) []string {
	var gws []string
	add := func(g string) {
		if g != "" && !slices.Contains(gws, g) {
			gws = append(gws, g)
		}
	}
	for _, g := range named {
		add(g)
	}
	add(obj.GetLabels()[v1.LabelVpcNatGwName])
	for _, g := range d.Registry.Holders(string(obj.GetUID())) {
		add(g)
	}
	return gws
}

// unprogram deletes uid from every gateway in gws except keep. Unknown
// gateways are skipped (nothing can have been programmed through them).
func (d *Deps) unprogram(ctx context.Context, log logr.Logger, kind nat.Kind, uid string, gws []string, keep string) error {
	for _, name := range gws {
		if name == keep {
			continue
		}
		gw, err := d.Registry.Get(name)
		if errors.Is(err, gateway.ErrUnknownGateway) {
			log.Info("gateway not configured; nothing to delete there", "gateway", name)
			continue
		}
		if err != nil {
			return err
		}
		if err := gw.Delete(ctx, kind, uid); err != nil {
			return fmt.Errorf("delete %s %s on gateway %s: %w", kind, uid, name, err)
		}
		log.V(1).Info("deleted on gateway", "gateway", name)
	}
	return nil
}

// finishDelete handles a terminating object: delete by UID on its
// gateways, then remove the finalizer(s).
func (d *Deps) finishDelete(ctx context.Context, log logr.Logger, obj client.Object, kind nat.Kind, uids []string, gws []string) (ctrl.Result, error) {
	return d.finishDeleteThen(ctx, log, obj, kind, uids, gws, nil)
}

// releaseRetry is the requeue delay while a release is under way (the
// watch of what is released also brings the object back).
const releaseRetry = time.Second

// finishDeleteThen is finishDelete with release (when not nil) called
// after the gateways confirmed the delete and before the finalizer goes:
// the finalizer stays until release reports done (an EIP's address goes
// back to Kube-OVN's IPAM only once no gateway holds it).
func (d *Deps) finishDeleteThen(ctx context.Context, log logr.Logger, obj client.Object, kind nat.Kind, uids []string, gws []string, release func(context.Context) (bool, error)) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(obj, Finalizer) {
		log.V(1).Info("terminating without natgw's finalizer; nothing to do", "finalizers", obj.GetFinalizers())
		return ctrl.Result{}, nil
	}
	log.V(1).Info("deleting on gateways", "gateways", gws)
	for _, uid := range uids {
		if err := d.unprogram(ctx, log, kind, uid, gws, ""); err != nil {
			f := classify(firstOr(gws), err)
			if !f.quiet {
				d.event(obj, &failure{reason: "DeleteFailed", msg: f.msg})
			}
			log.Error(err, "delete on gateway failed; keeping the finalizer")
			if f.requeueAfter > 0 && f.err == nil {
				return ctrl.Result{RequeueAfter: f.requeueAfter}, nil
			}
			return ctrl.Result{}, err
		}
	}
	if release != nil {
		done, err := release(ctx)
		if err != nil {
			d.event(obj, &failure{reason: "ReleaseFailed", msg: err.Error()})
			log.Error(err, "release failed; keeping the finalizer")
			return ctrl.Result{}, err
		}
		if !done {
			log.V(1).Info("deleted on gateways; waiting for the release")
			return ctrl.Result{RequeueAfter: releaseRetry}, nil
		}
	}
	// Deleted on every gateway: nothing is left for reapVanished. Forgotten
	// before the finalizer goes, so that the object's delete event finds
	// nothing tracked (untrackedGone drops it); a failed removal retries
	// the whole deletion, which needs no tracker (the object is there).
	for _, uid := range uids {
		d.tracked().forget(kind, obj.GetName(), uid)
	}
	if ok, res, err := d.removeFinalizers(ctx, obj); !ok {
		return res, err
	}
	log.V(1).Info("deleted on gateway; finalizer removed", "gateways", gws)
	d.deleteLeftovers(ctx, log, kind, uids)
	return ctrl.Result{}, nil
}

// removeFinalizers removes natgw's finalizer (and upstream's with
// RemoveUpstreamFinalizer) from obj by metadata patch. ok is false when
// they were not removed: the object is gone already (a zero result), the
// patch conflicted (retry soon) or failed (err).
func (d *Deps) removeFinalizers(ctx context.Context, obj client.Object) (ok bool, res ctrl.Result, err error) {
	before := obj.DeepCopyObject().(client.Object)
	controllerutil.RemoveFinalizer(obj, Finalizer)
	if d.RemoveUpstreamFinalizer && !upstreamReleases(obj) {
		controllerutil.RemoveFinalizer(obj, v1.Finalizer)
	}
	if err := d.patchMeta(ctx, obj, before); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return false, ctrl.Result{}, nil
		case apierrors.IsConflict(err):
			return false, ctrl.Result{RequeueAfter: staleRetry}, nil
		}
		return false, ctrl.Result{}, fmt.Errorf("remove finalizer: %w", err)
	}
	return true, ctrl.Result{}, nil
}

// upstreamReleases says whether Kube-OVN's finalizer on obj guards a
// release only Kube-OVN can make: an IptablesEIP whose address Kube-OVN's
// own handler allocated (eipalloc.KubeOVNAllocated) is held in its IPAM
// under the EIP's name, and Kube-OVN releases it on the EIP's deletion
// path, which runs with its feature off, before it removes its finalizer
// (vpc_nat_gw_eip.go:205-248). Removing the finalizer first would delete
// the EIP before that path runs, and the address would stay reserved
// until kube-ovn-controller restarts.
func upstreamReleases(obj client.Object) bool {
	e, ok := obj.(*v1.IptablesEIP)
	if !ok {
		return false
	}
	addr, err := eipalloc.KubeOVNAllocated(e)
	return err == nil && addr.IsValid()
}

// deleteLeftovers deletes uids, whose object is now gone, from every
// gateway that holds one of them after all: a gateway whose connect
// (sync, sweep) ran between the look-up of programmedOn and the finalizer's
// removal, and kept the UID because its object still existed then. The
// object is gone, so a failure here is the orphan sweep's to finish.
func (d *Deps) deleteLeftovers(ctx context.Context, log logr.Logger, kind nat.Kind, uids []string) {
	for _, uid := range uids {
		gws := d.Registry.Holders(uid)
		if len(gws) == 0 {
			continue
		}
		if err := d.unprogram(ctx, log, kind, uid, gws, ""); err != nil {
			log.Error(err, "deleting the rule of a deleted object left on a gateway failed; the orphan sweep removes it", "uid", uid, "gateways", gws)
			continue
		}
		log.Info("deleted the rule of a deleted object left on a gateway by a concurrent sync", "uid", uid, "gateways", gws)
	}
}

func firstOr(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}
