package main

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	nft "github.com/google/nftables"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
)

// fipSet returns n floating IPs tagged prefix: EIPs from base.0.0 up, internal
// addresses from 10.<second octet of base>.0.0 up.
func fipSet(prefix string, base [2]byte, n int) []nat.Object {
	objs := make([]nat.Object, n)
	for i := range n {
		hi, lo := byte(i>>8), byte(i)
		objs[i] = nat.Object{UID: fmt.Sprintf("%s-%05d", prefix, i), Kind: nat.KindFIP, FIP: &nat.FIP{
			EIP:        netip.AddrFrom4([4]byte{base[0], base[1], hi, lo}),
			InternalIP: netip.AddrFrom4([4]byte{10, base[1], hi, lo}),
		}}
	}
	return objs
}

// tableCensus counts the UIDs of each generation in the kernel's FIP maps
// (every FIP is one element in each, commented with its UID), read over
// netlink directly, bypassing natgw (`nft list` takes too long at 100,000
// elements).
func tableCensus(t *testing.T, ns string) (old, new int) {
	t.Helper()
	h, err := netns.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	c, err := nft.New(nft.WithNetNSFd(h.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	table := &nft.Table{Name: string(nftconn.MainTable), Family: nft.TableFamilyINet}
	for _, name := range []string{nftconn.MainSetFIPDNAT, nftconn.MainSetFIPSNAT} {
		set, err := c.GetSetByName(table, name)
		if err != nil {
			t.Fatalf("map %s: %v", name, err)
		}
		elems, err := c.GetSetElements(set)
		if err != nil {
			t.Fatalf("map %s elements: %v", name, err)
		}
		for _, e := range elems {
			switch {
			case strings.HasPrefix(e.Comment, "old-"):
				old++
			case strings.HasPrefix(e.Comment, "new-"):
				new++
			default:
				t.Fatalf("map %s: element of unknown owner %q", name, e.Comment)
			}
		}
	}
	runtime.KeepAlive(h)
	return old, new
}

// TestKillDuringLargeSync kills the agent with SIGKILL at several points of
// a sync that replaces 50,000 floating IPs by 50,000 others, and checks the
// kernel after each kill: the old set or the new set, never a mix.
func TestKillDuringLargeSync(t *testing.T) {
	if testing.Short() {
		t.Skip("large sync: skipped with -short")
	}
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	const n = 50_000
	oldSet, newSet := fipSet("old", [2]byte{100, 64}, n), fipSet("new", [2]byte{100, 65}, n)
	ctx := testCtx(t, 10*time.Minute)

	// check asserts the table holds exactly one generation and returns it.
	check := func(when string) string {
		t.Helper()
		o, nw := tableCensus(t, gw.GW)
		switch {
		case o == 2*n && nw == 0:
			return "old"
		case o == 0 && nw == 2*n:
			return "new"
		}
		t.Fatalf("%s: the table mixes generations: %d old and %d new map elements (want %d of one)", when, o, nw, 2*n)
		return ""
	}
	// Measure an uninterrupted old -> new switch.
	a := startAgent(t, gw.GW, "-v", "1")
	if err := a.Sync(ctx, oldSet); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := a.Sync(ctx, newSet); err != nil {
		t.Fatal(err)
	}
	full := time.Since(start)
	if got := check("after an uninterrupted sync"); got != "new" {
		t.Fatalf("uninterrupted sync left %s", got)
	}
	a.stop(t)
	t.Logf("uninterrupted sync of %d FIPs over %d others: %v", n, n, full)

	outcomes := map[string]int{}
	interrupted := 0
	for _, frac := range []float64{0.25, 0.5, 0.75, 0.95} {
		a := startAgent(t, gw.GW)
		if _, err := a.Info(ctx); err != nil { // loaded
			t.Fatal(err)
		}
		to := newSet
		if cur := check("before kill"); cur == "new" {
			to = oldSet
		}
		errc := make(chan error, 1)
		go func() { errc <- a.Sync(ctx, to) }()
		time.Sleep(time.Duration(frac * float64(full)))
		if err := a.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		a.wait(t)
		err := <-errc
		if err != nil {
			if !errors.Is(err, agentapi.ErrClosed) {
				t.Fatalf("sync cut by kill: %v, want ErrClosed", err)
			}
			interrupted++
		}
		got := check(fmt.Sprintf("after kill at %.0f%%", frac*100))
		outcomes[got]++
		t.Logf("kill at %.0f%% of %v: call error %v, table holds the %s set", frac*100, full, err, got)
	}
	if interrupted == 0 {
		t.Fatalf("no kill landed before the sync's response (outcomes %v): the test did not cut a sync", outcomes)
	}
	// A new agent takes over whatever generation is there.
	a2 := startAgent(t, gw.GW)
	objs, err := a2.List(ctx, true)
	if err != nil || len(objs) != n {
		t.Fatalf("agent after kills lists %d objects, %v", len(objs), err)
	}
	if err := a2.Sync(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if o, nw := tableCensus(t, gw.GW); o+nw != 0 {
		t.Fatalf("after empty sync: %d old, %d new elements", o, nw)
	}
	a2.stop(t)
}
