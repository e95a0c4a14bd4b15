package reconciler

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/eipalloc"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/nat"
)

// eipReconciler programs IptablesEIPs: the address (with the external
// network's prefix length) on the gateway's external interface, and its QoS.
type eipReconciler struct {
	*Deps
}

func (r *eipReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	e := &v1.IptablesEIP{}
	if err := r.Client.Get(ctx, req.NamespacedName, e); err != nil {
		if apierrors.IsNotFound(err) {
			return r.reapVanished(ctx, nat.KindEIP, req.Name, func(v trackVal) ([]string, error) { return []string{v.uid}, nil })
		}
		return ctrl.Result{}, err
	}
	uid := string(e.UID)
	log := logr.FromContextOrDiscard(ctx).WithValues("uid", uid)
	ctx = logr.NewContext(ctx, log)
	if !e.DeletionTimestamp.IsZero() {
		var release func(context.Context) (bool, error)
		if r.Alloc != nil {
			release = func(ctx context.Context) (bool, error) { return r.Alloc.Release(ctx, e) }
		}
		return r.finishDeleteThen(ctx, log, e, nat.KindEIP, []string{uid}, r.programmedOn(e, e.Spec.NatGwDp), release)
	}

	gwName := e.Spec.NatGwDp
	if err := r.reapReplaced(ctx, log, nat.KindEIP, e.Name, uid); err != nil {
		return r.finish(ctx, log, e, classify(gwName, err))
	}
	if err := r.unprogram(ctx, log, nat.KindEIP, uid, r.programmedOn(e), gwName); err != nil {
		return r.finish(ctx, log, e, classify(gwName, err))
	}
	var labels map[string]string
	if r.RuleLabels {
		labels = map[string]string{v1.LabelVpcNatGwName: gwName}
	}
	ok, res, err := r.ensureMeta(ctx, log, e, labels)
	if !ok {
		return res, err
	}
	var reserved netip.Addr
	if r.Alloc != nil {
		var f *failure
		if reserved, f = r.reserve(ctx, e); f != nil {
			return r.finish(ctx, log, e, f)
		}
		// On a dual-stack external subnet Kube-OVN reserved an IPv6
		// address too (the Vip's status.v6ip): the EIP has both.
		withV6 := *e
		withV6.Status.IP = reserved.String()
		addrs, err := r.eipAddrs(ctx, &withV6)
		if err != nil {
			return r.finish(ctx, log, e, fail(v1.ReasonInvalid, "%v", err))
		}
		if e.Spec.V6ip == "" && addrs.V6Address.IsValid() {
			withV6.Status.IP = e.Status.IP
			withV6.Spec.V6ip = addrs.V6Address.String()
			e = &withV6
		}
	}
	obj, f := r.build(ctx, e, reserved)
	if f != nil {
		return r.finish(ctx, log, e, f)
	}
	// The gateway's manager sends the object only when its agent does not
	// hold it exactly (gateway.Manager.Apply): a rule taking or leaving
	// the EIP changes its status.nat, not the gateway, and costs no call.
	gw, err := r.Registry.Get(gwName)
	if err == nil {
		err = gw.Apply(ctx, obj)
	}
	if err != nil {
		return r.finish(ctx, log, e, classify(gwName, err))
	}
	r.tracked().set(nat.KindEIP, e.Name, uid, gwName)
	log.V(1).Info("programmed", "gateway", gwName, "object", obj.String())
	return r.setStatus(ctx, e, obj, nil)
}

// addressRetry is the requeue delay of an EIP whose address Kube-OVN has
// not reserved yet (the Vip watch also brings it back).
const addressRetry = 5 * time.Second

// reserve returns the EIP's address reserved in Kube-OVN's IPAM
// (Deps.Alloc), or the failure that says why there is none yet.
func (r *eipReconciler) reserve(ctx context.Context, e *v1.IptablesEIP) (netip.Addr, *failure) {
	addr, err := r.Alloc.Ensure(ctx, e)
	var f *failure
	switch {
	case errors.Is(err, eipalloc.ErrInvalid), errors.Is(err, eipalloc.ErrConflict):
		return netip.Addr{}, fail(v1.ReasonInvalid, "%v", err)
	case errors.Is(err, eipalloc.ErrSubnet):
		f = fail(v1.ReasonSubnetNotReady, "%v", err)
	case errors.Is(err, eipalloc.ErrNotOwned):
		// The Vip of an earlier EIP of this name, until it is released
		// (or garbage-collected with its owner).
		f = fail(v1.ReasonAddressPending, "%v", err)
	case err != nil:
		f = fail(v1.ReasonAddressPending, "%v", err)
		f.err = err
		return netip.Addr{}, f
	case !addr.IsValid():
		f = fail(v1.ReasonAddressPending, "waiting for Kube-OVN to reserve the address in subnet %q (Vip %s)", kubeovn.EIPExternalSubnet(e), eipalloc.VipName(e.Name))
	default:
		return addr, nil
	}
	f.requeueAfter = addressRetry
	return netip.Addr{}, f
}

