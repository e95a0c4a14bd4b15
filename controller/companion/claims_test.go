package companion

import (
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/gwimage/compat"
	"github.com/natgw/natgw/nat"
)

var (
	eipA = netip.MustParseAddr("192.0.2.10")
	eipB = netip.MustParseAddr("192.0.2.11")
	inA  = netip.MustParseAddr("10.0.0.5")
	inB  = netip.MustParseAddr("10.0.0.6")
)

func meta(name string, labels map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Labels: labels}
}

func eipCR(name, v4ip, statusIP, gw string) v1.IptablesEIP {
	return v1.IptablesEIP{ObjectMeta: meta(name, nil), Spec: v1.IptablesEIPSpec{V4ip: v4ip, NatGwDp: gw}, Status: v1.IptablesEIPStatus{IP: statusIP}}
}

func fipCR(name, eip, internal string) v1.IptablesFIPRule {
	return v1.IptablesFIPRule{ObjectMeta: meta(name, nil), Spec: v1.IptablesFIPRuleSpec{EIP: eip, InternalIP: internal}}
}

func dnatCR(name, eip, port, proto, internal, inPort string) v1.IptablesDnatRule {
	return v1.IptablesDnatRule{ObjectMeta: meta(name, nil), Spec: v1.IptablesDnatRuleSpec{EIP: eip, ExternalPort: port, Protocol: proto, InternalIP: internal, InternalPort: inPort}}
}

func snatCR(name, eip, cidr string) v1.IptablesSnatRule {
	return v1.IptablesSnatRule{ObjectMeta: meta(name, nil), Spec: v1.IptablesSnatRuleSpec{EIP: eip, InternalCIDR: cidr}}
}

// Objects as the compat path makes them (UIDs from gwimage/compat's own
// functions).
func eipObj(a netip.Addr) nat.Object {
	return nat.Object{UID: compat.EIPUID(a), Kind: nat.KindEIP, EIP: &nat.EIP{Address: a, PrefixLen: 24}}
}

func fipObj(e, in netip.Addr) nat.Object {
	return nat.Object{UID: compat.FIPUID(e), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: e, InternalIP: in}}
}

func dnatObj(e netip.Addr, proto nat.Protocol, port uint16, in netip.Addr, inPort uint16) nat.Object {
	return nat.Object{UID: compat.DNATUID(e, proto, port), Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: e, Protocol: proto, ExternalPort: port, InternalIP: in, InternalPort: inPort}}
}

func snatObj(e netip.Addr, cidr string) nat.Object {
	p := netip.MustParsePrefix(cidr)
	return nat.Object{UID: compat.SNATUID(e, p), Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: e, InternalCIDR: p, RandomFully: true}}
}

