package v1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// IptablesFIPRuleSpec is the desired state of a floating IP: a 1:1 mapping
// between an EIP and an internal address.
type IptablesFIPRuleSpec struct {
	// EIP is the name of the IptablesEIP to map.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	EIP string `json:"eip"`

	// InternalIP is the address inside the VPC that the EIP maps to: IPv4,
	// or IPv6 (the EIP's IPv6 address, spec.v6ip, is used).
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IPv4 or IPv6 address"
	// +optional
	InternalIP string `json:"internalIp"`
}

// IptablesFIPRuleStatus is the observed state of an IptablesFIPRule.
type IptablesFIPRuleStatus struct {
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

	// InternalIP is the internal address programmed.
	// +optional
	InternalIP string `json:"internalIp,omitempty"`

	// Conditions are the latest observations of the rule's state.
	// +optional
	Conditions []Condition `json:"conditions,omitempty"`
}

// IptablesFIPRule maps an EIP 1:1 to an internal IP on a VPC NAT gateway.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,path=iptables-fip-rules,singular=iptables-fip-rule,shortName={fip,ifip}
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Eip",type="string",JSONPath=".spec.eip"
// +kubebuilder:printcolumn:name="V4ip",type="string",JSONPath=".status.v4ip"
// +kubebuilder:printcolumn:name="InternalIp",type="string",JSONPath=".spec.internalIp"
// +kubebuilder:printcolumn:name="V6ip",type="string",JSONPath=".status.v6ip"
// +kubebuilder:printcolumn:name="Ready",type="boolean",JSONPath=".status.ready"
// +kubebuilder:printcolumn:name="NatGwDp",type="string",JSONPath=".status.natGwDp"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type IptablesFIPRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec IptablesFIPRuleSpec `json:"spec"`
	// +optional
	Status IptablesFIPRuleStatus `json:"status,omitempty"`
}

// IptablesFIPRuleList is a list of IptablesFIPRule.
//
// +kubebuilder:object:root=true
type IptablesFIPRuleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IptablesFIPRule `json:"items"`
}

func init() {
	SchemeBuilder.Register(&IptablesFIPRule{}, &IptablesFIPRuleList{})
}
