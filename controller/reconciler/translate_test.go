package reconciler

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/nat"
)

func TestTranslate(t *testing.T) {
	eip := nat.EIP{Address: netip.MustParseAddr("192.0.2.10")}
	dual := nat.EIP{Address: netip.MustParseAddr("192.0.2.10"), V6Address: netip.MustParseAddr("2001:db8::10")}
	v6only := nat.EIP{V6Address: netip.MustParseAddr("2001:db8::10")}
	om := metav1.ObjectMeta{Name: "x", UID: "0b1e7c2a-5f0e-4c1e-9d57-0d1b2c3d4e5f"}
	cases := []struct {
		name    string
		build   func() (nat.Object, error)
		want    string // nat.Object.String(), or "" when an error is wanted
		wantErr string
	}{
		{"fip", func() (nat.Object, error) {
			return fipObject(&v1.IptablesFIPRule{ObjectMeta: om, Spec: v1.IptablesFIPRuleSpec{InternalIP: "10.0.1.5"}}, eip)
		}, "fip " + string(om.UID) + ": 192.0.2.10 <-> 10.0.1.5", ""},
		{"fip/equals-eip", func() (nat.Object, error) {
			return fipObject(&v1.IptablesFIPRule{ObjectMeta: om, Spec: v1.IptablesFIPRuleSpec{InternalIP: "192.0.2.10"}}, eip)
		}, "", "fip.internalIP"},
		{"fip/v6-on-v4-eip", func() (nat.Object, error) {
			return fipObject(&v1.IptablesFIPRule{ObjectMeta: om, Spec: v1.IptablesFIPRuleSpec{InternalIP: "fd00::1"}}, eip)
		}, "", `spec.internalIp "fd00::1": an IPv6 address, but the EIP has no IPv6 address (it is IPv4 only)`},
		{"fip/v6-on-dual-eip", func() (nat.Object, error) {
			return fipObject(&v1.IptablesFIPRule{ObjectMeta: om, Spec: v1.IptablesFIPRuleSpec{InternalIP: "fd00::1"}}, dual)
		}, "fip " + string(om.UID) + ": 2001:db8::10 <-> fd00::1", ""},
		{"fip/v4-on-v6-eip", func() (nat.Object, error) {
			return fipObject(&v1.IptablesFIPRule{ObjectMeta: om, Spec: v1.IptablesFIPRuleSpec{InternalIP: "10.0.1.5"}}, v6only)
		}, "", `spec.internalIp "10.0.1.5": an IPv4 address, but the EIP has no IPv4 address (it is IPv6 only)`},
		{"fip/v6-link-local", func() (nat.Object, error) {
			return fipObject(&v1.IptablesFIPRule{ObjectMeta: om, Spec: v1.IptablesFIPRuleSpec{InternalIP: "fe80::1"}}, dual)
		}, "", "spec.internalIp"},
		{"dnat/v6", func() (nat.Object, error) {
			return dnatObject(&v1.IptablesDnatRule{ObjectMeta: om, Spec: v1.IptablesDnatRuleSpec{
				ExternalPort: "8888", Protocol: "udp", InternalIP: "fd00::10", InternalPort: "80"}}, v6only)
		}, "dnat " + string(om.UID) + ": 2001:db8::10:8888/udp -> fd00::10:80", ""},
		{"dnat/v6-on-v4-eip", func() (nat.Object, error) {
			return dnatObject(&v1.IptablesDnatRule{ObjectMeta: om, Spec: v1.IptablesDnatRuleSpec{
				ExternalPort: "8888", InternalIP: "fd00::10", InternalPort: "80"}}, eip)
		}, "", `spec.internalIp "fd00::10"`},
		{"snat/v6", func() (nat.Object, error) {
			return snatObject(&v1.IptablesSnatRule{ObjectMeta: om, Spec: v1.IptablesSnatRuleSpec{InternalCIDR: "fd00:1::7/64"}}, dual)
		}, "snat " + string(om.UID) + ": fd00:1::/64 -> 2001:db8::10", ""},
		{"snat/v6-on-v4-eip", func() (nat.Object, error) {
			return snatObject(&v1.IptablesSnatRule{ObjectMeta: om, Spec: v1.IptablesSnatRuleSpec{InternalCIDR: "fd00:1::/64"}}, eip)
		}, "", `spec.internalCIDR "fd00:1::/64": an IPv6 address, but the EIP has no IPv6 address`},
		{"snat/v4-on-v6-eip", func() (nat.Object, error) {
			return snatObject(&v1.IptablesSnatRule{ObjectMeta: om, Spec: v1.IptablesSnatRuleSpec{InternalCIDR: "10.0.1.0/24"}}, v6only)
		}, "", `spec.internalCIDR "10.0.1.0/24"`},
		{"dnat", func() (nat.Object, error) {
			return dnatObject(&v1.IptablesDnatRule{ObjectMeta: om, Spec: v1.IptablesDnatRuleSpec{
				ExternalPort: "8888", Protocol: "UDP", InternalIP: "10.0.1.10", InternalPort: "80"}}, eip)
		}, "dnat " + string(om.UID) + ": 192.0.2.10:8888/udp -> 10.0.1.10:80", ""},
		{"dnat/default-protocol", func() (nat.Object, error) {
			return dnatObject(&v1.IptablesDnatRule{ObjectMeta: om, Spec: v1.IptablesDnatRuleSpec{
				ExternalPort: "1", InternalIP: "10.0.1.10", InternalPort: "65535"}}, eip)
		}, "dnat " + string(om.UID) + ": 192.0.2.10:1/tcp -> 10.0.1.10:65535", ""},
		{"dnat/port-0", func() (nat.Object, error) {
			return dnatObject(&v1.IptablesDnatRule{ObjectMeta: om, Spec: v1.IptablesDnatRuleSpec{
				ExternalPort: "0", InternalIP: "10.0.1.10", InternalPort: "80"}}, eip)
		}, "", "spec.externalPort"},
		{"dnat/sctp", func() (nat.Object, error) {
			return dnatObject(&v1.IptablesDnatRule{ObjectMeta: om, Spec: v1.IptablesDnatRuleSpec{
				ExternalPort: "80", Protocol: "sctp", InternalIP: "10.0.1.10", InternalPort: "80"}}, eip)
		}, "dnat " + string(om.UID) + ": 192.0.2.10:80/sctp -> 10.0.1.10:80", ""},
		{"dnat/type-share", func() (nat.Object, error) {
			return dnatObject(&v1.IptablesDnatRule{ObjectMeta: om, Spec: v1.IptablesDnatRuleSpec{
				ExternalPort: "443", InternalIP: "10.0.1.10", InternalPort: "8443", Type: "share"}}, eip)
		}, "dnat " + string(om.UID) + ": 192.0.2.10:443/tcp -> 10.0.1.10:8443 (share)", ""},
		{"dnat/type-exclusive", func() (nat.Object, error) {
			return dnatObject(&v1.IptablesDnatRule{ObjectMeta: om, Spec: v1.IptablesDnatRuleSpec{
				ExternalPort: "443", InternalIP: "10.0.1.10", InternalPort: "8443", Type: "exclusive"}}, eip)
		}, "dnat " + string(om.UID) + ": 192.0.2.10:443/tcp -> 10.0.1.10:8443", ""},
		{"dnat/type-bad", func() (nat.Object, error) {
			return dnatObject(&v1.IptablesDnatRule{ObjectMeta: om, Spec: v1.IptablesDnatRuleSpec{
				ExternalPort: "443", InternalIP: "10.0.1.10", InternalPort: "8443", Type: "shared"}}, eip)
		}, "", "dnat.type"},
		{"dnat/icmp", func() (nat.Object, error) {
			return dnatObject(&v1.IptablesDnatRule{ObjectMeta: om, Spec: v1.IptablesDnatRuleSpec{
				ExternalPort: "80", Protocol: "icmp", InternalIP: "10.0.1.10", InternalPort: "80"}}, eip)
		}, "", "spec.protocol"},
		{"snat", func() (nat.Object, error) {
			return snatObject(&v1.IptablesSnatRule{ObjectMeta: om, Spec: v1.IptablesSnatRuleSpec{InternalCIDR: "10.0.1.7/24"}}, eip)
		}, "snat " + string(om.UID) + ": 10.0.1.0/24 -> 192.0.2.10", ""},
		{"snat/bare-ip", func() (nat.Object, error) {
			return snatObject(&v1.IptablesSnatRule{ObjectMeta: om, Spec: v1.IptablesSnatRuleSpec{InternalCIDR: "10.0.1.7"}}, eip)
		}, "snat " + string(om.UID) + ": 10.0.1.7/32 -> 192.0.2.10", ""},
		{"snat/bad", func() (nat.Object, error) {
			return snatObject(&v1.IptablesSnatRule{ObjectMeta: om, Spec: v1.IptablesSnatRuleSpec{InternalCIDR: "10.0.1.0/33"}}, eip)
		}, "", "spec.internalCIDR"},
		{"eip", func() (nat.Object, error) {
			return eipObject(&v1.IptablesEIP{ObjectMeta: om, Spec: v1.IptablesEIPSpec{V4ip: "192.0.2.10"}}, 24, 64, nil)
		}, "eip " + string(om.UID) + ": 192.0.2.10/24", ""},
		{"eip/status-ip", func() (nat.Object, error) {
			return eipObject(&v1.IptablesEIP{ObjectMeta: om, Status: v1.IptablesEIPStatus{IP: "192.0.2.11"}}, 26, 64, nil)
		}, "eip " + string(om.UID) + ": 192.0.2.11/26", ""},
		{"eip/dual", func() (nat.Object, error) {
			return eipObject(&v1.IptablesEIP{ObjectMeta: om, Spec: v1.IptablesEIPSpec{V4ip: "192.0.2.10", V6ip: "2001:db8::10"}}, 24, 64, nil)
		}, "eip " + string(om.UID) + ": 192.0.2.10/24 2001:db8::10/64", ""},
		{"eip/v6-only", func() (nat.Object, error) {
			return eipObject(&v1.IptablesEIP{ObjectMeta: om, Spec: v1.IptablesEIPSpec{V6ip: "2001:db8::10"}}, 24, 120, nil)
		}, "eip " + string(om.UID) + ": 2001:db8::10/120", ""},
		{"eip/v6-status-ip", func() (nat.Object, error) {
			return eipObject(&v1.IptablesEIP{ObjectMeta: om, Status: v1.IptablesEIPStatus{IP: "2001:db8::11"}}, 24, 64, nil)
		}, "eip " + string(om.UID) + ": 2001:db8::11/64", ""},
		{"eip/v6-upper-case", func() (nat.Object, error) {
			return eipObject(&v1.IptablesEIP{ObjectMeta: om, Spec: v1.IptablesEIPSpec{V6ip: "2001:DB8::10"}}, 24, 64, nil)
		}, "", `spec.v6ip "2001:DB8::10": not in lower case`},
		{"eip/v6-in-v4ip", func() (nat.Object, error) {
			return eipObject(&v1.IptablesEIP{ObjectMeta: om, Spec: v1.IptablesEIPSpec{V4ip: "2001:db8::10"}}, 24, 64, nil)
		}, "", `spec.v4ip "2001:db8::10": not an IPv4 address`},
		{"eip/v6-no-prefix-length", func() (nat.Object, error) {
			return eipObject(&v1.IptablesEIP{ObjectMeta: om, Spec: v1.IptablesEIPSpec{V4ip: "192.0.2.10", V6ip: "2001:db8::10"}}, 24, 0, nil)
		}, "", "spec.v6ip"},
		{"eip/no-address", func() (nat.Object, error) {
			return eipObject(&v1.IptablesEIP{ObjectMeta: om}, 24, 64, nil)
		}, "", "spec.v4ip"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.build()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, %v; want an error naming %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want {
				t.Errorf("got %q, want %q", got.String(), tc.want)
			}
		})
	}
}

