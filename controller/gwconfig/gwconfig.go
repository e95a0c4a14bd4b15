// Package gwconfig maps gateway names (VpcNatGateway names, as referenced by
// IptablesEIP.spec.natGwDp) to where and how their agent runs: a network
// namespace for the local transport, or the gateway pod found by label for
// the exec transport; plus what the Kubernetes objects do not say, the
// external network's prefix length and gateway address.
//
// The file is YAML (or JSON):
//
//	defaults:
//	  externalPrefixLen: 24
//	  externalGateway: 192.0.2.1
//	gateways:
//	- name: gw1
//	  netns: ngw-gw1        # local transport only
//	  dataplane: iptables   # optional; the VpcNatGateway annotation wins
//	  externalGateway: 192.0.2.254
package gwconfig

import (
	"fmt"
	"net/netip"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/natgw/natgw/nat"
)

// Entry is one gateway's entry in the config file (or the file's
// defaults): where its agent runs and what the API does not say. Empty fields take the
// file's defaults.
type Entry struct {
	// Name is the VpcNatGateway's name.
	Name string `json:"name,omitempty"`
	// NetNS is the gateway's network namespace (local transport).
	NetNS string `json:"netns,omitempty"`
	// Dataplane overrides the controller's --dataplane for this gateway.
	// The VpcNatGateway annotation natgw.kubeovn.io/dataplane overrides both.
	Dataplane nat.DataplaneName `json:"dataplane,omitempty"`
	// ExternalPrefixLen is the prefix length of EIP addresses on the
	// external interface (upstream: the external subnet's mask).
	ExternalPrefixLen int `json:"externalPrefixLen,omitempty"`
	// ExternalGateway is the next hop of the gateway's default route
	// through the external interface; empty installs no default route.
	ExternalGateway string `json:"externalGateway,omitempty"`
	// ExternalV6PrefixLen is the prefix length of EIP IPv6 addresses on
	// the external interface (upstream: the external subnet's IPv6 CIDR);
	// DefaultExternalV6PrefixLen when unset.
	ExternalV6PrefixLen int `json:"externalV6PrefixLen,omitempty"`
	// ExternalGatewayV6 is the next hop of the gateway's IPv6 default
	// route through the external interface (upstream: GATEWAY_V6, the
	// external subnet's IPv6 gateway); empty installs none.
	ExternalGatewayV6 string `json:"externalGatewayV6,omitempty"`
	// ExternalInterface and InternalInterface override the agent's
	// defaults (net1 and eth0).
	ExternalInterface string `json:"externalInterface,omitempty"`
	InternalInterface string `json:"internalInterface,omitempty"`
}

// DefaultExternalPrefixLen is used when neither a gateway nor the defaults
// say otherwise.
const DefaultExternalPrefixLen = 24

// DefaultExternalV6PrefixLen is the IPv6 prefix length used when neither a
// gateway nor the defaults say otherwise.
const DefaultExternalV6PrefixLen = 64

// Config is the whole file.
type Config struct {
	Defaults Entry   `json:"defaults,omitempty"`
	Gateways []Entry `json:"gateways,omitempty"`
	// Unlisted allows gateways that are not listed, with the defaults
	// (the exec transport finds any gateway's pod by label). Set by the
	// controller for the exec transport, not read from the file.
	Unlisted bool `json:"-"`
}

// Load reads and validates a config file.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("gateway config: %w", err)
	}
	var c Config
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return nil, fmt.Errorf("gateway config %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("gateway config %s: %w", path, err)
	}
	return &c, nil
}

// Validate checks names, data planes and addresses.
func (c *Config) Validate() error {
	if err := c.Defaults.validate("defaults"); err != nil {
		return err
	}
	seen := map[string]bool{}
	for i, g := range c.Gateways {
		where := fmt.Sprintf("gateways[%d]", i)
		if g.Name == "" {
			return fmt.Errorf("%s.name: must not be empty", where)
		}
		if seen[g.Name] {
			return fmt.Errorf("%s.name: gateway %q listed twice", where, g.Name)
		}
		seen[g.Name] = true
		if err := g.validate(where); err != nil {
			return err
		}
	}
	return nil
}

func (g Entry) validate(where string) error {
	if g.Dataplane != "" {
		if _, err := nat.ParseDataplaneName(where+".dataplane", string(g.Dataplane)); err != nil {
			return err
		}
	}
	if g.ExternalPrefixLen < 0 || g.ExternalPrefixLen > 32 {
		return fmt.Errorf("%s.externalPrefixLen: %d is not 1..32", where, g.ExternalPrefixLen)
	}
	// The external gateways are the next hops of the gateway's default
	// routes: nat's rule for an address a gateway programs.
	if g.ExternalGateway != "" {
		if _, err := nat.ParseUnicastIPv4(where+".externalGateway", g.ExternalGateway); err != nil {
			return err
		}
	}
	if g.ExternalV6PrefixLen < 0 || g.ExternalV6PrefixLen > 128 {
		return fmt.Errorf("%s.externalV6PrefixLen: %d is not 1..128", where, g.ExternalV6PrefixLen)
	}
	if g.ExternalGatewayV6 != "" {
		if _, err := nat.ParseUnicastIPv6(where+".externalGatewayV6", g.ExternalGatewayV6); err != nil {
			return err
		}
	}
	return nil
}

// Lookup returns the configuration of gateway name with defaults filled in,
// and false when the gateway is not configured (and unlisted gateways are
// not allowed).
func (c *Config) Lookup(name string) (Entry, bool) {
	var g Entry
	found := false
	for _, x := range c.Gateways {
		if x.Name == name {
			g, found = x, true
			break
		}
	}
	if !found && !c.Unlisted {
		return Entry{}, false
	}
	g.Name = name
	d := c.Defaults
	fill := func(v *string, def string) {
		if *v == "" {
			*v = def
		}
	}
	if g.Dataplane == "" {
		g.Dataplane = d.Dataplane
	}
	fill(&g.ExternalGateway, d.ExternalGateway)
	fill(&g.ExternalGatewayV6, d.ExternalGatewayV6)
	fill(&g.ExternalInterface, d.ExternalInterface)
	fill(&g.InternalInterface, d.InternalInterface)
	if g.ExternalPrefixLen == 0 {
		g.ExternalPrefixLen = d.ExternalPrefixLen
	}
	if g.ExternalPrefixLen == 0 {
		g.ExternalPrefixLen = DefaultExternalPrefixLen
	}
	if g.ExternalV6PrefixLen == 0 {
		g.ExternalV6PrefixLen = d.ExternalV6PrefixLen
	}
	if g.ExternalV6PrefixLen == 0 {
		g.ExternalV6PrefixLen = DefaultExternalV6PrefixLen
	}
	return g, true
}

// ExternalGatewayAddr returns the parsed external gateway (invalid when unset).
func (g Entry) ExternalGatewayAddr() netip.Addr {
	a, _ := netip.ParseAddr(g.ExternalGateway)
	return a
}

// ExternalGatewayV6Addr returns the parsed IPv6 external gateway (invalid
// when unset).
func (g Entry) ExternalGatewayV6Addr() netip.Addr {
	a, _ := netip.ParseAddr(g.ExternalGatewayV6)
	return a
}
