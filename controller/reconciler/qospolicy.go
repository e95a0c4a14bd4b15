package reconciler

// The QoSPolicy reconciler: natgw-controller's counterpart, in replace
// mode, of kube-ovn-controller's QoSPolicy handlers (Kube-OVN v1.16.2
// pkg/controller/qos_policy.go). The limits themselves are programmed by
// the EIP reconciler (iptableseip.go build → translate.go qosObject), which reads
// the policy named by each IptablesEIP's spec.qosPolicy, and, for
// gateway-wide QoS (bindingType NATGW), by the VpcNatGateway reconciler
// (vpcnatgateway.go, vpcnatgateway_qos.go), which reads the status of the policy named by its
// spec.qosPolicy as upstream does; this reconciler owns the policy object:
//
//   - natgw's finalizer;
//   - status.shared, status.bindingType and status.bandwidthLimitRules
//     (sorted by name), written as upstream writes them: only when the
//     policy passes upstream's validation;
//   - conditions: Ready (Accepted, Invalid: what upstream refuses, or
//     Unsupported: what natgw's data plane does not program, the field and
//     value named) and InUse (whether an IptablesEIP or a VpcNatGateway
//     names it in spec.qosPolicy; while the policy is being deleted, which
//     ones), with a Warning Event when Ready turns
//     Invalid/Unsupported or a deletion is held;
//   - deletion held while any IptablesEIP or VpcNatGateway references the
//     policy, released when none does (their watches bring it back).

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/nat"
)

// qosPolicyIndex indexes IptablesEIPs and VpcNatGateways by spec.qosPolicy.
const qosPolicyIndex = "spec.qosPolicy"

// maxNamed is how many users a condition message names before "and N more".
const maxNamed = 10

// setupQoSPolicy registers the QoSPolicy controller (its indexes are in
// RegisterIndexes).
func setupQoSPolicy(ctx context.Context, mgr ctrl.Manager, deps *Deps, opts controller.Options) error {
	// A user's update maps its old and its new object: the policy it
	// dropped is reconciled as well as the one it names now.
	toPolicy := toNamed(specQoSPolicy)
	err := ctrl.NewControllerManagedBy(mgr).Named("qos-policy").WithOptions(opts).
		For(&v1.QoSPolicy{}, builder.WithPredicates(specOrMetaChanged)).
		Watches(&v1.IptablesEIP{}, toPolicy, builder.WithPredicates(qosUserChanged)).
		Watches(&v1.VpcNatGateway{}, toPolicy, builder.WithPredicates(qosUserChanged)).
		Complete(&qosPolicyReconciler{Deps: deps})
	if err != nil {
		return fmt.Errorf("qos-policy controller: %w", err)
	}
	return nil
}

// specQoSPolicy is an IptablesEIP's or a VpcNatGateway's spec.qosPolicy.
func specQoSPolicy(o client.Object) string {
	switch x := o.(type) {
	case *v1.IptablesEIP:
		return x.Spec.QoSPolicy
	case *v1.VpcNatGateway:
		return x.Spec.QoSPolicy
	}
	return ""
}

// qosUserChanged passes the updates of an EIP or a gateway that change
// whether it uses a policy: spec.qosPolicy, deletion, finalizers (a
// terminating object stops counting once natgw released it).
var qosUserChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld, e.ObjectNew
		return specQoSPolicy(o) != specQoSPolicy(n) ||
			!equality.Semantic.DeepEqual(o.GetDeletionTimestamp(), n.GetDeletionTimestamp()) ||
			!slices.Equal(o.GetFinalizers(), n.GetFinalizers())
	},
}

type qosPolicyReconciler struct {
	*Deps
}

// qosUsers are the objects whose spec.qosPolicy names a policy.
type qosUsers struct {
	eips, gateways []string // names, sorted
}

func (u qosUsers) empty() bool { return len(u.eips) == 0 && len(u.gateways) == 0 }

