package scenario

import (
	"fmt"
	"net/netip"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// FIP is one floating IP as every method sees it.
type FIP struct {
	UID      string
	EIP      netip.Addr
	Internal netip.Addr
}

// Object is the FIP as a natgw object.
func (f FIP) Object() nat.Object {
	return nat.Object{UID: f.UID, Kind: nat.KindFIP, FIP: &nat.FIP{EIP: f.EIP, InternalIP: f.Internal}}
}

// MaxFillers bounds filler indexes: EIPs come from 100.64.0.0/10, internal
// addresses from 10.0.0.0/8.
const MaxFillers = 1 << 22

// Filler returns the i-th FIP that fills the table: EIP 100.64.0.0+i+1,
// internal 10.0.0.0+i+1, and a Kubernetes-shaped 36-character UID. No
// traffic ever goes to them; they make the table big.
func Filler(i int) FIP {
	if i < 0 || i >= MaxFillers-2 {
		panic(fmt.Sprintf("filler index %d out of range", i)) // a bug in a scenario's sizes, not input
	}
	v := uint32(i + 1)
	return FIP{
		UID:      fmt.Sprintf("%08x-f111-4000-8000-%012x", v, v),
		EIP:      netip.AddrFrom4([4]byte{100, 64 | byte(v>>16&0x3f), byte(v >> 8), byte(v)}),
		Internal: netip.AddrFrom4([4]byte{10, byte(v >> 16), byte(v >> 8), byte(v)}),
	}
}

// Fillers returns n filler FIPs of a family: Filler(0..n-1), or with v6
// Filler6(0..n-1).
func Fillers(v6 bool, n int) []FIP {
	fill := Filler
	if v6 {
		fill = Filler6
	}
	out := make([]FIP, n)
	for i := range out {
		out[i] = fill(i)
	}
	return out
}

// Probe is the FIP the scenarios add, delete and send traffic to: the
// topology's first EIP to its first VPC host, so its flows are real (ext
// → gw → vm1); with v6 their IPv6 addresses in a dual-stack topology
// (netlab.GatewayOptions.IPv6).
func Probe(v6 bool) FIP {
	if v6 {
		return FIP{UID: "b0b0b0b0-0000-4000-8000-000000000006", EIP: netlab.EIP6(0), Internal: netlab.VMAddr6(0)}
	}
	return FIP{UID: "b0b0b0b0-0000-4000-8000-000000000001", EIP: netlab.EIP(0), Internal: netlab.VMAddr(0)}
}

// ProbeEIPUID is the UID of the probe's EIP object, for the methods that
// take one (EIPHolder).
const ProbeEIPUID = "b0b0b0b0-0000-4000-8000-0000000000e1"

// Objects converts FIPs to natgw objects.
func Objects(fs []FIP) []nat.Object {
	out := make([]nat.Object, len(fs))
	for i, f := range fs {
		out[i] = f.Object()
	}
	return out
}

// Filler6 is the IPv6 counterpart of Filler: the i-th IPv6 FIP that fills
// a table, EIP 2001:db8:6400::1+i (a /40 of the documentation prefix that
// the dual-stack topology does not use), internal fd00:a::1+i, and a
// 36-character UID distinct from every Filler's. No traffic goes to them.
func Filler6(i int) FIP {
	if i < 0 || i >= MaxFillers-2 {
		panic(fmt.Sprintf("filler index %d out of range", i)) // a bug in a scenario's sizes, not input
	}
	v := uint32(i + 1)
	eip := [16]byte{0x20, 0x01, 0x0d, 0xb8, 0x64}
	in := [16]byte{0xfd, 0x00, 0x00, 0x0a}
	eip[13], eip[14], eip[15] = byte(v>>16), byte(v>>8), byte(v)
	in[13], in[14], in[15] = byte(v>>16), byte(v>>8), byte(v)
	return FIP{
		UID:      fmt.Sprintf("%08x-f666-4000-8000-%012x", v, v),
		EIP:      netip.AddrFrom16(eip),
		Internal: netip.AddrFrom16(in),
	}
}
