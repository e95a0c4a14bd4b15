package snatqueue

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/natfake"
)

func snat(uid, eip, cidr string) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: netip.MustParseAddr(eip), InternalCIDR: netip.MustParsePrefix(cidr)}}
}

func uids(objs []nat.Object) string {
	var s []string
	for _, o := range objs {
		s = append(s, o.UID)
	}
	return strings.Join(s, " ")
}

var (
	a1 = snat("a1", "192.0.2.11", "10.0.1.0/24") // first SNAT of 10.0.1.0/24
	a2 = snat("a2", "192.0.2.12", "10.0.1.0/24") // second: queued behind a1
	a3 = snat("a3", "192.0.2.13", "10.0.1.0/24") // third: queued behind a2
	b1 = snat("b1", "192.0.2.11", "10.0.2.0/24") // another CIDR
	f1 = nat.Object{UID: "f1", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netip.MustParseAddr("192.0.2.20"), InternalIP: netip.MustParseAddr("10.0.1.5")}}
)

// TestHoldAndDelete drives the queue through add and delete sequences over
// natgw's in-memory data plane and checks what is programmed and what is
// queued after each step.
func TestHoldAndDelete(t *testing.T) {
	type step struct {
		add    []nat.Object // Hold, then Apply what it returns
		del    []string     // Delete
		prog   string       // programmed UIDs after the step, in canonical order
		queued string       // queued UIDs after the step, in order
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"one SNAT per CIDR programs all", []step{
			{add: []nat.Object{a1, b1, f1}, prog: "f1 a1 b1"},
			{del: []string{"a1"}, prog: "f1 b1"},
		}},
		{"second of a CIDR is queued, promoted on delete", []step{
			{add: []nat.Object{a1}, prog: "a1"},
			{add: []nat.Object{a2}, prog: "a1", queued: "a2"},
			{add: []nat.Object{a2}, prog: "a1", queued: "a2"}, // again: queued once
			{del: []string{"a1"}, prog: "a2"},
			{del: []string{"a2"}},
		}},
		{"same call: first programmed, rest queued in order", []step{
			{add: []nat.Object{a1, a2, b1, a3}, prog: "a1 b1", queued: "a2 a3"},
			{del: []string{"a1"}, prog: "a2 b1", queued: "a3"},
			{del: []string{"a2"}, prog: "a3 b1"},
		}},
		{"deleting a queued SNAT leaves the programmed one", []step{
			{add: []nat.Object{a1, a2, a3}, prog: "a1", queued: "a2 a3"},
			{del: []string{"a2"}, prog: "a1", queued: "a3"},
			{del: []string{"a1"}, prog: "a3"},
		}},
		{"re-adding the programmed SNAT is not queued", []step{
			{add: []nat.Object{a1}, prog: "a1"},
			{add: []nat.Object{a1}, prog: "a1"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dp, err := natfake.New("fake")
			if err != nil {
				t.Fatal(err)
			}
			q := Queue{Dir: filepath.Join(t.TempDir(), "state")}
			for i, s := range tc.steps {
				cur, err := dp.List(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if s.add != nil {
					rest, _, err := q.Hold(cur, s.add)
					if err != nil {
						t.Fatalf("step %d: hold: %v", i+1, err)
					}
					if err := dp.Apply(ctx, rest...); err != nil {
						t.Fatalf("step %d: apply %s: %v", i+1, uids(rest), err)
					}
				}
				if s.del != nil {
					if err := q.Delete(ctx, dp, cur, s.del); err != nil {
						t.Fatalf("step %d: delete: %v", i+1, err)
					}
				}
				after, err := dp.List(ctx)
				if err != nil {
					t.Fatal(err)
				}
				held, err := q.Load()
				if err != nil {
					t.Fatal(err)
				}
				if uids(after) != s.prog || uids(held) != s.queued {
					t.Errorf("step %d: programmed %q queued %q, want %q and %q", i+1, uids(after), uids(held), s.prog, s.queued)
				}
				if _, err := os.Stat(q.File()); (err == nil) != (s.queued != "") {
					t.Errorf("step %d: queue file present %v with queue %q (an empty queue has no file)", i+1, err == nil, s.queued)
				}
			}
		})
	}
}

// TestHoldWithoutConflictDoesNotTouchTheFile: a call with no second SNAT of
// a CIDR reads no queue, so a broken queue file does not fail it; one that
// must queue reports the broken file with its path.
func TestHoldWithoutConflictDoesNotTouchTheFile(t *testing.T) {
	q := Queue{Dir: t.TempDir()}
	if err := os.WriteFile(q.File(), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	rest, queued, err := q.Hold([]nat.Object{a1}, []nat.Object{b1, f1})
	if err != nil || queued || uids(rest) != "b1 f1" {
		t.Fatalf("Hold without conflict: %s, %v, %v", uids(rest), queued, err)
	}
	if _, _, err := q.Hold([]nat.Object{a1}, []nat.Object{a2}); err == nil || !strings.Contains(err.Error(), q.File()) {
		t.Fatalf("Hold over a broken queue file: %v, want an error naming %s", err, q.File())
	}
	dp, err := natfake.New("fake")
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Delete(context.Background(), dp, nil, []string{"a1"}); err == nil {
		t.Fatal("Delete over a broken queue file: no error")
	}
}

// TestSaveLoad: the queue round-trips in order and an empty queue removes
// the file.
func TestSaveLoad(t *testing.T) {
	q := Queue{Dir: filepath.Join(t.TempDir(), "a", "b")}
	if got, err := q.Load(); err != nil || got != nil {
		t.Fatalf("Load of no file: %v, %v", got, err)
	}
	want := []nat.Object{a3, a1, f1}
	if err := q.Save(want); err != nil {
		t.Fatal(err)
	}
	got, err := q.Load()
	if err != nil || !slices.EqualFunc(got, want, func(x, y nat.Object) bool { return x.Equal(y) && x.UID == y.UID }) {
		t.Fatalf("Load: %s, %v, want %s", uids(got), err, uids(want))
	}
	if err := q.Save(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(q.File()); !os.IsNotExist(err) {
		t.Fatalf("empty queue left its file: %v", err)
	}
}
