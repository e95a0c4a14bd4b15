package admission

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/eipalloc"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/controller/provision"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/nat"
)

// maxStatefulSetName is the longest gateway StatefulSet name: a label
// value (63) less the hash suffix the StatefulSet controller appends to
// controller-revision-hash (11) (util.NatGwStatefulSetNameMaxLength).
const maxStatefulSetName = 63 - 11

var (
	specPath       = field.NewPath("spec")
	tolerationOps  = []string{string(corev1.TolerationOpEqual), string(corev1.TolerationOpExists)}
	tolerationEffs = []string{string(corev1.TaintEffectNoSchedule), string(corev1.TaintEffectPreferNoSchedule), string(corev1.TaintEffectNoExecute)}
)

// get reads the object of name into obj; found is false when it does not
// exist.
func (v *Validator) get(ctx context.Context, name string, obj client.Object) (found bool, err error) {
	if err := v.Reader.Get(ctx, types.NamespacedName{Name: name}, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("get %T %s: %w", obj, name, err)
	}
	return true, nil
}

// subnet reads Kube-OVN's Subnet name.
func (v *Validator) subnet(ctx context.Context, name string) (kubeovn.Subnet, bool, error) {
	u := kubeovn.NewSubnet()
	found, err := v.get(ctx, name, u)
	if !found || err != nil {
		return kubeovn.Subnet{}, false, err
	}
	return kubeovn.SubnetFrom(u), true, nil
}

// gateway checks a VpcNatGateway.
func (v *Validator) gateway(ctx context.Context, g *v1.VpcNatGateway) (field.ErrorList, error) {
	var errs field.ErrorList
	if sts := provision.StatefulSetName(g.Name); len(sts) > maxStatefulSetName {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), g.Name,
			fmt.Sprintf("the gateway's StatefulSet name %q has %d characters, more than %d", sts, len(sts), maxStatefulSetName)))
	}
	// One rule with the provisioner's: 1 or 2, from spec.replicas or the
	// annotation for CRDs that prune it.
	if _, ferr := provision.Replicas(g); ferr != nil {
		errs = append(errs, ferr)
	}
	if g.Spec.Vpc == "" {
		errs = append(errs, field.Required(specPath.Child("vpc"), ""))
	} else if v.KubeOVN {
		vpc := &unstructured.Unstructured{}
		vpc.SetGroupVersionKind(kubeovn.VpcGVK)
		found, err := v.get(ctx, g.Spec.Vpc, vpc)
		if err != nil {
			return nil, err
		}
		if !found {
			errs = append(errs, field.NotFound(specPath.Child("vpc"), g.Spec.Vpc))
		}
	}
	lan := specPath.Child("lanIp")
	addr, perr := nat.ParseIP(lan.String(), g.Spec.LanIP)
	if perr != nil {
		fe, err := fieldError(perr)
		if err != nil {
			return nil, err
		}
		errs = append(errs, fe)
	}
	if g.Spec.Subnet == "" {
		errs = append(errs, field.Required(specPath.Child("subnet"), ""))
	} else if v.KubeOVN {
		s, found, err := v.subnet(ctx, g.Spec.Subnet)
		switch {
		case err != nil:
			return nil, err
		case !found:
			errs = append(errs, field.NotFound(specPath.Child("subnet"), g.Spec.Subnet))
		case perr == nil && !s.Contains(addr):
			errs = append(errs, field.Invalid(lan, g.Spec.LanIP, fmt.Sprintf("not in subnet %q (cidrBlock %s)", s.Name, s.CIDRBlock)))
		}
	}
	for i, t := range g.Spec.Tolerations {
		p := specPath.Child("tolerations").Index(i)
		if !slices.Contains(tolerationOps, string(t.Operator)) {
			errs = append(errs, field.NotSupported(p.Child("operator"), t.Operator, tolerationOps))
		}
		if !slices.Contains(tolerationEffs, string(t.Effect)) {
			errs = append(errs, field.NotSupported(p.Child("effect"), t.Effect, tolerationEffs))
		}
	}
	if g.Spec.QoSPolicy != "" {
		found, err := v.get(ctx, g.Spec.QoSPolicy, &v1.QoSPolicy{})
		if err != nil {
			return nil, err
		}
		if !found {
			errs = append(errs, field.NotFound(specPath.Child("qosPolicy"), g.Spec.QoSPolicy))
		}
	}
	return errs, nil
}

