package nat

import (
	"net/netip"
	"strings"
)

// The parsers of the text forms the API objects and Kube-OVN's script calls
// carry, shared by the controller's translation (controller/reconciler) and
// the compatibility layer (gwimage/compat), so that both accept exactly the
// same addresses. Their errors are *FieldError naming field and value, with
// no UID (the caller's object has none yet or names it itself).

// ParseIPv4 parses an IPv4 address (no prefix length, no IPv6, no zone).
func ParseIPv4(field, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return netip.Addr{}, &FieldError{Field: field, Value: s, Reason: "not an IPv4 address"}
	}
	return a, nil
}

// ParseIPv4Prefix parses an IPv4 CIDR ("198.51.100.0/24"), or a bare IPv4
// address as its /32: the forms an SNAT's internal CIDR takes in Kube-OVN's
// CRDs and in nat-gateway.sh. Host bits are kept as given; callers mask them
// or refuse them. A bare value that is not an IPv4 address fails with
// "not an IPv4 address", any other with "not an IPv4 CIDR".
func ParseIPv4Prefix(field, s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := ParseIPv4(field, s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return netip.PrefixFrom(a, 32), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() {
		return netip.Prefix{}, &FieldError{Field: field, Value: s, Reason: "not an IPv4 CIDR"}
	}
	return p, nil
}
