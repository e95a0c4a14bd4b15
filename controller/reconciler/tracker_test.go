package reconciler

import (
	"testing"
	"unsafe"

	"github.com/natgw/natgw/nat"
)

// TestTrackerEntrySize: the tracker holds one entry per reconciled object
// (113k at scenario 6's full size), so its value stays two strings.
func TestTrackerEntrySize(t *testing.T) {
	if got, want := unsafe.Sizeof(trackVal{}), 2*unsafe.Sizeof(""); got > want {
		t.Fatalf("trackVal is %d bytes, want at most %d (two strings)", got, want)
	}
}

// TestTrackerForget: forget only drops the UID it is given.
func TestTrackerForget(t *testing.T) {
	tr := newTracker()
	tr.set(nat.KindEIP, "e", "u1", "gw")
	if v, ok := tr.get(nat.KindEIP, "e"); !ok || v.uid != "u1" || v.gateway != "gw" {
		t.Fatalf("after set: %+v, %v", v, ok)
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