func TestQoS(t *testing.T) {
	p := &v1.QoSPolicy{ObjectMeta: metav1.ObjectMeta{Name: "q"}, Spec: v1.QoSPolicySpec{BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{
		{Name: "in", RateMax: "10", BurstMax: "2.5", Direction: v1.QoSDirectionIngress},
		{Name: "out", RateMax: "3", Direction: v1.QoSDirectionEgress},
	}}}
	q, err := qosObject(p)
	if err != nil {
		t.Fatal(err)
	}
	// burstMax 2.5 MB = 2,621,440 bytes = 20.97 Mbit, rounded up.
	want := nat.QoS{IngressRateMbps: 10, IngressBurstMbit: 21, EgressRateMbps: 3}
	if q == nil || *q != want {
		t.Errorf("got %+v, want %+v", q, want)
	}
	// A match is not used, as Kube-OVN's EIP path: the same limits.
	p.Spec.BandwidthLimitRules[1].MatchType, p.Spec.BandwidthLimitRules[1].MatchValue = v1.QoSMatchTypeIP, "src 10.0.0.0/24"
	if q, err := qosObject(p); err != nil || q == nil || *q != want {
		t.Errorf("a rule with a match: got %+v, %v, want %+v", q, err, want)
	}
	if q, err := qosObject(nil); q != nil || err != nil {
		t.Errorf("no policy: %v, %v", q, err)
	}
}

