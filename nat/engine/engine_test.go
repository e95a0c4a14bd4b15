package engine

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"testing"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/nat"
)

// fakeRenderer is a unit-test double for the engine's sequencing logic: it
// stores committed objects in a map and can be told to fail. The real
// backends are tested against the kernel in their own packages.
type fakeRenderer struct {
	kernel    map[string]nat.Object
	boot      string
	failNext  error
	commits   int
	forgotten []netip.Addr
}

func (f *fakeRenderer) Name() string { return "fake" }
func (f *fakeRenderer) Load(context.Context) ([]nat.Object, string, error) {
	var out []nat.Object
	for _, o := range f.kernel {
		out = append(out, o)
	}
	return out, f.boot, nil
}
func (f *fakeRenderer) Commit(_ context.Context, c Commit) error {
	if err := f.failNext; err != nil {
		f.failNext = nil
		if errors.Is(err, nat.ErrUnknownState) {
			// The kernel did take it.
			f.apply(c)
		}
		return err
	}
	f.commits++
	f.apply(c)
	return nil
}
func (f *fakeRenderer) apply(c Commit) {
	if c.Full {
		f.kernel = map[string]nat.Object{}
		for _, o := range c.Want {
			f.kernel[o.UID] = o
		}
		return
	}
	for _, o := range c.Removed {
		delete(f.kernel, o.UID)
	}
	for _, o := range c.Added {
		f.kernel[o.UID] = o
	}
}
func (f *fakeRenderer) ForgetFlows(_ context.Context, eips []netip.Addr) error {
	f.forgotten = append(f.forgotten, eips...)
	return nil
}
func (f *fakeRenderer) Close() error { return nil }

func fip(uid, e, in string) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netip.MustParseAddr(e), InternalIP: netip.MustParseAddr(in)}}
}

func TestEngineSequencing(t *testing.T) {
	ctx := context.Background()
	r := &fakeRenderer{kernel: map[string]nat.Object{"f0": fip("f0", "192.0.2.9", "10.0.0.9")}, boot: "b1"}
	e, err := New(ctx, r, nil, logr.Discard())
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
		var u []string
		for _, o := range objs {
			u = append(u, o.UID)
		}
		return u
	}
	if got := list(); !reflect.DeepEqual(got, []string{"f0"}) {
		t.Fatalf("loaded %v", got)
	}
	// No-op apply makes no kernel transaction.
	if err := e.Apply(ctx, fip("f0", "192.0.2.9", "10.0.0.9")); err != nil || r.commits != 0 {
		t.Fatalf("no-op apply: %v, %d commits", err, r.commits)
	}
	// A refused transaction leaves the index as it was.
	r.failNext = fmt.Errorf("EPERM")
	if err := e.Apply(ctx, fip("f1", "192.0.2.10", "10.0.0.5")); err == nil {
		t.Fatal("apply must fail")
	}
	if got := list(); !reflect.DeepEqual(got, []string{"f0"}) {
		t.Fatalf("after refused commit %v", got)
	}
	// Unknown outcome: the engine re-reads the kernel, which did take it.
	r.failNext = fmt.Errorf("read acks: %w", nat.ErrUnknownState)
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
	if !reflect.DeepEqual(r.forgotten, want) {
		t.Fatalf("forgotten flows %v, want %v", r.forgotten, want)
	}
	// Sync: exactly the desired set.
	if err := e.Sync(ctx, []nat.Object{fip("f5", "192.0.2.15", "10.0.0.15")}); err != nil {
		t.Fatal(err)
	}
	if len(r.kernel) != 1 || r.kernel["f5"].UID != "f5" {
		t.Fatalf("kernel after sync %v", r.kernel)
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
