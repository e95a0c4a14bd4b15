package reconciler

import (
	"testing"
	"unsafe"

	"github.com/natgw/natgw/nat"
)

// TestTrackerEntrySize: the tracker holds one entry per reconciled object
// (113k at scenario 6's full size), so its value stays two strings and a
// pointer; what only EIPs record (the object applied and its session) is
// behind the pointer. An entry of 120 bytes cost ~10 MB more at that size.
func TestTrackerEntrySize(t *testing.T) {
	if got, want := unsafe.Sizeof(trackVal{}), 2*unsafe.Sizeof("")+unsafe.Sizeof(uintptr(0)); got > want {
		t.Fatalf("trackVal is %d bytes, want at most %d (two strings and a pointer)", got, want)
	}
}

// TestTrackerApplied: setApplied records the object and session, set and
// dropApplied clear them, forget only drops the UID it is given.
func TestTrackerApplied(t *testing.T) {
	tr := newTracker()
	obj := nat.Object{UID: "u1"}
	s := gatewaySession{changes: 3, connected: true}
	tr.setApplied(nat.KindEIP, "e", "u1", "gw", obj, s)
	v, ok := tr.get(nat.KindEIP, "e")
	if !ok || v.applied == nil || v.applied.obj.UID != "u1" || v.applied.session != s || v.gateway != "gw" {
		t.Fatalf("after setApplied: %+v, %v", v, ok)
	}
	tr.dropApplied(nat.KindEIP, "e")
	if v, _ := tr.get(nat.KindEIP, "e"); v.applied != nil || v.uid != "u1" {
		t.Fatalf("after dropApplied: %+v", v)
	}
	tr.setApplied(nat.KindEIP, "e", "u1", "gw", obj, s)
	tr.set(nat.KindEIP, "e", "u1", "gw")
	if v, _ := tr.get(nat.KindEIP, "e"); v.applied != nil {
		t.Fatalf("after set: %+v", v)
	}
	tr.forget(nat.KindEIP, "e", "other")
	if _, ok := tr.get(nat.KindEIP, "e"); !ok {
		t.Fatal("forget of another UID dropped the entry")
	}
	tr.forget(nat.KindEIP, "e", "u1")
	if _, ok := tr.get(nat.KindEIP, "e"); ok {
		t.Fatal("forget of its UID kept the entry")
	}
}
