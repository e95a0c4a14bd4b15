package v1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// IptablesEIPSpec is the desired state of an IptablesEIP: an external
// address on a VPC NAT gateway.
type IptablesEIPSpec struct {
	// V4ip is the IPv4 address of the EIP. Empty means: allocate one from
	// the external subnet.
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="self == '' || (isIP(self) && ip(self).family() == 4)",message="must be an IPv4 address"
	// +optional
	V4ip string `json:"v4ip,omitempty"`

	// V6ip is the IPv6 address of the EIP.
	// +kubebuilder:validation:MaxLength=45
	// +kubebuilder:validation:XValidation:rule="self == '' || (isIP(self) && ip(self).family() == 6)",message="must be an IPv6 address"
	// +optional
	V6ip string `json:"v6ip,omitempty"`

	// MacAddress is the MAC address of the EIP's port on the external network.
	// +kubebuilder:validation:MaxLength=17
	// +kubebuilder:validation:XValidation:rule="self == '' || self.matches('^([0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}$')",message="must be a MAC address such as 00:00:5e:00:53:01"
	// +optional
	MacAddress string `json:"macAddress,omitempty"`

	// NatGwDp is the name of the VpcNatGateway that holds the EIP.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	NatGwDp string `json:"natGwDp"`

	// QoSPolicy is the name of a QoSPolicy applied to the EIP.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	QoSPolicy string `json:"qosPolicy,omitempty"`

	// ExternalSubnet is the name of the external subnet the EIP comes from;
	// empty means the gateway's first external subnet.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	ExternalSubnet string `json:"externalSubnet,omitempty"`
}

// IptablesEIPStatus is the observed state of an IptablesEIP.
type IptablesEIPStatus struct {
	// Ready is true when the EIP is configured on its gateway.
	// +optional
	Ready bool `json:"ready"`

	// IP is the address in use (IPv4, or IPv6 for an IPv6-only EIP).
	// +optional
	IP string `json:"ip,omitempty"`

	// Nat lists the kinds of NAT rules using the EIP (comma-separated:
	// fip, dnat, snat).
	// +optional
	Nat string `json:"nat,omitempty"`

	// Redo is set to trigger a re-programming (upstream compatibility).
	// +optional
	Redo string `json:"redo,omitempty"`

	// QoSPolicy is the QoS policy in effect.
	// +optional
	QoSPolicy string `json:"qosPolicy,omitempty"`

	// Conditions are the latest observations of the EIP's state.
	// +optional
	Conditions []Condition `json:"conditions,omitempty"`
}

// IptablesEIP is an external IP address on a VPC NAT gateway.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,path=iptables-eips,singular=iptables-eip,shortName={eip,ieip}
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="IP",type="string",JSONPath=".status.ip"
// +kubebuilder:printcolumn:name="Mac",type="string",JSONPath=".spec.macAddress"
// +kubebuilder:printcolumn:name="Nat",type="string",JSONPath=".status.nat"
// +kubebuilder:printcolumn:name="NatGwDp",type="string",JSONPath=".spec.natGwDp"
// +kubebuilder:printcolumn:name="Ready",type="boolean",JSONPath=".status.ready"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type IptablesEIP struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec IptablesEIPSpec `json:"spec"`
	// +optional
	Status IptablesEIPStatus `json:"status,omitempty"`
}

// IptablesEIPList is a list of IptablesEIP.
//
// +kubebuilder:object:root=true
type IptablesEIPList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []IptablesEIP `json:"items"`
}

func init() {
	SchemeBuilder.Register(&IptablesEIP{}, &IptablesEIPList{})
}
