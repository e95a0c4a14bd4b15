package scenario

import (
	"context"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/iptables"
	"github.com/natgw/natgw/nat/nftables"
)

// openNftables opens natgw's nftables backend as deployed (with the link
// plumber; FIPs need no addresses, so it stays idle here).
func openNftables(ctx context.Context, cfg nat.Config) (nat.Dataplane, error) {
	return nftables.New(ctx, cfg)
}

// openIptables opens natgw's iptables-legacy backend.
func openIptables(ctx context.Context, cfg nat.Config) (nat.Dataplane, error) {
	return iptables.New(ctx, cfg)
}

// natgwMethods lists natgw's own scenario 1 methods: (d) the nftables
// backend in-process, (e) the same through `natgw serve` (when the binary
// is given), (f) the iptables-legacy backend in-process. (d) and (e) are
// measured in IPv6 too; (f) is not: natgw's iptables-legacy data plane
// refuses IPv6 (nat/iptables, doc.go "IPv6").
func natgwMethods(e *Env) []Method {
	ms := []Method{
		{Key: "d", Label: "natgw nftables backend, in-process", Ours: true, CleansConntrack: true, IPv6: true, Open: openDataplane(openNftables)},
	}
	if agent := agentMethod(e); agent != nil {
		ms = append(ms, *agent)
	}
	ms = append(ms, Method{Key: "f", Label: "natgw iptables-legacy backend, in-process", Ours: true, Exec: true, CleansConntrack: true, Open: openDataplane(openIptables)})
	return ms
}

// agentMethod is (e): natgw serve over its pipe protocol; nil when no natgw
// binary was given.
func agentMethod(e *Env) *Method {
	if e.Natgw == "" {
		return nil
	}
	return &Method{Key: "e", Label: "natgw serve (nftables) over its pipe protocol", Ours: true, CleansConntrack: true, IPv6: true, Open: openAgent}
}
