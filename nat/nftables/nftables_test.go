package nftables

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
)

var (
	addr   = netip.MustParseAddr
	prefix = netip.MustParsePrefix
)

// gateway returns the config of a fresh gateway namespace (dummy net1/eth0).
func gateway(t testing.TB) nat.Config {
	t.Helper()
	lab := netlab.ForTest(t)
	ns, err := lab.NS("gw")
	if err != nil {
		t.Fatal(err)
	}
	// veth pairs inside the namespace: this kernel has no dummy driver.
	// IPv6 too: the golden objects' IPv6 routes need their next hops on a
	// connected network.
	for _, e := range []struct {
		name  string
		addrs []netip.Prefix
	}{
		{nat.DefaultExternalInterface, []netip.Prefix{netip.PrefixFrom(netlab.GWExtAddr, 24), prefix("2001:db8::fe/64")}},
		{nat.DefaultInternalInterface, []netip.Prefix{netip.PrefixFrom(netlab.GWVPCAddr, 24), prefix("fd00::1/64")}},
	} {
		if err := netlab.Veth(netlab.End{NS: ns, Name: e.name, Addrs: e.addrs}, netlab.End{NS: ns, Name: "peer-" + e.name}); err != nil {
			t.Fatal(err)
		}
	}
	return nat.Config{NetNS: ns}
}

func open(t testing.TB, cfg nat.Config, opts ...Option) nat.Dataplane {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dp, err := New(ctx, cfg, opts...)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { dp.Close() })
	return dp
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func table(t testing.TB, ns string) string {
	t.Helper()
	out, err := netlab.NftTable(context.Background(), ns, "inet", tableName)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// goldenObjects is the fixed object set of the golden dump.
func goldenObjects() []nat.Object {
	u := nattest.UID
	return []nat.Object{
		nattest.EIPQoS(u(nat.KindEIP, 1), addr("192.0.2.10"), nat.QoS{IngressRateMbps: 100, IngressBurstMbit: 10, EgressRateMbps: 50, EgressBurstMbit: 5}),
		nattest.EIPQoS(u(nat.KindEIP, 2), addr("192.0.2.11"), nat.QoS{EgressRateMbps: 20}),
		nattest.EIP(u(nat.KindEIP, 3), addr("192.0.2.12")),
		nattest.FIP(u(nat.KindFIP, 1), addr("192.0.2.10"), addr("198.51.100.10")),
		nattest.DNAT(u(nat.KindDNAT, 1), addr("192.0.2.11"), nat.TCP, 8080, addr("198.51.100.11"), 80),
		nattest.DNAT(u(nat.KindDNAT, 2), addr("192.0.2.11"), nat.UDP, 5353, addr("198.51.100.12"), 53),
		nattest.ShareDNAT(u(nat.KindDNAT, 3), addr("192.0.2.11"), nat.TCP, 443, addr("198.51.100.13"), 8443),
		nattest.ShareDNAT(u(nat.KindDNAT, 4), addr("192.0.2.11"), nat.TCP, 443, addr("198.51.100.14"), 8443),
		nattest.SNAT(u(nat.KindSNAT, 1), addr("192.0.2.12"), prefix("198.51.100.0/24"), false),
		nattest.SNAT(u(nat.KindSNAT, 2), addr("192.0.2.11"), prefix("198.51.100.0/28"), true),
		nattest.SNAT(u(nat.KindSNAT, 3), addr("192.0.2.12"), prefix("10.0.0.0/8"), false),
		nattest.Route(u(nat.KindRoute, 1), prefix("10.0.0.0/8"), addr("198.51.100.254"), nat.DeviceInternal),
		nattest.Route(u(nat.KindRoute, 2), prefix("0.0.0.0/0"), addr("192.0.2.1"), nat.DeviceExternal),
		// IPv6: a dual-stack EIP, an IPv6-only one, a FIP, port DNATs,
		// share DNATs and overlapping CIDR SNATs with and without
		// random-fully.
		{UID: u(nat.KindEIP, 4), Kind: nat.KindEIP, EIP: &nat.EIP{Address: addr("192.0.2.13"), PrefixLen: 24, V6Address: addr("2001:db8::13"), V6PrefixLen: 64, QoS: &nat.QoS{IngressRateMbps: 30}}},
		{UID: u(nat.KindEIP, 5), Kind: nat.KindEIP, EIP: &nat.EIP{V6Address: addr("2001:db8::10"), V6PrefixLen: 64, QoS: &nat.QoS{IngressRateMbps: 40, IngressBurstMbit: 4, EgressRateMbps: 10}}},
		nattest.FIP(u(nat.KindFIP, 2), addr("2001:db8::10"), addr("fd00::10")),
		nattest.DNAT(u(nat.KindDNAT, 5), addr("2001:db8::13"), nat.TCP, 8080, addr("fd00::11"), 80),
		nattest.DNAT(u(nat.KindDNAT, 6), addr("2001:db8::13"), nat.UDP, 5353, addr("fd00::12"), 53),
		nattest.ShareDNAT(u(nat.KindDNAT, 7), addr("2001:db8::13"), nat.TCP, 443, addr("fd00::13"), 8443),
		nattest.ShareDNAT(u(nat.KindDNAT, 8), addr("2001:db8::13"), nat.TCP, 443, addr("fd00::14"), 8443),
		nattest.ShareDNAT(u(nat.KindDNAT, 9), addr("2001:db8::13"), nat.TCP, 443, addr("fd00::15"), 8443),
		nattest.SNAT(u(nat.KindSNAT, 4), addr("2001:db8::13"), prefix("fd00::/64"), false),
		nattest.SNAT(u(nat.KindSNAT, 5), addr("2001:db8::13"), prefix("fd00::/48"), true),
		nattest.SNAT(u(nat.KindSNAT, 6), addr("2001:db8::13"), prefix("fd00::20/128"), false),
		nattest.Route(u(nat.KindRoute, 3), prefix("::/0"), addr("2001:db8::1"), nat.DeviceExternal),
		nattest.Route(u(nat.KindRoute, 4), prefix("fd00:9::/48"), addr("fd00::fe"), nat.DeviceInternal),
	}
}

func TestSmoke(t *testing.T) {
	cfg := gateway(t)
	dp := open(t, cfg)
	if err := dp.Apply(ctxT(t), goldenObjects()...); err != nil {
		t.Fatal(err)
	}
	t.Log(table(t, cfg.NetNS))
}
