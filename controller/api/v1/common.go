package v1

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Well-known names shared with upstream Kube-OVN.
const (
	// Finalizer is the finalizer upstream's controller puts on NAT objects.
	Finalizer = "kubeovn.io/kube-ovn-controller"

	// LabelEIPV4IP labels a NAT rule with the IPv4 address of its EIP.
	LabelEIPV4IP = "ovn.kubernetes.io/eip_v4_ip"
	// LabelVpcNatGwName labels EIPs and NAT rules with their gateway's name.
	LabelVpcNatGwName = "ovn.kubernetes.io/vpc-nat-gw-name"
)

// Protocol values of IptablesDnatRule.spec.protocol.
const (
	ProtocolTCP  = "tcp"
	ProtocolUDP  = "udp"
	ProtocolSCTP = "sctp"
)

// Common condition types and reasons. Controllers may add their own.
const (
	// ConditionReady is True when the object is programmed on its gateway.
	ConditionReady = "Ready"

	ReasonProgrammed      = "Programmed"
	ReasonEIPNotFound     = "EIPNotFound"
	ReasonEIPNotReady     = "EIPNotReady"
	ReasonEIPInUse        = "EIPInUse"
	ReasonGatewayNotFound = "GatewayNotFound"
	ReasonGatewayNotReady = "GatewayNotReady"
	ReasonInvalid         = "Invalid"
	ReasonProgramFailed   = "ProgramFailed"
	// ReasonSubnetNotReady: a Kube-OVN Subnet the object's network comes
	// from (replace mode, --network-source=kube-ovn) is missing or has no
	// usable IPv4 CIDR or gateway; what is programmed stays.
	ReasonSubnetNotReady = "SubnetNotReady"
	// ReasonAddressPending: the EIP's address is not reserved in Kube-OVN's
	// IPAM yet (replace mode, --network-source=kube-ovn: natgw's Vip for
	// it has no address yet); nothing is programmed before it is.
	ReasonAddressPending = "AddressPending"
)

// Condition is one observation of an object's state, in the shape of
// upstream's kubeovn.io/v1 Condition (every field optional, lastUpdateTime
// besides metav1.Condition's fields), so that conditions written by either
// controller pass either schema.
type Condition struct {
	// Type of the condition, e.g. Ready.
	// +optional
	Type string `json:"type,omitempty"`
	// Status of the condition: True, False or Unknown.
	// +optional
	Status metav1.ConditionStatus `json:"status,omitempty"`
	// Reason is a CamelCase word for the last transition.
	// +optional
	Reason string `json:"reason,omitempty"`
	// Message says what happened, for humans.
	// +optional
	Message string `json:"message,omitempty"`
	// ObservedGeneration is the metadata.generation the condition
	// describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// LastUpdateTime is when the condition last changed in any way.
	// +optional
	LastUpdateTime metav1.Time `json:"lastUpdateTime,omitzero"`
	// LastTransitionTime is when Status last changed.
	// +optional
	LastTransitionTime metav1.Time `json:"lastTransitionTime,omitzero"`
}

// FindCondition returns the condition of type t in conds (nil when none).
func FindCondition(conds []Condition, t string) *Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// SetCondition puts c into conds, replacing the condition of its type.
// LastTransitionTime changes (to now) only when the status does, and
// LastUpdateTime only when anything does; it reports whether anything did.
// Times given in c are ignored.
func SetCondition(conds *[]Condition, c Condition, now metav1.Time) bool {
	cur := FindCondition(*conds, c.Type)
	if cur == nil {
		c.LastTransitionTime, c.LastUpdateTime = now, now
		*conds = append(*conds, c)
		return true
	}
	if cur.Status == c.Status && cur.Reason == c.Reason && cur.Message == c.Message && cur.ObservedGeneration == c.ObservedGeneration {
		return false
	}
	c.LastTransitionTime, c.LastUpdateTime = cur.LastTransitionTime, now
	if cur.Status != c.Status || c.LastTransitionTime.IsZero() {
		c.LastTransitionTime = now
	}
	*cur = c
	return true
}

// ReadyAnnotation holds a VpcNatGateway's Ready condition (JSON of a
// Condition): upstream's VpcNatGateway status has no conditions, and a
// status field its schema lacks would be pruned by the API server.
const ReadyAnnotation = "natgw.kubeovn.io/ready"

// GatewayReady returns the Ready condition stored in g's ReadyAnnotation
// (nil when there is none or it does not parse).
func GatewayReady(g *VpcNatGateway) *Condition {
	v, ok := g.Annotations[ReadyAnnotation]
	if !ok {
		return nil
	}
	c := &Condition{}
	if err := json.Unmarshal([]byte(v), c); err != nil {
		return nil
	}
	c.Type = ConditionReady
	return c
}

// StatusSummary is the part of the status every NAT kind shares.
// +kubebuilder:object:generate=false
type StatusSummary struct {
	// Ready is status.ready. A VpcNatGateway has no such field and reports
	// true, so that its Ready condition alone decides.
	Ready bool
	// ObservedGeneration is the Ready condition's observedGeneration (0
	// without one): upstream's schema has no status.observedGeneration.
	ObservedGeneration int64
	// Conditions are status.conditions (a VpcNatGateway's: the one in
	// ReadyAnnotation).
	Conditions []Condition
}

// SummaryOf returns obj's shared status; ok is false for other types.
func SummaryOf(obj runtime.Object) (s StatusSummary, ok bool) {
	switch o := obj.(type) {
	case *IptablesEIP:
		s = StatusSummary{Ready: o.Status.Ready, Conditions: o.Status.Conditions}
	case *IptablesFIPRule:
		s = StatusSummary{Ready: o.Status.Ready, Conditions: o.Status.Conditions}
	case *IptablesDnatRule:
		s = StatusSummary{Ready: o.Status.Ready, Conditions: o.Status.Conditions}
	case *IptablesSnatRule:
		s = StatusSummary{Ready: o.Status.Ready, Conditions: o.Status.Conditions}
	case *VpcNatGateway:
		s = StatusSummary{Ready: true}
		if c := GatewayReady(o); c != nil {
			s.Conditions = []Condition{*c}
		}
	default:
		return StatusSummary{}, false
	}
	if c := s.ReadyCondition(); c != nil {
		s.ObservedGeneration = c.ObservedGeneration
	}
	return s, true
}

// ReadyCondition returns the Ready condition (nil when there is none).
func (s StatusSummary) ReadyCondition() *Condition {
	return FindCondition(s.Conditions, ConditionReady)
}