// build resolves the EIP's gateway configuration and QoS policy. reserved,
// when valid, is its address reserved in Kube-OVN's IPAM (else spec.v4ip,
// then status.ip).
func (r *eipReconciler) build(ctx context.Context, e *v1.IptablesEIP, reserved netip.Addr) (nat.Object, *failure) {
	if reserved.IsValid() {
		withAddr := *e
		withAddr.Status.IP = reserved.String()
		e = &withAddr
	}
	cfg, ok := r.Registry.Lookup(e.Spec.NatGwDp)
	if !ok {
		return nat.Object{}, fail(v1.ReasonGatewayNotFound, "gateway %s is not configured in natgw-controller's gateway config", e.Spec.NatGwDp)
	}
	var policy *v1.QoSPolicy
	if e.Spec.QoSPolicy != "" {
		policy = &v1.QoSPolicy{}
		if err := r.Client.Get(ctx, types.NamespacedName{Name: e.Spec.QoSPolicy}, policy); err != nil {
			f := fail(v1.ReasonInvalid, "QoSPolicy %s: %v", e.Spec.QoSPolicy, err)
			if !apierrors.IsNotFound(err) {
				f.err = err
			}
			return nat.Object{}, f
		}
	}
	qos, err := qosObject(policy)
	if err != nil {
		return nat.Object{}, fail(v1.ReasonInvalid, "%v", err)
	}
	plen, plen6, f := r.eipPrefixLen(ctx, e, cfg)
	if f != nil {
		return nat.Object{}, f
	}
	obj, err := eipObject(e, plen, plen6, qos)
	if err != nil {
		return nat.Object{}, fail(v1.ReasonInvalid, "%v", err)
	}
	return obj, nil
}

func (r *eipReconciler) finish(ctx context.Context, log logr.Logger, e *v1.IptablesEIP, f *failure) (ctrl.Result, error) {
	if res, ok := quietResult(log, f); ok {
		return res, nil
	}
	switch f.reason {
	case v1.ReasonInvalid, v1.ReasonEIPInUse, v1.ReasonGatewayNotFound:
		if err := r.unprogram(ctx, log, nat.KindEIP, string(e.UID), r.programmedOn(e, e.Spec.NatGwDp), ""); err != nil {
			log.Error(err, "removing the EIP from its gateway failed")
			if f.err == nil {
				f.err = err
			}
		}
	}
	log.Info("not programmed", "reason", f.reason, "message", f.msg)
	r.event(e, f)
	res, err := r.setStatus(ctx, e, nat.Object{}, f)
	if err != nil {
		return res, errors.Join(f.err, err)
	}
	return f.result()
}

// setStatus writes ready, ip, nat (which rule kinds use the EIP), the QoS
// policy and the Ready condition.
func (r *eipReconciler) setStatus(ctx context.Context, e *v1.IptablesEIP, obj nat.Object, f *failure) (ctrl.Result, error) {
	before := e.DeepCopy()
	natKinds, err := r.natUsers(ctx, e.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	s := &e.Status
	s.Nat = natKinds
	if f == nil {
		s.Ready, s.IP, s.QoSPolicy = true, primary(*obj.EIP).String(), e.Spec.QoSPolicy
		setCondition(&s.Conditions, readyCondition(e.Spec.NatGwDp), e.Generation)
	} else {
		s.Ready = false
		setCondition(&s.Conditions, f.condition(), e.Generation)
	}
	return r.patchStatusFresh(ctx, e, before)
}

// natUsers is upstream's status.nat: which kinds of rules use the EIP, in
// upstream's order (dnat, fip, snat), joined by commas.
func (r *eipReconciler) natUsers(ctx context.Context, eip string) (string, error) {
	var kinds []string
	for _, l := range []struct {
		kind string
		list client.ObjectList
	}{
		{"dnat", &v1.IptablesDnatRuleList{}},
		{"fip", &v1.IptablesFIPRuleList{}},
		{"snat", &v1.IptablesSnatRuleList{}},
	} {
		if err := r.Client.List(ctx, l.list, client.MatchingFields{EIPIndex: eip}); err != nil {
			return "", err
		}
		if n, err := liveCount(l.list); err != nil {
			return "", err
		} else if n > 0 {
			kinds = append(kinds, l.kind)
		}
	}
	return strings.Join(kinds, ","), nil
}
