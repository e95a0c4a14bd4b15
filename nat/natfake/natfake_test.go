package natfake

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/natgw/natgw/internal/golden"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
)

var (
	eip1 = netip.MustParseAddr("192.0.2.10")
	eip2 = netip.MustParseAddr("192.0.2.11")
	in1  = netip.MustParseAddr("10.0.1.5")
	in2  = netip.MustParseAddr("10.0.1.6")
)

// TestRefusals: the fake refuses what the engine's rules refuse, changes
// nothing when it does, and says which field.
func TestRefusals(t *testing.T) {
	ctx := context.Background()
	base := []nat.Object{
		nattest.EIP("e1", eip1),
		nattest.FIP("f1", eip1, in1),
		nattest.DNAT("d1", eip2, nat.TCP, 80, in2, 8080),
	}
	tests := []struct {
		name    string
		apply   []nat.Object
		field   string // of the *ConflictError or *FieldError
		invalid bool   // *FieldError rather than *ConflictError
	}{
		{"second FIP on an EIP", []nat.Object{nattest.FIP("f2", eip1, in2)}, "fip.eip", false},
		{"DNAT port taken", []nat.Object{nattest.DNAT("d2", eip2, nat.TCP, 80, in1, 22)}, "dnat.externalPort", false},
		{"bad one among good ones", []nat.Object{nattest.FIP("f3", eip2, in1), {UID: "x", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip2}}}, "fip.internalIP", true},
		{"no UID", []nat.Object{{Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip2, InternalIP: in1}}}, "uid", true},
		{"share DNAT on an exclusive identity", []nat.Object{nattest.ShareDNAT("h1", eip2, nat.TCP, 80, in1, 22)}, "dnat.type", false},
		{"bad DNAT type", []nat.Object{func() nat.Object {
			o := nattest.DNAT("d3", eip2, nat.TCP, 81, in1, 22)
			o.DNAT.Type = "shared"
			return o
		}()}, "dnat.type", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := New("nftables")
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Apply(ctx, base...); err != nil {
				t.Fatal(err)
			}
			before, commits := d.Dump(), d.Backend.Commits()
			err = d.Apply(ctx, tt.apply...)
			var ce *nat.ConflictError
			var fe *nat.FieldError
			switch {
			case err == nil:
				t.Fatal("accepted")
			case tt.invalid && !errors.As(err, &fe):
				t.Fatalf("want a *nat.FieldError, got %T %v", err, err)
			case !tt.invalid && !errors.As(err, &ce):
				t.Fatalf("want a *nat.ConflictError, got %T %v", err, err)
			case tt.invalid && fe.Field != tt.field, !tt.invalid && ce.Field != tt.field:
				t.Fatalf("error names the wrong field: %v (want %s)", err, tt.field)
			}
			if d.Dump() != before || d.Backend.Commits() != commits {
				t.Fatalf("a refused apply changed the kernel:\n%s\nwas\n%s", d.Dump(), before)
			}
		})
	}
}

// TestTransactions: failures leave the kernel as it was; an unknown outcome
// is re-read; a lost kernel comes back with a new boot id.
func TestTransactions(t *testing.T) {
	ctx := context.Background()
	d, err := New("iptables")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Apply(ctx, nattest.FIP("f1", eip1, in1)); err != nil {
		t.Fatal(err)
	}
	d.Backend.FailNext(fmt.Errorf("EPERM"))
	if err := d.Apply(ctx, nattest.FIP("f2", eip2, in2)); err == nil {
		t.Fatal("a failed commit was reported done")
	}
	if got := uids(t, d); fmt.Sprint(got) != "[f1]" {
		t.Fatalf("after a failed commit: %v", got)
	}
	d.Backend.FailNext(fmt.Errorf("ack lost: %w", nat.ErrUnknownState))
	if err := d.Apply(ctx, nattest.FIP("f2", eip2, in2)); !errors.Is(err, nat.ErrUnknownState) {
		t.Fatalf("want ErrUnknownState, got %v", err)
	}
	if got := uids(t, d); fmt.Sprint(got) != "[f1 f2]" {
		t.Fatalf("after an unknown outcome the index must mirror the kernel: %v", got)
	}
	if err := d.Delete(ctx, "f1", "unknown"); err != nil {
		t.Fatal(err)
	}
	if got := d.Backend.Forgotten(); fmt.Sprint(got) != "[192.0.2.10]" {
		t.Fatalf("conntrack of the deleted FIP's EIP: %v", got)
	}
	if err := d.Sync(ctx, []nat.Object{nattest.FIP("f9", eip1, in2)}); err != nil {
		t.Fatal(err)
	}
	if got := uids(t, d); fmt.Sprint(got) != "[f9]" {
		t.Fatalf("after sync: %v", got)
	}
	boot := d.BootID()
	d.Backend.Lose()
	if err := d.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if d.BootID() == boot || len(uids(t, d)) != 0 {
		t.Fatalf("lost kernel: boot %s (was %s), objects %v", d.BootID(), boot, uids(t, d))
	}
	// An agent restart over the same kernel keeps its state and boot id.
	if err := d.Apply(ctx, nattest.FIP("f1", eip1, in1)); err != nil {
		t.Fatal(err)
	}
	again, err := Over(d.Backend)
	if err != nil {
		t.Fatal(err)
	}
	if again.BootID() != d.BootID() || fmt.Sprint(uids(t, again)) != "[f1]" {
		t.Fatalf("restart: boot %s/%s objects %v", again.BootID(), d.BootID(), uids(t, again))
	}
}

