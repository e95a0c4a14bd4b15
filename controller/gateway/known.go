package gateway

import (
	"net/netip"

	"github.com/natgw/natgw/nat"
)

// knownObj is one object of Manager.known, stored by value in the map
// under its UID (the key, which shares the UID string the caller gave):
// the objects natgw programs by the thousand (FIP, DNAT, SNAT, an EIP
// without QoS) fit in two 16-byte addresses and a few small fields (48
// bytes), without an allocation of their own; any other object (an EIP with QoS, a Route, a
// value outside what the compact form holds) is kept whole in other.
// object returns exactly the nat.Object that was stored (newKnown checks
// the round trip and keeps the whole object when it would differ).
type knownObj struct {
	a, b   [16]byte // addresses in 16-byte form (addrs says which are valid IPv4)
	other  *nat.Object
	p1, p2 uint16 // DNAT: external, internal port; SNAT: prefix bits; EIP: prefix lengths
	kind   uint8  // index in knownKinds; 0: other
	flags  uint8  // knownProtos index | knownTypes index<<2 | knownRandomFully
	addrs  uint8  // knownAValid | knownA4 | knownBValid | knownB4
}

// Bits of knownObj.addrs: a (b) is a valid address; an IPv4 one.
const (
	knownAValid = 1 << iota
	knownA4
	knownBValid
	knownB4
)

// packAddr returns a in 16-byte form and its bits of knownObj.addrs
// (valid, IPv4; shifted by shift); false for an address with a zone,
// which the compact form does not hold.
func packAddr(a netip.Addr, shift uint) ([16]byte, uint8, bool) {
	if !a.IsValid() {
		return [16]byte{}, 0, true
	}
	if a.Zone() != "" {
		return [16]byte{}, 0, false
	}
	bits := uint8(knownAValid)
	if a.Is4() {
		bits |= knownA4
	}
	return a.As16(), bits << shift, true
}

// unpackAddr is packAddr's inverse (bits unshifted).
func unpackAddr(b [16]byte, bits uint8) netip.Addr {
	switch {
	case bits&knownAValid == 0:
		return netip.Addr{}
	case bits&knownA4 != 0:
		return netip.AddrFrom16(b).Unmap()
	}
	return netip.AddrFrom16(b)
}

// withAddrs sets k's addresses a and b (false: one does not fit).
func (k knownObj) withAddrs(a, b netip.Addr) (knownObj, bool) {
	var okA, okB bool
	var bitsA, bitsB uint8
	k.a, bitsA, okA = packAddr(a, 0)
	k.b, bitsB, okB = packAddr(b, 2)
	k.addrs = bitsA | bitsB
	return k, okA && okB
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
		return knownObj{kind: 2}.withAddrs(o.FIP.EIP, o.FIP.InternalIP)
	case o.Kind == nat.KindDNAT && o.DNAT != nil:
		d := o.DNAT
		p, okP := index(knownProtos[:], d.Protocol)
		t, okT := index(knownTypes[:], d.Type)
		k, ok := knownObj{kind: 3, p1: d.ExternalPort, p2: d.InternalPort, flags: p | t<<2}.withAddrs(d.EIP, d.InternalIP)
		return k, ok && okP && okT
	case o.Kind == nat.KindSNAT && o.SNAT != nil && o.SNAT.InternalCIDR.IsValid():
		s := o.SNAT
		k := knownObj{kind: 4, p1: uint16(s.InternalCIDR.Bits())}
		if s.RandomFully {
			k.flags = knownRandomFully
		}
		return k.withAddrs(s.EIP, s.InternalCIDR.Addr())
	case o.Kind == nat.KindEIP && o.EIP != nil && o.EIP.QoS == nil:
		e := o.EIP
		fits := func(n int) bool { return n >= 0 && n <= 0xffff }
		k, ok := knownObj{kind: 1, p1: uint16(e.PrefixLen), p2: uint16(e.V6PrefixLen)}.withAddrs(e.Address, e.V6Address)
		return k, ok && fits(e.PrefixLen) && fits(e.V6PrefixLen)
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
	a, b := unpackAddr(k.a, k.addrs), unpackAddr(k.b, k.addrs>>2)
	switch o.Kind {
	case nat.KindFIP:
		o.FIP = &nat.FIP{EIP: a, InternalIP: b}
	case nat.KindDNAT:
		o.DNAT = &nat.DNAT{EIP: a, InternalIP: b, ExternalPort: k.p1, InternalPort: k.p2, Protocol: knownProtos[k.flags&3], Type: knownTypes[k.flags>>2&3]}
	case nat.KindSNAT:
		o.SNAT = &nat.SNAT{EIP: a, InternalCIDR: netip.PrefixFrom(b, int(k.p1)), RandomFully: k.flags&knownRandomFully != 0}
	case nat.KindEIP:
		o.EIP = &nat.EIP{Address: a, V6Address: b, PrefixLen: int(k.p1), V6PrefixLen: int(k.p2)}
	}
	return o
}
