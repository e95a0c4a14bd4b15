package nat

import (
	"errors"
	"fmt"
	"net/netip"
)

// FieldError is a validation error: which field of which object holds which
// bad value, and why.
type FieldError struct {
	UID    string // the object's UID ("" when the UID itself is bad)
	Field  string // e.g. "fip.internalIP"
	Value  string // the offending value as text
	Reason string
}

func (e *FieldError) Error() string {
	if e.UID == "" {
		return fmt.Sprintf("invalid %s %q: %s", e.Field, e.Value, e.Reason)
	}
	return fmt.Sprintf("object %s: invalid %s %q: %s", e.UID, e.Field, e.Value, e.Reason)
}

// ErrInvalid is matched (errors.Is) by every validation error.
var ErrInvalid = errors.New("invalid object")

// Is makes errors.Is(err, ErrInvalid) true for every *FieldError.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// MaxUIDLen bounds a UID; Kubernetes UIDs are 36 characters.
const MaxUIDLen = 64

// uidOK admits Kubernetes UIDs and the derived UIDs of the compatibility
// layer: [A-Za-z0-9][A-Za-z0-9._:-]*, no spaces or quotes, so a UID is safe
// in an nft comment or an iptables --comment. (A table lookup per byte:
// this runs for every object of a 100k-object sync or reload, and the
// switch it replaced was a quarter of the engine's instructions of a 100k
// Sync; see bench/README.md "Scenario 2: the Sync's user-space path".)
func uidOK(uid string) bool {
	if uid == "" || uidBytes[uid[0]]&uidFirst == 0 {
		return false
	}
	for i := 1; i < len(uid); i++ {
		if uidBytes[uid[i]]&uidRest == 0 {
			return false
		}
	}
	return true
}

// uidBytes says where a byte may stand in a UID: uidFirst (letters and
// digits) anywhere, uidRest (those and . _ : -) after the first.
var uidBytes = func() (t [256]uint8) {
	for c := range 256 {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			t[c] = uidFirst | uidRest
		case c == '.' || c == '_' || c == ':' || c == '-':
			t[c] = uidRest
		}
	}
	return t
}()

const (
	uidFirst = 1 << iota
	uidRest
)

// ValidateUID checks that uid can key kernel state.
func ValidateUID(uid string) error {
	if uid == "" {
		return &FieldError{Field: "uid", Value: uid, Reason: "must not be empty"}
	}
	if len(uid) > MaxUIDLen {
		return &FieldError{Field: "uid", Value: uid, Reason: fmt.Sprintf("longer than %d characters", MaxUIDLen)}
	}
	if !uidOK(uid) {
		return &FieldError{Field: "uid", Value: uid, Reason: "may hold only letters, digits and . _ : -"}
	}
	return nil
}

