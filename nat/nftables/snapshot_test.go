package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
)

// TestSnapshotFile: the snapshot file round-trips IPv4 and IPv6 FIPs, and
// is refused (errSnapshot) for another boot id or snapshot id, a changed
// byte and a truncation. No kernel needed.
func TestSnapshotFile(t *testing.T) {
	fips := append(manyFIPs(3, 64), nattest.FIP("fip-v6", addr("2001:db8::10"), addr("fd00::10")))
	b := encodeSnapshot("boot1", 42, fips)
	var got []nat.Object
	hinted := -1
	if err := decodeSnapshot(b, "boot1", 42, func(n int) { hinted = n }, func(o nat.Object) error {
		got = append(got, o)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if hinted != len(fips) || !sameObjects(got, fips) {
		t.Errorf("decoded %d (hint %d): %v, want %v", len(got), hinted, got, fips)
	}
	flipped := bytes.Clone(b)
	flipped[len(flipped)/2] ^= 1
	for name, tc := range map[string]struct {
		b    []byte
		boot string
		id   uint64
	}{
		"other boot id":     {b, "boot2", 42},
		"other snapshot id": {b, "boot1", 43},
		"a changed byte":    {flipped, "boot1", 42},
		"truncated":         {b[:len(b)-10], "boot1", 42},
		"empty":             {nil, "boot1", 42},
	} {
		if err := decodeSnapshot(tc.b, tc.boot, tc.id, func(int) {}, func(nat.Object) error { return nil }); !errors.Is(err, errSnapshot) {
			t.Errorf("%s: %v, want errSnapshot", name, err)
		}
	}
}

// TestIndexSnapshot (root): Load takes the FIPs from the index snapshot
// only while the kernel proves it current, and reads the FIP maps in full
// after anything else committed: a FIP deleted by hand with `nft` (the
// table stays consistent, so only the snapshot would still hold it), an
// older snapshot file put back, a damaged file, a FIP change by a natgw
// without a state directory. Every read must give the kernel's objects.
func TestIndexSnapshot(t *testing.T) {
	cfg := gateway(t)
	cfg.StateDir = t.TempDir()
	file := filepath.Join(cfg.StateDir, snapFile)
	want := append(goldenObjects(), snapFIPs(20)...)
	dp := open(t, cfg)
	if err := dp.Apply(ctxT(t), want...); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); err == nil {
		t.Fatalf("a snapshot was written before Close")
	}
	dp.Close()

	// check reads the kernel as Load does and says whether the FIPs came
	// from the snapshot.
	check := func(what string, fromSnap bool, want []nat.Object) {
		t.Helper()
		k := kernelOf(t, cfg)
		if k.fromSnap != fromSnap {
			t.Errorf("%s: FIPs from the snapshot: %v, want %v", what, k.fromSnap, fromSnap)
		}
		st, _, ok := k.objects(logr.Discard())
		if !ok {
			t.Errorf("%s: inconsistent", what)
		}
		if got := st.Objects(); !sameObjects(got, want) {
			t.Errorf("%s: read %d objects, want %d:\n%v\nwant\n%v", what, len(got), len(want), got, want)
		}
	}
	// run opens an agent on cfg and closes it.
	run := func(cfg nat.Config, fn func(dp nat.Dataplane)) {
		t.Helper()
		dp, err := New(ctxT(t), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if fn != nil {
			fn(dp)
		}
		if err := dp.Close(); err != nil {
			t.Fatal(err)
		}
	}
	check("after Close wrote the snapshot", true, want)
	old, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}

	// A FIP deleted by hand: the table is consistent without it, the
	// snapshot still holds it.
	gone := snapFIPs(1)[0]
	nftExec(t, cfg.NetNS, "delete element inet natgw fip_dnat { "+gone.FIP.EIP.String()+" }\n"+
		"delete element inet natgw fip_snat { "+gone.FIP.InternalIP.String()+" }\n")
	want = want[:len(want)-20+copy(want[len(want)-20:], want[len(want)-19:])]
	check("after a FIP was deleted by hand", false, want)
	run(cfg, nil) // reads in full, writes a new snapshot at Close
	check("after an agent's run since", true, want)
	run(cfg, nil) // two runs in a row: the second starts from the snapshot
	check("after a second agent's run", true, want)

	// The older snapshot file put back: natgw_meta names another one.
	if err := os.WriteFile(file, old, 0o644); err != nil {
		t.Fatal(err)
	}
	check("with the older snapshot file put back", false, want)
	run(cfg, nil)
	check("after an agent rewrote it", true, want)

	// A damaged file.
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x40
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	check("with a damaged file", false, want)
	run(cfg, nil)
	check("after an agent rewrote it", true, want)

	// A file with the right boot id, id and checksum whose FIPs conflict
	// (a writer's bug, a hand-made file): the bulk State refuses it and
	// Load reads the FIP maps.
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	boot, id := snapIDs(t, cfg)
	for _, tc := range []struct {
		name string
		edit func(f []nat.Object)
	}{
		{"two FIPs on one EIP", func(f []nat.Object) { f[1].FIP = &nat.FIP{EIP: f[0].FIP.EIP, InternalIP: f[1].FIP.InternalIP} }},
		{"one internal IP twice", func(f []nat.Object) { f[1].FIP = &nat.FIP{EIP: f[1].FIP.EIP, InternalIP: f[0].FIP.InternalIP} }},
		{"one UID twice", func(f []nat.Object) { f[1].UID = f[0].UID }},
		{"an invalid FIP", func(f []nat.Object) { f[1].FIP = &nat.FIP{EIP: f[1].FIP.EIP, InternalIP: addr("224.0.0.1")} }},
	} {
		var fips []nat.Object
		if err := decodeSnapshot(good, boot, id, func(int) {}, func(o nat.Object) error {
			fips = append(fips, o)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		// The edits take two IPv4 FIPs, moved to the front.
		v4 := slices.DeleteFunc(slices.Clone(fips), func(o nat.Object) bool { return !o.FIP.EIP.Is4() })
		if len(v4) < 2 {
			t.Fatalf("the snapshot holds %d IPv4 FIPs", len(v4))
		}
		fips = append(v4[:2:2], slices.DeleteFunc(fips, func(o nat.Object) bool { return o.UID == v4[0].UID || o.UID == v4[1].UID })...)
		tc.edit(fips)
		if err := os.WriteFile(file, encodeSnapshot(boot, id, fips), 0o644); err != nil {
			t.Fatal(err)
		}
		check("with a snapshot of "+tc.name, false, want)
	}
	if err := os.WriteFile(file, good, 0o644); err != nil {
		t.Fatal(err)
	}
	check("with the good file put back", true, want)

	// A natgw without a state directory that only starts keeps the
	// snapshot valid (its repair leaves the FIP maps alone); one that
	// changes a FIP ends it.
	bare := cfg
	bare.StateDir = ""
	run(bare, nil)
	check("after a start without a state directory", true, want)
	added := nattest.FIP("fip-added-by-bare", addr("100.127.0.1"), addr("10.200.0.1"))
	run(bare, func(dp nat.Dataplane) {
		if err := dp.Apply(ctxT(t), added); err != nil {
			t.Fatal(err)
		}
	})
	want = append(want, added)
	check("after a FIP add without a state directory", false, want)

	// An `nft` edit between two agents' runs that leaves every FIP map
	// element but one in place: the internal IP of a FIP rewritten.
	run(cfg, nil)
	check("after an agent's run", true, want)
	moved := want[len(want)-2]
	nftExec(t, cfg.NetNS, "delete element inet natgw fip_dnat { "+moved.FIP.EIP.String()+" }\n"+
		"delete element inet natgw fip_snat { "+moved.FIP.InternalIP.String()+" }\n"+
		"add element inet natgw fip_dnat { "+moved.FIP.EIP.String()+" comment \""+moved.UID+"\" : 10.201.0.1 }\n"+
		"add element inet natgw fip_snat { 10.201.0.1 comment \""+moved.UID+"\" : "+moved.FIP.EIP.String()+" }\n")
	moved = nattest.FIP(moved.UID, moved.FIP.EIP, addr("10.201.0.1"))
	want[len(want)-2] = moved
	check("after a FIP was rewritten by hand", false, want)
}

// snapFIPs returns n FIPs whose UIDs and addresses no golden object has.
func snapFIPs(n int) []nat.Object {
	out := make([]nat.Object, n)
	for i := range out {
		out[i] = nattest.FIP(fmt.Sprintf("snapshot-fip-%d", i), netip.AddrFrom4([4]byte{100, 64, 0, byte(i + 1)}), netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}))
	}
	return out
}

// snapIDs returns the boot id of cfg's table and the index snapshot its
// natgw_meta names (read as Load reads them).
func snapIDs(t *testing.T, cfg nat.Config) (string, uint64) {
	t.Helper()
	k := kernelOf(t, cfg)
	if k.snap == 0 {
		t.Fatalf("natgw_meta names no snapshot")
	}
	return k.boot, k.snap
}

// kernelOf reads cfg's table as Load does (readKernel), with a Backend
// of its own that it closes (no Load: nothing to settle).
func kernelOf(t testing.TB, cfg nat.Config) *kernelState {
	t.Helper()
	r, err := NewBackend(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	k, err := r.readKernel(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return k
}
