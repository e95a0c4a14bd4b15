package reconciler

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/nat"
)

// ruleStatus is what a rule's status says after a reconcile.
type ruleStatus struct {
	ready   bool
	v4ip    string // the EIP's IPv4 address ("" without one)
	v6ip    string // the EIP's IPv6 address ("" without one)
	gateway string
	cond    v1.Condition
}

// ruleKind describes one NAT rule CRD to the generic rule reconciler: one
// value per kind replaces four copies of the same reconcile logic.
type ruleKind[T client.Object] struct {
	// kind is the gateway object kind, and the word in IptablesEIP
	// status.nat.
	kind    nat.Kind
	newObj  func() T
	newList func() client.ObjectList
	items   func(client.ObjectList) []T
	eipName func(T) string
	// build turns the rule into its gateway object on the EIP with the
	// addresses eip (the rule takes the one of its family).
	build func(T, nat.EIP) (nat.Object, error)
	// setStatus writes st (plus the kind's own fields) into the status.
	setStatus func(T, ruleStatus)
	ready     func(T) bool
	// gateway is the gateway the status says the rule is programmed on.
	gateway func(T) string
}

var fipKind = ruleKind[*v1.IptablesFIPRule]{
	kind:    nat.KindFIP,
	newObj:  func() *v1.IptablesFIPRule { return &v1.IptablesFIPRule{} },
	newList: func() client.ObjectList { return &v1.IptablesFIPRuleList{} },
	items:   func(l client.ObjectList) []*v1.IptablesFIPRule { return ptrs(l.(*v1.IptablesFIPRuleList).Items) },
	eipName: func(o *v1.IptablesFIPRule) string { return o.Spec.EIP },
	build:   fipObject,
	setStatus: func(o *v1.IptablesFIPRule, st ruleStatus) {
		s := &o.Status
		s.Ready, s.V4ip, s.V6ip, s.NatGwDp = st.ready, st.v4ip, st.v6ip, st.gateway
		s.InternalIP = ""
		if st.ready {
			s.InternalIP = o.Spec.InternalIP
		}
		setCondition(&s.Conditions, st.cond, o.Generation)
	},
	ready:   func(o *v1.IptablesFIPRule) bool { return o.Status.Ready },
	gateway: func(o *v1.IptablesFIPRule) string { return o.Status.NatGwDp },
}

var dnatKind = ruleKind[*v1.IptablesDnatRule]{
	kind:    nat.KindDNAT,
	newObj:  func() *v1.IptablesDnatRule { return &v1.IptablesDnatRule{} },
	newList: func() client.ObjectList { return &v1.IptablesDnatRuleList{} },
	items:   func(l client.ObjectList) []*v1.IptablesDnatRule { return ptrs(l.(*v1.IptablesDnatRuleList).Items) },
	eipName: func(o *v1.IptablesDnatRule) string { return o.Spec.EIP },
	build:   dnatObject,
	setStatus: func(o *v1.IptablesDnatRule, st ruleStatus) {
		s := &o.Status
		s.Ready, s.V4ip, s.V6ip, s.NatGwDp = st.ready, st.v4ip, st.v6ip, st.gateway
		s.Protocol, s.InternalIP, s.InternalPort, s.ExternalPort = "", "", "", ""
		if st.ready {
			s.Protocol, s.InternalIP, s.InternalPort, s.ExternalPort = o.Spec.Protocol, o.Spec.InternalIP, o.Spec.InternalPort, o.Spec.ExternalPort
			if s.Protocol == "" {
				s.Protocol = string(nat.DefaultProtocol) // what was programmed
			}
		}
		setCondition(&s.Conditions, st.cond, o.Generation)
	},
	ready:   func(o *v1.IptablesDnatRule) bool { return o.Status.Ready },
	gateway: func(o *v1.IptablesDnatRule) string { return o.Status.NatGwDp },
}

var snatKind = ruleKind[*v1.IptablesSnatRule]{
	kind:    nat.KindSNAT,
	newObj:  func() *v1.IptablesSnatRule { return &v1.IptablesSnatRule{} },
	newList: func() client.ObjectList { return &v1.IptablesSnatRuleList{} },
	items:   func(l client.ObjectList) []*v1.IptablesSnatRule { return ptrs(l.(*v1.IptablesSnatRuleList).Items) },
	eipName: func(o *v1.IptablesSnatRule) string { return o.Spec.EIP },
	build:   snatObject,
	setStatus: func(o *v1.IptablesSnatRule, st ruleStatus) {
		s := &o.Status
		s.Ready, s.V4ip, s.V6ip, s.NatGwDp = st.ready, st.v4ip, st.v6ip, st.gateway
		s.InternalCIDR = ""
		if st.ready {
			s.InternalCIDR = o.Spec.InternalCIDR
		}
		setCondition(&s.Conditions, st.cond, o.Generation)
	},
	ready:   func(o *v1.IptablesSnatRule) bool { return o.Status.Ready },
	gateway: func(o *v1.IptablesSnatRule) string { return o.Status.NatGwDp },
}

func ptrs[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

// setCondition sets the Ready condition with observedGeneration.
func setCondition(conds *[]v1.Condition, c v1.Condition, gen int64) {
	c.Type = v1.ConditionReady
	c.ObservedGeneration = gen
	v1.SetCondition(conds, c, metav1.Now())
}
