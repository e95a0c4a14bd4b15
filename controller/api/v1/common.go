package v1

import (
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
	ProtocolTCP = "tcp"
	ProtocolUDP = "udp"
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
)

// StatusSummary is the part of the status every NAT kind shares.
// +kubebuilder:object:generate=false
type StatusSummary struct {
	// Ready is status.ready. A VpcNatGateway has no such field and reports
	// true, so that its Ready condition alone decides.
	Ready bool
	// ObservedGeneration is status.observedGeneration.
	ObservedGeneration int64
	// Conditions are status.conditions.
	Conditions []metav1.Condition
}

// SummaryOf returns obj's shared status; ok is false for other types.
func SummaryOf(obj runtime.Object) (s StatusSummary, ok bool) {
	switch o := obj.(type) {
	case *IptablesEIP:
		return StatusSummary{o.Status.Ready, o.Status.ObservedGeneration, o.Status.Conditions}, true
	case *IptablesFIPRule:
		return StatusSummary{o.Status.Ready, o.Status.ObservedGeneration, o.Status.Conditions}, true
	case *IptablesDnatRule:
		return StatusSummary{o.Status.Ready, o.Status.ObservedGeneration, o.Status.Conditions}, true
	case *IptablesSnatRule:
		return StatusSummary{o.Status.Ready, o.Status.ObservedGeneration, o.Status.Conditions}, true
	case *VpcNatGateway:
		return StatusSummary{true, o.Status.ObservedGeneration, o.Status.Conditions}, true
	}
	return StatusSummary{}, false
}

// ReadyCondition returns the Ready condition (nil when there is none).
func (s StatusSummary) ReadyCondition() *metav1.Condition {
	for i := range s.Conditions {
		if s.Conditions[i].Type == ConditionReady {
			return &s.Conditions[i]
		}
	}
	return nil
}
