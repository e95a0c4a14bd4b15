package shape

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
	"github.com/natgw/natgw/nat/nftables"
)

// TestWrapShapesIPv6EIPs: through Wrap (the agent's default,
// --eip-qos=shape) over the nftables data plane, an IPv6-only EIP and a
// dual-stack EIP with QoS are shaped like IPv4 ones: one HTB class per
// direction with the rate (Get: the dual-stack EIP's classes shared by its
// two addresses, ingress found by the IPv6 mark id the NAT table holds),
// no policer in the NAT table (no qos_in/qos_out chain), and the shaping
// holds real TCP to its rate in both directions through the IPv6-only EIP
// and both addresses of the dual-stack one; an update without the QoS
// lifts it and leaves nothing shaped. It fails if an IPv6 EIP's QoS stays
// policed or is stripped without being shaped.
func TestWrapShapesIPv6EIPs(t *testing.T) {
	const (
		rateMbps = 16
		port     = 8080
	)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{IPv6: true})
	if err != nil {
		t.Fatal(err)
	}
	cfg := gw.Config()
	inner, err := nftables.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { inner.Close() })
	dp := Wrap(inner, cfg)
	for _, vm := range gw.VMs[:2] {
		for _, a := range []netip.Addr{vm.Addr, vm.Addr6} {
			if _, err := lab.ServeTCP(ctx, vm.NS, netip.AddrPortFrom(a, port).String()); err != nil {
				t.Fatal(err)
			}
		}
	}
	q := nat.QoS{IngressRateMbps: rateMbps, IngressBurstMbit: 1, EgressRateMbps: rateMbps, EgressBurstMbit: 1}
	dual := nat.EIP{Address: netlab.EIP(0), PrefixLen: 24, V6Address: netlab.EIP6(0), V6PrefixLen: 64}
	only6 := nat.EIP{V6Address: netlab.EIP6(1), V6PrefixLen: 64}
	eips := func(q *nat.QoS) []nat.Object {
		d, o := dual, only6
		d.QoS, o.QoS = q, q
		return []nat.Object{{UID: "eip-dual", Kind: nat.KindEIP, EIP: &d}, {UID: "eip-v6", Kind: nat.KindEIP, EIP: &o}}
	}
	fips := []nat.Object{
		{UID: "fip-dual4", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: dual.Address, InternalIP: gw.VMs[0].Addr}},
		{UID: "fip-dual6", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: dual.V6Address, InternalIP: gw.VMs[0].Addr6}},
		{UID: "fip-v6", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: only6.V6Address, InternalIP: gw.VMs[1].Addr6}},
	}
	if err := dp.Apply(ctx, append(eips(&q), fips...)...); err != nil {
		t.Fatal(err)
	}
	// Shaped, with the NAT table's mark ids; no policer in the NAT table.
	rs, err := netlab.NftRuleset(ctx, gw.GW)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rs, "table inet "+string(table.Name)) || strings.Contains(rs, "qos_in_") || strings.Contains(rs, "qos_out_") {
		t.Errorf("want the EIPs shaped in inet %s and no policer in the NAT table:\n%s", table.Name, rs)
	}
	in, eg := QoSToLimits(&q)
	var want []EIP
	ids, ok := inner.(nat.MarkIDs)
	if !ok {
		t.Fatal("the nftables data plane gives no IPv6 mark ids")
	}
	for _, e := range []nat.EIP{dual, only6} {
		id, ok := ids.MarkID6(e.V6Address)
		if !ok {
			t.Fatalf("the nftables data plane holds no mark id for %s", e.V6Address)
		}
		want = append(want, EIP{Address: e.Address, V6Address: e.V6Address, Mark6: id, Ingress: in, Egress: eg})
	}
	if got, err := Get(ctx, cfg); err != nil || !slices.Equal(got, want) {
		t.Errorf("shaping = %+v, %v; want %+v", got, err, want)
	}
	objs, err := dp.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.Kind == nat.KindEIP && (o.EIP.QoS == nil || *o.EIP.QoS != q) {
			t.Errorf("List: %s QoS %+v, want %+v", o.UID, o.EIP.QoS, q)
		}
	}
	var targets []netip.AddrPort
	for _, eip := range []netip.Addr{dual.Address, dual.V6Address, only6.V6Address} {
		targets = append(targets, netip.AddrPortFrom(eip, port))
	}
	nattest.WantPoliced(t, ctx, gw.Ext.NS, targets, rateMbps, nil, func() {
		if err := dp.Apply(ctx, eips(nil)...); err != nil {
			t.Fatal(err)
		}
		if got, err := Get(ctx, cfg); err != nil || len(got) != 0 {
			t.Errorf("after the update without QoS: shaping = %+v, %v; want none", got, err)
		}
	})
}
