package engine_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/engine"
	"github.com/natgw/natgw/nat/natfake"
)

func fip(uid, e, in string) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netip.MustParseAddr(e), InternalIP: netip.MustParseAddr(in)}}
}

func TestEngineSequencing(t *testing.T) {
	ctx := context.Background()
	// The fake kernel (natfake) stands in for a backend: this tests the
	// engine's sequencing; the backends are tested against the kernel.
	r := natfake.NewBackend("", "b1", fip("f0", "192.0.2.9", "10.0.0.9"))
	e, err := engine.New(ctx, r, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if e.BootID() != "b1" {
		t.Fatalf("boot id %q", e.BootID())
	}
	list := func() []string {
		objs, err := e.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return nat.UIDs(objs)
	}
	if got := list(); !reflect.DeepEqual(got, []string{"f0"}) {
		t.Fatalf("loaded %v", got)
	}
	// No-op apply makes no kernel transaction.
	if err := e.Apply(ctx, fip("f0", "192.0.2.9", "10.0.0.9")); err != nil || r.Commits() != 0 {
		t.Fatalf("no-op apply: %v, %d commits", err, r.Commits())
	}
	// A refused transaction leaves the index as it was.
	r.FailNext(fmt.Errorf("EPERM"))
	if err := e.Apply(ctx, fip("f1", "192.0.2.10", "10.0.0.5")); err == nil {
		t.Fatal("apply must fail")
	}
	if got := list(); !reflect.DeepEqual(got, []string{"f0"}) {
		t.Fatalf("after refused commit %v", got)
	}
	// Unknown outcome: the engine re-reads the kernel, which did take it.
	r.FailNext(fmt.Errorf("read acks: %w", nat.ErrUnknownState))
	if err := e.Apply(ctx, fip("f1", "192.0.2.10", "10.0.0.5")); !errors.Is(err, nat.ErrUnknownState) {
		t.Fatalf("want ErrUnknownState, got %v", err)
	}
	if got := list(); !reflect.DeepEqual(got, []string{"f0", "f1"}) {
		t.Fatalf("after unknown-state commit the index must mirror the kernel: %v", got)
	}
	// Moving a FIP's internal IP forgets the EIP's flows; deleting does too.
	if err := e.Apply(ctx, fip("f1", "192.0.2.10", "10.0.0.6")); err != nil {
		t.Fatal(err)
	}
	if err := e.Delete(ctx, "f0", "missing"); err != nil {
		t.Fatal(err)
	}
	want := []netip.Addr{netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.9")}
	if !reflect.DeepEqual(r.Forgotten(), want) {
		t.Fatalf("forgotten flows %v, want %v", r.Forgotten(), want)
	}
	// Sync: exactly the desired set.
	if err := e.Sync(ctx, []nat.Object{fip("f5", "192.0.2.15", "10.0.0.15")}); err != nil {
		t.Fatal(err)
	}
	if k := r.Kernel(); len(k) != 1 || k[0].UID != "f5" {
		t.Fatalf("kernel after sync %v", k)
	}
	// Cancelled context: nothing happens.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := e.Apply(cctx, fip("f6", "192.0.2.16", "10.0.0.16")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled apply: %v", err)
	}
	if got := list(); !reflect.DeepEqual(got, []string{"f5"}) {
		t.Fatalf("after cancelled apply %v", got)
	}
}

// markBackend is a natfake backend whose rules give every IPv6 address
// mark id 0x10002.
type markBackend struct{ *natfake.Backend }

func (markBackend) MarkID6(a netip.Addr) (uint32, bool) { return 0x10002, a.Is6() }

// TestMarkID6: the engine is a nat.MarkIDs (what nat/shape looks for) and
// answers with its backend's MarkID6, or false when the backend has none.
func TestMarkID6(t *testing.T) {
	ctx := context.Background()
	v6 := netip.MustParseAddr("2001:db8::1")
	for _, tc := range []struct {
		name string
		r    engine.Backend
		want bool
	}{
		{"backend with mark ids", markBackend{natfake.NewBackend("", "b1")}, true},
		{"backend without", natfake.NewBackend("", "b1"), false},
	} {
		e, err := engine.New(ctx, tc.r, nil, logr.Discard())
		if err != nil {
			t.Fatal(err)
		}
		var ids nat.MarkIDs = e
		if id, ok := ids.MarkID6(v6); ok != tc.want || ok && id != 0x10002 {
			t.Errorf("%s: MarkID6(%s) = %#x, %v; want 0x10002 %v", tc.name, v6, id, ok, tc.want)
		}
	}
}
