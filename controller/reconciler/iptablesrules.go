package reconciler

import (
	"context"
	"errors"
	"net/netip"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/nat"
)

// eipRef is a rule's EIP resolved from the cache.
type eipRef struct {
	eip     *v1.IptablesEIP
	addrs   nat.EIP    // its addresses (EIPAddrs)
	addr    netip.Addr // its primary address (EIPAddress)
	gateway string
}

// resolveEIP finds the EIP named name. requireReady also demands that the
// EIP is programmed (its Ready status): a rule is Ready only when its
// traffic can flow.
func (d *Deps) resolveEIP(ctx context.Context, name string, requireReady bool) (eipRef, *failure) {
	e := &v1.IptablesEIP{}
	if err := d.Client.Get(ctx, types.NamespacedName{Name: name}, e); err != nil {
		if apierrors.IsNotFound(err) {
			return eipRef{}, fail(v1.ReasonEIPNotFound, "IptablesEIP %s not found", name)
		}
		f := fail(v1.ReasonEIPNotFound, "get IptablesEIP %s: %v", name, err)
		f.err = err
		return eipRef{}, f
	}
	if !e.DeletionTimestamp.IsZero() {
		return eipRef{}, fail(v1.ReasonEIPNotFound, "IptablesEIP %s is being deleted", name)
	}
	addrs, err := d.eipAddrs(ctx, e)
	if err != nil {
		return eipRef{}, fail(v1.ReasonEIPNotReady, "IptablesEIP %s: %v", name, err)
	}
	addr := primary(addrs)
	if !addr.IsValid() {
		return eipRef{}, fail(v1.ReasonEIPNotReady, "IptablesEIP %s has no address yet (spec.v4ip, spec.v6ip)", name)
	}
	if requireReady && !e.Status.Ready {
		// The EIP is down with its gateway: say so (and retry as for
		// any unreachable gateway) rather than blame the EIP.
		if c := v1.FindCondition(e.Status.Conditions, v1.ConditionReady); c != nil && c.Reason == v1.ReasonGatewayNotReady {
			f := fail(v1.ReasonGatewayNotReady, "IptablesEIP %s: %s", name, c.Message)
			f.requeueAfter = gatewayRetry
			return eipRef{}, f
		}
		return eipRef{}, fail(v1.ReasonEIPNotReady, "IptablesEIP %s is not ready on gateway %s", name, e.Spec.NatGwDp)
	}
	return eipRef{eip: e, addrs: addrs, addr: addr, gateway: e.Spec.NatGwDp}, nil
}

// eipAddrs is EIPAddrs of e, with the IPv6 address Kube-OVN's IPAM
// reserved for it on a dual-stack external subnet when it has no
// spec.v6ip (Deps.Alloc set: eipalloc.Allocator.ReservedV6).
func (d *Deps) eipAddrs(ctx context.Context, e *v1.IptablesEIP) (nat.EIP, error) {
	addrs, err := EIPAddrs(e)
	if err != nil || d.Alloc == nil || addrs.V6Address.IsValid() || !addrs.Address.IsValid() {
		return addrs, err
	}
	v6, err := d.Alloc.ReservedV6(ctx, e)
	if err != nil {
		return nat.EIP{}, err
	}
	addrs.V6Address = v6
	return addrs, nil
}

// ruleReconciler reconciles one NAT rule kind.
type ruleReconciler[T client.Object] struct {
	*Deps
	k ruleKind[T]
}

