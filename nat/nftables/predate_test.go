package nftables

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/engine"
	"github.com/natgw/natgw/nat/nattest"
)

// openEngine opens cfg's Backend (no plumbing) under an engine and returns
// both: tests reach the Backend's mark ids through it.
func openEngine(t testing.TB, cfg nat.Config) (*Backend, nat.Dataplane) {
	t.Helper()
	r, err := NewBackend(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dp, err := engine.New(context.Background(), r, nil, logr.Discard())
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	return r, dp
}

// insertFlow inserts the conntrack entry of a UDP connection src:sport →
// dst:53 with mark in namespace ns (what natgw's rules leave; mark 0 for
// one they did not mark).
func insertFlow(ctx context.Context, ns string, src, dst netip.Addr, sport uint16, mark uint32) error {
	_, err := netlab.Exec(ctx, ns, "", "conntrack", "-I", "-p", "udp", "-s", src.String(), "-d", dst.String(),
		"--sport", fmt.Sprint(sport), "--dport", "53", "--timeout", "120", "--mark", fmt.Sprint(mark))
	return err
}

// TestForgetFlowsPredatingMark: IPv6 connections of an EIP that predate its
// mark id (made before the id was given: an older layout, a FIP used before
// its EIP object came; here entries with mark 0) are deleted with the
// EIP's FIP like its marked ones, and only the deleted EIP's: while the
// table may hold such connections ForgetFlows deletes IPv6 flows by
// address, and once its dump sees none left it flushes by mark id again
// (a mark-0 entry made after that stays: the rules mark every new
// connection, so the scan is no longer needed). A new id sets the scan
// again.
func TestForgetFlowsPredatingMark(t *testing.T) {
	cfg := gateway(t)
	ctx := ctxT(t)
	r, dp := openEngine(t, cfg)
	a, b := addr("2001:db8:2::100"), addr("2001:db8:2::200")
	ext := addr("2001:db8:ffff::7")
	fipA := nattest.FIP("fip-a", a, addr("fd00::a"))
	fipB := nattest.FIP("fip-b", b, addr("fd00::b"))
	if err := dp.Sync(ctx, []nat.Object{nattest.EIP6("eip-a", a), nattest.EIP6("eip-b", b), fipA, fipB}); err != nil {
		t.Fatal(err)
	}
	if !r.unmarked6 {
		t.Fatal("new mark ids given, but no scan for connections that predate them")
	}
	id := func(e netip.Addr) uint32 {
		m, ok := r.marks6[e]
		if !ok {
			t.Fatalf("no mark id for %s", e)
		}
		return m.id
	}
	sport := uint16(30000)
	add := func(eip netip.Addr, mark uint32) {
		t.Helper()
		sport++
		if err := insertFlow(ctx, cfg.NetNS, ext, eip, sport, mark); err != nil {
			t.Fatal(err)
		}
	}
	count := func(eip netip.Addr) int {
		t.Helper()
		flows, err := netlab.ConntrackEntries(ctx, cfg.NetNS)
		if err != nil {
			t.Fatal(err)
		}
		return len(netlab.FlowsWith(flows, eip))
	}
	add(a, 0)
	add(a, id(a))
	add(b, 0)
	add(b, id(b))

	steps := []struct {
		name          string
		del           nat.Object
		leftA, leftB  int
		wantUnmarked6 bool
	}{
		// b's mark-0 entry is still there: the scan stays.
		{"delete fip-a", fipA, 0, 2, true},
		// Nothing predates a mark any more: back to flushes by id.
		{"delete fip-b", fipB, 0, 0, false},
	}
	for _, s := range steps {
		if err := dp.Delete(ctx, s.del.UID); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := count(a); got != s.leftA {
			t.Errorf("%s: %d entries to %s left, want %d", s.name, got, a, s.leftA)
		}
		if got := count(b); got != s.leftB {
			t.Errorf("%s: %d entries to %s left, want %d", s.name, got, b, s.leftB)
		}
		if r.unmarked6 != s.wantUnmarked6 {
			t.Errorf("%s: scan for predating connections %v, want %v", s.name, r.unmarked6, s.wantUnmarked6)
		}
	}

	// Scan off: the delete flushes by id; a mark-0 entry made now (which
	// the rules would not make) shows the flush left the address alone.
	if err := dp.Apply(ctx, fipA); err != nil {
		t.Fatal(err)
	}
	add(a, id(a))
	add(a, 0)
	if err := dp.Delete(ctx, fipA.UID); err != nil {
		t.Fatal(err)
	}
	if got := count(a); got != 1 {
		t.Errorf("after the scan ended, delete fip-a: %d entries to %s left, want 1 (the mark-0 one)", got, a)
	}

	// A new EIP's id turns the scan on again.
	if err := dp.Apply(ctx, nattest.EIP6("eip-c", addr("2001:db8:2::300"))); err != nil {
		t.Fatal(err)
	}
	if !r.unmarked6 {
		t.Error("a new mark id did not turn the scan for predating connections on")
	}
}
