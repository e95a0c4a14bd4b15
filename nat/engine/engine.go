// Package engine turns a packet-filter Backend into a nat.Dataplane. It is
// the one place that holds the operation sequence every backend shares:
// serialize calls, plan them on a nat.State (validation, conflicts, update =
// old out + new in), check and program addresses and routes, commit the
// packet-filter change as one kernel transaction, roll back on failure,
// and clean the conntrack entries of what was removed.
package engine

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/link"
)

// Backend is what a backend (nftables, iptables-legacy) implements: the
// kernel side of one gateway's NAT rules.
type Backend interface {
	// Name is the data plane's name (nat.DataplaneNftables, nat.DataplaneIptables).
	Name() nat.DataplaneName
	// Load makes sure the backend's table/chains exist (creating them,
	// and a new boot id, when they do not) and reads back every object
	// stored in the kernel with the boot id.
	Load(ctx context.Context) (objs []nat.Object, bootID string, err error)
	// Commit programs one change as one kernel transaction: the removed
	// objects leave and the added ones enter, all or nothing. When full
	// is true the change is a Sync: after it the kernel must hold exactly
	// want (removed and added are still given, for backends that diff).
	// An error wrapping nat.ErrUnknownState means the outcome is unknown.
	Commit(ctx context.Context, c Commit) error
	// ForgetFlows deletes the conntrack entries NATed through the given
	// EIPs (to an EIP, or from an internal address translated to it), in
	// the gateway's namespace, like upstream's `conntrack -D -d EIP`.
	ForgetFlows(ctx context.Context, eips []netip.Addr) error
	// Close releases the backend's sockets; kernel state stays.
	Close() error
}

// DNATFlowForgetter is implemented by Backends that can delete the
// conntrack entries of single DNATs. The engine calls it for every removed
// or changed DNAT, exclusive or one backend of a share identity, so that
// the EIP's other connections (other ports, other backends, a FIP's) stay,
// as upstream's dnat-del deletes only `-d EIP -p PROTO --dport PORT`; a
// Backend without it gets the removed DNAT's EIP in ForgetFlows instead.
type DNATFlowForgetter interface {
	// ForgetDNATFlows deletes the conntrack entries DNATed through each
	// of dnats (its EIP and external port to its internal address and
	// port), and no other.
	ForgetDNATFlows(ctx context.Context, dnats []nat.DNAT) error
}

// StateLoader is implemented by Renderers whose Load builds the nat.State
// of the objects it reads anyway (to check them against each other): the
// engine adopts that State instead of inserting every object again.
type StateLoader interface {
	// LoadState is Load, returning the objects as a State.
	LoadState(ctx context.Context) (st *nat.State, bootID string, err error)
}

// WantOnDemand is implemented by Renderers that need the whole desired
// state of a Sync only sometimes (they diff): the engine then leaves
// Commit.Want nil and the Backend calls Commit.Desired when it needs it,
// which saves building and sorting 100,000 objects per Sync.
type WantOnDemand interface {
	WantOnDemand() bool
}

// Commit is one change handed to a Backend.
type Commit struct {
	Removed []nat.Object
	Added   []nat.Object
	// Full marks a Sync: Want is the whole desired state (in canonical
	// order), unless the Backend is a WantOnDemand (see Desired).
	Full bool
	Want []nat.Object

	desired func() []nat.Object // Want on demand, in no particular order
	n       int                 // its length
}

// Desired returns the whole desired state of a Sync: Want if set, else
// computed on demand (in no particular order).
func (c Commit) Desired() []nat.Object {
	if c.Want != nil || c.desired == nil {
		return c.Want
	}
	return c.desired()
}

// DesiredLen returns len(c.Desired()) without computing it.
func (c Commit) DesiredLen() int {
	if c.Want != nil || c.desired == nil {
		return len(c.Want)
	}
	return c.n
}

// Engine implements nat.Dataplane over a Backend and a link.Plumber.
type Engine struct {
	mu     sync.Mutex
	r      Backend
	plumb  *link.Plumber
	state  *nat.State
	bootID string
	log    logr.Logger
}

var _ nat.Dataplane = (*Engine)(nil)

