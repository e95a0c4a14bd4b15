package nattest

import (
	"net/netip"
	"testing"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// familyTest is a state case (no packets) with one body for both
// families: run in IPv4 under its name and in IPv6 under <name>/IPv6 (not
// for a backend of Options.NoIPv6, whose refusal of every IPv6 kind
// Packets/IPv6 checks).
func (s *suite) familyTest(name string, fn func(*testing.T, family)) test {
	return test{name, func(t *testing.T) {
		fn(t, ipv4)
		if !s.opts.NoIPv6 {
			t.Run("IPv6", func(t *testing.T) { fn(t, ipv6) })
		}
	}}
}

// stateEnv is the env of a state case in family f: a stand-alone gateway
// namespace (GatewayNS; in IPv6 with IPv6 addresses on net1 and eth0 too,
// so IPv6 next hops are on link).
func (s *suite) stateEnv(t *testing.T, f family) *env {
	t.Helper()
	return s.newEnvWith(t, false, netlab.GatewayOptions{IPv6: f.v6})
}

// vm is address i of the family's VPC network (VPC host i's, i from 0).
func (f family) vm(i int) netip.Addr {
	if f.v6 {
		return netlab.VMAddr6(i)
	}
	return netlab.VMAddr(i)
}

// pick is the prefix of the family: v4 or v6.
func (f family) pick(v4, v6 string) netip.Prefix {
	if f.v6 {
		return prefix(v6)
	}
	return prefix(v4)
}

// other is the other family.
func (f family) other() family { return family{v6: !f.v6} }

// eipQoS is eipObject with QoS q.
func (f family) eipQoS(uid string, a netip.Addr, q nat.QoS) nat.Object {
	o := f.eipObject(uid, a)
	o.EIP.QoS = &q
	return o
}

// sampleOf is sample() in family f: the same kinds and shapes at the same
// positions (IPv6: IPv6-only EIPs, IPv6 internal addresses, CIDRs and
// routes).
func sampleOf(f family) []nat.Object {
	if !f.v6 {
		return sample()
	}
	return []nat.Object{
		f.eipObject(UID(nat.KindEIP, 0), f.eip(0)),
		f.eipQoS(UID(nat.KindEIP, 1), f.eip(1), nat.QoS{IngressRateMbps: 10, IngressBurstMbit: 1, EgressRateMbps: 20, EgressBurstMbit: 2}),
		f.eipObject(UID(nat.KindEIP, 2), f.eip(2)),
		f.eipQoS(UID(nat.KindEIP, 3), f.eip(3), nat.QoS{EgressRateMbps: 5}),
		FIP(UID(nat.KindFIP, 0), f.eip(0), f.vm(0)),
		DNAT(UID(nat.KindDNAT, 0), f.eip(1), nat.TCP, 2222, f.vm(1), 8080),
		DNAT(UID(nat.KindDNAT, 1), f.eip(1), nat.UDP, 2222, f.vm(1), 8081),
		SNAT(UID(nat.KindSNAT, 0), f.eip(2), netlab.VPCNet6, false),
		SNAT(UID(nat.KindSNAT, 1), f.eip(3), f.vm12Net(), true),
		Route(UID(nat.KindRoute, 0), prefix("2001:db8:300::/48"), f.vm(0), nat.DeviceInternal),
		Route(UID(nat.KindRoute, 1), prefix("::/0"), netlab.ExtAddr6, nat.DeviceExternal),
	}
}

// benchAddr is benchAddr(first, second, i) in IPv4; in IPv6 address i of
// fd00:<first>:<second>::/48 (distinct for distinct first, second, i).
func (f family) benchAddr(first, second byte, i int) netip.Addr {
	if !f.v6 {
		return benchAddr(first, second, i)
	}
	n := uint32(i + 1)
	return netip.AddrFrom16([16]byte{0xfd, 0, 0, first, 0, second, 12: byte(n >> 24), 13: byte(n >> 16), 14: byte(n >> 8), 15: byte(n)})
}
