package nat

import (
	"fmt"
	"net/netip"
	"strings"
)

// The one home of natgw's parse and validity rules for addresses, prefixes,
// ports, protocols and QoS matches, in the text forms the API objects and
// Kube-OVN's script calls carry. The admission webhook, the controller's
// translation (controller/reconciler), the compatibility layer
// (gwimage/compat) and the agent (Object.Validate) all call these, so that
// every path gives the same verdict naming the same field. Their errors are *FieldError naming field and value, with
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

// CheckUnicastIPv4 is natgw's one rule for an IPv4 address a gateway
// programs (an EIP, an internal IP, a next hop): a valid IPv4 address that
// is not 0.0.0.0, loopback (127/8), multicast or 255.255.255.255. The error
// is a *FieldError (value "" for a missing address).
func CheckUnicastIPv4(field string, a netip.Addr) error {
	if !a.Is4() && a.IsValid() {
		return &FieldError{Field: field, Value: a.String(), Reason: "not an IPv4 address"}
	}
	if fe := checkUnicast(field, a); fe != nil {
		return fe
	}
	return nil
}

// CheckUnicast is natgw's one rule for an address a gateway programs, of
// either family: CheckUnicastIPv4's rule for IPv4; for IPv6 a valid
// address that is not unspecified (::), loopback (::1), multicast
// (ff00::/8), link-local (fe80::/10) or IPv4-mapped (::ffff:0:0/96, which
// would alias an IPv4 address), and has no zone. The error is a
// *FieldError (value "" for a missing address).
func CheckUnicast(field string, a netip.Addr) error {
	if fe := checkUnicast(field, a); fe != nil {
		return fe
	}
	return nil
}

func checkUnicast(field string, a netip.Addr) *FieldError {
	bad := func(reason string) *FieldError { return &FieldError{Field: field, Value: addrText(a), Reason: reason} }
	switch {
	case !a.IsValid():
		return bad("missing address")
	case a.Is4In6():
		return bad("an IPv4-mapped IPv6 address (write the IPv4 address)")
	case a.Zone() != "":
		return bad("an address with a zone")
	case a.IsUnspecified(), a.IsMulticast(), a.IsLoopback(), a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return bad("not a unicast address")
	case a.Is6() && (a.IsLinkLocalUnicast() || a.IsInterfaceLocalMulticast()):
		return bad("a link-local IPv6 address")
	}
	return nil
}

