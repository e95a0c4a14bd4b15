package leasefence

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/nat/ha"
)

func TestNewRejects(t *testing.T) {
	leases, err := LeasesForConfig(&rest.Config{Host: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(nil, "ns", "gw", 0); err == nil || !strings.Contains(err.Error(), "no client") {
		t.Fatalf("New(nil client) = %v, want an error naming the client", err)
	}
	if _, err := LeasesForConfig(nil); err == nil {
		t.Fatal("LeasesForConfig(nil): no error")
	}
	for _, tc := range []struct {
		name      string
		ns, lname string
		timeout   time.Duration
		want      string
	}{
		{"no namespace", "", "gw", 0, "namespace: empty"},
		{"no name", "ns", "", 0, "name: empty"},
		{"negative timeout", "ns", "gw", -time.Second, "call timeout -1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(leases, tc.ns, tc.lname, tc.timeout)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New(%q, %q, %s) = %v, want an error naming %q", tc.ns, tc.lname, tc.timeout, err, tc.want)
			}
		})
	}
}

// TestLeaseFence runs the fence against a real kube-apiserver: acquire,
// renew, steal refused, expiry and takeover, the old holder refused after
// it, release, races of two replicas, and the API server stopped.
func TestLeaseFence(t *testing.T) {
	assets := apitest.RequireAssets(t)
	env := apitest.Environment(assets, apitest.CRDDir())
	cfg, err := apitest.Start(env)
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = env.Stop()
		}
	})
	// The fences use LeasesForConfig's client (a RESTClient knowing
	// coordination/v1 only); the test reads the holder through the typed
	// clientset, a reader independent of the code under test.
	leases, err := LeasesForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg).CoordinationV1()
	ctx := t.Context()
	const ttl = 400 * time.Millisecond
	a, err := New(leases, "default", "gw1", 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := New(leases, "default", "gw1", 0)
	holder := func() string {
		l, err := cs.Leases("default").Get(ctx, "gw1", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get lease: %v", err)
		}
		return holderOf(l)
	}

	steps := []struct {
		name   string
		f      *Fence
		op     string // acquire, release, wait
		id     string
		held   bool // want ha.ErrHeld
		holder string
	}{
		{"a creates and acquires", a, "acquire", "a", false, "a"},
		{"a renews", a, "acquire", "a", false, "a"},
		{"b refused while a's lease runs", b, "acquire", "b", true, "a"},
		{"a renews again (cached version)", a, "acquire", "a", false, "a"},
		{"b refused again", b, "acquire", "b", true, "a"},
		{"lease runs out", nil, "wait", "", false, "a"},
		{"b takes over", b, "acquire", "b", false, "b"},
		{"a's renewal refused (stale version, b holds it)", a, "acquire", "a", true, "b"},
		{"a's release of b's lease does nothing", a, "release", "a", false, "b"},
		{"b renews", b, "acquire", "b", false, "b"},
		{"b releases", b, "release", "b", false, ""},
		{"a acquires at once after the release", a, "acquire", "a", false, "a"},
	}
	for _, s := range steps {
		switch s.op {
		case "acquire":
			before := time.Now()
			err := s.f.Acquire(ctx, s.id, ttl)
			if s.held != errors.Is(err, ha.ErrHeld) || (!s.held && err != nil) {
				t.Fatalf("%s: Acquire(%s) = %v, want held=%t", s.name, s.id, err, s.held)
			}
			// A refusal read from the Lease says until when it runs
			// (renewTime + duration), for the standby to ask again
			// then; a conflict on a stale version does not know.
			var he *ha.HeldError
			if s.held && s.f == b && (!errors.As(err, &he) || he.Holder != "a" || he.Until.After(before.Add(ttl)) || he.Until.Before(before.Add(-time.Second))) {
				t.Fatalf("%s: Acquire(%s) = %v, want a HeldError of a until at most %s after the call", s.name, s.id, err, ttl)
			}
		case "release":
			if err := s.f.Release(ctx, s.id); err != nil {
				t.Fatalf("%s: Release(%s) = %v", s.name, s.id, err)
			}
		case "wait":
			time.Sleep(ttl + 50*time.Millisecond)
		}
		if h := holder(); h != s.holder {
			t.Fatalf("%s: holder %q, want %q", s.name, h, s.holder)
		}
	}
	if err := a.Release(ctx, "a"); err != nil {
		t.Fatal(err)
	}

	// Two replicas racing for a free lease, each from its own fence: at
	// most one wins every round (exactly one when the API server answers).
	for round := range 20 {
		name := fmt.Sprintf("race%d", round)
		x, _ := New(leases, "default", name, 0)
		y, _ := New(leases, "default", name, 0)
		if round%2 == 1 { // a lease that exists and is free
			if err := x.Acquire(ctx, "x", ttl); err != nil {
				t.Fatal(err)
			}
			if err := x.Release(ctx, "x"); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, f := range []*Fence{x, y} {
			wg.Go(func() { errs[i] = f.Acquire(ctx, []string{"x", "y"}[i], 10*time.Second) })
		}
		wg.Wait()
		won := 0
		for i, err := range errs {
			switch {
			case err == nil:
				won++
			case !errors.Is(err, ha.ErrHeld):
				t.Fatalf("round %d: replica %d: %v", round, i, err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d replicas hold the lease (%v), want exactly 1", round, won, errs)
		}
	}

	// The API server stopped: the holder's renewal fails with an error that
	// is not ErrHeld (cannot prove it may lead), within the call timeout.
	c, _ := New(leases, "default", "gw2", 300*time.Millisecond)
	if err := c.Acquire(ctx, "c", ttl); err != nil {
		t.Fatal(err)
	}
	if err := env.Stop(); err != nil {
		t.Fatalf("stop kube-apiserver: %v", err)
	}
	stopped = true
	start := time.Now()
	err = c.Acquire(ctx, "c", ttl)
	took := time.Since(start)
	if err == nil || errors.Is(err, ha.ErrHeld) {
		t.Fatalf("Acquire with the API server stopped = %v, want an unreachable error", err)
	}
	// One call for the renewal (its error is not a conflict, so no second).
	if took > time.Second {
		t.Fatalf("Acquire with the API server stopped took %s, want ≤ 1s (call timeout 300ms)", took)
	}
	t.Logf("API server stopped: Acquire failed in %s: %v", took, err)
	// The same through a caller's context that ends first.
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	start = time.Now()
	if err := c.Acquire(cctx, "c", ttl); err == nil || errors.Is(err, ha.ErrHeld) {
		t.Fatalf("Acquire = %v, want an unreachable error", err)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Fatalf("Acquire with a 50ms context took %s", took)
	}
}
