package gateway

import (
	"slices"
	"sync"
)

// holderIndex is the union of the managers' held sets, by UID: which
// gateways' agents hold a UID as far as this process knows. Registry.Holders
// reads it with one lookup instead of one per gateway (a reconcile asks on
// every run, so with 1,000 gateways the per-gateway walk was a reconcile's
// largest cost at a cold start). A UID is almost always held by one
// gateway, so that one is stored by value and only further holders (a
// rule whose EIP moved, until the old gateway lets it go) in a slice.
// A manager updates it under its knownMu, with every change of held; mu is
// taken after knownMu and nothing is taken under it. A nil index (a manager
// outside a Registry) records nothing.
type holderIndex struct {
	mu   sync.Mutex
	one  map[string]*Manager
	more map[string][]*Manager
}

func newHolderIndex() *holderIndex {
	return &holderIndex{one: map[string]*Manager{}, more: map[string][]*Manager{}}
}

// add records that g holds uid (caller holds x.mu).
func (x *holderIndex) add(g *Manager, uid string) {
	h, ok := x.one[uid]
	switch {
	case !ok:
		x.one[uid] = g
	case h == g, slices.Contains(x.more[uid], g):
	default:
		x.more[uid] = append(x.more[uid], g)
	}
}

// remove records that g no longer holds uid (caller holds x.mu).
func (x *holderIndex) remove(g *Manager, uid string) {
	h, ok := x.one[uid]
	if !ok {
		return
	}
	rest := x.more[uid]
	if h == g {
		if len(rest) == 0 {
			delete(x.one, uid)
			return
		}
		x.one[uid] = rest[0]
		rest = rest[1:]
	} else {
		i := slices.Index(rest, g)
		if i < 0 {
			return
		}
		rest = slices.Delete(slices.Clone(rest), i, i+1)
	}
	if len(rest) == 0 {
		delete(x.more, uid)
	} else {
		x.more[uid] = rest
	}
}

// update applies g's held changes: added and removed UIDs.
func (x *holderIndex) update(g *Manager, added, removed []string) {
	if x == nil || len(added)+len(removed) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, u := range removed {
		x.remove(g, u)
	}
	for _, u := range added {
		x.add(g, u)
	}
}

// replace records that g now holds exactly now, having held before.
func (x *holderIndex) replace(g *Manager, before, now map[string]struct{}) {
	if x == nil {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for u := range before {
		if _, ok := now[u]; !ok {
			x.remove(g, u)
		}
	}
	for u := range now {
		if _, ok := before[u]; !ok {
			x.add(g, u)
		}
	}
}

// get returns the gateways that hold uid.
func (x *holderIndex) get(uid string) []*Manager {
	x.mu.Lock()
	defer x.mu.Unlock()
	h, ok := x.one[uid]
	if !ok {
		return nil
	}
	return append([]*Manager{h}, x.more[uid]...)
}