// String names the users ("IptablesEIP a, b; VpcNatGateway g"), at most
// maxNamed of each kind.
func (u qosUsers) String() string {
	var parts []string
	if len(u.eips) > 0 {
		parts = append(parts, "IptablesEIP "+joinNames(u.eips, maxNamed))
	}
	if len(u.gateways) > 0 {
		parts = append(parts, "VpcNatGateway "+joinNames(u.gateways, maxNamed))
	}
	return strings.Join(parts, "; ")
}

// users lists the IptablesEIPs and VpcNatGateways whose spec.qosPolicy is
// name. A terminating object counts until natgw released it (its
// finalizer gone): until then natgw may still program it.
func (r *qosPolicyReconciler) users(ctx context.Context, name string) (qosUsers, error) {
	var u qosUsers
	counts := func(o client.Object) bool {
		return o.GetDeletionTimestamp().IsZero() || controllerutil.ContainsFinalizer(o, Finalizer)
	}
	eips := &v1.IptablesEIPList{}
	if err := r.Client.List(ctx, eips, client.MatchingFields{qosPolicyIndex: name}); err != nil {
		return u, fmt.Errorf("list IptablesEIPs of QoSPolicy %s: %w", name, err)
	}
	for i := range eips.Items {
		if e := &eips.Items[i]; e.Spec.QoSPolicy == name && counts(e) {
			u.eips = append(u.eips, e.Name)
		}
	}
	gws := &v1.VpcNatGatewayList{}
	if err := r.Client.List(ctx, gws, client.MatchingFields{qosPolicyIndex: name}); err != nil {
		return u, fmt.Errorf("list VpcNatGateways of QoSPolicy %s: %w", name, err)
	}
	for i := range gws.Items {
		if g := &gws.Items[i]; g.Spec.QoSPolicy == name && counts(g) {
			u.gateways = append(u.gateways, g.Name)
		}
	}
	sort.Strings(u.eips)
	sort.Strings(u.gateways)
	return u, nil
}

func (r *qosPolicyReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	p := &v1.QoSPolicy{}
	if err := r.Client.Get(ctx, req.NamespacedName, p); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("uid", string(p.UID))
	ctx = logr.NewContext(ctx, log)
	users, err := r.users(ctx, p.Name)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !p.DeletionTimestamp.IsZero() {
		return r.finishPolicyDelete(ctx, log, p, users)
	}
	ok, res, err := r.ensureMeta(ctx, log, p, nil)
	if !ok {
		return res, err
	}

	before := p.DeepCopy()
	now := metav1.Now()
	ready := v1.Condition{Type: v1.ConditionReady, ObservedGeneration: p.Generation}
	if invalid := validateQoSPolicy(p); len(invalid) > 0 {
		// Upstream refuses the policy and leaves its status as it was.
		ready.Status, ready.Reason = metav1.ConditionFalse, v1.ReasonInvalid
		ready.Message = strings.Join(invalid, "; ")
	} else {
		p.Status.Shared = p.Spec.Shared
		p.Status.BindingType = p.Spec.BindingType
		p.Status.BandwidthLimitRules = sortedRules(p.Spec.BandwidthLimitRules)
		if unsupported := unsupportedQoS(p, users); len(unsupported) > 0 {
			ready.Status, ready.Reason = metav1.ConditionFalse, v1.ReasonUnsupported
			ready.Message = "not programmed by natgw: " + strings.Join(unsupported, "; ")
		} else {
			ready.Status, ready.Reason = metav1.ConditionTrue, v1.ReasonAccepted
			ready.Message = "accepted; the limits apply to the IptablesEIPs that name the policy"
			if p.Spec.BindingType == v1.QoSBindingTypeNatGw {
				ready.Message = "accepted; the limits apply to the VpcNatGateways that name the policy (gateway-wide QoS)"
			}
		}
	}
	readyChanged := v1.SetCondition(&p.Status.Conditions, ready, now)
	v1.SetCondition(&p.Status.Conditions, inUseCondition(p, users, false), now)
	if res, err := r.patchStatusFresh(ctx, p, before); err != nil || !res.IsZero() {
		// A stale read (res: retry) says nothing about the stored policy:
		// no Event until a fresh read decides.
		return res, err
	}
	if readyChanged && ready.Status == metav1.ConditionFalse {
		log.Info("QoSPolicy not accepted as a whole", "reason", ready.Reason, "message", ready.Message)
		r.event(p, &failure{reason: ready.Reason, msg: ready.Message})
	}
	return ctrl.Result{}, nil
}

