package v1

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
