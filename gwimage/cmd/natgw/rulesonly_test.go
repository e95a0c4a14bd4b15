package main

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

// rulesDump returns the gateway's natgw rules of data plane plane.
func rulesDump(t *testing.T, ns, plane string) string {
	t.Helper()
	ctx := context.Background()
	var out string
	var err error
	if plane == "nftables" {
		out, err = netlab.NftTable(ctx, ns, "inet", nftconn.MainTable)
	} else {
		out, err = netlab.IptablesSave(ctx, ns, true)
	}
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// hasAddr reports whether dev in ns holds a.
func hasAddr(t *testing.T, ns, dev string, a netip.Prefix) bool {
	t.Helper()
	got, err := netlab.Addrs(ns, dev)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Contains(got, a)
}

// hasRoute reports whether ns's main table routes dst.
func hasRoute(t *testing.T, ns string, dst netip.Prefix) bool {
	t.Helper()
	rs, err := netlab.Routes(ns)
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(rs, func(r netlab.Route) bool { return r.Dst == dst })
}

// TestServeRulesOnly: `serve --rules-only` programs an EIP's FIP rule and
// keeps the EIP and a Route in its state, but puts neither the address on
// net1 nor the route in the kernel (nat/ha moves them); plain `serve` does
// both. Removing the objects leaves the rules-only agent's kernel as it was.
func TestServeRulesOnly(t *testing.T) {
	for _, plane := range dataplanes() {
		for _, rulesOnly := range []bool{false, true} {
			name := plane + "/plumbed"
			if rulesOnly {
				name = plane + "/rules-only"
			}
			t.Run(name, func(t *testing.T) {
				lab := netlab.ForTest(t)
				gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
				if err != nil {
					t.Fatal(err)
				}
				ctx := testCtx(t, time.Minute)
				extra := []string{"--dataplane", plane}
				args := []string{}
				if rulesOnly {
					args = append(args, "--rules-only")
				}
				a := startAgentArgs(t, gw.GW, extra, args)
				eip := netip.PrefixFrom(netlab.EIP(0), 24)
				dst := netip.MustParsePrefix("10.20.0.0/16")
				objs := []nat.Object{
					{UID: "eip-1", Kind: nat.KindEIP, EIP: &nat.EIP{Address: eip.Addr(), PrefixLen: eip.Bits()}},
					{UID: "route-1", Kind: nat.KindRoute, Route: &nat.Route{Destination: dst, NextHop: netlab.VMAddr(0), Device: nat.DeviceInternal}},
					{UID: "fip-1", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip.Addr(), InternalIP: netlab.VMAddr(0)}},
				}
				if err := a.Apply(ctx, objs...); err != nil {
					t.Fatalf("apply: %v", err)
				}
				got, err := a.List(ctx, true)
				if err != nil {
					t.Fatal(err)
				}
				sameObjects(t, "list", got, objs)
				rules := rulesDump(t, gw.GW, plane)
				if !strings.Contains(rules, eip.Addr().String()) || !strings.Contains(rules, netlab.VMAddr(0).String()) {
					t.Errorf("the FIP %s <-> %s is not in the %s rules:\n%s", eip.Addr(), netlab.VMAddr(0), plane, rules)
				}
				if on := hasAddr(t, gw.GW, gw.ExternalInterface, eip); on == rulesOnly {
					t.Errorf("EIP %s on %s: %t, want %t", eip, gw.ExternalInterface, on, !rulesOnly)
				}
				if has := hasRoute(t, gw.GW, dst); has == rulesOnly {
					t.Errorf("route to %s: %t, want %t", dst, has, !rulesOnly)
				}
				if rulesOnly {
					// An address nat/ha put there is not the agent's to remove.
					if err := netlab.AddAddr(gw.GW, gw.ExternalInterface, eip); err != nil {
						t.Fatal(err)
					}
				}
				if err := a.Delete(ctx, "fip-1", "route-1", "eip-1"); err != nil {
					t.Fatalf("delete: %v", err)
				}
				if on := hasAddr(t, gw.GW, gw.ExternalInterface, eip); on != rulesOnly {
					t.Errorf("after delete: EIP %s on %s: %t, want %t", eip, gw.ExternalInterface, on, rulesOnly)
				}
				a.stop(t)
			})
		}
	}
}

// TestServeSyncedFile: `serve --synced-file` leaves no mark for an apply,
// leaves it (with its directory) at the first sync, even of an empty set,
// and keeps it through later syncs; a sync that fails leaves none.
func TestServeSyncedFile(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, time.Minute)
	mark := filepath.Join(t.TempDir(), "run", "rules-synced")
	exists := func() bool {
		_, err := os.Stat(mark)
		return err == nil
	}
	a := startAgentArgs(t, gw.GW, []string{"--dataplane", "nftables"}, []string{"--rules-only", "--synced-file", mark})
	eip := nat.Object{UID: "eip-1", Kind: nat.KindEIP, EIP: &nat.EIP{Address: netlab.EIP(0), PrefixLen: 24}}
	if err := a.Apply(ctx, eip); err != nil {
		t.Fatal(err)
	}
	if exists() {
		t.Fatal("mark after an apply, before any sync")
	}
	bad := nat.Object{UID: "fip-bad", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netlab.EIP(0), InternalIP: netip.MustParseAddr("127.0.0.1")}}
	if err := a.Sync(ctx, []nat.Object{eip, bad}); err == nil {
		t.Fatal("a sync with a FIP to 127.0.0.1 succeeded")
	}
	if exists() {
		t.Fatal("mark after a failed sync")
	}
	if err := a.Sync(ctx, []nat.Object{}); err != nil {
		t.Fatal(err)
	}
	if !exists() {
		t.Fatal("no mark after a sync")
	}
	if err := a.Sync(ctx, []nat.Object{eip}); err != nil {
		t.Fatal(err)
	}
	if !exists() {
		t.Fatal("mark gone after a second sync")
	}
	a.stop(t)
}
