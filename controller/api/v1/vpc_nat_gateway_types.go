package v1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// VpcNatGatewaySpec is the desired state of a VPC NAT gateway.
type VpcNatGatewaySpec struct {
	// Vpc is the name of the VPC the gateway serves.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Vpc string `json:"vpc"`

	// Subnet is the name of the VPC subnet the gateway's LAN side sits in.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	Subnet string `json:"subnet"`

	// ExternalSubnets are the names of the external subnets the gateway
	// attaches to.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +optional
	ExternalSubnets []string `json:"externalSubnets,omitempty"`

	// LanIP is the gateway's IPv4 address in Subnet.
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="self == '' || (isIP(self) && ip(self).family() == 4)",message="must be an IPv4 address"
	// +optional
	LanIP string `json:"lanIp,omitempty"`

	// Selector are "key: value" node labels the gateway pod is placed by.
	// +optional
	Selector []string `json:"selector,omitempty"`

	// Tolerations of the gateway pod.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Affinity of the gateway pod.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`

	// QoSPolicy is the name of a QoSPolicy applied to the gateway.
	// +kubebuilder:validation:MaxLength=253
	// +optional
	QoSPolicy string `json:"qosPolicy,omitempty"`

	// BgpSpeaker configures a BGP speaker sidecar (accepted for upstream
	// compatibility; natgw does not run one).
	// +optional
	BgpSpeaker *VpcBgpSpeaker `json:"bgpSpeaker,omitempty"`

	// Routes are extra routes via the VPC interface.
	// +kubebuilder:validation:MaxItems=1024
	// +optional
	Routes []Route `json:"routes,omitempty"`

	// NoDefaultEIP disables the default EIP upstream assigns to a new
	// gateway (kept for upstream compatibility; natgw assigns none).
	// +optional
	NoDefaultEIP bool `json:"noDefaultEIP,omitempty"`

	// Annotations are added to the gateway pod template when upstream
	// creates the gateway (kept for upstream compatibility).
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`

	// Namespace is where the gateway workload lives (Kube-OVN master's
	// field; empty: the controller's own namespace, as upstream).
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Namespace string `json:"namespace,omitempty"`

	// Replicas is the number of gateway instances (Kube-OVN master's HA
	// field, default 1). natgw accepts 1 or 2 (an active and a hot
	// standby; its admission webhook refuses more), fixed once the
	// gateway exists; on CRDs without this field the annotation
	// natgw.kubeovn.io/replicas says it. 2 is provisioned as two pods
	// only with natgw-controller's --ha-gateways (controller/README.md).
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// BFD configures BFD sessions of the gateway instances (Kube-OVN
	// master's HA field). Accepted and kept, not used by natgw.
	// +optional
	BFD *VpcNatGatewayBFD `json:"bfd,omitempty"`

	// InternalSubnets are subnet names whose traffic to 0.0.0.0/0 OVN
	// routes to the gateway instances (Kube-OVN master's HA field).
	// Accepted and kept, not used by natgw.
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=253
	// +optional
	InternalSubnets []string `json:"internalSubnets,omitempty"`

	// InternalCIDRs are CIDRs whose traffic to 0.0.0.0/0 OVN routes to
	// the gateway instances (Kube-OVN master's HA field). Accepted and
	// kept, not used by natgw.
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=43
	// +optional
	InternalCIDRs []string `json:"internalCIDRs,omitempty"`
}

// VpcNatGatewayBFD is Kube-OVN master's BFD configuration of a gateway,
// with master's defaults and bounds (milliseconds).
type VpcNatGatewayBFD struct {
	// Enabled turns BFD on.
	// +kubebuilder:default=false
	// +optional
	Enabled bool `json:"enabled"`

	// MinRX is the minimum receive interval in milliseconds.
	// +kubebuilder:default=1000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600000
	// +optional
	MinRX int32 `json:"minRX,omitempty"`

	// MinTX is the minimum transmit interval in milliseconds.
	// +kubebuilder:default=1000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600000
	// +optional
	MinTX int32 `json:"minTX,omitempty"`

	// Multiplier is the number of missed packets before the session is
	// down.
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=255
	// +optional
	Multiplier int32 `json:"multiplier,omitempty"`
}

// Route is a route on the gateway: cidr via nextHopIP on the VPC interface.
type Route struct {
	// CIDR is the IPv4 destination, e.g. 10.1.0.0/16.
	// +kubebuilder:validation:MaxLength=18
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self).ip().family() == 4",message="must be an IPv4 CIDR such as 10.1.0.0/16"
	// +optional
	CIDR string `json:"cidr"`

	// NextHopIP is the IPv4 next hop.
	// +kubebuilder:validation:MaxLength=15
	// +kubebuilder:validation:XValidation:rule="isIP(self) && ip(self).family() == 4",message="must be an IPv4 address"
	// +optional
	NextHopIP string `json:"nextHopIP"`
}

// VpcBgpSpeaker is upstream's BGP speaker configuration, kept so existing
// manifests apply.
type VpcBgpSpeaker struct {
	// +optional
	Enabled bool `json:"enabled,omitempty"`
	// +optional
	ASN uint32 `json:"asn,omitempty"`
	// +optional
	RemoteASN uint32 `json:"remoteAsn,omitempty"`
	// +optional
	Neighbors []string `json:"neighbors,omitempty"`
	// +optional
	HoldTime metav1.Duration `json:"holdTime,omitempty"`
	// +optional
	RouterID string `json:"routerId,omitempty"`
	// +optional
	Password string `json:"password,omitempty"`
	// +optional
	EnableGracefulRestart bool `json:"enableGracefulRestart,omitempty"`
	// +optional
	ExtraArgs []string `json:"extraArgs,omitempty"`
}

// VpcNatGatewayStatus is the observed state of a VpcNatGateway. Upstream's
// schema has no conditions here: natgw keeps the gateway's Ready condition
// in the annotation ReadyAnnotation (see GatewayReady).
type VpcNatGatewayStatus struct {
	// QoSPolicy is the QoS policy in effect.
	// +optional
	QoSPolicy string `json:"qosPolicy,omitempty"`

	// ExternalSubnets are the external subnets in effect.
	// +optional
	ExternalSubnets []string `json:"externalSubnets,omitempty"`

	// Selector is the node selector in effect.
	// +optional
	Selector []string `json:"selector,omitempty"`

	// Tolerations are the tolerations in effect.
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// Affinity is the affinity in effect.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
}

// VpcNatGateway is a NAT gateway for a VPC: a pod (or, locally, a network
// namespace) with one leg in the VPC and one on the external network.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,path=vpc-nat-gateways,singular=vpc-nat-gateway,shortName=vpc-nat-gw
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Vpc",type="string",JSONPath=".spec.vpc"
// +kubebuilder:printcolumn:name="Subnet",type="string",JSONPath=".spec.subnet"
// +kubebuilder:printcolumn:name="LanIP",type="string",JSONPath=".spec.lanIp"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type VpcNatGateway struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec VpcNatGatewaySpec `json:"spec"`
	// +optional
	Status VpcNatGatewayStatus `json:"status,omitempty"`
}

// VpcNatGatewayList is a list of VpcNatGateway.
//
// +kubebuilder:object:root=true
type VpcNatGatewayList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []VpcNatGateway `json:"items"`
}

func init() {
	SchemeBuilder.Register(&VpcNatGateway{}, &VpcNatGatewayList{})
}