// Family names an address family in messages: "IPv4" or "IPv6".
func Family(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// CheckSameFamily is natgw's one rule that an object's addresses are of
// one family (an IPv6 internal address needs an IPv6 EIP): field and a
// name the value refused, eip the address it must agree with.
func CheckSameFamily(field string, a netip.Addr, eipField string, eip netip.Addr) error {
	if a.Is4() == eip.Is4() {
		return nil
	}
	return &FieldError{Field: field, Value: addrText(a),
		Reason: fmt.Sprintf("an %s address with the %s %s %s (an object's addresses must be of one family)", Family(a), Family(eip), eipField, eip)}
}

func addrText(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// ParseUnicastIPv4 parses an address a gateway programs: ParseIPv4, then
// CheckUnicastIPv4 (the check Object.Validate makes, so a value refused
// here is refused by the agent too).
func ParseUnicastIPv4(field, s string) (netip.Addr, error) {
	a, err := ParseIPv4(field, s)
	if err != nil {
		return netip.Addr{}, err
	}
	if err := CheckUnicastIPv4(field, a); err != nil {
		return netip.Addr{}, err
	}
	return a, nil
}

// ParseUnicastIPv6 parses an IPv6 address a gateway programs (an EIP's
// spec.v6ip): ParseUnicastIP, refusing an IPv4 address. IPv6 text is taken
// in lower case only, as Kube-OVN refuses upper case in an EIP's or a Vip's
// v6ip (vpc_nat_gw_eip.go:95-99, vip.go:100-103 in v1.16.2).
func ParseUnicastIPv6(field, s string) (netip.Addr, error) {
	a, err := ParseUnicastIP(field, s)
	if err != nil {
		return netip.Addr{}, err
	}
	if !a.Is6() {
		return netip.Addr{}, &FieldError{Field: field, Value: s, Reason: "not an IPv6 address"}
	}
	if s != strings.ToLower(s) {
		return netip.Addr{}, &FieldError{Field: field, Value: s, Reason: "not in lower case (Kube-OVN refuses upper case in an IPv6 address)"}
	}
	return a, nil
}

// ParseIP parses an address of either family (no prefix length, no zone).
func ParseIP(field, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, &FieldError{Field: field, Value: s, Reason: "not an IP address"}
	}
	return a, nil
}

// ParseUnicastIP parses an address a gateway programs, of either family:
// ParseIP, then CheckUnicast (the check Object.Validate makes).
func ParseUnicastIP(field, s string) (netip.Addr, error) {
	a, err := ParseIP(field, s)
	if err != nil {
		return netip.Addr{}, err
	}
	if err := CheckUnicast(field, a); err != nil {
		return netip.Addr{}, err
	}
	return a, nil
}

// ParsePrefix parses a CIDR of either family ("198.51.100.0/24",
// "2001:db8:1::/64"), or a bare address as its /32 or /128, as
// ParseIPv4Prefix does for IPv4. Host bits are kept as given.
func ParsePrefix(field, s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := ParseIP(field, s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, &FieldError{Field: field, Value: s, Reason: "not a CIDR"}
	}
	return p, nil
}

// ParseIPv4Network parses an IPv4 network in CIDR form with its host bits
// clear ("10.1.0.0/16"), as a route destination is written. A bare address
// or host bits set are refused, naming the masked form.
func ParseIPv4Network(field, s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() {
		return netip.Prefix{}, &FieldError{Field: field, Value: s, Reason: "not an IPv4 CIDR"}
	}
	if err := CheckNetwork(field, p); err != nil {
		return netip.Prefix{}, err
	}
	return p, nil
}

// CheckNetwork is natgw's one rule that a network (a route's destination,
// an SNAT's internal CIDR) has its host bits clear; the error names the
// masked form.
func CheckNetwork(field string, p netip.Prefix) error {
	if fe := checkNetwork(field, p); fe != nil {
		return fe
	}
	return nil
}

// CheckRoute is natgw's one rule for a route: dst a network of either
// family with its host bits clear (CheckNetwork), hop a unicast next hop
// (CheckUnicast) of dst's family. dstField and hopField name them in the
// error, a *FieldError.
func CheckRoute(dstField string, dst netip.Prefix, hopField string, hop netip.Addr) error {
	if fe := checkRoute(dstField, dst, hopField, hop); fe != nil {
		return fe
	}
	return nil
}

func checkRoute(dstField string, dst netip.Prefix, hopField string, hop netip.Addr) *FieldError {
	if !dst.IsValid() || dst.Addr().Is4In6() || dst.Addr().Zone() != "" {
		return &FieldError{Field: dstField, Value: prefixText(dst), Reason: "must be an IPv4 or IPv6 CIDR"}
	}
	if fe := checkNetwork(dstField, dst); fe != nil {
		return fe
	}
	if fe := checkUnicast(hopField, hop); fe != nil {
		return fe
	}
	if hop.Is4() != dst.Addr().Is4() {
		return &FieldError{Field: hopField, Value: hop.String(), Reason: fmt.Sprintf("an %s next hop for the %s %s %s (a route's addresses must be of one family)",
			Family(hop), Family(dst.Addr()), dstField, dst)}
	}
	return nil
}

func checkNetwork(field string, p netip.Prefix) *FieldError {
	if p.Masked() != p {
		return &FieldError{Field: field, Value: p.String(), Reason: "host bits set (want " + p.Masked().String() + ")"}
	}
	return nil
}

// ParsePort parses a TCP/UDP/SCTP port: decimal digits without sign or
// leading zero, 1..65535. A leading zero is refused because upstream's
// script hands the text to iptables, which reads it as octal: "010" is
// port 8 there and "080" an error ("invalid port/service").
func ParsePort(field, s string) (uint16, error) {
	bad := &FieldError{Field: field, Value: s, Reason: "not a port number from 1 to 65535 (decimal, no leading zero)"}
	if s == "" || len(s) > 5 || s[0] == '0' {
		return 0, bad
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, bad
		}
		n = n*10 + int(c-'0')
	}
	if n > 65535 {
		return 0, bad
	}
	return uint16(n), nil
}

// DefaultProtocol is the protocol of a DNAT that names none (Kube-OVN's
// IptablesDnatRule defaults spec.protocol to tcp).
const DefaultProtocol = TCP

// ParseProtocol parses a DNAT protocol: tcp, udp or sctp in any case
// (iptables' -p, which upstream's script uses, takes TCP as tcp); ""
// is DefaultProtocol.
func ParseProtocol(field, s string) (Protocol, error) {
	if s == "" {
		return DefaultProtocol, nil
	}
	p := Protocol(strings.ToLower(s))
	if p.Number() == 0 {
		return "", &FieldError{Field: field, Value: s, Reason: "must be tcp, udp or sctp"}
	}
	return p, nil
}

// ParseQoSMatch parses a QoS rule's ip match, Kube-OVN's matchValue
// "src CIDR" or "dst CIDR" (one space; a bare address is not a CIDR). The
// prefix is returned as written (host bits kept); callers mask it. Both
// families parse, as upstream's check does; a data plane that programs
// IPv4 only refuses IPv6 itself.
func ParseQoSMatch(field, s string) (dir string, p netip.Prefix, err error) {
	dir, cidr, ok := strings.Cut(s, " ")
	if ok && (dir == "src" || dir == "dst") {
		if p, perr := netip.ParsePrefix(cidr); perr == nil {
			return dir, p, nil
		}
	}
	return "", netip.Prefix{}, &FieldError{Field: field, Value: s, Reason: `want "src CIDR" or "dst CIDR"`}
}
