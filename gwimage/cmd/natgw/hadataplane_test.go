//go:build !natgw_omit_ha

package main

import (
	"bufio"
	"encoding/json"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/syncbuf"
	"github.com/natgw/natgw/nat"
)

// TestHAEIPsFromDataplane: `natgw serve --rules-only` and `natgw ha
// --eips-from-dataplane` in one gateway namespace (the lone replica leads,
// file fence). An EIP applied through the agent gets its address on net1
// while the replica is active, and a FIP through it carries real packets;
// a deleted EIP's address goes; the replica's stop removes the rest. On
// both data planes.
func TestHAEIPsFromDataplane(t *testing.T) {
	for _, plane := range dataplanes() {
		t.Run(plane, func(t *testing.T) {
			lab := netlab.ForTest(t)
			gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 2})
			if err != nil {
				t.Fatal(err)
			}
			ctx := testCtx(t, 2*time.Minute)
			for _, vm := range gw.VMs {
				if _, err := lab.ServeTCP(ctx, vm.NS, "0.0.0.0:7001"); err != nil {
					t.Fatal(err)
				}
			}
			a := startAgentArgs(t, gw.GW, []string{"--dataplane", plane}, []string{"--rules-only"})
			eip := func(i int) netip.Prefix { return netip.PrefixFrom(netlab.EIP(i), 24) }
			eipObj := func(i int) nat.Object {
				return nat.Object{UID: "eip-" + string(rune('a'+i)), Kind: nat.KindEIP, EIP: &nat.EIP{Address: eip(i).Addr(), PrefixLen: 24}}
			}
			fipObj := func(i int) nat.Object {
				return nat.Object{UID: "fip-" + string(rune('a'+i)), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip(i).Addr(), InternalIP: gw.VMs[i].Addr}}
			}
			if err := a.Apply(ctx, eipObj(0), fipObj(0)); err != nil {
				t.Fatalf("apply: %v", err)
			}
			probe := func(i int) error {
				_, _, err := netlab.Upload(ctx, gw.Ext.NS, netip.AddrPortFrom(eip(i).Addr(), 7001).String(), 1000, time.Second)
				return err
			}
			// Rules only: nobody holds the EIP yet, so nothing answers.
			if err := probe(0); err == nil {
				t.Fatalf("FIP %s reachable before the replica holds its address", eip(0))
			}

			ha := exec.Command(natgwBin, "--netns", gw.GW, "--dataplane", plane, "ha", "--id", "gwa",
				"--local", netip.AddrPortFrom(netlab.GWVPCAddr, 7400).String(), "--peer", "198.51.100.250:7400",
				"--fence-file", filepath.Join(t.TempDir(), "lease"), "--interval", "20ms",
				"--eips-from-dataplane", "--eips-poll", "100ms")
			stderr := &syncbuf.Buffer{}
			ha.Stderr = stderr
			out, err := ha.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := ha.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- ha.Wait() }()
			t.Cleanup(func() {
				_ = ha.Process.Kill()
				<-done
				if t.Failed() {
					t.Logf("natgw ha stderr:\n%s", stderr.String())
				}
			})
			roles := make(chan string, 16)
			go func() {
				sc := bufio.NewScanner(out)
				for sc.Scan() {
					var ev struct{ Role string }
					if json.Unmarshal(sc.Bytes(), &ev) == nil {
						roles <- ev.Role
					}
				}
			}()
			select {
			case r := <-roles:
				if r != "active" {
					t.Fatalf("first role %q, want active", r)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the lone replica did not become active within 10 s")
			}
			// waitAddrs waits (5 s at most) until list gives exactly want
			// on the external interface; kind names the addresses.
			waitAddrs := func(what, kind string, list func(ns, dev string) ([]netip.Prefix, error), want []netip.Prefix) {
				t.Helper()
				deadline := time.Now().Add(5 * time.Second)
				for {
					got, err := list(gw.GW, gw.ExternalInterface)
					if err != nil {
						t.Fatal(err)
					}
					if sameSet(got, want) {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s: %s holds %s%v, want %v", what, gw.ExternalInterface, kind, got, want)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			waitNet1 := func(what string, want ...netip.Prefix) {
				t.Helper()
				waitAddrs(what, "", netlab.Addrs, append(want, netip.PrefixFrom(netlab.GWExtAddr, 24)))
			}
			// waitNet16 is waitNet1 for the IPv6 addresses (link-local
			// ones left out).
			waitNet16 := func(what string, want ...netip.Prefix) {
				t.Helper()
				waitAddrs(what, "the IPv6 addresses ", netlab.Addrs6, want)
			}
			waitNet1("active with the EIP applied before the start", eip(0))
			if err := probe(0); err != nil {
				t.Fatalf("FIP %s through the active replica: %v", eip(0), err)
			}
			if err := a.Apply(ctx, eipObj(1), fipObj(1)); err != nil {
				t.Fatalf("apply: %v", err)
			}
			waitNet1("EIP added through the agent", eip(0), eip(1))
			if err := probe(1); err != nil {
				t.Fatalf("FIP %s through the active replica: %v", eip(1), err)
			}
			if err := a.Delete(ctx, "fip-a", "eip-a"); err != nil {
				t.Fatalf("delete: %v", err)
			}
			waitNet1("EIP deleted through the agent", eip(1))
			if plane == string(nat.DataplaneNftables) { // iptables-legacy refuses IPv6 objects
				// A dual-stack EIP floats as its two prefixes.
				v6 := netip.PrefixFrom(netlab.EIP6(2), 64)
				dual := nat.Object{UID: "eip-dual", Kind: nat.KindEIP, EIP: &nat.EIP{Address: eip(2).Addr(), PrefixLen: 24, V6Address: v6.Addr(), V6PrefixLen: 64}}
				if err := a.Apply(ctx, dual); err != nil {
					t.Fatalf("apply: %v", err)
				}
				waitNet1("dual-stack EIP added through the agent", eip(1), eip(2))
				waitNet16("dual-stack EIP added through the agent", v6)
			}
			if err := ha.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				done <- err
				if err != nil {
					t.Fatalf("natgw ha exit after SIGTERM: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("natgw ha did not stop within 10 s of SIGTERM")
			}
			waitNet1("replica stopped")
			waitNet16("replica stopped")
			if !strings.Contains(stderr.String(), "floating EIPs follow the data plane") {
				t.Errorf("no log of the followed set:\n%s", stderr.String())
			}
			a.stop(t)
		})
	}
}

// sameSet reports whether a and b hold the same prefixes.
func sameSet(a, b []netip.Prefix) bool {
	if len(a) != len(b) {
		return false
	}
	for _, p := range a {
		found := false
		for _, q := range b {
			found = found || p == q
		}
		if !found {
			return false
		}
	}
	return true
}