// eip checks an IptablesEIP.
func (v *Validator) eip(ctx context.Context, e *v1.IptablesEIP) (field.ErrorList, error) {
	var errs field.ErrorList
	if e.Spec.NatGwDp == "" {
		errs = append(errs, field.Required(specPath.Child("natGwDp"), ""))
	}
	if err := reconciler.CheckEIP(e); err != nil {
		fe, err := fieldError(err)
		if err != nil {
			return nil, err
		}
		return append(errs, fe), nil // no address to check further
	}
	static, _ := netip.ParseAddr(e.Spec.V4ip) // valid: CheckEIP passed
	ext := kubeovn.EIPExternalSubnet(e)
	if v.KubeOVN {
		s, found, err := v.subnet(ctx, ext)
		switch {
		case err != nil:
			return nil, err
		case !found:
			return append(errs, field.NotFound(specPath.Child("externalSubnet"), ext)), nil
		}
		if err := eipalloc.CheckSubnet(s.Name, s.CIDRBlock, s.Gateway, static); err != nil {
			errs = append(errs, field.Invalid(specPath.Child("v4ip"), e.Spec.V4ip, err.Error()))
		}
	}
	for _, a := range []struct{ field, value string }{{"v4ip", e.Spec.V4ip}, {"v6ip", e.Spec.V6ip}} {
		if a.value == "" {
			continue
		}
		other, err := v.eipWithAddress(ctx, e, ext, a.value)
		if err != nil {
			return nil, err
		}
		if other != "" {
			errs = append(errs, field.Invalid(specPath.Child(a.field), a.value,
				fmt.Sprintf("already used by IptablesEIP %q of external subnet %q", other, ext)))
		}
	}
	return errs, nil
}

// eipWithAddress returns the name of another EIP of external subnet ext
// with address s (spec.v4ip, spec.v6ip or status.ip; canonical text, as
// CheckEIP admitted it), or "".
func (v *Validator) eipWithAddress(ctx context.Context, e *v1.IptablesEIP, ext string, s string) (string, error) {
	list := &v1.IptablesEIPList{}
	if err := v.Reader.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
		return "", fmt.Errorf("list IptablesEIPs: %w", err)
	}
	for i := range list.Items {
		o := &list.Items[i]
		if o.Name != e.Name && kubeovn.EIPExternalSubnet(o) == ext && (o.Spec.V4ip == s || o.Spec.V6ip == s || o.Status.IP == s) {
			return o.Name, nil
		}
	}
	return "", nil
}

