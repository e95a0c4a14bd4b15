// Package nat is natgw's data plane model: the objects a VPC NAT gateway
// programs (EIPs, floating IPs, port DNATs, CIDR SNATs and routes), their
// validation and conflict rules, and the Dataplane interface that the
// nftables and iptables-legacy backends implement.
//
// Every object carries the Kubernetes UID of its owner. A backend keys all
// kernel state by that UID, so an object can be deleted knowing only its UID.
//
// Objects are IPv4 or IPv6: a FIP, DNAT or SNAT takes the family of its
// addresses, which must agree (Validate refuses a mix, naming the field).
// An EIP has an IPv4 address, an IPv6 address or both.
package nat

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Kind names the type of an Object.
type Kind string

// The kinds of objects a gateway programs.
const (
	KindEIP   Kind = "eip"
	KindFIP   Kind = "fip"
	KindDNAT  Kind = "dnat"
	KindSNAT  Kind = "snat"
	KindRoute Kind = "route"
)

// Kinds lists every Kind in the order a backend programs them.
var Kinds = []Kind{KindEIP, KindRoute, KindFIP, KindDNAT, KindSNAT}

// Protocol is a transport protocol of a port DNAT.
type Protocol string

// Supported DNAT protocols.
const (
	TCP  Protocol = "tcp"
	UDP  Protocol = "udp"
	SCTP Protocol = "sctp"
)

// Number returns the IANA protocol number (6, 17 or 132), or 0 if unknown.
func (p Protocol) Number() uint8 {
	switch p {
	case TCP:
		return 6
	case UDP:
		return 17
	case SCTP:
		return 132
	}
	return 0
}

// Object is one thing programmed on a gateway: exactly one of the payload
// pointers is set, matching Kind. UID is the owner's Kubernetes UID.
type Object struct {
	UID   string `json:"uid"`
	Kind  Kind   `json:"kind"`
	EIP   *EIP   `json:"eip,omitempty"`
	FIP   *FIP   `json:"fip,omitempty"`
	DNAT  *DNAT  `json:"dnat,omitempty"`
	SNAT  *SNAT  `json:"snat,omitempty"`
	Route *Route `json:"route,omitempty"`
}

// EIP is an external address of the gateway: an IPv4 address (Address,
// PrefixLen), an IPv6 address (V6Address, V6PrefixLen) or both. Applying it
// puts its addresses on the external interface (IPv4 with a gratuitous
// ARP, IPv6 with an unsolicited neighbour advertisement) and, when QoS is
// set, polices the EIP's traffic. An IPv6-only EIP has no Address (the
// zero netip.Addr) and PrefixLen 0.
type EIP struct {
	Address     netip.Addr `json:"address"`
	PrefixLen   int        `json:"prefixLen"`
	V6Address   netip.Addr `json:"v6Address,omitzero"`
	V6PrefixLen int        `json:"v6PrefixLen,omitempty"`
	QoS         *QoS       `json:"qos,omitempty"`
}

// Addrs returns the EIP's addresses: the IPv4 one first, then the IPv6
// one, each only if set.
func (e EIP) Addrs() []netip.Addr {
	out := make([]netip.Addr, 0, 2)
	if e.Address.IsValid() {
		out = append(out, e.Address)
	}
	if e.V6Address.IsValid() {
		out = append(out, e.V6Address)
	}
	return out
}

// Prefixes returns the EIP's addresses with their prefix lengths, as they
// go on the external interface (IPv4 first).
func (e EIP) Prefixes() []netip.Prefix {
	out := make([]netip.Prefix, 0, 2)
	if e.Address.IsValid() {
		out = append(out, netip.PrefixFrom(e.Address, e.PrefixLen))
	}
	if e.V6Address.IsValid() {
		out = append(out, netip.PrefixFrom(e.V6Address, e.V6PrefixLen))
	}
	return out
}

// AddressFor returns the EIP's address of the family of internal (what a
// FIP, DNAT or SNAT of that internal address or CIDR uses). field names the
// caller's internal field in the error: a *FieldError when the EIP has no
// address of that family (an IPv6 internal address on an IPv4-only EIP).
func (e EIP) AddressFor(field string, internal netip.Addr) (netip.Addr, error) {
	a := e.Address
	if internal.Is6() {
		a = e.V6Address
	}
	if !a.IsValid() {
		have := "IPv6"
		if e.Address.IsValid() {
			have = "IPv4"
		}
		return netip.Addr{}, &FieldError{Field: field, Value: addrText(internal),
			Reason: fmt.Sprintf("an %s address, but the EIP has no %s address (it is %s only)", Family(internal), Family(internal), have)}
	}
	return a, nil
}

