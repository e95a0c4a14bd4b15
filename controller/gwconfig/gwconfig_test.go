package gwconfig

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoad(t *testing.T) {
	cases := []struct {
		name, yaml, wantErr string
	}{
		{"ok", "defaults:\n  externalPrefixLen: 24\n  externalGateway: 192.0.2.1\n  externalGatewayV6: 2001:db8::1\ngateways:\n- name: gw1\n  netns: ns1\n  dataplane: iptables\n  externalV6PrefixLen: 120\n", ""},
		{"unknown-field", "gateways:\n- name: gw1\n  nets: ns1\n", "nets"},
		{"dup", "gateways:\n- name: gw1\n- name: gw1\n", "listed twice"},
		{"no-name", "gateways:\n- netns: x\n", "gateways[0].name"},
		{"dataplane", "gateways:\n- name: a\n  dataplane: ebpf\n", "gateways[0].dataplane"},
		{"gateway-addr", "defaults:\n  externalGateway: fd00::1\n", "defaults.externalGateway"},
		{"prefix", "gateways:\n- name: a\n  externalPrefixLen: 33\n", "externalPrefixLen"},
		{"gateway-v6-addr", "defaults:\n  externalGatewayV6: 192.0.2.1\n", `defaults.externalGatewayV6 "192.0.2.1": not an IPv6 address`},
		{"gateway-v6-link-local", "defaults:\n  externalGatewayV6: fe80::1\n", `defaults.externalGatewayV6 "fe80::1": a link-local IPv6 address`},
		{"prefix-v6", "gateways:\n- name: a\n  externalV6PrefixLen: 129\n", "gateways[0].externalV6PrefixLen: 129 is not 1..128"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "gw.yaml")
			if err := os.WriteFile(p, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := Load(p)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			g, ok := c.Lookup("gw1")
			if !ok || g.NetNS != "ns1" || g.Dataplane != "iptables" || g.ExternalPrefixLen != 24 || g.ExternalGateway != "192.0.2.1" ||
				g.ExternalV6PrefixLen != 120 || g.ExternalGatewayV6Addr() != netip.MustParseAddr("2001:db8::1") {
				t.Errorf("Lookup(gw1) = %+v, %v", g, ok)
			}
			if _, ok := c.Lookup("other"); ok {
				t.Error("unlisted gateway found")
			}
			c.Unlisted = true
			if g, ok := c.Lookup("other"); !ok || g.Name != "other" || g.ExternalPrefixLen != 24 || g.ExternalV6PrefixLen != DefaultExternalV6PrefixLen {
				t.Errorf("Lookup(other) with Unlisted = %+v, %v", g, ok)
			}
		})
	}
}
