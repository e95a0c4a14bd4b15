package shape

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftables"
)

// TestWrapPolicesIPv6EIPs: through Wrap (the agent's default,
// --eip-qos=shape) an EIP with an IPv6 address keeps its QoS in the NAT
// table, where it is policed (nothing shaped: no natgw_shape table, no
// natgw qdisc), and the policing holds real TCP to its rate in both
// directions through an IPv6-only EIP and through both addresses of a
// dual-stack EIP (the IPv4 one included); an update without the QoS lifts
// it. It fails if Wrap strips an IPv6 EIP's QoS (then nothing limits it).
func TestWrapPolicesIPv6EIPs(t *testing.T) {
	const (
		rateMbps = 16
		size     = 6 << 20                  // bytes: about 3 s at the rate
		rate     = rateMbps * 1_000_000 / 8 // bytes per second
		timeout  = 30 * time.Second
		port     = 8080
	)
	// As nattest's QoS case: 80% of the time the bytes beyond a 1.5 s
	// burst need at the rate.
	const floor = time.Duration((size - 3*rate/2) * int64(time.Second) / rate * 8 / 10)
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
	// Policed in the NAT table, nothing shaped.
	rs, err := netlab.NftRuleset(ctx, gw.GW)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(rs, string(table.Name)) || !strings.Contains(rs, "qos_in_") || !strings.Contains(rs, "qos_out_") {
		t.Errorf("want the EIPs policed in the NAT table and no %s:\n%s", table.Name, rs)
	}
	if got, err := Get(ctx, cfg); err != nil || len(got) != 0 {
		t.Errorf("shaping = %+v, %v; want none", got, err)
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
	type xfer struct {
		name string
		run  func() (netlab.Reply, time.Duration, error)
	}
	var xfers []xfer
	for _, eip := range []netip.Addr{dual.Address, dual.V6Address, only6.V6Address} {
		target := netip.AddrPortFrom(eip, port).String()
		xfers = append(xfers,
			xfer{"ingress to " + eip.String(), func() (netlab.Reply, time.Duration, error) {
				return netlab.Upload(ctx, gw.Ext.NS, target, size, timeout)
			}},
			xfer{"egress from " + eip.String(), func() (netlab.Reply, time.Duration, error) {
				return netlab.Download(ctx, gw.Ext.NS, target, size, timeout)
			}})
	}
	took := make([]time.Duration, len(xfers))
	for i, x := range xfers {
		_, d, err := x.run()
		if err != nil {
			t.Errorf("%s with QoS %d Mbit/s: %v", x.name, rateMbps, err)
			continue
		}
		took[i] = d
		t.Logf("%s, policed at %d Mbit/s: %d bytes in %v (%.1f Mbit/s)", x.name, rateMbps, size, d, float64(size)*8/d.Seconds()/1e6)
		if d < floor {
			t.Errorf("%s: %d bytes in %v, faster than %d Mbit/s allows (at least %v)", x.name, size, d, rateMbps, floor)
		}
	}
	if err := dp.Apply(ctx, eips(nil)...); err != nil {
		t.Fatal(err)
	}
	for i, x := range xfers {
		_, d, err := x.run()
		if err != nil {
			t.Errorf("%s without QoS: %v", x.name, err)
			continue
		}
		t.Logf("%s, QoS removed: %d bytes in %v (%.1f Mbit/s)", x.name, size, d, float64(size)*8/d.Seconds()/1e6)
		if took[i] > 0 && d > took[i]/2 {
			t.Errorf("%s: still slow after removing the QoS: %v (policed: %v)", x.name, d, took[i])
		}
	}
}