// Reconcile runs the finalizer-first sequence of the package comment
// (common.go) for a rule.
func (r *ruleReconciler[T]) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	obj := r.k.newObj()
	if err := r.Client.Get(ctx, req.NamespacedName, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return r.reapVanished(ctx, r.k.kind, req.Name, func(v trackVal) ([]string, error) { return []string{v.uid}, nil })
		}
		return ctrl.Result{}, err
	}
	uid := string(obj.GetUID())
	log := logr.FromContextOrDiscard(ctx).WithValues("uid", uid)
	ctx = logr.NewContext(ctx, log)

	if !obj.GetDeletionTimestamp().IsZero() {
		return r.finishDelete(ctx, log, obj, r.k.kind, []string{uid}, r.programmedOn(obj, r.k.gateway(obj)))
	}

	if err := r.reapReplaced(ctx, log, r.k.kind, obj.GetName(), uid); err != nil {
		return r.finish(ctx, log, obj, classify(firstOr(r.programmedOn(obj, r.k.gateway(obj))), err))
	}
	ref, f := r.resolveEIP(ctx, r.k.eipName(obj), true)
	var labels map[string]string
	if f == nil && r.RuleLabels {
		labels = map[string]string{v1.LabelEIPV4IP: ref.addr.String(), v1.LabelVpcNatGwName: ref.gateway}
	}
	// A rule whose EIP moved to another gateway leaves the old one first.
	if f == nil {
		if err := r.unprogram(ctx, log, r.k.kind, uid, r.programmedOn(obj, r.k.gateway(obj)), ref.gateway); err != nil {
			return r.finish(ctx, log, obj, classify(ref.gateway, err))
		}
	}
	ok, res, err := r.ensureMeta(ctx, log, obj, labels)
	if !ok {
		return res, err
	}
	if f != nil {
		return r.finish(ctx, log, obj, f)
	}

	natObj, err := r.k.build(obj, ref.addrs)
	if err != nil {
		return r.finish(ctx, log, obj, fail(v1.ReasonInvalid, "%v", err))
	}
	gw, err := r.Registry.Get(ref.gateway)
	if err == nil {
		err = gw.Apply(ctx, natObj)
	}
	if err != nil {
		return r.finish(ctx, log, obj, classify(ref.gateway, err))
	}
	r.tracked().set(r.k.kind, obj.GetName(), uid, ref.gateway)
	log.V(1).Info("programmed", "gateway", ref.gateway, "object", natObj.String())
	before := obj.DeepCopyObject().(T)
	r.k.setStatus(obj, programmedStatus(ref.addrs, ref.gateway))
	return r.patchStatusFresh(ctx, obj, before)
}

// programmedStatus is the status of a rule programmed on gateway gw, on
// an EIP with the addresses addrs: status.v4ip and status.v6ip are the
// EIP's IPv4 and IPv6 addresses (as the CRD describes them; an IPv6 rule
// uses the latter), each empty when the EIP has none of that family. Both
// are written every time (a failure writes neither), so neither keeps an
// address the EIP no longer has after it changed family or lost one.
func programmedStatus(addrs nat.EIP, gw string) ruleStatus {
	st := ruleStatus{ready: true, gateway: gw, cond: readyCondition(gw)}
	if addrs.Address.IsValid() {
		st.v4ip = addrs.Address.String()
	}
	if addrs.V6Address.IsValid() {
		st.v6ip = addrs.V6Address.String()
	}
	return st
}

// finish records a failure: nothing stays programmed for the rule (except
// when the gateway could not be reached: the sync on reconnect uses the
// desired set, which leaves unresolvable rules out), the status says why and
// an Event is emitted.
func (r *ruleReconciler[T]) finish(ctx context.Context, log logr.Logger, obj T, f *failure) (ctrl.Result, error) {
	if res, ok := quietResult(log, f); ok {
		return res, nil
	}
	switch f.reason {
	case v1.ReasonEIPNotFound, v1.ReasonEIPNotReady, v1.ReasonInvalid, v1.ReasonEIPInUse:
		if err := r.unprogram(ctx, log, r.k.kind, string(obj.GetUID()), r.programmedOn(obj, r.k.gateway(obj)), ""); err != nil {
			log.Error(err, "removing the rule from its gateway failed")
			if f.err == nil {
				f.err = err
			}
		}
	}
	log.Info("not programmed", "reason", f.reason, "message", f.msg)
	r.event(obj, f)
	before := obj.DeepCopyObject().(T)
	r.k.setStatus(obj, ruleStatus{cond: f.condition()})
	res, err := r.patchStatusFresh(ctx, obj, before)
	if err != nil {
		return ctrl.Result{}, errors.Join(f.err, err)
	}
	if res.RequeueAfter > 0 {
		return res, nil // stale: the next run decides again
	}
	return f.result()
}

// desired returns the gateway objects of this kind that belong on the
// gateway of eips (its EIPs that are not being deleted): rules with the
// finalizer, not terminating, on one of those EIPs that has an address.
func (r *ruleReconciler[T]) desired(ctx context.Context, eips []*v1.IptablesEIP) ([]owned, error) {
	var out []owned
	for _, e := range eips {
		addr, err := r.eipAddrs(ctx, e)
		if err != nil || !primary(addr).IsValid() {
			continue
		}
		list := r.k.newList()
		// Read-only (translated into gateway objects): the cache's
		// objects, not deep copies, for every gateway's desired set.
		if err := r.Client.List(ctx, list, client.MatchingFields{EIPIndex: e.Name}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		for _, o := range r.k.items(list) {
			if !isLive(o) {
				continue
			}
			if n, err := r.k.build(o, addr); err == nil {
				out = append(out, owned{obj: n, created: o.GetCreationTimestamp().Time})
			}
		}
	}
	return out, nil
}
