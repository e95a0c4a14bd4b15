package scenario

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/e2e/framework"
)

// fipWatch follows IptablesFIPRule events and records, by name, when each
// object was first seen Ready (Ready=True, reason Programmed, for its
// current generation) and when it was seen deleted: the times a client
// watching the API server observes, as `kubectl wait` would.
type fipWatch struct {
	c      client.WithWatch
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	ready   map[string]time.Time
	gone    map[string]time.Time
	changed chan struct{} // closed and replaced on every change
	err     error
}

// watchFIPs starts watching; call Stop when done.
func watchFIPs(ctx context.Context, c client.WithWatch) (*fipWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	w, err := c.Watch(ctx, &v1.IptablesFIPRuleList{})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch IptablesFIPRules: %w", err)
	}
	fw := &fipWatch{c: c, cancel: cancel, done: make(chan struct{}), ready: map[string]time.Time{}, gone: map[string]time.Time{}, changed: make(chan struct{})}
	go fw.loop(ctx, w)
	return fw, nil
}

// loop records events; when the API server ends the watch it starts a new
// one from the last resource version seen (at most 5 times in a row
// without an event in between).
func (fw *fipWatch) loop(ctx context.Context, w watch.Interface) {
	defer close(fw.done)
	rv, restarts := "", 0
	for {
		for ev := range w.ResultChan() {
			now := time.Now()
			restarts = 0
			switch ev.Type {
			case watch.Added, watch.Modified, watch.Deleted:
				f, ok := ev.Object.(*v1.IptablesFIPRule)
				if !ok {
					continue
				}
				rv = f.ResourceVersion
				fw.record(f, ev.Type == watch.Deleted, now)
			case watch.Error:
				fw.fail(fmt.Errorf("watch of IptablesFIPRules: %w", apierrors.FromObject(ev.Object)))
				w.Stop()
				return
			}
		}
		if ctx.Err() != nil {
			return
		}
		if restarts++; restarts > 5 {
			fw.fail(errors.New("watch of IptablesFIPRules: ended 5 times in a row"))
			return
		}
		var err error
		w, err = fw.c.Watch(ctx, &v1.IptablesFIPRuleList{}, &client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv}})
		if err != nil {
			fw.fail(fmt.Errorf("watch of IptablesFIPRules again from resource version %q: %w", rv, err))
			return
		}
	}
}

func (fw *fipWatch) record(f *v1.IptablesFIPRule, deleted bool, now time.Time) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	switch {
	case deleted:
		if _, ok := fw.gone[f.Name]; !ok {
			fw.gone[f.Name] = now
		}
	default:
		r := framework.ReadyOf(f)
		if r.Status != metav1.ConditionTrue || r.Reason != v1.ReasonProgrammed || !r.Current {
			return
		}
		if _, ok := fw.ready[f.Name]; ok {
			return
		}
		fw.ready[f.Name] = now
	}
	close(fw.changed)
	fw.changed = make(chan struct{})
}

func (fw *fipWatch) fail(err error) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.err == nil {
		fw.err = err
	}
	close(fw.changed)
	fw.changed = make(chan struct{})
}

// Stop ends the watch.
func (fw *fipWatch) Stop() {
	fw.cancel()
	<-fw.done
}

// waitAll waits until every name has a time in the map that pick selects
// (fw.ready or fw.gone), and returns those times in the order of names.
func (fw *fipWatch) waitAll(ctx context.Context, timeout time.Duration, what string, names []string, pick func(*fipWatch) map[string]time.Time) ([]time.Time, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		fw.mu.Lock()
		m, changed, err := pick(fw), fw.changed, fw.err
		missing, first := 0, ""
		for _, n := range names {
			if _, ok := m[n]; !ok {
				if missing == 0 {
					first = n
				}
				missing++
			}
		}
		var out []time.Time
		if missing == 0 {
			out = make([]time.Time, len(names))
			for i, n := range names {
				out[i] = m[n]
			}
		}
		fw.mu.Unlock()
		switch {
		case missing == 0:
			return out, nil
		case err != nil:
			return nil, err
		}
		select {
		case <-changed:
		case <-deadline.C:
			return nil, fmt.Errorf("%d of %d IptablesFIPRules not %s within %v (e.g. %s)", missing, len(names), what, timeout, first)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// waitReady waits until every FIP in names was seen Ready.
func (fw *fipWatch) waitReady(ctx context.Context, timeout time.Duration, names ...string) ([]time.Time, error) {
	return fw.waitAll(ctx, timeout, "Ready", names, func(fw *fipWatch) map[string]time.Time { return fw.ready })
}

// waitGone waits until every FIP in names was seen deleted.
func (fw *fipWatch) waitGone(ctx context.Context, timeout time.Duration, names ...string) ([]time.Time, error) {
	return fw.waitAll(ctx, timeout, "gone", names, func(fw *fipWatch) map[string]time.Time { return fw.gone })
}