// New loads the kernel state through r and returns the Engine. plumb may be
// nil when addresses and routes are not to be programmed (then EIP and
// Route objects only live in the packet filter's bookkeeping).
func New(ctx context.Context, r Backend, plumb *link.Plumber, log logr.Logger) (*Engine, error) {
	e := &Engine{r: r, plumb: plumb, log: log.WithValues("dataplane", r.Name())}
	if err := e.reload(ctx); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Engine) reload(ctx context.Context) error {
	if sl, ok := e.r.(StateLoader); ok {
		st, boot, err := sl.LoadState(ctx)
		if err != nil {
			return fmt.Errorf("%s: load kernel state: %w", e.r.Name(), err)
		}
		e.state, e.bootID = st, boot
		return nil
	}
	objs, boot, err := e.r.Load(ctx)
	if err != nil {
		return fmt.Errorf("%s: load kernel state: %w", e.r.Name(), err)
	}
	st := nat.NewStateSize(len(objs))
	for _, o := range objs {
		if err := st.Insert(o); err != nil {
			// The kernel holds something our rules would refuse (hand
			// edits): keep the first, log the rest; Sync repairs.
			e.log.Error(err, "inconsistent object in kernel state, ignored", "uid", o.UID)
		}
	}
	e.state, e.bootID = st, boot
	return nil
}

// Name implements nat.Dataplane.
func (e *Engine) Name() nat.DataplaneName { return e.r.Name() }

// BootID implements nat.Dataplane.
func (e *Engine) BootID() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.bootID
}

// Apply implements nat.Dataplane.
func (e *Engine) Apply(ctx context.Context, objs ...nat.Object) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, err := e.state.PlanApply(objs)
	if err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	return e.run(ctx, "apply", c, nil)
}

// Delete implements nat.Dataplane.
func (e *Engine) Delete(ctx context.Context, uids ...string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.run(ctx, "delete", e.state.PlanDelete(uids), nil)
}

// Change deletes the objects with the given UIDs and applies objs in one
// kernel transaction (a UID may be in both). Compat's nft-dnat-map-add
// uses it to replace the backends of a share DNAT identity at once.
func (e *Engine) Change(ctx context.Context, objs []nat.Object, uids []string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, err := e.state.PlanChange(objs, uids)
	if err != nil {
		return fmt.Errorf("change: %w", err)
	}
	return e.run(ctx, "change", c, nil)
}

// Sync implements nat.Dataplane.
func (e *Engine) Sync(ctx context.Context, desired []nat.Object) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if desired == nil {
		desired = []nat.Object{} // a Sync to nothing is still a Sync (run)
	}
	c, err := e.state.PlanSync(desired)
	if err != nil {
		return fmt.Errorf("sync: %w", err)
	}
	// The State now holds exactly desired (PlanSync checked its UIDs
	// are unique): a Backend that wants the whole desired state gets
	// desired itself, not a list built from the State's index.
	return e.run(ctx, "sync", c, desired)
}

// List implements nat.Dataplane.
func (e *Engine) List(ctx context.Context) ([]nat.Object, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state.Objects(), nil
}

// Reload implements nat.Dataplane.
func (e *Engine) Reload(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reload(ctx)
}

// Counts returns the number of objects per kind.
func (e *Engine) Counts() map[nat.Kind]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state.Counts()
}

// MarkID6 is the backend's IPv6 EIP mark id of a (nftables.Backend's
// MarkID6), read between changes; false when a has none or the backend
// keeps no ids.
func (e *Engine) MarkID6(a netip.Addr) (uint32, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if m, ok := e.r.(nat.MarkIDs); ok {
		return m.MarkID6(a)
	}
	return 0, false
}

// Close implements nat.Dataplane.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	if e.plumb != nil {
		errs = append(errs, e.plumb.Close())
	}
	errs = append(errs, e.r.Close())
	return errors.Join(errs...)
}

