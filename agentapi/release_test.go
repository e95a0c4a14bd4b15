package agentapi

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// withFree makes Serve's memory release call free after wait instead of
// debug.FreeOSMemory after releaseIdle.
func withFree(wait time.Duration, free func()) Option {
	return func(o *serveOptions) { o.releaseIdle, o.free = wait, free }
}

// waitCount waits up to 10 s for n to reach want.
func waitCount(t *testing.T, n *atomic.Int32, want int32) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); n.Load() < want; {
		if time.Now().After(deadline) {
			t.Fatalf("%d releases after 10 s, want %d", n.Load(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestReleaseAfterLargeRequest: a large request's answer is followed by
// one release once input stops; small requests owe none.
func TestReleaseAfterLargeRequest(t *testing.T) {
	var n atomic.Int32
	c, stop := pipeAgent(t, newFakeDP(), WithReleaseMemory(200), withFree(time.Millisecond, func() { n.Add(1) }))
	ctx := context.Background()
	for range 5 {
		if _, err := c.Info(ctx); err != nil { // ~100-byte lines: under the bound
			t.Fatal(err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if got := n.Load(); got != 0 {
		t.Fatalf("%d releases after small requests, want 0", got)
	}
	if err := c.Sync(ctx, smallGateway(10, 0)); err != nil { // ~1 KB
		t.Fatal(err)
	}
	waitCount(t, &n, 1)
	time.Sleep(50 * time.Millisecond)
	if got := n.Load(); got != 1 {
		t.Fatalf("%d releases after one large request, want 1", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

// TestIdleReleaseWaitsForInput: input arriving before the wait is over
// postpones an owed release until an answer is followed by the wait;
// a release is made once per owe.
func TestIdleReleaseWaitsForInput(t *testing.T) {
	var n atomic.Int32
	r := newIdleRelease(500*time.Millisecond, func() { n.Add(1) })
	defer r.stop()
	r.owe()
	r.busy() // a request came in at once
	time.Sleep(time.Second)
	if got := n.Load(); got != 0 {
		t.Fatalf("%d releases while a request was in, want 0", got)
	}
	r.idle() // answered: wait again
	waitCount(t, &n, 1)
	r.idle() // nothing owed any more
	r.fire()
	if got := n.Load(); got != 1 {
		t.Fatalf("%d releases, want 1", got)
	}
}
