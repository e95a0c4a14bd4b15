package scenario

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/e2e/framework"
)

// s6Kinds are the kinds scenario 6 counts, by the short names it uses.
var s6Kinds = []struct {
	name string
	obj  client.Object
}{
	{"eip", &v1.IptablesEIP{}},
	{"fip", &v1.IptablesFIPRule{}},
	{"dnat", &v1.IptablesDnatRule{}},
	{"snat", &v1.IptablesSnatRule{}},
}

// readyTracker follows the objects of s6Kinds through informers (list,
// then watch, relisting when a watch ends) and keeps, per kind, the names
// that are Ready (Ready=True for the current generation) as the API
// server last showed them, when each kind last gained a Ready object, and
// how often a Ready object lost Ready.
type readyTracker struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	ready     map[string]map[string]bool
	lastReady map[string]time.Time
	lost      map[string]int
	changed   chan struct{} // closed and replaced on every change
}

// trackReady starts informers for s6Kinds on cfg's API server and waits
// until they have listed.
func trackReady(ctx context.Context, cp *controlPlane) (*readyTracker, error) {
	ca, err := cache.New(cp.cfg, cache.Options{Scheme: framework.Scheme})
	if err != nil {
		return nil, fmt.Errorf("informer cache: %w", err)
	}
	t := &readyTracker{ready: map[string]map[string]bool{}, lastReady: map[string]time.Time{}, lost: map[string]int{}, changed: make(chan struct{}), done: make(chan struct{})}
	ctx, t.cancel = context.WithCancel(ctx)
	for _, k := range s6Kinds {
		t.ready[k.name] = map[string]bool{}
		inf, err := ca.GetInformer(ctx, k.obj)
		if err != nil {
			t.cancel()
			return nil, fmt.Errorf("informer for %s: %w", k.name, err)
		}
		kind := k.name
		_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { t.observe(kind, o, false) },
			UpdateFunc: func(_, o any) { t.observe(kind, o, false) },
			DeleteFunc: func(o any) {
				if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
					o = d.Obj
				}
				t.observe(kind, o, true)
			},
		})
		if err != nil {
			t.cancel()
			return nil, fmt.Errorf("informer handler for %s: %w", k.name, err)
		}
	}
	go func() {
		defer close(t.done)
		_ = ca.Start(ctx)
	}()
	if !ca.WaitForCacheSync(ctx) {
		t.Stop()
		return nil, fmt.Errorf("informers did not sync: %w", context.Cause(ctx))
	}
	return t, nil
}

func (t *readyTracker) observe(kind string, o any, deleted bool) {
	obj, ok := o.(client.Object)
	if !ok {
		return
	}
	now := time.Now()
	r := framework.ReadyOf(obj)
	isReady := !deleted && r.Status == metav1.ConditionTrue && r.Current
	t.mu.Lock()
	defer t.mu.Unlock()
	was := t.ready[kind][obj.GetName()]
	switch {
	case isReady && !was:
		t.ready[kind][obj.GetName()] = true
		t.lastReady[kind] = now
	case !isReady && was:
		delete(t.ready[kind], obj.GetName())
		if !deleted {
			t.lost[kind]++
		}
	default:
		return
	}
	close(t.changed)
	t.changed = make(chan struct{})
}

// Stop ends the informers.
func (t *readyTracker) Stop() {
	t.cancel()
	<-t.done
}

// counts returns the Ready objects per kind and how many times an object
// lost Ready, in all kinds.
func (t *readyTracker) counts() (map[string]int, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	lost := 0
	for k, m := range t.ready {
		out[k] = len(m)
		lost += t.lost[k]
	}
	return out, lost
}

// wait waits until every kind in want has at least that many Ready
// objects and returns when the last of them became Ready. It fails when no
// object changed state for stall, when alive (checked every second) fails,
// or ctx ends. progress gets the Ready count over all kinds in want.
func (t *readyTracker) wait(ctx context.Context, want map[string]int, stall time.Duration, alive func() error, progress func(ready, total int)) (time.Time, error) {
	total := 0
	for _, n := range want {
		total += n
	}
	timer := time.NewTimer(stall)
	defer timer.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		t.mu.Lock()
		ready, changed := 0, t.changed
		var last time.Time
		var short []string
		for k, n := range want {
			have := len(t.ready[k])
			ready += min(have, n)
			if have < n {
				short = append(short, fmt.Sprintf("%s %d of %d", k, have, n))
			}
			if t.lastReady[k].After(last) {
				last = t.lastReady[k]
			}
		}
		t.mu.Unlock()
		if progress != nil {
			progress(ready, total)
		}
		if len(short) == 0 {
			return last, nil
		}
		if err := alive(); err != nil {
			return time.Time{}, err
		}
		select {
		case <-changed:
			timer.Reset(stall)
			// At most one progress update per change burst.
			select {
			case <-tick.C:
			case <-ctx.Done():
				return time.Time{}, ctx.Err()
			}
		case <-tick.C:
		case <-timer.C:
			sort.Strings(short)
			return time.Time{}, fmt.Errorf("no object became Ready or lost Ready for %v; Ready: %s", stall, strings.Join(short, ", "))
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		}
	}
}
