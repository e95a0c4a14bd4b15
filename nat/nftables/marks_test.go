package nftables

import (
	"net/netip"
	"testing"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
)

// TestMarkIDs: IPv6 EIPs get the lowest free mark ids; an update keeps
// its EIP's id; an id freed by a change is not given out in that change,
// is known to the ForgetFlows after it, and is given out again later; a
// full Sync keeps the ids of the EIPs it keeps.
func TestMarkIDs(t *testing.T) {
	r := &Backend{}
	r.setMarks(nil)
	eip := func(uid string, i int) nat.Object {
		return nattest.EIP6(uid, netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i)}))
	}
	step := func(removed, added []nat.Object) {
		t.Helper()
		ch := &change{del: setElems{}, add: setElems{}}
		d, err := r.markChange(ch, removed, added)
		if err != nil {
			t.Fatal(err)
		}
		r.commitMarks(d)
	}
	want := func(o nat.Object, id uint32) {
		t.Helper()
		if got, ok := r.markOf6(o.EIP.V6Address); !ok || got != id {
			t.Errorf("mark of %s = %#x, %v; want %#x", o.EIP.V6Address, got, ok, id)
		}
	}
	a, b, c := eip("a", 1), eip("b", 2), eip("c", 3)
	step(nil, []nat.Object{a, b})
	want(a, markID6Min)
	want(b, markID6Min+1)
	moved := a
	moved.EIP = &nat.EIP{V6Address: a.EIP.V6Address, V6PrefixLen: 96}
	step([]nat.Object{a}, []nat.Object{moved})
	want(moved, markID6Min)
	// a goes and c comes in one change: c does not take a's id, which
	// ForgetFlows still knows.
	step([]nat.Object{moved}, []nat.Object{c})
	want(c, markID6Min+2)
	want(a, markID6Min)
	d := eip("d", 4)
	step(nil, []nat.Object{d})
	want(d, markID6Min)
	ch := &change{add: setElems{}}
	full, err := r.markFull(ch, []nat.Object{b, eip("e", 5), c})
	if err != nil {
		t.Fatal(err)
	}
	r.commitMarks(full)
	want(b, markID6Min+1)
	want(c, markID6Min+2)
	want(eip("e", 5), markID6Min+3) // not d's, freed by this change
	want(d, markID6Min)             // known to the ForgetFlows that follows
	if len(ch.add[setMarks6]) != 3 {
		t.Errorf("full change: %d eip_marks6 elements, want 3", len(ch.add[setMarks6]))
	}
}
