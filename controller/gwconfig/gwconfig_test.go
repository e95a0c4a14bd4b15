package gwconfig

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/natgw/natgw/nat"
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

// TestExternalGatewayNatRule: the external gateways (the next hops of the
// default routes) get nat's verdict: the field named as in the file, nat's
// parser's reason, and for an address the agent takes as a route's next
// hop, the agent's verdict too.
func TestExternalGatewayNatRule(t *testing.T) {
	for _, tc := range []struct {
		key   string
		parse func(field, s string) (netip.Addr, error)
		vals  []string
	}{
		{"externalGateway", nat.ParseUnicastIPv4, []string{"192.0.2.1", "127.0.0.1", "0.0.0.0", "224.0.0.1", "255.255.255.255", "fd00::1", "192.0.2.1/24", "x"}},
		{"externalGatewayV6", nat.ParseUnicastIPv6, []string{"2001:db8::1", "::1", "fe80::1", "ff02::1", "::ffff:192.0.2.1", "192.0.2.1", "2001:DB8::1", "x"}},
	} {
		for _, v := range tc.vals {
			p := filepath.Join(t.TempDir(), "gw.yaml")
			if err := os.WriteFile(p, []byte("defaults:\n  "+tc.key+": \""+v+"\"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Load(p)
			field := "defaults." + tc.key
			_, want := tc.parse(field, v)
			var fe, wantFE *nat.FieldError
			switch {
			case (err == nil) != (want == nil):
				t.Errorf("%s %q: %v, nat says %v", tc.key, v, err, want)
				continue
			case want != nil && (!errors.As(err, &fe) || !errors.As(want, &wantFE) || *fe != *wantFE):
				t.Errorf("%s %q: %v, want nat's %v", tc.key, v, err, want)
				continue
			}
			// The agent's verdict on the default route through it.
			addr, perr := netip.ParseAddr(v)
			if perr != nil || addr.Is4() != (tc.key == "externalGateway") || v != strings.ToLower(v) {
				continue // not an address of the route's family (or text case): never sent
			}
			dst := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
			if addr.Is6() {
				dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
			}
			route := nat.Object{UID: "r", Kind: nat.KindRoute, Route: &nat.Route{Destination: dst, NextHop: addr, Device: nat.DeviceExternal}}
			if agentErr := route.Validate(); (agentErr == nil) != (err == nil) {
				t.Errorf("%s %q: gwconfig says %v, the agent's route check %v", tc.key, v, err, agentErr)
			}
		}
	}
}