// Validate checks an object on its own (not against others; see State for
// conflicts). The error is a *FieldError naming the field and the value.
func (o Object) Validate() error {
	if err := ValidateUID(o.UID); err != nil {
		return err
	}
	bad := func(field, value, reason string) error {
		return &FieldError{UID: o.UID, Field: field, Value: value, Reason: reason}
	}
	set := 0
	for _, p := range []bool{o.EIP != nil, o.FIP != nil, o.DNAT != nil, o.SNAT != nil, o.Route != nil} {
		if p {
			set++
		}
	}
	if set != 1 {
		return bad("kind", string(o.Kind), fmt.Sprintf("exactly one payload must be set, found %d", set))
	}
	unicast := func(field string, a netip.Addr) error {
		if fe := checkUnicast(field, a); fe != nil {
			fe.UID = o.UID
			return fe
		}
		return nil
	}
	network := func(field string, p netip.Prefix) error {
		if fe := checkNetwork(field, p); fe != nil {
			fe.UID = o.UID
			return fe
		}
		return nil
	}
	same := func(field string, a netip.Addr, eipField string, eip netip.Addr) error {
		if err := CheckSameFamily(field, a, eipField, eip); err != nil {
			err.(*FieldError).UID = o.UID
			return err
		}
		return nil
	}
	switch o.Kind {
	case KindEIP:
		if o.EIP == nil {
			return bad("kind", string(o.Kind), "eip payload missing")
		}
		e := o.EIP
		if !e.Address.IsValid() && !e.V6Address.IsValid() {
			return bad("eip.address", "", "missing address (an EIP has an IPv4 address, an IPv6 address in eip.v6Address, or both)")
		}
		if e.Address.IsValid() {
			if e.Address.Is6() {
				return bad("eip.address", e.Address.String(), "not an IPv4 address (an IPv6 address goes in eip.v6Address)")
			}
			if err := unicast("eip.address", e.Address); err != nil {
				return err
			}
			if e.PrefixLen < 1 || e.PrefixLen > 32 {
				return bad("eip.prefixLen", fmt.Sprint(e.PrefixLen), "must be 1..32")
			}
		} else if e.PrefixLen != 0 {
			return bad("eip.prefixLen", fmt.Sprint(e.PrefixLen), "set without an IPv4 address")
		}
		if e.V6Address.IsValid() {
			if !e.V6Address.Is6() || e.V6Address.Is4In6() {
				return bad("eip.v6Address", e.V6Address.String(), "not an IPv6 address (an IPv4 address goes in eip.address)")
			}
			if err := unicast("eip.v6Address", e.V6Address); err != nil {
				return err
			}
			if e.V6PrefixLen < 1 || e.V6PrefixLen > 128 {
				return bad("eip.v6PrefixLen", fmt.Sprint(e.V6PrefixLen), "must be 1..128")
			}
		} else if e.V6PrefixLen != 0 {
			return bad("eip.v6PrefixLen", fmt.Sprint(e.V6PrefixLen), "set without an IPv6 address")
		}
		if q := o.EIP.QoS; q != nil {
			if q.IngressBurstMbit != 0 && q.IngressRateMbps == 0 {
				return bad("eip.qos.ingressBurstMbit", fmt.Sprint(q.IngressBurstMbit), "burst without a rate")
			}
			if q.EgressBurstMbit != 0 && q.EgressRateMbps == 0 {
				return bad("eip.qos.egressBurstMbit", fmt.Sprint(q.EgressBurstMbit), "burst without a rate")
			}
			const maxRate = 100_000 // 100 Gbit/s
			if q.IngressRateMbps > maxRate {
				return bad("eip.qos.ingressRateMbps", fmt.Sprint(q.IngressRateMbps), "above 100000")
			}
			if q.EgressRateMbps > maxRate {
				return bad("eip.qos.egressRateMbps", fmt.Sprint(q.EgressRateMbps), "above 100000")
			}
		}
	case KindFIP:
		if o.FIP == nil {
			return bad("kind", string(o.Kind), "fip payload missing")
		}
		if err := unicast("fip.eip", o.FIP.EIP); err != nil {
			return err
		}
		if err := unicast("fip.internalIP", o.FIP.InternalIP); err != nil {
			return err
		}
		if err := same("fip.internalIP", o.FIP.InternalIP, "fip.eip", o.FIP.EIP); err != nil {
			return err
		}
		if o.FIP.EIP == o.FIP.InternalIP {
			return bad("fip.internalIP", o.FIP.InternalIP.String(), "equals the EIP")
		}
	case KindDNAT:
		d := o.DNAT
		if d == nil {
			return bad("kind", string(o.Kind), "dnat payload missing")
		}
		if err := unicast("dnat.eip", d.EIP); err != nil {
			return err
		}
		if d.Protocol.Number() == 0 { // canonical (lower case): ParseProtocol's output
			return bad("dnat.protocol", string(d.Protocol), "must be tcp, udp or sctp")
		}
		if d.ExternalPort == 0 {
			return bad("dnat.externalPort", "0", "must be 1..65535")
		}
		if err := unicast("dnat.internalIP", d.InternalIP); err != nil {
			return err
		}
		if err := same("dnat.internalIP", d.InternalIP, "dnat.eip", d.EIP); err != nil {
			return err
		}
		if d.InternalPort == 0 {
			return bad("dnat.internalPort", "0", "must be 1..65535")
		}
		if d.Type != "" && d.Type != DNATExclusive && d.Type != DNATShare {
			return bad("dnat.type", string(d.Type), "must be exclusive or share")
		}
	case KindSNAT:
		s := o.SNAT
		if s == nil {
			return bad("kind", string(o.Kind), "snat payload missing")
		}
		if err := unicast("snat.eip", s.EIP); err != nil {
			return err
		}
		if !s.InternalCIDR.IsValid() {
			return bad("snat.internalCIDR", "", "missing CIDR")
		}
		if a := s.InternalCIDR.Addr(); a.Is4In6() || a.Zone() != "" {
			return bad("snat.internalCIDR", s.InternalCIDR.String(), "an IPv4-mapped or zoned IPv6 CIDR")
		}
		if a := s.InternalCIDR.Addr(); a.Is4() != s.EIP.Is4() {
			return bad("snat.internalCIDR", s.InternalCIDR.String(),
				fmt.Sprintf("an %s CIDR with the %s snat.eip %s (an object's addresses must be of one family)", Family(a), Family(s.EIP), s.EIP))
		}
		if err := network("snat.internalCIDR", s.InternalCIDR); err != nil {
			return err
		}
	case KindRoute:
		r := o.Route
		if r == nil {
			return bad("kind", string(o.Kind), "route payload missing")
		}
		if fe := checkRoute("route.destination", r.Destination, "route.nextHop", r.NextHop); fe != nil {
			fe.UID = o.UID
			return fe
		}
		if r.Device != DeviceInternal && r.Device != DeviceExternal {
			return bad("route.device", string(r.Device), "must be internal or external")
		}
	default:
		return bad("kind", string(o.Kind), "must be one of eip, fip, dnat, snat, route")
	}
	return nil
}

func prefixText(p netip.Prefix) string {
	if !p.IsValid() {
		return ""
	}
	return p.String()
}
