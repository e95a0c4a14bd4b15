package v1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// IptablesSnatRuleSpec is the desired state of a shared source NAT: traffic
// from internalCIDR leaving through the external network gets the EIP as
// its source. Overlapping CIDRs match longest prefix first.
type IptablesSnatRuleSpec struct {
	// EIP is the name of the IptablesEIP to use as source address.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	EIP string `json:"eip"`

	// InternalCIDR is the source range inside the VPC, e.g. 10.0.1.0/24 or
	// fd00:1::/64 (an IPv6 one uses the EIP's IPv6 address, spec.v6ip).
	// A bare IPv4 address (as upstream's iptables accepts) means a /32.
	// +kubebuilder:validation:MaxLength=49
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) || isIP(self)",message="must be a CIDR such as 10.0.1.0/24 or fd00:1::/64, or an address"
	// +optional
	InternalCIDR string `json:"internalCIDR"`
}

// IptablesSnatRuleStatus is the observed state of an IptablesSnatRule.
type IptablesSnatRuleStatus struct {
	// Ready is true when the rule is programmed on its gateway.
	// +optional
	Ready bool `json:"ready"`

	// V4ip is the IPv4 address of the EIP.
	// +optional
	V4ip string `json:"v4ip,omitempty"`

	// V6ip is the IPv6 address of the EIP.
	// +optional
	V6ip string `json:"v6ip,omitempty"`

	// NatGwDp is the gateway the rule is programmed on.
	// +optional
	NatGwDp string `json:"natGwDp,omitempty"`

	// Redo is set to trigger a re-programming (upstream compatibility).
	// +optional
	Redo string `json:"redo,omitempty"`

	// InternalCIDR is the source range programmed.
	// +optional
	InternalCIDR string `json:"internalCIDR,omitempty"`

	// Conditions are the latest observations of the rule's state.
	// +optional
	Conditions []Condition `json:"conditions,omitempty"`
}

// IptablesSnatRule source-NATs an internal CIDR to an EIP on a VPC NAT
// gateway.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,path=iptables-snat-rules,singular=iptables-snat-rule,shortName={snat,isnat}
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="EIP",type="string",JSONPath=".spec.eip"
// +kubebuilder:printcolumn:name="V4ip",type="string",JSONPath=".status.v4ip"
// +kubebuilder:printcolumn:name="V6ip",type="string",JSONPath=".status.v6ip"
// +kubebuilder:printcolumn:name="InternalCIDR",type="string",JSONPath=".spec.internalCIDR"
// +kubebuilder:printcolumn:name="NatGwDp",type="string",JSONPath=".status.natGwDp"
// +kubebuilder:printcolumn:name="Ready",type="boolean",JSONPath=".status.ready"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type IptablesSnatRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec IptablesSnatRuleSpec `json:"spec"`
	// +optional
	Status IptablesSnatRuleStatus `json:"status,omitempty"`
}

// IptablesSnatRuleList is a list of IptablesSnatRule.
//
// +kubebuilder:object:root=true
type IptablesSnatRuleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IptablesSnatRule `json:"items"`
}

func init() {
	SchemeBuilder.Register(&IptablesSnatRule{}, &IptablesSnatRuleList{})
}
