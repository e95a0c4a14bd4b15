package nftables

import (
	"reflect"
	"testing"

	"github.com/natgw/natgw/nat"
)

// TestRenderBulk: renderBulk (a full Sync's and Plan's rendering: sets
// sized once, keys and values in shared slabs) gives every set the
// elements, in the order, that rendering each object on its own into a
// setElems gives: on the golden objects (every kind and family) and on
// 10,000 FIPs after them (keys and values over several slabs).
func TestRenderBulk(t *testing.T) {
	objs := append(goldenObjects(), manyFIPs(10_000, 36)...)
	want := setElems{}
	for _, o := range objs {
		if err := render(o, want); err != nil {
			t.Fatal(err)
		}
	}
	got, err := renderBulk(objs)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d sets, want %d", len(got), len(want))
	}
	for set, es := range want {
		if !reflect.DeepEqual(got[set], es) {
			t.Errorf("set %s: %d elements differ from the object by object rendering (%d)", set, len(got[set]), len(es))
		}
	}
	if n := len(got[setFIPDNAT]); n < 10_000 {
		t.Fatalf("fip_dnat: %d elements", n)
	}
	// An object render refuses fails the whole rendering.
	bad := nat.Object{UID: "x", Kind: "nope"}
	if _, err := renderBulk(append(objs[:1:1], bad)); err == nil {
		t.Fatal("an unknown kind was rendered")
	}
}
