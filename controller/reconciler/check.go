package reconciler

import (
	"fmt"
	"net/netip"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/nat"
)

// CheckEIP returns, as a *nat.FieldError, what in an IptablesEIP's spec
// natgw cannot program (spec.v4ip that is not a unicast IPv4 address), or nil.
// It runs the reconcile's own translation, so that the admission webhook
// (controller/admission) refuses at creation with the words a reconcile
// would report later.
func CheckEIP(e *v1.IptablesEIP) error {
	_, err := EIPAddress(&v1.IptablesEIP{Spec: e.Spec})
	return err
}

// standInEIP stands in for the address of an EIP that has none yet (an
// allocation pending) when a rule's own fields are checked.
var standInEIP = netip.MustParseAddr("192.0.2.1")

// CheckRule returns, as a *nat.FieldError, the first field of a NAT rule's
// spec (IptablesFIPRule, IptablesDnatRule, IptablesSnatRule) natgw cannot
// program with the EIP address eip (invalid: the EIP has none yet), or
// nil. Like CheckEIP it runs the reconcile's own translation.
func CheckRule(obj client.Object, eip netip.Addr) error {
	_, err := RuleObject(obj, eip)
	return err
}

// RuleObject returns the natgw object the reconcile programs for a NAT
// rule (IptablesFIPRule, IptablesDnatRule, IptablesSnatRule) with the EIP
// address eip (invalid: a stand-in address), or the *nat.FieldError of the
// first field it cannot program. The admission webhook checks a rule
// against the others of its EIP with it and nat.State, natgw's one
// conflict rule set.
func RuleObject(obj client.Object, eip netip.Addr) (nat.Object, error) {
	if !eip.IsValid() {
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