func TestRouteObjects(t *testing.T) {
	g := &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: "gw", UID: "0b1e7c2a-5f0e-4c1e-9d57-0d1b2c3d4e5f"},
		Spec: v1.VpcNatGatewaySpec{Routes: []v1.Route{{CIDR: "10.2.0.0/16", NextHopIP: "10.0.1.1"}}}}
	objs, err := routeObjects(g, kubeovn.Network{ExternalGateway: netip.MustParseAddr("192.0.2.1")})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 2 {
		t.Fatalf("got %v", objs)
	}
	if objs[0].UID != string(g.UID)+":rt:10.2.0.0-16" || objs[0].Route.Device != nat.DeviceInternal {
		t.Errorf("route 0: %v", objs[0])
	}
	if objs[1].Route.Destination.Bits() != 0 || objs[1].Route.Device != nat.DeviceExternal || objs[1].Route.NextHop.String() != "192.0.2.1" {
		t.Errorf("default route: %v", objs[1])
	}
	for _, o := range objs {
		if len(o.UID) > nat.MaxUIDLen {
			t.Errorf("route UID %q longer than %d", o.UID, nat.MaxUIDLen)
		}
		if owner, ok := routeOwner(o.UID); !ok || owner != string(g.UID) {
			t.Errorf("routeOwner(%q) = %q, %v", o.UID, owner, ok)
		}
	}
	g.Spec.Routes = append(g.Spec.Routes, v1.Route{CIDR: "10.2.0.0/16", NextHopIP: "10.0.1.2"})
	if _, err := routeObjects(g, kubeovn.Network{}); err == nil || !strings.Contains(err.Error(), "spec.routes[1].cidr") {
		t.Errorf("duplicate destination: %v", err)
	}
	g.Spec.Routes = []v1.Route{{CIDR: "10.2.0.1/16", NextHopIP: "10.0.1.1"}}
	if _, err := routeObjects(g, kubeovn.Network{}); err == nil || !strings.Contains(err.Error(), "host bits") {
		t.Errorf("host bits: %v", err)
	}
}

