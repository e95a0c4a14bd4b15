package engine_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/engine"
)

// recordBackend is a nullBackend that keeps the last Commit it was given.
type recordBackend struct {
	nullBackend
	last engine.Commit
}

func (b *recordBackend) Commit(ctx context.Context, c engine.Commit) error {
	b.last = c
	return b.nullBackend.Commit(ctx, c)
}

// TestSyncDesired: a Sync hands a WantOnDemand Backend a full Commit whose
// Desired is the Sync's objects, in their order, whatever the State held
// (empty, others, the same); a Sync of nil is a full Commit too, with no
// desired object and every held object removed; the State lists the
// objects after it.
func TestSyncDesired(t *testing.T) {
	ctx := context.Background()
	r := &recordBackend{}
	e, err := engine.New(ctx, r, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	objs := fipsN(5)
	rev := []nat.Object{objs[4], objs[3], objs[2], objs[1], objs[0]}
	for i, step := range []struct {
		sync          []nat.Object
		added, remove int
	}{
		{rev, 5, 0},
		{objs[:3], 0, 2},
		{nil, 0, 3},
		{objs, 5, 0},
	} {
		if err := e.Sync(ctx, step.sync); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		c := r.last
		if !c.Full || len(c.Added) != step.added || len(c.Removed) != step.remove {
			t.Fatalf("step %d: full %v, %d added, %d removed; want full, %d, %d", i, c.Full, len(c.Added), len(c.Removed), step.added, step.remove)
		}
		if got := c.Desired(); len(got) != len(step.sync) || c.DesiredLen() != len(step.sync) || (len(got) > 0 && !reflect.DeepEqual(got, step.sync)) {
			t.Fatalf("step %d: desired %v (len %d), want %v", i, nat.UIDs(got), c.DesiredLen(), nat.UIDs(step.sync))
		}
		list, _ := e.List(ctx)
		if want := nat.UIDs(step.sync); len(list) != len(want) {
			t.Fatalf("step %d: the engine lists %v, want %v", i, nat.UIDs(list), want)
		}
	}
}
