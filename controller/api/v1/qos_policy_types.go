package v1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// QoSPolicyBindingType says what a QoSPolicy is bound to.
// +kubebuilder:validation:Enum=EIP;NATGW
type QoSPolicyBindingType string

const (
	QoSBindingTypeEIP   QoSPolicyBindingType = "EIP"
	QoSBindingTypeNatGw QoSPolicyBindingType = "NATGW"
)

// QoSPolicyRuleDirection is the direction a bandwidth limit applies to.
// +kubebuilder:validation:Enum=ingress;egress
type QoSPolicyRuleDirection string

const (
	QoSDirectionIngress QoSPolicyRuleDirection = "ingress"
	QoSDirectionEgress  QoSPolicyRuleDirection = "egress"
)

// QoSPolicyRuleMatchType is what a bandwidth limit rule matches on.
// +kubebuilder:validation:Enum=ip
type QoSPolicyRuleMatchType string

const QoSMatchTypeIP QoSPolicyRuleMatchType = "ip"

// Condition types and reasons natgw-controller writes on a QoSPolicy (its
// Ready condition says whether natgw accepted the policy and can program
// every binding; InUse names the objects that reference it).
const (
	// ConditionInUse is True while an IptablesEIP or a VpcNatGateway
	// names the policy in spec.qosPolicy; a terminating policy keeps
	// natgw's finalizer meanwhile (reason DeletionBlocked).
	ConditionInUse = "InUse"

	// ReasonAccepted: the policy passed upstream's validation, its status
	// records the spec, and natgw programs every binding of it.
	ReasonAccepted = "Accepted"
	// ReasonUnsupported: the policy is valid but names something natgw's
	// data plane does not program (gateway-wide QoS, a rule with a match);
	// the message names the field and value.
	ReasonUnsupported = "Unsupported"
	ReasonInUse       = "InUse"
	ReasonNotInUse    = "NotInUse"
	// ReasonDeletionBlocked: the policy is being deleted while objects
	// still reference it; the message names them.
	ReasonDeletionBlocked = "DeletionBlocked"
)

// QoSPolicyBandwidthLimitRule is one rate limit.
// +kubebuilder:validation:XValidation:rule="!has(self.matchValue) || size(self.matchValue) == 0 || has(self.matchType)",message="matchType is required with matchValue"
type QoSPolicyBandwidthLimitRule struct {
	// Name identifies the rule within the policy.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +required
	Name string `json:"name"`

	// Interface the rule applies to (NATGW binding).
	// +kubebuilder:validation:MaxLength=15
	// +optional
	Interface string `json:"interface,omitempty"`

	// RateMax is the rate limit in Mbit/s.
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="self == '' || self.matches('^[0-9]+([.][0-9]+)?$')",message="must be a number of Mbit/s"
	// +optional
	RateMax string `json:"rateMax,omitempty"`

	// BurstMax is the burst in MB (1,048,576 bytes), Kube-OVN's unit.
	// +kubebuilder:validation:MaxLength=16
	// +kubebuilder:validation:XValidation:rule="self == '' || self.matches('^[0-9]+([.][0-9]+)?$')",message="must be a number of MB"
	// +optional
	BurstMax string `json:"burstMax,omitempty"`

	// Priority orders rules with a match.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Priority int `json:"priority,omitempty"`

	// Direction is ingress or egress.
	// +optional
	Direction QoSPolicyRuleDirection `json:"direction,omitempty"`

	// MatchType is what MatchValue matches on.
	// +optional
	MatchType QoSPolicyRuleMatchType `json:"matchType,omitempty"`

	// MatchValue is the match, e.g. "src 10.0.1.0/24".
	// +kubebuilder:validation:MaxLength=128
	// +optional
	MatchValue string `json:"matchValue,omitempty"`
}

// QoSPolicyBandwidthLimitRules is a list of rules.
type QoSPolicyBandwidthLimitRules []QoSPolicyBandwidthLimitRule

// QoSPolicySpec is the desired state of a QoSPolicy.
type QoSPolicySpec struct {
	// BandwidthLimitRules are the limits of the policy.
	// +kubebuilder:validation:MaxItems=64
	// +optional
	BandwidthLimitRules QoSPolicyBandwidthLimitRules `json:"bandwidthLimitRules,omitempty"`

	// Shared policies may be bound to several objects.
	// +optional
	Shared bool `json:"shared,omitempty"`

	// BindingType is EIP or NATGW.
	// +optional
	BindingType QoSPolicyBindingType `json:"bindingType,omitempty"`
}

// QoSPolicyStatus is the observed state of a QoSPolicy.
type QoSPolicyStatus struct {
	// +kubebuilder:validation:MaxItems=64
	// +optional
	BandwidthLimitRules QoSPolicyBandwidthLimitRules `json:"bandwidthLimitRules,omitempty"`
	// +optional
	Shared bool `json:"shared,omitempty"`
	// +optional
	BindingType QoSPolicyBindingType `json:"bindingType,omitempty"`

	// Conditions are the latest observations of the policy's state.
	// +optional
	Conditions []Condition `json:"conditions,omitempty"`
}

// QoSPolicy limits bandwidth of an EIP or a gateway.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,path=qos-policies,singular=qos-policy,shortName=qos
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Shared",type="string",JSONPath=".spec.shared"
// +kubebuilder:printcolumn:name="BindingType",type="string",JSONPath=".spec.bindingType"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type QoSPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec QoSPolicySpec `json:"spec,omitempty"`
	// +optional
	Status QoSPolicyStatus `json:"status,omitempty"`
}

// QoSPolicyList is a list of QoSPolicy.
//
// +kubebuilder:object:root=true
type QoSPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []QoSPolicy `json:"items"`
}

func init() {
	SchemeBuilder.Register(&QoSPolicy{}, &QoSPolicyList{})
}