// TestClaims: which CRs claim which compat objects, against the UIDs
// gwimage/compat gives them.
func TestClaims(t *testing.T) {
	type crs struct {
		eips  []v1.IptablesEIP
		fips  []v1.IptablesFIPRule
		dnats []v1.IptablesDnatRule
		snats []v1.IptablesSnatRule
	}
	withLabels := func(f v1.IptablesFIPRule, l map[string]string) v1.IptablesFIPRule { f.Labels = l; return f }
	withStatus := func(f v1.IptablesFIPRule, ip, gw string) v1.IptablesFIPRule {
		f.Status.V4ip, f.Status.NatGwDp = ip, gw
		return f
	}
	cases := []struct {
		name    string
		crs     crs
		gw      string
		obj     nat.Object
		claimed string // substring of the reason; "" = unclaimed
	}{
		{"EIP by spec.v4ip", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}}, "gw1", eipObj(eipA), "IptablesEIP/e"},
		{"EIP by status.ip", crs{eips: []v1.IptablesEIP{eipCR("e", "", eipA.String(), "gw1")}}, "gw1", eipObj(eipA), "IptablesEIP/e"},
		{"EIP of another address", crs{eips: []v1.IptablesEIP{eipCR("e", eipB.String(), "", "gw1")}}, "gw1", eipObj(eipA), ""},
		{"EIP on another gateway", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}}, "gw2", eipObj(eipA), ""},
		{"EIP of unknown gateway claims on all", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "")}}, "gw2", eipObj(eipA), "IptablesEIP/e"},
		{"EIP without address blocks EIPs", crs{eips: []v1.IptablesEIP{eipCR("e", "", "", "gw1")}}, "gw1", eipObj(eipA), "cannot be resolved"},
		{"EIP without address does not block FIPs", crs{eips: []v1.IptablesEIP{eipCR("e", "", "", "gw1")}}, "gw1", fipObj(eipA, inA), ""},
		{"FIP", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}, fips: []v1.IptablesFIPRule{fipCR("f", "e", inA.String())}}, "gw1", fipObj(eipA, inA), "IptablesFIPRule/f"},
		{"FIP claims its EIP", crs{fips: []v1.IptablesFIPRule{withStatus(fipCR("f", "gone", inA.String()), eipA.String(), "gw1")}}, "gw1", eipObj(eipA), "IptablesFIPRule/f"},
		{"FIP of another internal address", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}, fips: []v1.IptablesFIPRule{fipCR("f", "e", inB.String())}}, "gw1", fipObj(eipA, inA), ""},
		{"FIP with a malformed internal address claims any content", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}, fips: []v1.IptablesFIPRule{fipCR("f", "e", "10.0.0.300")}}, "gw1", fipObj(eipA, inA), "IptablesFIPRule/f"},
		{"FIP by its label when the EIP is gone", crs{fips: []v1.IptablesFIPRule{withLabels(fipCR("f", "gone", inA.String()), map[string]string{v1.LabelEIPV4IP: eipA.String()})}}, "gw9", fipObj(eipA, inA), "IptablesFIPRule/f"},
		{"FIP by status when the EIP is gone", crs{fips: []v1.IptablesFIPRule{withStatus(fipCR("f", "gone", inA.String()), eipA.String(), "gw1")}}, "gw1", fipObj(eipA, inA), "IptablesFIPRule/f"},
		{"FIP whose EIP is unknown blocks FIPs", crs{fips: []v1.IptablesFIPRule{fipCR("f", "gone", inA.String())}}, "gw1", fipObj(eipB, inB), "cannot be resolved"},
		{"FIP with a separator in its EIP address blocks", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String()+",x", "", "gw1")}, fips: []v1.IptablesFIPRule{fipCR("f", "e", inA.String())}}, "gw1", fipObj(eipA, inA), "cannot be resolved"},
		{"DNAT", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}, dnats: []v1.IptablesDnatRule{dnatCR("d", "e", "80", "TCP", inA.String(), "8080")}}, "gw1", dnatObj(eipA, nat.TCP, 80, inA, 8080), "IptablesDnatRule/d"},
		{"DNAT other port", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}, dnats: []v1.IptablesDnatRule{dnatCR("d", "e", "81", "tcp", inA.String(), "8080")}}, "gw1", dnatObj(eipA, nat.TCP, 80, inA, 8080), ""},
		{"DNAT other protocol", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}, dnats: []v1.IptablesDnatRule{dnatCR("d", "e", "80", "udp", inA.String(), "8080")}}, "gw1", dnatObj(eipA, nat.TCP, 80, inA, 8080), ""},
		{"DNAT other internal port", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}, dnats: []v1.IptablesDnatRule{dnatCR("d", "e", "80", "tcp", inA.String(), "9090")}}, "gw1", dnatObj(eipA, nat.TCP, 80, inA, 8080), ""},
		{"DNAT without protocol blocks DNATs", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}, dnats: []v1.IptablesDnatRule{dnatCR("d", "e", "80", "", inA.String(), "8080")}}, "gw1", dnatObj(eipB, nat.UDP, 53, inA, 53), "cannot be resolved"},
		{"SNAT", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}, snats: []v1.IptablesSnatRule{snatCR("s", "e", "10.0.0.0/24")}}, "gw1", snatObj(eipA, "10.0.0.0/24"), "IptablesSnatRule/s"},
		{"SNAT of a bare address is its /32", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}, snats: []v1.IptablesSnatRule{snatCR("s", "e", "10.0.0.5")}}, "gw1", snatObj(eipA, "10.0.0.5/32"), "IptablesSnatRule/s"},
		{"SNAT other CIDR", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}, snats: []v1.IptablesSnatRule{snatCR("s", "e", "10.0.0.0/16")}}, "gw1", snatObj(eipA, "10.0.0.0/24"), ""},
		{"SNAT content (random-fully) does not matter", crs{eips: []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}, snats: []v1.IptablesSnatRule{snatCR("s", "e", "10.0.0.0/24")}}, "gw1", func() nat.Object { o := snatObj(eipA, "10.0.0.0/24"); o.SNAT.RandomFully = false; return o }(), "IptablesSnatRule/s"},
		{"nothing", crs{}, "gw1", fipObj(eipA, inA), ""},
		{"a route is never a candidate", crs{}, "gw1", nat.Object{UID: compat.RouteUID(netip.MustParsePrefix("10.0.0.0/24")), Kind: nat.KindRoute, Route: &nat.Route{Destination: netip.MustParsePrefix("10.0.0.0/24"), NextHop: inA}}, "not a compat object"},
		{"a Kubernetes UID is never a candidate", crs{}, "gw1", func() nat.Object { o := fipObj(eipA, inA); o.UID = "0b5e8f3c-2f59-4f9a-9f3d-0d3f7a3c1e11"; return o }(), "not a compat object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := BuildClaims(tc.crs.eips, tc.crs.fips, tc.crs.dnats, tc.crs.snats)
			got := c.Protects(tc.gw, tc.obj)
			switch {
			case tc.claimed == "" && got != "":
				t.Errorf("%s on %s: kept (%s), want unclaimed", tc.obj, tc.gw, got)
			case tc.claimed != "" && !strings.Contains(got, tc.claimed):
				t.Errorf("%s on %s: %q, want a reason naming %q", tc.obj, tc.gw, got, tc.claimed)
			}
		})
	}
}

