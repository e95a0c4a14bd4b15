package gateway

import (
	"context"
	"sync"
	"time"
)

// recovery ends the reconnect backoff of every gateway when the path to
// the agents answers again (Options.Probe): after an API server restart
// every exec session breaks at once, and without it each manager would
// wait out its doubled backoff (up to BackoffMax) after the API server is
// back. The loop probes only while some manager waits in backoff, at
// most every Options.ProbeInterval; managers asking whether a broken
// session or a failed reconnect is the path's fault (down) probe too, at
// most twice per connect attempt, sharing the next probe with every
// caller waiting for it (never one that started before they asked). One
// probe at a time, for all gateways: never more than one request at once.
type recovery struct {
	probe    func(context.Context) error
	interval time.Duration

	// probeMu serializes probes; probedAt is when the last one started
	// and probeErr its result, shared by callers that asked before then.
	probeMu  sync.Mutex
	probedAt time.Time
	probeErr error

	mu      sync.Mutex
	waiters int
	// back is closed when the probe answers after it failed while
	// managers waited; then replaced.
	back chan struct{}
}

func newRecovery(probe func(context.Context) error, interval time.Duration) *recovery {
	return &recovery{probe: probe, interval: interval, back: make(chan struct{})}
}

// wait sleeps d, or until the probe answers again (then it returns
// recovered true); ok is false when ctx ended first. A nil recovery (no
// Options.Probe) only sleeps.
func (r *recovery) wait(ctx context.Context, d time.Duration) (ok, recovered bool) {
	if r == nil {
		return sleep(ctx, d), false
	}
	r.mu.Lock()
	r.waiters++
	back := r.back
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.waiters--
		r.mu.Unlock()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false, false
	case <-t.C:
		return true, false
	case <-back:
		return true, true
	}
}

// run probes every interval while a manager waits, and wakes the waiters
// when a probe succeeds after one failed, until ctx ends.
func (r *recovery) run(ctx context.Context) {
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	failed := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		r.mu.Lock()
		n := r.waiters
		r.mu.Unlock()
		if n == 0 {
			failed = false
			continue
		}
		if r.down(ctx) {
			failed = true
			continue
		}
		if failed {
			failed = false
			r.mu.Lock()
			close(r.back)
			r.back = make(chan struct{})
			r.mu.Unlock()
		}
	}
}

// down reports whether the path to the agents fails a probe started
// after the call; false for a nil recovery (no Options.Probe: a broken
// session is the gateway's own). Every session breaks at once when the
// API server restarts: concurrent callers share a probe, one started
// after each of them asked (never an older result: one from before the
// path went down would read as the gateway's own failure).
func (r *recovery) down(ctx context.Context) bool {
	if r == nil {
		return false
	}
	asked := time.Now()
	r.probeMu.Lock()
	defer r.probeMu.Unlock()
	if !r.probedAt.Before(asked) {
		return r.probeErr != nil
	}
	r.probedAt = time.Now()
	r.probeErr = r.probeNow(ctx)
	return r.probeErr != nil
}

// probeNow runs the probe once, bounded by the interval (at least 2 s).
func (r *recovery) probeNow(ctx context.Context) error {
	pctx, cancel := context.WithTimeout(ctx, max(r.interval, 2*time.Second))
	defer cancel()
	return r.probe(pctx)
}