// rule checks a FIP, DNAT or SNAT.
func (v *Validator) rule(ctx context.Context, obj client.Object) (field.ErrorList, error) {
	name := reconciler.RuleEIP(obj)
	if name == "" {
		return field.ErrorList{field.Required(specPath.Child("eip"), "")}, nil
	}
	eip := &v1.IptablesEIP{}
	found, err := v.get(ctx, name, eip)
	if err != nil {
		return nil, err
	}
	if !found {
		return field.ErrorList{field.NotFound(specPath.Child("eip"), name)}, nil
	}
	// The EIP's address as the reconcile reads it; a bad one is the EIP's
	// own error (refused on the EIP), and the rule is checked on a
	// stand-in address (invalid Addr) as while an allocation is pending.
	eipAddr, _ := reconciler.EIPAddrs(eip)
	if v.KubeOVN && eipAddr.Address.IsValid() && !eipAddr.V6Address.IsValid() {
		// Kube-OVN's IPAM may hold an IPv6 address for it (a dual-stack
		// external subnet: the Vip's status.v6ip, which this webhook does
		// not read): an IPv6 rule is not refused here; the reconcile
		// refuses it naming the field when the EIP has none.
		eipAddr.V6Address = reconciler.StandInV6
	}
	if err := reconciler.CheckRule(obj, eipAddr); err != nil {
		fe, err := fieldError(err)
		if err != nil {
			return nil, err
		}
		return field.ErrorList{fe}, nil
	}
	fips, dnats := &v1.IptablesFIPRuleList{}, &v1.IptablesDnatRuleList{}
	for _, l := range []client.ObjectList{fips, dnats} {
		if err := v.Reader.List(ctx, l, client.MatchingFields{reconciler.EIPIndex: name}); err != nil {
			return nil, fmt.Errorf("list rules of IptablesEIP %s: %w", name, err)
		}
	}
	live := func(o client.Object) bool { return o.GetName() != obj.GetName() && o.GetDeletionTimestamp() == nil }
	eipField := specPath.Child("eip")
	switch o := obj.(type) {
	case *v1.IptablesFIPRule:
		for i := range fips.Items {
			if live(&fips.Items[i]) {
				return field.ErrorList{field.Invalid(eipField, name, fmt.Sprintf("already used by IptablesFIPRule %q: a FIP needs its EIP to itself", fips.Items[i].Name))}, nil
			}
		}
		for i := range dnats.Items {
			if live(&dnats.Items[i]) {
				return field.ErrorList{field.Invalid(eipField, name, fmt.Sprintf("already used by IptablesDnatRule %q: a FIP needs its EIP to itself (it would shadow the DNAT)", dnats.Items[i].Name))}, nil
			}
		}
	case *v1.IptablesDnatRule:
		for i := range fips.Items {
			if live(&fips.Items[i]) {
				return field.ErrorList{field.Invalid(eipField, name, fmt.Sprintf("already used by IptablesFIPRule %q: a FIP takes all of its EIP's traffic", fips.Items[i].Name))}, nil
			}
		}
		return dnatConflict(o, name, eipAddr, dnats.Items, live), nil
	}
	return nil, nil
}

// dnatConflict checks a DNAT against the live DNATs of its EIP with natgw's
// own conflict rules (nat.State: one exclusive DNAT per EIP, protocol and
// port, or share DNATs with distinct backends and no exclusive one),
// naming the rule that holds what it wants.
func dnatConflict(o *v1.IptablesDnatRule, eipName string, eip nat.EIP, dnats []v1.IptablesDnatRule, live func(client.Object) bool) field.ErrorList {
	st := nat.NewState()
	names := map[string]string{} // nat UID -> rule name
	for i := range dnats {
		d := &dnats[i]
		if !live(d) {
			continue
		}
		c := d.DeepCopy()
		c.UID = types.UID("rule-" + strconv.Itoa(i)) // nat objects need one; names may not be UIDs
		obj, err := reconciler.RuleObject(c, eip)
		if err != nil {
			continue // a rule natgw cannot program holds nothing
		}
		if st.Insert(obj) == nil {
			names[obj.UID] = d.Name
		}
	}
	c := o.DeepCopy()
	c.UID = "new" // a rule being created has no UID yet
	obj, err := reconciler.RuleObject(c, eip)
	if err != nil {
		return nil // CheckRule reported it
	}
	var ce *nat.ConflictError
	if err := st.Insert(obj); !errors.As(err, &ce) {
		return nil
	}
	path, value := specPath.Child("externalPort"), o.Spec.ExternalPort
	switch ce.Field {
	case "dnat.type":
		path, value = specPath.Child("type"), o.Spec.Type
		if value == "" {
			value = v1.DnatTypeExclusive // dnatType's default
		}
	case "dnat.internalIP":
		path, value = specPath.Child("internalIp"), o.Spec.InternalIP+":"+o.Spec.InternalPort
	}
	return field.ErrorList{field.Invalid(path, value, fmt.Sprintf("%s on IptablesEIP %q (IptablesDnatRule %q)", ce.What, eipName, names[ce.With]))}
}

