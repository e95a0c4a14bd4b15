package gateway

import (
	"fmt"
	"net/netip"
	"reflect"
	"runtime"
	"testing"

	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/internal/heapstat"
	"github.com/natgw/natgw/nat"
)

// TestKnownRoundTrip: every object stored in Manager.known comes back
// exactly (reflect.DeepEqual, all payload fields), in the compact form
// when it fits and whole when it does not, and Kind says its kind.
func TestKnownRoundTrip(t *testing.T) {
	a4, b4 := netip.MustParseAddr("172.31.0.10"), netip.MustParseAddr("10.0.1.5")
	a6 := netip.MustParseAddr("2001:db8::10")
	cases := []struct {
		o       nat.Object
		compact bool
	}{
		{nat.Object{UID: "fip", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a4, InternalIP: b4}}, true},
		{nat.Object{UID: "fip6", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a6, InternalIP: netip.MustParseAddr("fd00::5")}}, true},
		{nat.Object{UID: "dnat", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a4, Protocol: nat.TCP, ExternalPort: 8080, InternalIP: b4, InternalPort: 80}}, true},
		{nat.Object{UID: "dnat-share", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a4, Protocol: nat.SCTP, ExternalPort: 65535, InternalIP: b4, InternalPort: 1, Type: nat.DNATShare}}, true},
		{nat.Object{UID: "dnat-excl", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a4, Protocol: nat.UDP, ExternalPort: 53, InternalIP: b4, InternalPort: 53, Type: nat.DNATExclusive}}, true},
		{nat.Object{UID: "dnat-noproto", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a4, ExternalPort: 1, InternalIP: b4, InternalPort: 2}}, true},
		{nat.Object{UID: "dnat-oddproto", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a4, Protocol: "icmp", ExternalPort: 1, InternalIP: b4, InternalPort: 2}}, false},
		{nat.Object{UID: "dnat-oddtype", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a4, Protocol: nat.TCP, ExternalPort: 1, InternalIP: b4, InternalPort: 2, Type: "other"}}, false},
		{nat.Object{UID: "snat", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a4, InternalCIDR: netip.MustParsePrefix("10.0.1.0/24")}}, true},
		{nat.Object{UID: "snat-rf", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a6, InternalCIDR: netip.MustParsePrefix("fd00::/64"), RandomFully: true}}, true},
		{nat.Object{UID: "snat-unmasked", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a4, InternalCIDR: netip.PrefixFrom(b4, 24)}}, true},
		{nat.Object{UID: "snat-noprefix", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a4}}, false},
		{nat.Object{UID: "eip", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a4, PrefixLen: 24}}, true},
		{nat.Object{UID: "eip-dual", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a4, PrefixLen: 24, V6Address: a6, V6PrefixLen: 64}}, true},
		{nat.Object{UID: "eip6", Kind: nat.KindEIP, EIP: &nat.EIP{V6Address: a6, V6PrefixLen: 64}}, true},
		{nat.Object{UID: "eip-qos", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a4, PrefixLen: 24, QoS: &nat.QoS{IngressRateMbps: 10}}}, false},
		{nat.Object{UID: "eip-oddlen", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a4, PrefixLen: -1}}, false},
		{nat.Object{UID: "route", Kind: nat.KindRoute, Route: &nat.Route{Destination: netip.MustParsePrefix("0.0.0.0/0"), NextHop: a4, Device: nat.DeviceExternal}}, false},
		{nat.Object{UID: "two-payloads", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a4, InternalIP: b4}, SNAT: &nat.SNAT{EIP: a4}}, false},
		{nat.Object{UID: "no-payload", Kind: nat.KindFIP}, false},
		{nat.Object{UID: "fip-mapped", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netip.MustParseAddr("::ffff:172.31.0.10"), InternalIP: b4}}, true},
		{nat.Object{UID: "fip-zone", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a4, InternalIP: netip.MustParseAddr("fe80::1%eth0")}}, false},
		{nat.Object{UID: "fip-zero", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a4}}, true},
	}
	for _, c := range cases {
		k := newKnown(c.o)
		if got := k.other == nil; got != c.compact {
			t.Errorf("%s: compact %v, want %v", c.o.UID, got, c.compact)
		}
		if got := k.object(c.o.UID); !reflect.DeepEqual(got, c.o) {
			t.Errorf("%s: round trip %+v, want %+v", c.o.UID, got, c.o)
		}
		if k.Kind() != c.o.Kind {
			t.Errorf("%s: kind %q, want %q", c.o.UID, k.Kind(), c.o.Kind)
		}
	}
}

// knownBenchObject is object i of BenchmarkKnownHeap: FIP, DNAT, SNAT and
// EIP in turn, as the reconcilers translate them.
func knownBenchObject(uid string, i int) nat.Object {
	eip := netip.AddrFrom4([4]byte{172, 16 + byte(i>>16), byte(i >> 8), byte(i)})
	in := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
	switch i % 4 {
	case 0:
		return nat.Object{UID: uid, Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip, InternalIP: in}}
	case 1:
		return nat.Object{UID: uid, Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: eip, Protocol: nat.TCP, ExternalPort: uint16(10000 + i%1000), InternalIP: in, InternalPort: 80}}
	case 2:
		return nat.Object{UID: uid, Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: eip, InternalCIDR: netip.PrefixFrom(in, 24).Masked()}}
	}
	return nat.Object{UID: uid, Kind: nat.KindEIP, EIP: &nat.EIP{Address: eip, PrefixLen: 24}}
}

// BenchmarkKnownHeap is the live heap Manager.known holds per object
// (B/obj, heap after runtime.GC over n; load-independent): n objects
// (FIP, DNAT, SNAT, EIP in turn) remembered as Apply remembers them, in
// the map of nat.Object the Manager kept before (nat.Object, a baseline
// in the same run) and in its compact form (known). The UIDs are held
// outside (the cache's objects hold them), as are no payloads.
func BenchmarkKnownHeap(b *testing.B) {
	const n = 100_000
	uids := make([]string, n)
	for i := range uids {
		uids[i] = fmt.Sprintf("%08x-1111-4222-8333-%012x", i, i)
	}
	b.Run("nat.Object", func(b *testing.B) {
		for b.Loop() {
			h0 := heapstat.Live()
			m := map[string]nat.Object{}
			for i, u := range uids {
				o := knownBenchObject(u, i)
				m[o.UID] = o
			}
			h1 := heapstat.Live()
			runtime.KeepAlive(m)
			b.ReportMetric(float64(h1-h0)/n, "B/obj")
		}
	})
	b.Run("known", func(b *testing.B) {
		for b.Loop() {
			h0 := heapstat.Live()
			g := newManager(gwconfig.Entry{Name: "gw"}, &Options{})
			for i, u := range uids {
				o := knownBenchObject(u, i)
				g.known[o.UID] = newKnown(o)
			}
			h1 := heapstat.Live()
			if len(g.known) != n {
				b.Fatalf("%d known", len(g.known))
			}
			runtime.KeepAlive(g)
			b.ReportMetric(float64(h1-h0)/n, "B/obj")
		}
	})
}
