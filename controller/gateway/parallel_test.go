package gateway

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/internal/testlog"
	"github.com/natgw/natgw/nat"
)

// gatedTransport opens sessions to one agent per gateway whose Sync waits
// for the test (gate) and counts how many run at once.
type gatedTransport struct {
	gate chan struct{} // a receive lets one Sync finish; closed: all
	hold time.Duration // when gate is nil: each Sync takes this long

	mu       sync.Mutex
	agents   map[string]*agent
	inflight int
	peak     int
	entered  int
	failed   []string // Syncs that failed (their context ended)
}

func (t *gatedTransport) Open(_ context.Context, gw transport.Endpoint) (transport.Session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a, ok := t.agents[gw.Name]
	if !ok {
		a = newAgent()
		t.agents[gw.Name] = a
	}
	return &gatedSession{session: &session{a: a, done: make(chan struct{})}, t: t, gw: gw.Name}, nil
}

func (t *gatedTransport) counts() (inflight, peak, entered int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inflight, t.peak, t.entered
}

type gatedSession struct {
	*session
	t  *gatedTransport
	gw string
}

func (s *gatedSession) Sync(ctx context.Context, desired []nat.Object) error {
	t := s.t
	t.mu.Lock()
	t.inflight++
	t.entered++
	t.peak = max(t.peak, t.inflight)
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		t.inflight--
		t.mu.Unlock()
	}()
	var wait <-chan time.Time
	if t.gate == nil {
		wait = time.After(t.hold)
	}
	select {
	case <-t.gate:
	case <-wait:
	case <-ctx.Done():
		t.mu.Lock()
		t.failed = append(t.failed, s.gw)
		t.mu.Unlock()
		return fmt.Errorf("sync of %s: %w", s.gw, ctx.Err())
	}
	return s.session.Sync(ctx, desired)
}

// startGated runs a Registry of n gateways (gw1…gwN) that starts them all
// itself (Options.Initial, no Get) with the given bound and call timeout.
func startGated(t *testing.T, n, bound int, callTimeout time.Duration, tr *gatedTransport) *Registry {
	t.Helper()
	cfg := &gwconfig.Config{}
	var names []string
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("gw%d", i)
		names = append(names, name)
		cfg.Gateways = append(cfg.Gateways, gwconfig.Entry{Name: name})
	}
	tr.agents = map[string]*agent{}
	src := &source{desired: []nat.Object{fip("f1", 1)}}
	reg := NewRegistry(Options{
		Transport: tr, Source: src, Config: cfg, DefaultDataplane: nat.DataplaneNftables,
		SyncParallel: bound, CallTimeout: callTimeout,
		BackoffMin: time.Hour, BackoffMax: time.Hour, // a failed connect is not retried within the test
		Initial: func(context.Context) ([]string, error) {
			// Not configured: skipped, and does not take a slot.
			return append(names, "not-configured"), nil
		},
		Log: testlog.New(t, 0),
	})
	runRegistry(t, reg)
	return reg
}

// connected counts the Registry's gateways with a published session.
func connected(reg *Registry) int {
	reg.mu.Lock()
	defer reg.mu.Unlock()
	n := 0
	for _, g := range reg.gateways {
		if g.Dataplane() != "" {
			n++
		}
	}
	return n
}

// TestSyncParallelBound: at a cold start every gateway syncs, at most
// SyncParallel at a time and exactly that many while more wait; each
// finished sync lets one waiting gateway in, in whatever order.
func TestSyncParallelBound(t *testing.T) {
	const n = 6
	for _, bound := range []int{1, 2, n, n + 3} {
		t.Run(fmt.Sprintf("bound=%d", bound), func(t *testing.T) {
			tr := &gatedTransport{gate: make(chan struct{})}
			reg := startGated(t, n, bound, time.Minute, tr)
			want := min(bound, n)
			eventually(t, fmt.Sprintf("%d syncs in flight", want), func() error {
				if in, _, _ := tr.counts(); in != want {
					return fmt.Errorf("%d syncs in flight", in)
				}
				return nil
			})
			// Nobody else gets in while the slots are held.
			time.Sleep(200 * time.Millisecond)
			if in, peak, entered := tr.counts(); in != want || peak != want || entered != want {
				t.Fatalf("with every slot held: %d in flight, peak %d, %d entered; want %d each", in, peak, entered, want)
			}
			if bound < n {
				// One finishes: exactly one more starts.
				tr.gate <- struct{}{}
				eventually(t, "the next gateway's sync", func() error {
					if _, _, entered := tr.counts(); entered != want+1 {
						return fmt.Errorf("%d syncs entered", entered)
					}
					return nil
				})
				time.Sleep(100 * time.Millisecond)
				if in, peak, entered := tr.counts(); in != want || peak != want || entered != want+1 {
					t.Fatalf("after one finished: %d in flight, peak %d, %d entered; want %d, %d, %d", in, peak, entered, want, want, want+1)
				}
			}
			close(tr.gate)
			eventually(t, "every gateway connected", func() error {
				if c := connected(reg); c != n {
					return fmt.Errorf("%d of %d gateways connected", c, n)
				}
				return nil
			})
			if _, peak, entered := tr.counts(); peak != want || entered != n {
				t.Errorf("peak %d syncs at once, %d entered; want %d, %d", peak, entered, want, n)
			}
			tr.mu.Lock()
			defer tr.mu.Unlock()
			for name, a := range tr.agents {
				if got := a.uids(); len(got) != 1 || got[0] != "f1" {
					t.Errorf("%s holds %v, want [f1]", name, got)
				}
			}
		})
	}
}

// TestSyncParallelOwnTimeout: the wait for a slot is not charged to a
// gateway's CallTimeout: four gateways whose syncs take 200 ms each, one
// at a time, all connect with a 500 ms CallTimeout (the last waits
// ~600 ms for its slot).
func TestSyncParallelOwnTimeout(t *testing.T) {
	const n = 4
	tr := &gatedTransport{hold: 200 * time.Millisecond}
	reg := startGated(t, n, 1, 500*time.Millisecond, tr)
	eventually(t, "every gateway connected", func() error {
		if c := connected(reg); c != n {
			return fmt.Errorf("%d of %d gateways connected", c, n)
		}
		return nil
	})
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.failed) > 0 || tr.peak != 1 {
		t.Errorf("failed syncs %v, peak %d at once; want none, 1", tr.failed, tr.peak)
	}
}
