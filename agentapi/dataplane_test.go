package agentapi

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/natgw/natgw/nat"
)

// TestDataplane drives a Client through the nat.Dataplane face: the calls,
// the agent's refusals as nat errors, and Reload picking up a new boot id.
func TestDataplane(t *testing.T) {
	bothModes(t, func(t *testing.T, direct bool) {
		ctx := context.Background()
		fake := newFakeDP()
		c, _ := pipeAgentMode(t, fake, direct)
		var dp nat.Dataplane
		d, err := NewDataplane(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		dp = d
		if dp.Name() != "fake" || dp.BootID() != "boot-1" {
			t.Fatalf("Name, BootID = %q, %q; want fake, boot-1", dp.Name(), dp.BootID())
		}
		if err := dp.Apply(ctx, fip("f1", "192.0.2.10", "198.51.100.1")); err != nil {
			t.Fatal(err)
		}
		err = dp.Apply(ctx, fip("f2", "192.0.2.10", "198.51.100.2"))
		var pe *Error
		if !errors.Is(err, nat.ErrConflict) || !errors.As(err, &pe) || pe.Code != CodeConflict || errors.Is(err, nat.ErrInvalid) {
			t.Fatalf("conflicting apply: %v, want a Conflict *Error matching nat.ErrConflict", err)
		}
		bad := fip("f3", "192.0.2.11", "198.51.100.3")
		bad.FIP.InternalIP = netip.MustParseAddr("2001:db8::1")
		if err := dp.Apply(ctx, bad); !errors.Is(err, nat.ErrInvalid) || !errors.As(err, &pe) || pe.Code != CodeInvalid {
			t.Fatalf("invalid apply: %v, want an Invalid *Error matching nat.ErrInvalid", err)
		}
		if err := dp.Sync(ctx, []nat.Object{fip("f1", "192.0.2.10", "198.51.100.1"), dnat("d1", "192.0.2.12", 80, "198.51.100.4", 8080)}); err != nil {
			t.Fatal(err)
		}
		if err := dp.Delete(ctx, "f1"); err != nil {
			t.Fatal(err)
		}
		objs, err := dp.List(ctx)
		if err != nil || len(objs) != 1 || objs[0].UID != "d1" {
			t.Fatalf("List = %v, %v; want d1 only", objs, err)
		}
		fake.Dataplane.Backend.Lose()
		if dp.BootID() != "boot-1" {
			t.Fatalf("BootID asked the agent before Reload: %q", dp.BootID())
		}
		if err := dp.Reload(ctx); err != nil {
			t.Fatal(err)
		}
		if b := dp.BootID(); b == "boot-1" || b == "" {
			t.Fatalf("BootID after the kernel was lost and Reload = %q, want a new one", b)
		}
		if objs, err := dp.List(ctx); err != nil || len(objs) != 0 {
			t.Fatalf("List after Reload = %v, %v; want nothing", objs, err)
		}
		if err := dp.Close(); err != nil {
			t.Fatal(err)
		}
		if err := dp.Apply(ctx, fip("f1", "192.0.2.10", "198.51.100.1")); !errors.Is(err, ErrClosed) {
			t.Fatalf("Apply after Close: %v, want ErrClosed", err)
		}
	})
}