// TestShareForget: deleting one backend of a shared identity forgets that
// backend's flows only, not its EIP's; so does deleting an exclusive DNAT.
func TestShareForget(t *testing.T) {
	ctx := context.Background()
	d, err := New("nftables")
	if err != nil {
		t.Fatal(err)
	}
	h1, h2 := nattest.ShareDNAT("h1", eip2, nat.TCP, 443, in1, 8443), nattest.ShareDNAT("h2", eip2, nat.TCP, 443, in2, 8443)
	if err := d.Apply(ctx, h1, h2, nattest.DNAT("d1", eip2, nat.UDP, 53, in2, 53)); err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	if got := d.Backend.ForgottenDNATs(); len(got) != 1 || got[0] != *h1.DNAT {
		t.Fatalf("forgotten backends %v, want [%v]", got, *h1.DNAT)
	}
	if got := d.Backend.Forgotten(); len(got) != 0 {
		t.Fatalf("deleting a share backend forgot whole EIPs %v", got)
	}
	// The same backend applied again unchanged forgets nothing.
	if err := d.Apply(ctx, h2); err != nil || len(d.Backend.ForgottenDNATs()) != 1 {
		t.Fatalf("no-op apply: %v, forgotten %v", err, d.Backend.ForgottenDNATs())
	}
	// An exclusive DNAT's deletion forgets its own flows too, not its
	// EIP's (the share identity's connections on it stay), as upstream's
	// dnat-del deletes only -d EIP -p PROTO --dport PORT.
	d1 := nattest.DNAT("d1", eip2, nat.UDP, 53, in2, 53)
	if err := d.Delete(ctx, "d1"); err != nil {
		t.Fatal(err)
	}
	if got := d.Backend.ForgottenDNATs(); len(got) != 2 || got[1] != *d1.DNAT {
		t.Fatalf("deleting an exclusive DNAT: forgotten DNATs %v, want [%v %v]", got, *h1.DNAT, *d1.DNAT)
	}
	if got := d.Backend.Forgotten(); len(got) != 0 {
		t.Fatalf("deleting an exclusive DNAT forgot whole EIPs %v", got)
	}
}

// TestDump is a golden test of the text dump.
func TestDump(t *testing.T) {
	ctx := context.Background()
	r := NewBackend("nftables", "0123456789abcdef0123456789abcdef")
	d, err := Over(r)
	if err != nil {
		t.Fatal(err)
	}
	err = d.Apply(ctx,
		nattest.EIPQoS("e1", eip1, nat.QoS{IngressRateMbps: 10, IngressBurstMbit: 8}),
		nattest.FIP("f1", eip1, in1),
		nattest.DNAT("d1", eip2, nat.UDP, 53, in2, 5353),
		nattest.ShareDNAT("h1", eip2, nat.TCP, 443, in1, 8443),
		nattest.ShareDNAT("h2", eip2, nat.TCP, 443, in2, 8443),
		nattest.SNAT("s1", eip2, netip.MustParsePrefix("10.0.1.0/24"), true),
		nattest.Route("r1", netip.MustParsePrefix("10.0.2.0/24"), netip.MustParseAddr("10.0.1.1"), nat.DeviceInternal),
	)
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("testdata", "dump.golden"), d.Dump(), os.Getenv("UPDATE_GOLDEN") != "") // UPDATE_GOLDEN=1 rewrites it
}

func uids(t *testing.T, d nat.Dataplane) []string {
	t.Helper()
	objs, err := d.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return nat.UIDs(objs)
}
