package engine_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/engine"
)

// nullBackend is a Backend that commits nothing: it asks a full Commit for
// its desired objects as nftables.Backend does (Desired, on demand) and
// counts what it is given, so that a benchmark measures the engine's own
// share of a Sync (planning, the desired list, the conntrack cleanup's
// planning) and no kernel's.
type nullBackend struct {
	desired, forgotten int
}

func (*nullBackend) Name() nat.DataplaneName { return nat.DataplaneNftables }
func (*nullBackend) Load(context.Context) ([]nat.Object, string, error) {
	return nil, "boot", nil
}
func (b *nullBackend) Commit(_ context.Context, c engine.Commit) error {
	if c.Full && len(c.Removed)+len(c.Added) >= c.DesiredLen()/2 {
		b.desired += len(c.Desired())
	}
	return nil
}
func (b *nullBackend) ForgetFlows(_ context.Context, eips []netip.Addr) error {
	b.forgotten += len(eips)
	return nil
}
func (*nullBackend) Close() error       { return nil }
func (*nullBackend) WantOnDemand() bool { return true }

// fipsN returns n FIPs with distinct EIPs, internal IPs and 36-char UIDs.
func fipsN(n int) []nat.Object {
	out := make([]nat.Object, n)
	for i := range out {
		e := netip.AddrFrom4([4]byte{100, byte(64 + i>>16), byte(i >> 8), byte(i)})
		in := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		out[i] = nat.Object{UID: fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: e, InternalIP: in}}
	}
	return out
}

// BenchmarkSync100k is the engine's share of one Sync of 100,000 FIPs
// (kernel-free: the Backend commits nothing, see nullBackend):
//   - Empty: a new engine on an empty table, then one Sync of all 100k
//     (scenario 2's Sync; the Backend asks for every desired object);
//   - Unchanged: a Sync of the same 100k to an engine that holds them
//     (a resync that changes nothing);
//   - FillClear: a Sync of 100k into an empty engine, then a Sync of none
//     (the second removes 100k FIPs: the conntrack cleanup's planning,
//     flowsToForget, and 100k EIPs handed to ForgetFlows).
//
// Measure it by instruction counts (cachegrind) on a loaded host.
func BenchmarkSync100k(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	objs := fipsN(n)
	newEngine := func(b *testing.B) (*engine.Engine, *nullBackend) {
		r := &nullBackend{}
		e, err := engine.New(ctx, r, nil, logr.Discard())
		if err != nil {
			b.Fatal(err)
		}
		return e, r
	}
	sync := func(b *testing.B, e *engine.Engine, objs []nat.Object) {
		if err := e.Sync(ctx, objs); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("Empty", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			e, r := newEngine(b)
			sync(b, e, objs)
			if r.desired != n {
				b.Fatalf("the Backend was given %d desired objects, want %d", r.desired, n)
			}
		}
	})
	b.Run("Unchanged", func(b *testing.B) {
		e, r := newEngine(b)
		sync(b, e, objs)
		b.ReportAllocs()
		for b.Loop() {
			sync(b, e, objs)
		}
		if r.desired != n || r.forgotten != 0 {
			b.Fatalf("desired %d (want %d once), forgotten %d", r.desired, n, r.forgotten)
		}
	})
	b.Run("FillClear", func(b *testing.B) {
		e, r := newEngine(b)
		ops := 0
		b.ReportAllocs()
		for b.Loop() {
			sync(b, e, objs)
			sync(b, e, []nat.Object{})
			ops++
		}
		if r.forgotten != ops*n {
			b.Fatalf("forgotten %d EIPs, want %d", r.forgotten, ops*n)
		}
	})
}
