package reconciler

import (
	"sync"

	"github.com/natgw/natgw/nat"
)

// tracker remembers, per object kind and name, the UID and gateway this
// process programmed. It closes a hole that finalizers alone leave: the API
// server checks for finalizers when a DELETE starts, so an object deleted
// while our finalizer patch is in flight can vanish although the patch
// succeeded (and we programmed it). The reconcile that then finds the name
// gone from the cache deletes the remembered UID. Leftovers from before a
// controller restart are the orphan sweep's.
type tracker struct {
	mu sync.Mutex
	m  map[trackKey]trackVal
}

type trackKey struct {
	kind nat.Kind
	name string
}

type trackVal struct {
	uid     string
	gateway string
}

func newTracker() *tracker { return &tracker{m: map[trackKey]trackVal{}} }

func (t *tracker) set(kind nat.Kind, name, uid, gateway string) {
	t.mu.Lock()
	t.m[trackKey{kind, name}] = trackVal{uid: uid, gateway: gateway}
	t.mu.Unlock()
}

func (t *tracker) get(kind nat.Kind, name string) (trackVal, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, ok := t.m[trackKey{kind, name}]
	return v, ok
}

// forget drops the entry of name if it still records uid.
func (t *tracker) forget(kind nat.Kind, name, uid string) {
	t.mu.Lock()
	if v, ok := t.m[trackKey{kind, name}]; ok && v.uid == uid {
		delete(t.m, trackKey{kind, name})
	}
	t.mu.Unlock()
}