// QoS polices an EIP's traffic like upstream's `tc ... police ... drop`:
// packets beyond rate+burst are dropped. Rates are in Mbit/s, bursts in
// Mbit; zero means unlimited in that direction.
type QoS struct {
	IngressRateMbps  uint32 `json:"ingressRateMbps,omitempty"`
	IngressBurstMbit uint32 `json:"ingressBurstMbit,omitempty"`
	EgressRateMbps   uint32 `json:"egressRateMbps,omitempty"`
	EgressBurstMbit  uint32 `json:"egressBurstMbit,omitempty"`
}

// FIP is a 1:1 floating IP: traffic to EIP goes to InternalIP, and traffic
// from InternalIP leaves with source EIP.
type FIP struct {
	EIP        netip.Addr `json:"eip"`
	InternalIP netip.Addr `json:"internalIP"`
}

// DNAT forwards (EIP, Protocol, ExternalPort) to InternalIP:InternalPort.
//
// (EIP, Protocol, ExternalPort) is the DNAT's identity. An exclusive DNAT
// (Type "" or "exclusive", the default) holds its identity alone. Share
// DNATs (Type "share", Kube-OVN master's IptablesDnatRule spec.type) on one
// identity are its backends: each is its own object with its own UID, new
// connections to the identity are spread at random over them and stay on
// the backend conntrack pinned them to.
type DNAT struct {
	EIP          netip.Addr `json:"eip"`
	Protocol     Protocol   `json:"protocol"`
	ExternalPort uint16     `json:"externalPort"`
	InternalIP   netip.Addr `json:"internalIP"`
	InternalPort uint16     `json:"internalPort"`
	Type         DNATType   `json:"type,omitempty"`
}

// DNATType says whether a DNAT holds its identity alone or shares it.
type DNATType string

// DNAT types (Kube-OVN master's IptablesDnatRule spec.type values).
const (
	// DNATExclusive is the default: one DNAT per identity. The empty
	// type means the same.
	DNATExclusive DNATType = "exclusive"
	// DNATShare makes the DNAT one backend of its identity.
	DNATShare DNATType = "share"
)

// Shared reports whether d is a backend of a share identity.
func (d DNAT) Shared() bool { return d.Type == DNATShare }

// sameDNAT compares two DNATs with the empty type read as exclusive.
func sameDNAT(a, b DNAT) bool {
	if a.Type == "" {
		a.Type = DNATExclusive
	}
	if b.Type == "" {
		b.Type = DNATExclusive
	}
	return a == b
}

// SNAT translates traffic from InternalCIDR leaving through the external
// interface to source EIP. Overlapping CIDRs match longest prefix first.
type SNAT struct {
	EIP          netip.Addr   `json:"eip"`
	InternalCIDR netip.Prefix `json:"internalCIDR"`
	RandomFully  bool         `json:"randomFully,omitempty"`
}

// RouteDevice says which of the gateway's interfaces a route leaves through.
type RouteDevice string

// Route devices.
const (
	// DeviceInternal is the VPC-side interface (eth0 in Kube-OVN).
	DeviceInternal RouteDevice = "internal"
	// DeviceExternal is the external interface (net1 in Kube-OVN).
	DeviceExternal RouteDevice = "external"
)

// Route is a static route on the gateway: Destination via NextHop through
// Device. A route through the external device is installed onlink, like
// upstream's default route via the external gateway.
type Route struct {
	Destination netip.Prefix `json:"destination"`
	NextHop     netip.Addr   `json:"nextHop"`
	Device      RouteDevice  `json:"device"`
}

// String gives a short human-readable form, e.g. "fip 3f2c…: 192.0.2.10 -> 10.0.1.5".
func (o Object) String() string {
	switch {
	case o.Kind == KindEIP && o.EIP != nil:
		ps := o.EIP.Prefixes()
		t := make([]string, len(ps))
		for i, p := range ps {
			t[i] = p.String()
		}
		return fmt.Sprintf("eip %s: %s", o.UID, strings.Join(t, " "))
	case o.Kind == KindFIP && o.FIP != nil:
		return fmt.Sprintf("fip %s: %s <-> %s", o.UID, o.FIP.EIP, o.FIP.InternalIP)
	case o.Kind == KindDNAT && o.DNAT != nil:
		d := o.DNAT
		share := ""
		if d.Shared() {
			share = " (share)"
		}
		return fmt.Sprintf("dnat %s: %s:%d/%s -> %s:%d%s", o.UID, d.EIP, d.ExternalPort, d.Protocol, d.InternalIP, d.InternalPort, share)
	case o.Kind == KindSNAT && o.SNAT != nil:
		return fmt.Sprintf("snat %s: %s -> %s", o.UID, o.SNAT.InternalCIDR, o.SNAT.EIP)
	case o.Kind == KindRoute && o.Route != nil:
		r := o.Route
		return fmt.Sprintf("route %s: %s via %s dev %s", o.UID, r.Destination, r.NextHop, r.Device)
	}
	return fmt.Sprintf("%s %s", o.Kind, o.UID)
}

