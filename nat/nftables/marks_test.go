package nftables

import (
	"net/netip"
	"testing"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
)

// markEIP is the IPv6 EIP object uid with address 2001:db8::i.
func markEIP(uid string, i int) nat.Object {
	return nattest.EIP6(uid, netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)}))
}

// markStep plans and commits a change that removes removed and adds added.
func markStep(t *testing.T, r *Backend, removed, added []nat.Object) {
	t.Helper()
	ch := &change{del: setElems{}, add: setElems{}}
	d, err := r.markChange(ch, removed, added)
	if err != nil {
		t.Fatal(err)
	}
	r.commitMarks(d)
}

// wantMark checks the id r knows for o's IPv6 address.
func wantMark(t *testing.T, r *Backend, o nat.Object, id uint32) {
	t.Helper()
	if got, ok := r.markOf6(o.EIP.V6Address); !ok || got != id {
		t.Errorf("mark of %s = %#x, %v; want %#x", o.EIP.V6Address, got, ok, id)
	}
}

// TestMarkIDs: an IPv6 EIP gets its home id; an update keeps it; an id
// freed by a change is not given out in that change (a new EIP whose home
// it is takes the next one) and is known to the ForgetFlows after it; a
// full Sync keeps the ids of the EIPs it keeps.
func TestMarkIDs(t *testing.T) {
	r := &Backend{}
	r.setMarks(nil)
	a, b, c := markEIP("a", 1), markEIP("b", 2), markEIP("c", 3)
	home := func(o nat.Object) uint32 { return markHome(o.EIP.V6Address) }
	for _, o := range []nat.Object{a, b, c} {
		if h := home(o); h < markID6Min || h > markID6Max {
			t.Fatalf("home of %s %#x out of range", o.EIP.V6Address, h)
		}
	}
	markStep(t, r, nil, []nat.Object{a, b})
	wantMark(t, r, a, home(a))
	wantMark(t, r, b, home(b))
	moved := a
	moved.EIP = &nat.EIP{V6Address: a.EIP.V6Address, V6PrefixLen: 96}
	markStep(t, r, []nat.Object{a}, []nat.Object{moved})
	wantMark(t, r, moved, home(a))

	// a goes and c comes in one change; a's id stays known to the
	// ForgetFlows after it.
	markStep(t, r, []nat.Object{moved}, []nat.Object{c})
	wantMark(t, r, c, home(c))
	wantMark(t, r, a, home(a))

	// A full Sync keeps b's and c's ids, gives e its home.
	e := markEIP("e", 5)
	ch := &change{add: setElems{}}
	full, err := r.markFull(ch, []nat.Object{b, e, c})
	if err != nil {
		t.Fatal(err)
	}
	r.commitMarks(full)
	wantMark(t, r, b, home(b))
	wantMark(t, r, c, home(c))
	wantMark(t, r, e, home(e))
	if len(ch.add[setMarks6]) != 3 {
		t.Errorf("full change: %d eip_marks6 elements, want 3", len(ch.add[setMarks6]))
	}
}

// TestMarkIDsTaken: an EIP whose home is held (by another EIP, or by one
// this change removes: its id is held until the change commits) takes the
// next free id after it, wrapping from the range's last id to its first.
func TestMarkIDsTaken(t *testing.T) {
	other := netip.MustParseAddr("2001:db8::beef")
	wrap := func(id uint32) uint32 { return markID6Min + (id-markID6Min)%markSpan }
	r := &Backend{}
	r.setMarks(nil)
	a := markEIP("a", 1)
	h := markHome(a.EIP.V6Address)
	r.marksUsed[h], r.marksUsed[wrap(h+1)] = other, other
	markStep(t, r, nil, []nat.Object{a})
	wantMark(t, r, a, wrap(h+2))

	alloc := &markAlloc{used: map[uint32]netip.Addr{markID6Max: other}, taken: map[uint32]bool{markID6Min: true}}
	if got, ok := alloc.firstFree(markID6Max); !ok || got != markID6Min+1 {
		t.Errorf("first free from the last id = %#x, %v; want %#x", got, ok, markID6Min+1)
	}
	if got, ok := alloc.firstFree(markID6Min + 5); !ok || got != markID6Min+5 {
		t.Errorf("first free from a free home = %#x, %v; want the home", got, ok)
	}
}

// TestMarkIDsAgree: two tables that receive the same IPv6 EIPs in
// different orders and histories (the active's table built one change at
// a time with deletes in between, the standby's by one full Sync) give
// every EIP the same id, as ctsync's replicated entries need.
func TestMarkIDsAgree(t *testing.T) {
	var eips []nat.Object
	for i := range 300 {
		eips = append(eips, markEIP("e"+string(rune('a'+i%26))+string(rune('a'+i/26)), i+1))
	}
	active := &Backend{}
	active.setMarks(nil)
	for i := len(eips) - 1; i >= 0; i-- { // reverse order, one at a time
		markStep(t, active, nil, []nat.Object{eips[i]})
	}
	gone := markEIP("gone", 1000)
	markStep(t, active, nil, []nat.Object{gone})
	markStep(t, active, []nat.Object{gone}, nil)

	standby := &Backend{}
	standby.setMarks(nil)
	ch := &change{add: setElems{}}
	full, err := standby.markFull(ch, eips)
	if err != nil {
		t.Fatal(err)
	}
	standby.commitMarks(full)
	for _, o := range eips {
		a, _ := active.markOf6(o.EIP.V6Address)
		s, _ := standby.markOf6(o.EIP.V6Address)
		if a != s {
			t.Errorf("%s: active's id %#x, standby's %#x", o.EIP.V6Address, a, s)
		}
	}
}
