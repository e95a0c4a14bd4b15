package kubeovn

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

func TestSubnetFrom(t *testing.T) {
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal([]byte(`{"apiVersion":"kubeovn.io/v1","kind":"Subnet","metadata":{"name":"s1"},
		"spec":{"vpc":"v","provider":"p.ns","cidrBlock":"10.0.0.0/24","gateway":"10.0.0.1","vlan":"vl","u2oInterconnection":true,"unknown":1},
		"status":{"conditions":[{"type":"Ready","status":"True"},{"type":"Validated","status":"True"}]}}`), &u.Object); err != nil {
		t.Fatal(err)
	}
	want := Subnet{Name: "s1", Vpc: "v", Provider: "p.ns", CIDRBlock: "10.0.0.0/24", Gateway: "10.0.0.1", Vlan: "vl", U2OInterconnection: true, Validated: true}
	if got := SubnetFrom(u); got != want {
		t.Errorf("SubnetFrom = %+v, want %+v", got, want)
	}
}

// cluster is a VPC vpc1 with the gateway's subnet net1, other subnets of
// every kind, and two external subnets.
func cluster() map[string]Subnet {
	m := map[string]Subnet{}
	for _, s := range []Subnet{
		{Name: DefaultExternalNetwork, Provider: "ovn-vpc-external-network.kube-system", CIDRBlock: "192.0.2.0/24", Gateway: "192.0.2.1", Validated: true},
		{Name: "ext26", Provider: "ext26.kube-system", CIDRBlock: "198.51.100.64/26,2001:db8::/64", Gateway: "198.51.100.65,2001:db8::1", Validated: true},
		{Name: "ext6", Provider: "ext6.kube-system", CIDRBlock: "2001:db8:1::/64", Gateway: "2001:db8:1::1", Validated: true},
		{Name: "net1", Vpc: "vpc1", Provider: "ovn", CIDRBlock: "10.0.1.0/24", Gateway: "10.0.1.1", Validated: true},
		{Name: "b", Vpc: "vpc1", CIDRBlock: "10.0.2.0/24", Gateway: "10.0.2.1", Validated: true},
		{Name: "a", Vpc: "vpc1", Provider: "a.ns.ovn", CIDRBlock: "10.0.3.0/24,fd00::/64", Validated: true},
		{Name: "v6only", Vpc: "vpc1", CIDRBlock: "fd00:1::/64", Validated: true},
		{Name: "notvalidated", Vpc: "vpc1", CIDRBlock: "10.0.4.0/24"},
		{Name: "vlan", Vpc: "vpc1", CIDRBlock: "10.0.5.0/24", Vlan: "v1", Validated: true},
		{Name: "vlanu2o", Vpc: "vpc1", CIDRBlock: "10.0.6.0/24", Vlan: "v1", U2OInterconnection: true, Validated: true},
		{Name: "othervpc", Vpc: "vpc2", CIDRBlock: "10.0.7.0/24", Validated: true},
		{Name: "underlay", Vpc: "vpc1", Provider: "macvlan.default", CIDRBlock: "10.0.8.0/24", Validated: true},
	} {
		m[s.Name] = s
	}
	return m
}

func TestVPCSubnets(t *testing.T) {
	var got []string
	for _, s := range VPCSubnets("vpc1", cluster()) {
		got = append(got, s.Name)
	}
	if want := []string{"a", "b", "net1", "v6only", "vlanu2o"}; !reflect.DeepEqual(got, want) {
		t.Errorf("VPCSubnets = %v, want %v", got, want)
	}
}

