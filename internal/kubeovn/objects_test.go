package kubeovn

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestObjectsExternalSubnet: the external subnet is IPv4 unless an IPv6
// CIDR is given; then it is dual-stack as Kube-OVN writes one (protocol
// Dual, "v4,v6" in cidrBlock and gateway).
func TestObjectsExternalSubnet(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		n                       Network
		protocol, cidrBlock, gw string
	}{
		{"ipv4", Network{ExternalCIDR: "192.0.2.0/24", ExternalGateway: "192.0.2.1"}, "IPv4", "192.0.2.0/24", "192.0.2.1"},
		{"dual stack", Network{ExternalCIDR: "192.0.2.0/24", ExternalGateway: "192.0.2.1", ExternalCIDR6: "2001:db8:2::/64", ExternalGateway6: "2001:db8:2::1"},
			"Dual", "192.0.2.0/24,2001:db8:2::/64", "192.0.2.1,2001:db8:2::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			found := false
			for _, doc := range strings.Split(Objects("img", tc.n), "\n---\n") {
				var o struct {
					Kind     string `json:"kind"`
					Metadata struct {
						Name string `json:"name"`
					} `json:"metadata"`
					Spec struct {
						Protocol  string `json:"protocol"`
						CIDRBlock string `json:"cidrBlock"`
						Gateway   string `json:"gateway"`
					} `json:"spec"`
				}
				if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
					t.Fatalf("%v in:\n%s", err, doc)
				}
				if o.Kind != "Subnet" || o.Metadata.Name != ExternalNetwork {
					continue
				}
				found = true
				if o.Spec.Protocol != tc.protocol || o.Spec.CIDRBlock != tc.cidrBlock || o.Spec.Gateway != tc.gw {
					t.Errorf("external subnet protocol %q cidrBlock %q gateway %q; want %q %q %q", o.Spec.Protocol, o.Spec.CIDRBlock, o.Spec.Gateway, tc.protocol, tc.cidrBlock, tc.gw)
				}
			}
			if !found {
				t.Fatalf("no Subnet %s in the objects", ExternalNetwork)
			}
		})
	}
}
