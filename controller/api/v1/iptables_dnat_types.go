package v1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// IptablesDnatRuleSpec is the desired state of a port forward from
// EIP:externalPort/protocol to internalIp:internalPort. Ports are strings,
// as upstream.
type IptablesDnatRuleSpec struct {
	// EIP is the name of the IptablesEIP to forward from.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	EIP string `json:"eip"`

	// ExternalPort is the port on the EIP, "1".."65535".
	// +kubebuilder:validation:MaxLength=5
	// +kubebuilder:validation:XValidation:rule="self.matches('^[1-9][0-9]{0,4}$') && int(self) <= 65535",message="must be a port number from 1 to 65535"
	// +optional
	ExternalPort string `json:"externalPort"`

	// Protocol is tcp, udp or sctp; empty means tcp (no schema default:
	// objects are stored as upstream's schema stores them).
	// +kubebuilder:validation:Enum=tcp;udp;sctp
	// +optional
	Protocol string `json:"protocol,omitempty"`

	// InternalIP is the address inside the VPC to forward to: IPv4, or
	// IPv6 (the EIP's IPv6 address, spec.v6ip, is used).
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="must be an IPv4 or IPv6 address"
	// +optional
	InternalIP string `json:"internalIp"`

	// InternalPort is the port to forward to, "1".."65535".
	// +kubebuilder:validation:MaxLength=5
	// +kubebuilder:validation:XValidation:rule="self.matches('^[1-9][0-9]{0,4}$') && int(self) <= 65535",message="must be a port number from 1 to 65535"
	// +optional
	InternalPort string `json:"internalPort"`

	// Type is Kube-OVN master's DNAT type: exclusive (the default: the
	// EIP, protocol and port belong to this rule alone) or share (every
	// rule of type share on one EIP, protocol and port is a backend; new
	// connections are spread at random and pinned by conntrack).
	// +kubebuilder:validation:Enum=exclusive;share
	// +kubebuilder:default=exclusive
	// +optional
	Type string `json:"type,omitempty"`
}

// DNAT types (spec.type).
const (
	DnatTypeExclusive = "exclusive"
	DnatTypeShare     = "share"
)

// IptablesDnatRuleStatus is the observed state of an IptablesDnatRule.
type IptablesDnatRuleStatus struct {
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

	// Protocol is the protocol programmed.
	// +optional
	Protocol string `json:"protocol,omitempty"`

	// InternalIP is the internal address programmed.
	// +optional
	InternalIP string `json:"internalIp,omitempty"`

	// InternalPort is the internal port programmed.
	// +optional
	InternalPort string `json:"internalPort,omitempty"`

	// ExternalPort is the external port programmed.
	// +optional
	ExternalPort string `json:"externalPort,omitempty"`

	// Conditions are the latest observations of the rule's state.
	// +optional
	Conditions []Condition `json:"conditions,omitempty"`
}

// IptablesDnatRule forwards one port of an EIP to an internal address on a
// VPC NAT gateway. Its identity on the gateway is (EIP, externalPort,
// protocol).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,path=iptables-dnat-rules,singular=iptables-dnat-rule,shortName={dnat,idnat}
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Eip",type="string",JSONPath=".spec.eip"
// +kubebuilder:printcolumn:name="Protocol",type="string",JSONPath=".spec.protocol"
// +kubebuilder:printcolumn:name="V4ip",type="string",JSONPath=".status.v4ip"
// +kubebuilder:printcolumn:name="V6ip",type="string",JSONPath=".status.v6ip"
// +kubebuilder:printcolumn:name="InternalIp",type="string",JSONPath=".spec.internalIp"
// +kubebuilder:printcolumn:name="ExternalPort",type="string",JSONPath=".spec.externalPort"
// +kubebuilder:printcolumn:name="InternalPort",type="string",JSONPath=".spec.internalPort"
// +kubebuilder:printcolumn:name="NatGwDp",type="string",JSONPath=".status.natGwDp"
// +kubebuilder:printcolumn:name="Ready",type="boolean",JSONPath=".status.ready"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type IptablesDnatRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec IptablesDnatRuleSpec `json:"spec"`
	// +optional
	Status IptablesDnatRuleStatus `json:"status,omitempty"`
}

// IptablesDnatRuleList is a list of IptablesDnatRule.
//
// +kubebuilder:object:root=true
type IptablesDnatRuleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IptablesDnatRule `json:"items"`
}

func init() {
	SchemeBuilder.Register(&IptablesDnatRule{}, &IptablesDnatRuleList{})
}
