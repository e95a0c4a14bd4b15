package gateway

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// apiServer is the path to the agents as Options.Probe sees it.
type apiServer struct {
	down   atomic.Bool
	probes atomic.Int64
}

func (a *apiServer) probe(context.Context) error {
	a.probes.Add(1)
	if a.down.Load() {
		return errors.New("connection refused (test)")
	}
	return nil
}

// setDown makes the API server and the agents behind it unreachable (or
// reachable again), as a kube-apiserver restart does to exec sessions.
func (f *fixture) setDown(api *apiServer, down bool) {
	f.tr.mu.Lock()
	f.tr.refuse = down
	f.tr.mu.Unlock()
	api.down.Store(down)
}

func (f *fixture) opens() int {
	f.tr.mu.Lock()
	defer f.tr.mu.Unlock()
	return f.tr.opens
}

// startRecovery runs gateway gw1 with a reconnect backoff of an hour (a
// backoff that doubled while the API server was down) and api as the
// probe, and waits for its first session.
func startRecovery(t *testing.T, api *apiServer) *fixture {
	t.Helper()
	f := startWith(t, &source{}, newAgent(), newAgent(), nil, 0, func(o *Options) {
		o.BackoffMin, o.BackoffMax = time.Hour, time.Hour
		o.Probe, o.ProbeInterval = api.probe, 20*time.Millisecond
	})
	eventually(t, "first session", func() error {
		if f.gw.Dataplane() == "" {
			return errors.New("no session")
		}
		return nil
	})
	return f
}

// TestReconnectWhenAPIServerBack: the sessions break and the API server is
// down; the manager's retry fails and it backs off (an hour here). When
// the probe answers again, it reconnects at once instead of waiting out
// the backoff, and while the API server was down it tried to open once.
func TestReconnectWhenAPIServerBack(t *testing.T) {
	api := &apiServer{}
	f := startRecovery(t, api)
	before := f.opens()
	f.setDown(api, true)
	f.tr.breakSessions()
	eventually(t, "a failed retry", func() error {
		if f.gw.Dataplane() != "" || f.opens() < before+1 {
			return errors.New("no retry yet")
		}
		return nil
	})
	probes := api.probes.Load()
	eventually(t, "the probe failing", func() error {
		if api.probes.Load() < probes+3 {
			return errors.New("fewer than 3 probes")
		}
		return nil
	})
	if n := f.opens() - before; n != 1 {
		t.Errorf("%d opens while the API server was down, want 1 (the backoff's)", n)
	}
	f.setDown(api, false)
	eventually(t, "reconnected once the API server answers", func() error {
		if f.gw.Dataplane() == "" {
			return errors.New("no session")
		}
		return nil
	})
}

// TestNoWakeWithoutRecovery: when the probe never failed (the agent, not
// the API server, was unreachable), the backoff stands, and with no
// manager waiting nothing is probed.
func TestNoWakeWithoutRecovery(t *testing.T) {
	api := &apiServer{}
	f := startRecovery(t, api)
	time.Sleep(100 * time.Millisecond)
	if n := api.probes.Load(); n != 0 {
		t.Errorf("%d probes with every gateway connected, want 0", n)
	}
	f.tr.mu.Lock()
	f.tr.refuse = true
	f.tr.mu.Unlock()
	before := f.opens()
	f.tr.breakSessions()
	eventually(t, "a failed retry", func() error {
		if f.opens() < before+1 {
			return errors.New("no retry yet")
		}
		return nil
	})
	f.tr.mu.Lock()
	f.tr.refuse = false
	f.tr.mu.Unlock()
	probes := api.probes.Load()
	eventually(t, "probing while the manager waits", func() error {
		if api.probes.Load() < probes+5 {
			return errors.New("fewer than 5 probes")
		}
		return nil
	})
	if dp := f.gw.Dataplane(); dp != "" {
		t.Errorf("reconnected (%s) within the backoff with the API server up all along", dp)
	}
	if n := f.opens() - before; n != 1 {
		t.Errorf("%d opens, want 1", n)
	}
}
