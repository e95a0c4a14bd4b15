package gateway

import (
	"net/netip"

	"github.com/natgw/natgw/nat"
)

// knownObj is one object of Manager.known, stored by value in the map
// under its UID (the key, which shares the UID string the caller gave):
// the objects natgw programs by the thousand (FIP, DNAT, SNAT, an EIP
// without QoS) fit in two addresses and a few small fields, without an
// allocation of their own; any other object (an EIP with QoS, a Route, a
// value outside what the compact form holds) is kept whole in other.
// object returns exactly the nat.Object that was stored (newKnown checks
// the round trip and keeps the whole object when it would differ).
type knownObj struct {
	a, b   netip.Addr
	other  *nat.Object
	p1, p2 uint16 // DNAT: external, internal port; SNAT: prefix bits; EIP: prefix lengths
	kind   uint8  // index in knownKinds; 0: other
	flags  uint8  // knownProto* | knownType* | knownRandomFully
}

// knownKinds are the kinds the compact form holds, by their index in kind.
var knownKinds = [...]nat.Kind{1: nat.KindEIP, 2: nat.KindFIP, 3: nat.KindDNAT, 4: nat.KindSNAT}

// Protocols (bits 0-1) and DNAT types (bits 2-3) of the compact form, and
// an SNAT's RandomFully (bit 4).
var (
	knownProtos = [...]nat.Protocol{"", nat.TCP, nat.UDP, nat.SCTP}
	knownTypes  = [...]nat.DNATType{"", nat.DNATExclusive, nat.DNATShare}
)

const knownRandomFully = 1 << 4

// newKnown returns o's entry in Manager.known.
func newKnown(o nat.Object) knownObj {
	if k, ok := compactKnown(o); ok && sameObject(k.object(o.UID), o) {
		return k
	}
	return knownObj{other: &o}
}

// sameObject is true when a and b are the same object field for field
// (every payload compared by value, unlike nat.Object.Equal, which
// compares only the payload of the kind).
func sameObject(a, b nat.Object) bool {
	return a.UID == b.UID && a.Kind == b.Kind && samePtr(a.EIP, b.EIP) && samePtr(a.FIP, b.FIP) &&
		samePtr(a.DNAT, b.DNAT) && samePtr(a.SNAT, b.SNAT) && samePtr(a.Route, b.Route)
}

func samePtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// compactKnown returns o in the compact form (false: it does not fit).
func compactKnown(o nat.Object) (knownObj, bool) {
	switch {
	case o.Kind == nat.KindFIP && o.FIP != nil:
		return knownObj{kind: 2, a: o.FIP.EIP, b: o.FIP.InternalIP}, true
	case o.Kind == nat.KindDNAT && o.DNAT != nil:
		d := o.DNAT
		p, okP := index(knownProtos[:], d.Protocol)
		t, okT := index(knownTypes[:], d.Type)
		return knownObj{kind: 3, a: d.EIP, b: d.InternalIP, p1: d.ExternalPort, p2: d.InternalPort, flags: p | t<<2}, okP && okT
	case o.Kind == nat.KindSNAT && o.SNAT != nil && o.SNAT.InternalCIDR.IsValid():
		s := o.SNAT
		k := knownObj{kind: 4, a: s.EIP, b: s.InternalCIDR.Addr(), p1: uint16(s.InternalCIDR.Bits())}
		if s.RandomFully {
			k.flags = knownRandomFully
		}
		return k, true
	case o.Kind == nat.KindEIP && o.EIP != nil && o.EIP.QoS == nil:
		e := o.EIP
		fits := func(n int) bool { return n >= 0 && n <= 0xffff }
		return knownObj{kind: 1, a: e.Address, b: e.V6Address, p1: uint16(e.PrefixLen), p2: uint16(e.V6PrefixLen)}, fits(e.PrefixLen) && fits(e.V6PrefixLen)
	}
	return knownObj{}, false
}

// index returns v's index in vs (false: not there).
func index[T comparable](vs []T, v T) (uint8, bool) {
	for i, x := range vs {
		if x == v {
			return uint8(i), true
		}
	}
	return 0, false
}

// Kind returns the entry's kind.
func (k knownObj) Kind() nat.Kind {
	if k.other != nil {
		return k.other.Kind
	}
	return knownKinds[k.kind]
}

// object returns the entry as the nat.Object stored under uid.
func (k knownObj) object(uid string) nat.Object {
	if k.other != nil {
		return *k.other
	}
	o := nat.Object{UID: uid, Kind: knownKinds[k.kind]}
	switch o.Kind {
	case nat.KindFIP:
		o.FIP = &nat.FIP{EIP: k.a, InternalIP: k.b}
	case nat.KindDNAT:
		o.DNAT = &nat.DNAT{EIP: k.a, InternalIP: k.b, ExternalPort: k.p1, InternalPort: k.p2, Protocol: knownProtos[k.flags&3], Type: knownTypes[k.flags>>2&3]}
	case nat.KindSNAT:
		o.SNAT = &nat.SNAT{EIP: k.a, InternalCIDR: netip.PrefixFrom(k.b, int(k.p1)), RandomFully: k.flags&knownRandomFully != 0}
	case nat.KindEIP:
		o.EIP = &nat.EIP{Address: k.a, V6Address: k.b, PrefixLen: int(k.p1), V6PrefixLen: int(k.p2)}
	}
	return o
}