func TestGatewayNetwork(t *testing.T) {
	gw := func(mod func(*v1.VpcNatGateway)) *v1.VpcNatGateway {
		g := &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: "gw1"},
			Spec: v1.VpcNatGatewaySpec{Vpc: "vpc1", Subnet: "net1", LanIP: "10.0.1.254"}}
		if mod != nil {
			mod(g)
		}
		return g
	}
	pfx := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, x := range s {
			out = append(out, netip.MustParsePrefix(x))
		}
		return out
	}
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name    string
		g       *v1.VpcNatGateway
		subnets func(map[string]Subnet)
		want    Network
		wantErr string
	}{
		{name: "default external network", g: gw(nil),
			want: Network{ExternalGateway: a("192.0.2.1"), InternalGateway: a("10.0.1.1"),
				VPCRoutes: pfx("10.0.3.0/24", "10.0.2.0/24", "10.0.6.0/24")}},
		{name: "first external subnet, dual stack: both default routes (GATEWAY_V4, GATEWAY_V6)", g: gw(func(g *v1.VpcNatGateway) { g.Spec.ExternalSubnets = []string{"ext26", DefaultExternalNetwork} }),
			want: Network{ExternalGateway: a("198.51.100.65"), ExternalGatewayV6: a("2001:db8::1"), InternalGateway: a("10.0.1.1"),
				VPCRoutes: pfx("10.0.3.0/24", "10.0.2.0/24", "10.0.6.0/24")}},
		{name: "IPv6-only external subnet: the IPv6 default route only", g: gw(func(g *v1.VpcNatGateway) { g.Spec.ExternalSubnets = []string{"ext6"} }),
			want: Network{ExternalGatewayV6: a("2001:db8:1::1"), InternalGateway: a("10.0.1.1"), VPCRoutes: pfx("10.0.3.0/24", "10.0.2.0/24", "10.0.6.0/24")}},
		{name: "a subnet holding the internal gateway is not routed (upstream's CIDRContainIP)", g: gw(nil),
			subnets: func(m map[string]Subnet) {
				m["wide"] = Subnet{Name: "wide", Vpc: "vpc1", CIDRBlock: "10.0.0.0/16", Validated: true}
			},
			want: Network{ExternalGateway: a("192.0.2.1"), InternalGateway: a("10.0.1.1"),
				VPCRoutes: pfx("10.0.3.0/24", "10.0.2.0/24", "10.0.6.0/24")}},
		{name: "host bits in a CIDR are masked", g: gw(nil),
			subnets: func(m map[string]Subnet) { s := m["b"]; s.CIDRBlock = "10.0.2.7/24"; m["b"] = s },
			want: Network{ExternalGateway: a("192.0.2.1"), InternalGateway: a("10.0.1.1"),
				VPCRoutes: pfx("10.0.3.0/24", "10.0.2.0/24", "10.0.6.0/24")}},
		{name: "gateway subnet without an IPv4 gateway: no VPC routes", g: gw(nil),
			subnets: func(m map[string]Subnet) { s := m["net1"]; s.Gateway = "fd00::1"; m["net1"] = s },
			want:    Network{ExternalGateway: a("192.0.2.1")}},
		{name: "external subnet missing", g: gw(func(g *v1.VpcNatGateway) { g.Spec.ExternalSubnets = []string{"nope"} }),
			wantErr: `external subnet "nope" not found`},
		{name: "gateway subnet missing", g: gw(func(g *v1.VpcNatGateway) { g.Spec.Subnet = "nope" }),
			wantErr: `spec.subnet: subnet "nope" not found`},
		{name: "bad CIDR of a VPC subnet is named", g: gw(nil),
			subnets: func(m map[string]Subnet) { s := m["b"]; s.CIDRBlock = "10.0.2.0/33"; m["b"] = s },
			wantErr: `subnet "b" spec.cidrBlock: "10.0.2.0/33" is not an IPv4 CIDR`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := cluster()
			if tc.subnets != nil {
				tc.subnets(m)
			}
			got, err := GatewayNetwork(tc.g, m)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("GatewayNetwork =\n %+v\nwant\n %+v", got, tc.want)
			}
		})
	}
}

func TestEIPPrefixLen(t *testing.T) {
	m := cluster()
	for _, tc := range []struct {
		eip     v1.IptablesEIPSpec
		want    int
		wantErr string
	}{
		{eip: v1.IptablesEIPSpec{}, want: 24},
		{eip: v1.IptablesEIPSpec{ExternalSubnet: "ext26"}, want: 26},
		{eip: v1.IptablesEIPSpec{ExternalSubnet: "ext6"}, wantErr: `external subnet "ext6" spec.cidrBlock: "2001:db8:1::/64" has no IPv4 CIDR`},
	} {
		e := &v1.IptablesEIP{Spec: tc.eip}
		got, err := EIPPrefixLen(m[EIPExternalSubnet(e)])
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("%+v: err = %v, want %q", tc.eip, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%+v: EIPPrefixLen = %d, %v; want %d", tc.eip, got, err, tc.want)
		}
	}
}

// TestEIPV6PrefixLen: an EIP's IPv6 prefix length is its external
// subnet's IPv6 CIDR's; a subnet without one gives 0 (no IPv6 address).
func TestEIPV6PrefixLen(t *testing.T) {
	m := cluster()
	for _, tc := range []struct {
		subnet  Subnet
		want    int
		wantErr string
	}{
		{subnet: m["ext26"], want: 64},
		{subnet: m["ext6"], want: 64},
		{subnet: m[DefaultExternalNetwork], want: 0},
		{subnet: Subnet{Name: "w", CIDRBlock: "198.51.100.0/24,2001:db8::/120"}, want: 120},
		{subnet: Subnet{Name: "bad", CIDRBlock: "198.51.100.0/24,2001:db8::/129"}, wantErr: `external subnet "bad" spec.cidrBlock: "2001:db8::/129" is not an IPv6 CIDR`},
	} {
		got, err := EIPV6PrefixLen(tc.subnet)
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("%s: err = %v, want %q", tc.subnet.Name, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: EIPV6PrefixLen = %d, %v; want %d", tc.subnet.Name, got, err, tc.want)
		}
	}
}

func TestExternalSubnets(t *testing.T) {
	for _, tc := range []struct{ in, want string }{{"", DefaultExternalNetwork}, {"ext1", "ext1"}} {
		if got := EIPExternalSubnet(&v1.IptablesEIP{Spec: v1.IptablesEIPSpec{ExternalSubnet: tc.in}}); got != tc.want {
			t.Errorf("EIPExternalSubnet(%q) = %q, want %q", tc.in, got, tc.want)
		}
		var ext []string
		if tc.in != "" {
			ext = []string{tc.in, "second"}
		}
		if got := GatewayExternalSubnet(&v1.VpcNatGateway{Spec: v1.VpcNatGatewaySpec{ExternalSubnets: ext}}); got != tc.want {
			t.Errorf("GatewayExternalSubnet(%q) = %q, want %q", ext, got, tc.want)
		}
	}
}