// immutable checks an update against what cannot change: a gateway's
// spec.namespace (provision.NamespaceChange, as Kube-OVN master's webhook:
// the raw field, so "" to the configured namespace is refused too), its
// number of replicas (provision.ReplicasChange; an old value that was
// itself invalid may be corrected), an EIP's spec.natGwDp once set, and
// its spec once ready unless status.redo changes with it (spec.qosPolicy
// excepted).
func immutable(old, obj client.Object) field.ErrorList {
	if og, ok := old.(*v1.VpcNatGateway); ok {
		ng, ok := obj.(*v1.VpcNatGateway)
		if !ok {
			return nil
		}
		if ferr := provision.NamespaceChange(og.Spec.Namespace, ng.Spec.Namespace); ferr != nil {
			return field.ErrorList{ferr}
		}
		from, ferr := provision.Replicas(og)
		if ferr != nil {
			return nil
		}
		to, ferr := provision.Replicas(ng)
		if ferr != nil {
			return nil // checkSpec names it
		}
		if ferr := provision.ReplicasChange(from, to); ferr != nil {
			return field.ErrorList{ferr}
		}
		return nil
	}
	o, ok1 := old.(*v1.IptablesEIP)
	n, ok2 := obj.(*v1.IptablesEIP)
	if !ok1 || !ok2 {
		return nil
	}
	if o.Spec.NatGwDp != "" && n.Spec.NatGwDp != o.Spec.NatGwDp {
		return field.ErrorList{field.Forbidden(specPath.Child("natGwDp"),
			fmt.Sprintf("immutable once set (%q): an EIP does not move between gateways", o.Spec.NatGwDp))}
	}
	os, ns := o.Spec, n.Spec
	os.QoSPolicy, ns.QoSPolicy = "", ""
	if os != ns && o.Status.Ready && n.Status.Redo == o.Status.Redo {
		return field.ErrorList{field.Forbidden(specPath, "the EIP is ready: only spec.qosPolicy may change (its address is what its rules are programmed with)")}
	}
	return nil
}

// specChanged reports whether an update changes the object's spec (for a
// VpcNatGateway, also its annotation provision.ReplicasAnnotation).
func specChanged(old, obj client.Object) bool {
	spec := func(o client.Object) any {
		switch x := o.(type) {
		case *v1.VpcNatGateway:
			a, ok := x.Annotations[provision.ReplicasAnnotation]
			return struct {
				v1.VpcNatGatewaySpec
				replicas   string
				hasReplica bool
			}{x.Spec, a, ok}
		case *v1.IptablesEIP:
			return x.Spec
		case *v1.IptablesFIPRule:
			return x.Spec
		case *v1.IptablesDnatRule:
			return x.Spec
		case *v1.IptablesSnatRule:
			return x.Spec
		}
		return nil
	}
	return !reflect.DeepEqual(spec(old), spec(obj))
}

// kindList is a list of one kind, with the kind's name.
type kindList struct {
	kind string
	list client.ObjectList
}

// users names the objects, not themselves being deleted, that hold a
// deletion back: a gateway's EIPs; a ready EIP's FIPs, DNATs and SNATs.
func (v *Validator) users(ctx context.Context, obj client.Object) (string, error) {
	var lists []kindList
	var by client.MatchingFields
	switch o := obj.(type) {
	case *v1.VpcNatGateway:
		lists, by = []kindList{{"IptablesEIP", &v1.IptablesEIPList{}}}, client.MatchingFields{reconciler.GatewayIndex: o.Name}
	case *v1.IptablesEIP:
		if !o.Status.Ready {
			return "", nil
		}
		lists = []kindList{{"IptablesFIPRule", &v1.IptablesFIPRuleList{}}, {"IptablesDnatRule", &v1.IptablesDnatRuleList{}}, {"IptablesSnatRule", &v1.IptablesSnatRuleList{}}}
		by = client.MatchingFields{reconciler.EIPIndex: o.Name}
	default:
		return "", nil
	}
	var names []string
	for _, l := range lists {
		if err := v.Reader.List(ctx, l.list, by); err != nil {
			return "", fmt.Errorf("list %ss of %s: %w", l.kind, obj.GetName(), err)
		}
		items, err := meta.ExtractList(l.list)
		if err != nil {
			return "", fmt.Errorf("list %ss of %s: %w", l.kind, obj.GetName(), err)
		}
		for _, it := range items {
			if o, ok := it.(client.Object); ok && o.GetDeletionTimestamp() == nil {
				names = append(names, fmt.Sprintf("%s %q", l.kind, o.GetName()))
			}
		}
	}
	return strings.Join(names, ", "), nil
}