// TestRouteObjectsVPC: the VPC subnet routes from Kube-OVN's Subnets go via
// the internal gateway on the internal interface; a destination spec.routes
// names keeps spec.routes' next hop.
func TestRouteObjectsVPC(t *testing.T) {
	g := &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: "gw", UID: "0b1e7c2a-5f0e-4c1e-9d57-0d1b2c3d4e5f"},
		Spec: v1.VpcNatGatewaySpec{Routes: []v1.Route{{CIDR: "10.0.3.0/24", NextHopIP: "10.0.1.254"}}}}
	net := kubeovn.Network{
		ExternalGateway: netip.MustParseAddr("192.0.2.1"), InternalGateway: netip.MustParseAddr("10.0.1.1"),
		VPCRoutes: []netip.Prefix{netip.MustParsePrefix("10.0.2.0/24"), netip.MustParsePrefix("10.0.3.0/24")},
	}
	objs, err := routeObjects(g, net)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, fmt.Sprintf("%s via %s dev %v", o.Route.Destination, o.Route.NextHop, o.Route.Device))
	}
	want := []string{
		fmt.Sprintf("10.0.3.0/24 via 10.0.1.254 dev %v", nat.DeviceInternal),
		fmt.Sprintf("10.0.2.0/24 via 10.0.1.1 dev %v", nat.DeviceInternal),
		fmt.Sprintf("0.0.0.0/0 via 192.0.2.1 dev %v", nat.DeviceExternal),
	}
	if !slices.Equal(got, want) {
		t.Errorf("routes:\n got %q\nwant %q", got, want)
	}
}
