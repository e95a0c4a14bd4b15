package nattest

import (
	"fmt"
	"net/netip"

	"github.com/natgw/natgw/nat"
)

// UID returns a deterministic Kubernetes-shaped UID (36 characters) for
// test object n of the given kind, so kernel comments have realistic size.
func UID(kind nat.Kind, n int) string {
	var k int
	for i, x := range nat.Kinds {
		if x == kind {
			k = i + 1
		}
	}
	return fmt.Sprintf("%08x-0000-4000-8000-%012x", k, n)
}

// EIP returns an EIP object for addr/24 (the standard topology's prefix).
func EIP(uid string, addr netip.Addr) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindEIP, EIP: &nat.EIP{Address: addr, PrefixLen: 24}}
}

// EIPQoS returns an EIP object for addr/24 with QoS.
func EIPQoS(uid string, addr netip.Addr, q nat.QoS) nat.Object {
	o := EIP(uid, addr)
	o.EIP.QoS = &q
	return o
}

// FIP returns a floating IP object.
func FIP(uid string, eip, internal netip.Addr) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip, InternalIP: internal}}
}

// DNAT returns a port DNAT object.
func DNAT(uid string, eip netip.Addr, proto nat.Protocol, extPort uint16, internal netip.Addr, intPort uint16) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: eip, Protocol: proto, ExternalPort: extPort, InternalIP: internal, InternalPort: intPort}}
}

// ShareDNAT returns a share DNAT object: one backend of the identity
// (eip, proto, extPort).
func ShareDNAT(uid string, eip netip.Addr, proto nat.Protocol, extPort uint16, internal netip.Addr, intPort uint16) nat.Object {
	o := DNAT(uid, eip, proto, extPort, internal, intPort)
	o.DNAT.Type = nat.DNATShare
	return o
}

// SNAT returns a CIDR SNAT object.
func SNAT(uid string, eip netip.Addr, cidr netip.Prefix, randomFully bool) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: eip, InternalCIDR: cidr, RandomFully: randomFully}}
}

// Route returns a route object.
func Route(uid string, dst netip.Prefix, via netip.Addr, dev nat.RouteDevice) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindRoute, Route: &nat.Route{Destination: dst, NextHop: via, Device: dev}}
}

var (
	addr   = netip.MustParseAddr
	prefix = netip.MustParsePrefix
)
