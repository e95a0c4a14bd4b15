package vpclb

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/natgw/natgw/nat"
)

// TestRouteNatRules: `ip route replace DST via GW` gets the agent's verdict
// on a route (nat.Object.Validate: a network with host bits clear, a
// unicast next hop of its family), and a refusal is nat's *FieldError
// naming the argument (destination, gateway) with nat's reason.
func TestRouteNatRules(t *testing.T) {
	dsts := []string{"10.96.0.0/12", "10.96.0.5", "10.96.0.1/12", "fd00:10:96::/112", "fd00:10:96::1/112", "0.0.0.0/0", "svc", "fe80::1%eth0"}
	gws := []string{"10.0.0.1", "fd00::1", "127.0.0.1", "0.0.0.0", "224.0.0.1", "fe80::1", "::ffff:10.0.0.1", "gw"}
	for _, d := range dsts {
		for _, g := range gws {
			_, err := ParseRoute([]string{"route", "replace", d, "via", g})
			var fe *nat.FieldError
			if err != nil && (!errors.As(err, &fe) || fe.Field != "destination" && fe.Field != "gateway") {
				t.Errorf("%s via %s: %v, want a nat field error naming destination or gateway", d, g, err)
				continue
			}
			// The agent's verdict, where both parse as values it takes.
			dst, derr := netip.ParsePrefix(d)
			if !strings.Contains(d, "/") {
				a, aerr := netip.ParseAddr(d)
				dst, derr = netip.PrefixFrom(a, a.BitLen()), aerr
			}
			hop, herr := netip.ParseAddr(g)
			if derr != nil || herr != nil || strings.Contains(d, "%") {
				if err == nil {
					t.Errorf("%s via %s: accepted, want refused", d, g)
				}
				continue
			}
			route := nat.Object{UID: "r", Kind: nat.KindRoute, Route: &nat.Route{Destination: dst, NextHop: hop, Device: nat.DeviceExternal}}
			agent := route.Validate()
			if (err == nil) != (agent == nil) {
				t.Errorf("%s via %s: vpclb %v, the agent's route check %v", d, g, err, agent)
				continue
			}
			// The same field (by the agent's name for it) and reason.
			var afe *nat.FieldError
			if err != nil && errors.As(agent, &afe) {
				name := map[string]string{"destination": "route.destination", "gateway": "route.nextHop"}[fe.Field]
				reason := strings.ReplaceAll(fe.Reason, " destination ", " route.destination ")
				if name != afe.Field || reason != afe.Reason {
					t.Errorf("%s via %s: vpclb refuses %s: %q; the agent %s: %q", d, g, fe.Field, fe.Reason, afe.Field, afe.Reason)
				}
			}
		}
	}
}