// Equal reports whether two objects have the same UID, kind and spec.
func (o Object) Equal(p Object) bool {
	if o.UID != p.UID || o.Kind != p.Kind {
		return false
	}
	switch o.Kind {
	case KindEIP:
		return ptrEqual(o.EIP, p.EIP, func(a, b EIP) bool {
			return a.Address == b.Address && a.PrefixLen == b.PrefixLen && a.V6Address == b.V6Address && a.V6PrefixLen == b.V6PrefixLen && ptrEqual(a.QoS, b.QoS, func(x, y QoS) bool { return x == y })
		})
	case KindFIP:
		return ptrEqual(o.FIP, p.FIP, func(a, b FIP) bool { return a == b })
	case KindDNAT:
		return ptrEqual(o.DNAT, p.DNAT, sameDNAT)
	case KindSNAT:
		return ptrEqual(o.SNAT, p.SNAT, func(a, b SNAT) bool { return a == b })
	case KindRoute:
		return ptrEqual(o.Route, p.Route, func(a, b Route) bool { return a == b })
	}
	return false
}

func ptrEqual[T any](a, b *T, eq func(T, T) bool) bool {
	if a == nil || b == nil {
		return a == b
	}
	return eq(*a, *b)
}

// UIDs returns the UIDs of objs, in their order (an empty slice, not nil,
// for none).
func UIDs(objs []Object) []string {
	out := make([]string, len(objs))
	for i, o := range objs {
		out[i] = o.UID
	}
	return out
}

// SortObjects orders objects by kind (in Kinds order) and then UID, the
// canonical order of List results.
func SortObjects(objs []Object) {
	// UIDs are unique in every list a backend returns, so an unstable
	// sort gives the canonical order (and is several times faster at 100k).
	slices.SortFunc(objs, func(a, b Object) int {
		if a.Kind != b.Kind {
			return cmp.Compare(kindRank(a.Kind), kindRank(b.Kind))
		}
		return strings.Compare(a.UID, b.UID)
	})
}

func kindRank(k Kind) int {
	for i, kk := range Kinds {
		if kk == k {
			return i
		}
	}
	return len(Kinds)
}

// Addresses returns the EIP an object is about (FIP, DNAT, SNAT, EIP) and,
// when it has one, its internal address (FIP, DNAT). Backends use them to
// clean conntrack after a change. For an EIP it is the IPv4 address, or
// the IPv6 one of an IPv6-only EIP (EIP.Addrs has both).
func (o Object) Addresses() (eip, internal netip.Addr) {
	switch o.Kind {
	case KindEIP:
		if o.EIP != nil {
			if !o.EIP.Address.IsValid() {
				return o.EIP.V6Address, netip.Addr{}
			}
			return o.EIP.Address, netip.Addr{}
		}
	case KindFIP:
		if o.FIP != nil {
			return o.FIP.EIP, o.FIP.InternalIP
		}
	case KindDNAT:
		if o.DNAT != nil {
			return o.DNAT.EIP, o.DNAT.InternalIP
		}
	case KindSNAT:
		if o.SNAT != nil {
			return o.SNAT.EIP, netip.Addr{}
		}
	}
	return netip.Addr{}, netip.Addr{}
}

// IPv6Field returns the first field of o that holds an IPv6 address or
// CIDR (its name as Validate names it, and its value), if o has one: a
// backend that programs IPv4 only refuses such an object with it.
func (o Object) IPv6Field() (field, value string, ok bool) {
	switch {
	case o.EIP != nil:
		if o.EIP.V6Address.IsValid() {
			return "eip.v6Address", o.EIP.V6Address.String(), true
		}
	case o.FIP != nil:
		if o.FIP.EIP.Is6() {
			return "fip.eip", o.FIP.EIP.String(), true
		}
	case o.DNAT != nil:
		if o.DNAT.EIP.Is6() {
			return "dnat.eip", o.DNAT.EIP.String(), true
		}
	case o.SNAT != nil:
		if o.SNAT.EIP.Is6() {
			return "snat.eip", o.SNAT.EIP.String(), true
		}
	case o.Route != nil:
		if o.Route.Destination.Addr().Is6() {
			return "route.destination", o.Route.Destination.String(), true
		}
	}
	return "", "", false
}

// IsIPv6 reports whether o is an IPv6 object (an EIP: whether it has an
// IPv6 address).
func (o Object) IsIPv6() bool {
	_, _, ok := o.IPv6Field()
	return ok
}