// inUseCondition is the InUse condition for users (DeletionBlocked when
// deleting and used).
func inUseCondition(p *v1.QoSPolicy, users qosUsers, deleting bool) v1.Condition {
	c := v1.Condition{Type: v1.ConditionInUse, ObservedGeneration: p.Generation}
	switch {
	case users.empty():
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1.ReasonNotInUse, "no IptablesEIP or VpcNatGateway names the policy in spec.qosPolicy"
	case deleting:
		c.Status, c.Reason = metav1.ConditionTrue, v1.ReasonDeletionBlocked
		c.Message = "deletion waits until no object names the policy in spec.qosPolicy: " + users.String()
	default:
		// No names here: the EIP controller reconciles every EIP of a
		// policy on any change of the policy, status included, so a
		// message naming the users would cost each EIP of a shared policy
		// one apply per user that comes or goes.
		c.Status, c.Reason = metav1.ConditionTrue, v1.ReasonInUse
		c.Message = "named in spec.qosPolicy by at least one IptablesEIP or VpcNatGateway"
	}
	return c
}

// finishPolicyDelete keeps natgw's finalizer while users reference the
// policy (InUse DeletionBlocked and a Warning Event naming them), and
// removes it (and upstream's, with RemoveUpstreamFinalizer) once none does.
func (r *qosPolicyReconciler) finishPolicyDelete(ctx context.Context, log logr.Logger, p *v1.QoSPolicy, users qosUsers) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(p, Finalizer) {
		log.V(1).Info("terminating without natgw's finalizer; nothing to do", "finalizers", p.Finalizers)
		return ctrl.Result{}, nil
	}
	if !users.empty() {
		before := p.DeepCopy()
		c := inUseCondition(p, users, true)
		changed := v1.SetCondition(&p.Status.Conditions, c, metav1.Now())
		if res, err := r.patchStatusFresh(ctx, p, before); err != nil || !res.IsZero() {
			return res, err
		}
		if changed {
			log.Info("QoSPolicy deletion held: still referenced", "users", users.String())
			r.event(p, &failure{reason: v1.ReasonDeletionBlocked, msg: c.Message})
		}
		// The watches of EIPs and gateways bring the policy back when a
		// reference goes.
		return ctrl.Result{}, nil
	}
	if ok, res, err := r.removeFinalizers(ctx, p); !ok {
		return res, err
	}
	log.V(1).Info("no object references the QoSPolicy; finalizer removed")
	return ctrl.Result{}, nil
}

