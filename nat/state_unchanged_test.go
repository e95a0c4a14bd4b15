package nat

import (
	"errors"
	"testing"
)

// TestPlanSyncUnchanged: a Sync of exactly the State's objects (in another
// order) is an empty Change that leaves the State as it was, without a
// new index; what only looks like them is planned as before: the same
// count with a UID twice (refused, a duplicate), an object Equal to the
// held one but with a second payload (refused, invalid), one changed
// object (an update).
func TestPlanSyncUnchanged(t *testing.T) {
	objs := fips(4)
	s, err := NewStateOf(objs)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.PlanSync([]Object{objs[3], objs[1], objs[0], objs[2]})
	if err != nil || !c.Empty() {
		t.Fatalf("unchanged Sync: %v, %d removed, %d added", err, len(c.Removed), len(c.Added))
	}
	c.Commit()
	if s.Len() != 4 {
		t.Fatalf("%d objects after an unchanged Sync", s.Len())
	}
	for _, o := range objs {
		if got, ok := s.Get(o.UID); !ok || !got.Equal(o) {
			t.Fatalf("%s: %v %v after an unchanged Sync", o.UID, got, ok)
		}
	}
	if _, err := s.PlanSync([]Object{objs[0], objs[1], objs[2], objs[2]}); err == nil {
		t.Fatal("a Sync with a UID twice (as many objects as held) was planned")
	}
	two := objs[1]
	two.EIP = &EIP{Address: two.FIP.EIP, PrefixLen: 24}
	if _, err := s.PlanSync([]Object{objs[0], two, objs[2], objs[3]}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("an object with two payloads: %v, want ErrInvalid", err)
	}
	if s.Len() != 4 {
		t.Fatalf("%d objects after refused Syncs", s.Len())
	}
	moved := objs[2]
	f := *moved.FIP
	f.InternalIP = objs[3].FIP.InternalIP.Next().Next()
	moved.FIP = &f
	c, err = s.PlanSync([]Object{objs[0], objs[1], moved, objs[3]})
	if err != nil || len(c.Removed) != 1 || len(c.Added) != 1 || c.Added[0].UID != moved.UID {
		t.Fatalf("a Sync with one object changed: %v, removed %v, added %v", err, UIDs(c.Removed), UIDs(c.Added))
	}
	c.Rollback()
	if got, _ := s.Get(moved.UID); !got.Equal(objs[2]) {
		t.Fatalf("after Rollback %v", got)
	}
}