// run carries out a planned change: plumbing check, one packet-filter
// transaction, plumbing, conntrack. A Sync passes its desired objects
// (non-nil, perhaps empty: the change is full, and the State holds exactly
// them); other changes nil. Called with e.mu held.
func (e *Engine) run(ctx context.Context, op string, c *nat.Change, desired []nat.Object) error {
	full := desired != nil
	if c.Empty() && !full {
		c.Commit()
		return nil
	}
	if err := ctx.Err(); err != nil {
		c.Rollback()
		return fmt.Errorf("%s: %w", op, err)
	}
	if e.plumb != nil {
		if err := e.plumb.Check(c.Added); err != nil {
			c.Rollback()
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	commit := Commit{Removed: c.Removed, Added: c.Added, Full: full}
	if full {
		if wd, ok := e.r.(WantOnDemand); ok && wd.WantOnDemand() {
			commit.desired, commit.n = func() []nat.Object { return desired }, len(desired)
		} else {
			commit.Want = e.state.Objects()
		}
	}
	if err := e.r.Commit(ctx, commit); err != nil {
		c.Rollback()
		if errors.Is(err, nat.ErrUnknownState) {
			if rerr := e.reload(ctx); rerr != nil {
				return fmt.Errorf("%s: %w (and reload failed: %v)", op, err, rerr)
			}
		}
		return fmt.Errorf("%s: %w", op, err)
	}
	if e.plumb != nil {
		if err := e.plumb.Apply(ctx, c.Removed, c.Added); err != nil {
			// Undo the packet-filter change so that nothing is
			// half-applied, then restore the old addresses/routes.
			undo := Commit{Removed: c.Added, Added: c.Removed}
			if full {
				undo = Commit{Removed: c.Added, Added: c.Removed, Full: true}
				c.Rollback()
				undo.Want = e.state.Objects()
			} else {
				c.Rollback()
			}
			if uerr := e.r.Commit(ctx, undo); uerr != nil {
				_ = e.reload(ctx)
				return fmt.Errorf("%s: %w (undo failed: %v): %w", op, err, uerr, nat.ErrUnknownState)
			}
			if perr := e.plumb.Apply(ctx, c.Added, c.Removed); perr != nil {
				e.log.Error(perr, "restoring addresses/routes after a failed change")
			}
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	c.Commit()
	_, narrow := e.r.(DNATFlowForgetter)
	eips, backends := flowsToForget(c, e.state.Get, narrow)
	if len(backends) > 0 {
		if err := e.r.(DNATFlowForgetter).ForgetDNATFlows(ctx, backends); err != nil {
			e.log.Error(err, "conntrack cleanup of share DNAT backends failed", "op", op, "backends", len(backends))
		}
	}
	if len(eips) > 0 {
		if err := e.r.ForgetFlows(ctx, eips); err != nil {
			// The rules are committed; stale flows die on their own
			// timeouts. Report but do not fail the operation.
			e.log.Error(err, "conntrack cleanup failed", "op", op, "eips", eips)
		}
	}
	e.log.V(1).Info("committed", "op", op, "removed", len(c.Removed), "added", len(c.Added))
	return nil
}

// flowsToForget returns the EIPs whose NAT mappings went away or moved: those
// of removed FIP/DNAT/SNAT objects, unless the same UID was re-added with the
// same addresses. now looks an object up in the state after the change
// (which holds every added object), so no index of the added ones is built.
// With narrow, a removed DNAT (exclusive or share) is returned in backends
// instead (only its own flows go; see DNATFlowForgetter), unless it was
// re-added the same.
func flowsToForget(c *nat.Change, now func(uid string) (nat.Object, bool), narrow bool) (eips []netip.Addr, backends []nat.DNAT) {
	var seen map[netip.Addr]bool
	for _, o := range c.Removed {
		if o.Kind == nat.KindRoute || o.Kind == nat.KindEIP {
			continue // no NAT mapping of their own
		}
		a, b := o.Addresses()
		if o.Kind == nat.KindDNAT && o.DNAT != nil && narrow {
			if n, ok := now(o.UID); ok && n.DNAT != nil && *n.DNAT == *o.DNAT {
				continue
			}
			backends = append(backends, *o.DNAT)
			continue
		}
		if n, ok := now(o.UID); ok {
			if na, nb := n.Addresses(); na == a && nb == b {
				continue
			}
		}
		if !a.IsValid() {
			continue
		}
		if seen == nil {
			seen = make(map[netip.Addr]bool, len(c.Removed))
		}
		if !seen[a] {
			seen[a] = true
			eips = append(eips, a)
		}
	}
	return eips, backends
}
