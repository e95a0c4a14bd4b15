package nattest

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// testIPv6 runs a round trip of IPv6 objects beside IPv4 ones (apply,
// reopen, reload, update, Sync, delete by UID) and every packet case
// (packetCases: the same bodies as the IPv4 ones) in IPv6, with real TCP
// and UDP through a dual-stack topology; a backend of Options.NoIPv6 must
// refuse every IPv6 object instead.
func (s *suite) testIPv6(t *testing.T) {
	if s.opts.NoIPv6 {
		s.testIPv6Refused(t)
		return
	}
	t.Run("RoundTrip", s.testIPv6RoundTrip)
	s.runPackets(t, ipv6)
}

// EIP6 is an IPv6-only EIP object with a /64 (the dual-stack topology's
// external network).
func EIP6(uid string, a netip.Addr) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindEIP, EIP: &nat.EIP{V6Address: a, V6PrefixLen: 64}}
}

// DualEIP is a dual-stack EIP object: an IPv4 /24 and an IPv6 /64.
func DualEIP(uid string, v4, v6 netip.Addr) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindEIP, EIP: &nat.EIP{Address: v4, PrefixLen: 24, V6Address: v6, V6PrefixLen: 64}}
}

// testIPv6Refused: a backend of Options.NoIPv6 refuses each IPv6 kind
// (alone and in a batch with a valid IPv4 object) with a *nat.FieldError
// naming an IPv6 field, and neither the kernel nor List changes.
func (s *suite) testIPv6Refused(t *testing.T) {
	e := s.newEnv(t, false)
	present := sample()
	e.apply(present...)
	before := e.kernel()
	good := FIP("fip-good", netlab.EIP(6), vm3)
	v6 := netlab.EIP6(0)
	for _, bad := range []nat.Object{
		EIP6("eip6", v6),
		DualEIP("eip46", netlab.EIP(7), netlab.EIP6(1)),
		FIP("fip6", v6, netlab.VMAddr6(0)),
		DNAT("dnat6", v6, nat.TCP, 2222, netlab.VMAddr6(1), vmTCP),
		ShareDNAT("share6", v6, nat.TCP, 2223, netlab.VMAddr6(1), vmTCP),
		SNAT("snat6", v6, netlab.VPCNet6, false),
		Route("route6", netip.MustParsePrefix("::/0"), netlab.ExtAddr6, nat.DeviceExternal),
	} {
		e.run(bad.UID, func(t *testing.T) {
			for _, batch := range [][]nat.Object{{bad}, {good, bad}} {
				err := e.tryApply(batch...)
				var fe *nat.FieldError
				if !errors.As(err, &fe) || fe.UID != bad.UID || !isIPv6Text(fe.Value) {
					t.Errorf("apply %s: error %v, want a *nat.FieldError naming an IPv6 field of %s", describe(batch), err, bad.UID)
				}
				e.wantKernel("after a refused IPv6 apply", before)
				e.wantList("after a refused IPv6 apply", present...)
			}
		})
	}
}

// isIPv6Text reports whether s is an IPv6 address or CIDR.
func isIPv6Text(s string) bool {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr().Is6()
	}
	a, err := netip.ParseAddr(s)
	return err == nil && a.Is6()
}

// sample6 is one IPv6 object of every kind the IPv6 data plane takes: a
// dual-stack EIP with QoS, an IPv6-only EIP, a FIP, TCP and UDP DNATs on
// one port, overlapping SNATs (one random-fully) and the IPv6 default route.
func sample6() []nat.Object {
	dual := DualEIP(UID(nat.KindEIP, 10), netlab.EIP(10), netlab.EIP6(10))
	dual.EIP.QoS = &nat.QoS{IngressRateMbps: 10, EgressRateMbps: 20, EgressBurstMbit: 2}
	return []nat.Object{
		dual,
		EIP6(UID(nat.KindEIP, 11), netlab.EIP6(11)),
		FIP(UID(nat.KindFIP, 10), netlab.EIP6(10), netlab.VMAddr6(0)),
		DNAT(UID(nat.KindDNAT, 10), netlab.EIP6(11), nat.TCP, 2222, netlab.VMAddr6(1), 8080),
		DNAT(UID(nat.KindDNAT, 11), netlab.EIP6(11), nat.UDP, 2222, netlab.VMAddr6(1), 8081),
		SNAT(UID(nat.KindSNAT, 10), netlab.EIP6(11), netlab.VPCNet6, false),
		SNAT(UID(nat.KindSNAT, 11), netlab.EIP6(10), netip.MustParsePrefix("2001:db8:100::8/126"), true),
		Route(UID(nat.KindRoute, 10), netip.MustParsePrefix("::/0"), netlab.ExtAddr6, nat.DeviceExternal),
	}
}

// testIPv6RoundTrip: IPv6 objects beside the IPv4 sample survive a reopen
// and a reload unchanged (kernel and List, same boot id), an update of an
// IPv6 object replaces it, a Sync to a subset of both families leaves
// exactly that subset, and deleting by UID leaves the empty state.
func (s *suite) testIPv6RoundTrip(t *testing.T) {
	e := s.newEnvWith(t, true, netlab.GatewayOptions{IPv6: true})
	objs := append(sample(), sample6()...)
	e.apply(objs...)
	e.wantList("after apply", objs...)
	e.wantReopenReload(objs...)
	// Update: the IPv6 FIP moves to another VM.
	moved := FIP(UID(nat.KindFIP, 10), netlab.EIP6(10), netlab.VMAddr6(2))
	e.apply(moved)
	objs[len(sample())+2] = moved
	e.wantList("after updating the IPv6 FIP", objs...)
	// Sync to every other object, both families.
	var half []nat.Object
	for i, o := range objs {
		if i%2 == 0 {
			half = append(half, o)
		}
	}
	e.sync(half...)
	e.wantList("after a Sync to half", half...)
	e.reopen()
	e.wantList("after a Sync to half and a reopen", half...)
	e.del(nat.UIDs(half)...)
	e.wantList("after deleting everything")
	e.wantEquiv("after deleting everything", e.empty)
}
