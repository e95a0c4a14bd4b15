package gateway

import (
	"context"
	"slices"
	"testing"

	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/nat"
)

// TestApplyUnchangedNotSent: an Apply of objects the current session is
// known to hold exactly (the connect's converge left them, or an Apply
// put them) sends nothing to the agent; an Apply that changes one object
// of several sends only that one; after a reconnect to an agent that lost
// its state (a new boot id: the converge syncs), known is the new
// session's, and after a Delete the object is sent again.
func TestApplyUnchangedNotSent(t *testing.T) {
	nft := newAgent()
	src := &source{desired: []nat.Object{fip("a", 1), fip("b", 2)}}
	f := start(t, src, nft, 0)
	eventually(t, "first sync", holds(nft, "a", "b"))
	skipped := func() float64 { return metrics.CounterValue(metrics.UnchangedApplies.WithLabelValues(f.gw.Name())) }
	calls := func(from int) []string { return nft.callLog()[from:] }

	n, s0 := len(nft.callLog()), skipped()
	// Held exactly since the converge: nothing sent.
	if err := f.gw.Apply(context.Background(), fip("a", 1), fip("b", 2)); err != nil {
		t.Fatal(err)
	}
	if got := calls(n); len(got) != 0 {
		t.Errorf("calls for objects the agent holds %v, want none", got)
	}
	if got := skipped() - s0; got != 2 {
		t.Errorf("unchanged applies counted %v, want 2", got)
	}

	// One of two changed: only it is sent.
	n = len(nft.callLog())
	if err := f.gw.Apply(context.Background(), fip("a", 1), fip("b", 3)); err != nil {
		t.Fatal(err)
	}
	if got := calls(n); !slices.Equal(got, []string{"apply b"}) {
		t.Errorf("calls %v, want [apply b]", got)
	}
	// ... and now held: not sent again.
	n = len(nft.callLog())
	if err := f.gw.Apply(context.Background(), fip("b", 3)); err != nil {
		t.Fatal(err)
	}
	if got := calls(n); len(got) != 0 {
		t.Errorf("calls after the same apply %v, want none", got)
	}

	// A failed apply leaves nothing known: the next one is sent.
	nft.mu.Lock()
	nft.failOp = "apply"
	nft.mu.Unlock()
	if err := f.gw.Apply(context.Background(), fip("c", 4)); err == nil {
		t.Fatal("apply refused by the agent: no error")
	}
	nft.mu.Lock()
	nft.failOp = ""
	nft.mu.Unlock()
	n = len(nft.callLog())
	if err := f.gw.Apply(context.Background(), fip("c", 4)); err != nil {
		t.Fatal(err)
	}
	if got := calls(n); !slices.Equal(got, []string{"apply c"}) {
		t.Errorf("calls after a failed apply %v, want [apply c]", got)
	}

	// Deleted: sent again.
	if err := f.gw.Delete(context.Background(), nat.KindFIP, "c"); err != nil {
		t.Fatal(err)
	}
	n = len(nft.callLog())
	if err := f.gw.Apply(context.Background(), fip("c", 4)); err != nil {
		t.Fatal(err)
	}
	if got := calls(n); !slices.Equal(got, []string{"apply c"}) {
		t.Errorf("calls after a delete %v, want [apply c]", got)
	}

	// The agent lost its state and came back with a new boot id: the
	// reconnect's converge syncs, and known is what it synced.
	src.mu.Lock()
	src.desired = []nat.Object{fip("a", 1), fip("b", 3), fip("c", 4)}
	src.mu.Unlock()
	nft.mu.Lock()
	nft.lost()
	nft.mu.Unlock()
	f.tr.breakSessions()
	eventually(t, "resynced", holds(nft, "a", "b", "c"))
	n = len(nft.callLog())
	if err := f.gw.Apply(context.Background(), fip("b", 3)); err != nil {
		t.Fatal(err)
	}
	if got := calls(n); len(got) != 0 {
		t.Errorf("calls after the resync %v, want none", got)
	}
}
