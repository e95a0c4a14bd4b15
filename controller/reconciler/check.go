package reconciler

import (
	"fmt"
	"net/netip"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/nat"
)

// CheckEIP returns, as a *nat.FieldError, what in an IptablesEIP's spec
// natgw cannot program (spec.v4ip that is not a unicast IPv4 address,
// spec.v6ip that is not a unicast IPv6 address in lower case), or nil.
// It runs the reconcile's own translation, so that the admission webhook
// (controller/admission) refuses at creation with the words a reconcile
// would report later.
func CheckEIP(e *v1.IptablesEIP) error {
	_, err := EIPAddrs(&v1.IptablesEIP{Spec: e.Spec})
	return err
}

// standInEIP stands in for the addresses of an EIP that has none yet (an
// allocation pending, whose families are not known) when a rule's own
// fields are checked: both families, so that no family is refused before
// the EIP has its addresses.
var standInEIP = nat.EIP{Address: netip.MustParseAddr("192.0.2.1"), V6Address: StandInV6}

// StandInV6 stands in for an IPv6 EIP address not known yet (the admission
// webhook's, for an address Kube-OVN's IPAM may hold).
var StandInV6 = netip.MustParseAddr("2001:db8::1")

// CheckRule returns, as a *nat.FieldError, the first field of a NAT rule's
// spec (IptablesFIPRule, IptablesDnatRule, IptablesSnatRule) natgw cannot
// program on the EIP with the addresses eip (EIPAddrs; none: the EIP has
// none yet), or nil: among them nat's family rule (an IPv6 internal address
// on an IPv4-only EIP, and vice versa). Like CheckEIP it runs the
// reconcile's own translation.
func CheckRule(obj client.Object, eip nat.EIP) error {
	_, err := RuleObject(obj, eip)
	return err
}

// RuleObject returns the natgw object the reconcile programs for a NAT
// rule (IptablesFIPRule, IptablesDnatRule, IptablesSnatRule) on the EIP
// with the addresses eip (none: stand-ins of both families), or the *nat.FieldError of the
// first field it cannot program. The admission webhook checks a rule
// against the others of its EIP with it and nat.State, natgw's one
// conflict rule set.
func RuleObject(obj client.Object, eip nat.EIP) (nat.Object, error) {
	if len(eip.Addrs()) == 0 {
		eip = standInEIP
	}
	switch o := obj.(type) {
	case *v1.IptablesFIPRule:
		return fipObject(o, eip)
	case *v1.IptablesDnatRule:
		return dnatObject(o, eip)
	case *v1.IptablesSnatRule:
		return snatObject(o, eip)
	}
	return nat.Object{}, fmt.Errorf("check rule: %T is not a NAT rule", obj)
}