// TestClaimsMatchCompatCalls: for each CR, the compat call Kube-OVN makes
// for it (its add) yields an object the CR claims, and its del deletes that
// UID: the claims and the gateway parse the same strings.
func TestClaimsMatchCompatCalls(t *testing.T) {
	eips := []v1.IptablesEIP{eipCR("e", eipA.String(), "", "gw1")}
	fips := []v1.IptablesFIPRule{fipCR("f", "e", inA.String())}
	dnats := []v1.IptablesDnatRule{dnatCR("d", "e", "443", "udp", inB.String(), "8443")}
	snats := []v1.IptablesSnatRule{snatCR("s", "e", "10.1.0.0/16")}
	c := BuildClaims(eips, fips, dnats, snats)
	calls := [][2]string{
		{compat.OpEIPAdd, eipA.String() + "/24"},
		{compat.OpFIPAdd, eipA.String() + "," + inA.String()},
		{compat.OpDNATAdd, eipA.String() + ",443,udp," + inB.String() + ",8443"},
		{compat.OpSNATAdd, eipA.String() + ",10.1.0.0/16,--random-fully"},
	}
	for _, call := range calls {
		p, err := compat.Parse(call[0], []string{call[1]})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range p.Apply {
			if why := c.Protects("gw1", o); why == "" {
				t.Errorf("%s %s makes %s, which no CR claims", call[0], call[1], o)
			}
		}
	}
}

// BenchmarkBuildClaims: the claims of 10,000 EIPs each with a FIP (one
// sweep's CPU beside the lists; go test -run '^$' -bench BuildClaims).
func BenchmarkBuildClaims(b *testing.B) {
	const n = 10000
	eips := make([]v1.IptablesEIP, n)
	fips := make([]v1.IptablesFIPRule, n)
	for i := range n {
		a := netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
		in := netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)})
		name := "e" + a.String()
		eips[i] = eipCR(name, a.String(), "", "gw1")
		fips[i] = fipCR("f"+a.String(), name, in.String())
	}
	b.ResetTimer()
	for range b.N {
		if c := BuildClaims(eips, fips, nil, nil); len(c.byUID) != 2*n {
			b.Fatalf("%d UIDs claimed, want %d", len(c.byUID), 2*n)
		}
	}
}

// TestHeld: CRs with natgw-controller's replace-mode finalizer are reported
// (nothing removes it in companion mode); Kube-OVN's own is not.
func TestHeld(t *testing.T) {
	e := eipCR("e", eipA.String(), "", "gw1")
	e.Finalizers = []string{v1.Finalizer}
	f := fipCR("f", "e", inA.String())
	f.Finalizers = []string{reconciler.Finalizer, v1.Finalizer}
	c := BuildClaims([]v1.IptablesEIP{e}, []v1.IptablesFIPRule{f}, nil, nil)
	if got := c.Held(); len(got) != 1 || got[0] != "IptablesFIPRule/f" {
		t.Errorf("held %v, want [IptablesFIPRule/f]", got)
	}
}