// sortedRules is a copy of rules sorted by name, as upstream records them
// in status.
func sortedRules(rules v1.QoSPolicyBandwidthLimitRules) v1.QoSPolicyBandwidthLimitRules {
	if rules == nil {
		return nil
	}
	out := slices.Clone(rules)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Upstream's checks of rule values (they reach its gateway script).
var (
	qosNumber    = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)
	qosInterface = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,15}$`)
)

func ruleField(i int, r v1.QoSPolicyBandwidthLimitRule, field string) string {
	return fmt.Sprintf("spec.bandwidthLimitRules[%d] (%s).%s", i, r.Name, field)
}

// validateQoSPolicy returns what upstream's controller refuses a policy
// for (it then writes no status): rateMax/burstMax not a plain number, an
// interface name that is not one, a direction other than ingress/egress, a
// matchType ip whose matchValue is not "src CIDR" or "dst CIDR", and
// bindingType NATGW without shared. Each names the field and value.
func validateQoSPolicy(p *v1.QoSPolicy) []string {
	var out []string
	for i, r := range p.Spec.BandwidthLimitRules {
		for _, f := range []struct{ name, v string }{{"rateMax", r.RateMax}, {"burstMax", r.BurstMax}} {
			if f.v != "" && !qosNumber.MatchString(f.v) {
				out = append(out, fmt.Sprintf("%s %q: not a positive number", ruleField(i, r, f.name), f.v))
			}
		}
		if r.Interface != "" && !qosInterface.MatchString(r.Interface) {
			out = append(out, fmt.Sprintf("%s %q: not an interface name (1-15 letters, digits, _ or -)", ruleField(i, r, "interface"), r.Interface))
		}
		if r.Direction != "" && r.Direction != v1.QoSDirectionIngress && r.Direction != v1.QoSDirectionEgress {
			out = append(out, fmt.Sprintf("%s %q: not ingress or egress", ruleField(i, r, "direction"), r.Direction))
		}
		if r.MatchType == v1.QoSMatchTypeIP {
			if _, _, err := nat.ParseQoSMatch("matchValue", r.MatchValue); err != nil {
				out = append(out, fmt.Sprintf("%s %q: matchType ip needs \"src CIDR\" or \"dst CIDR\"", ruleField(i, r, "matchValue"), r.MatchValue))
			}
		}
	}
	if !p.Spec.Shared && p.Spec.BindingType == v1.QoSBindingTypeNatGw {
		out = append(out, "spec.shared false with spec.bindingType NATGW: a gateway's policy must be shared")
	}
	return out
}

// unsupportedQoS returns what of a valid policy natgw's data plane does
// not program, each naming the field and value: for bindingType NATGW,
// rules the gateway path (vpcnatgateway_qos.go natgwRules) refuses; for EIPs, rules the
// EIP path (translate.go qosObject) refuses or cannot represent; and a
// VpcNatGateway naming a policy of another binding type (upstream refuses
// it too).
func unsupportedQoS(p *v1.QoSPolicy, users qosUsers) []string {
	var out []string
	if p.Spec.BindingType == v1.QoSBindingTypeNatGw {
		if _, err := natgwRules(p.Name, "spec", p.Spec.Shared, p.Spec.BindingType, p.Spec.BandwidthLimitRules); err != nil {
			out = append(out, err.Error()+"; a VpcNatGateway naming the policy gets no gateway-wide QoS (Ready Invalid)")
		}
	} else {
		seen := map[v1.QoSPolicyRuleDirection]int{}
		for i, r := range p.Spec.BandwidthLimitRules {
			switch {
			case r.MatchValue != "":
				out = append(out, fmt.Sprintf("%s %q (matchType %q): not used: a per-EIP limit holds all of the EIP's traffic in its direction, as Kube-OVN's EIP path programs it",
					ruleField(i, r, "matchValue"), r.MatchValue, r.MatchType))
			case r.Direction == "":
				out = append(out, fmt.Sprintf("%s \"\": an EIP limit needs ingress or egress; an IptablesEIP naming the policy is refused (Ready Invalid)", ruleField(i, r, "direction")))
			default:
				if j, dup := seen[r.Direction]; dup {
					o := p.Spec.BandwidthLimitRules[j]
					out = append(out, fmt.Sprintf("%s %q: also the direction of spec.bandwidthLimitRules[%d] (%s); natgw programs one limit per direction, the last rule's",
						ruleField(i, r, "direction"), r.Direction, j, o.Name))
				}
				seen[r.Direction] = i
			}
		}
		if len(out) == 0 {
			// Whatever else the EIP path refuses (e.g. a rate over its
			// range), in its own words.
			if _, err := qosObject(p); err != nil {
				out = append(out, err.Error()+"; an IptablesEIP naming the policy is refused (Ready Invalid)")
			}
		}
	}
	if len(users.gateways) > 0 && p.Spec.BindingType != v1.QoSBindingTypeNatGw {
		out = append(out, fmt.Sprintf("spec.bindingType %q named in spec.qosPolicy of VpcNatGateway %s: a gateway's policy must have bindingType NATGW (as upstream); not programmed there",
			p.Spec.BindingType, joinNames(users.gateways, maxNamed)))
	}
	return out
}

// joinNames joins names, at most limit of them, then "and N more".
func joinNames(names []string, limit int) string {
	if len(names) <= limit {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:limit], ", ") + fmt.Sprintf(" and %d more", len(names)-limit)
}
