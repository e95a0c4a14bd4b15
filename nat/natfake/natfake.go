// Package natfake is an in-memory nat.Dataplane for tests that cannot or
// need not touch a kernel (controller and protocol tests, tests run without
// root). It is natgw's own engine (nat/engine: validation, conflict rules,
// update = old out + new in, all-or-nothing, conntrack bookkeeping) over a
// Backend that keeps "the kernel" in a map, so it refuses exactly what the
// real backends refuse. It does not program addresses or routes and no
// packet passes: the proof that a feature works stays with the real-kernel
// tests (nat/nftables, nat/iptables, e2e).
package natfake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/engine"
)

// Backend is an in-memory engine.Backend: the map it commits to stands
// for the kernel's table. Its methods are safe for concurrent use.
type Backend struct {
	name nat.DataplaneName

	mu             sync.Mutex
	kernel         map[string]nat.Object
	boot           string
	failNext       error
	commits        int
	forgottenDNATs []nat.DNAT
	forgotten      []netip.Addr
}

var _ engine.Backend = (*Backend)(nil)

// NewBackend returns a Backend named name ("" means "fake") whose kernel
// holds objs under boot id boot ("" makes one on the first Load, as a real
// backend does when it creates its table).
func NewBackend(name nat.DataplaneName, boot string, objs ...nat.Object) *Backend {
	if name == "" {
		name = "fake"
	}
	r := &Backend{name: name, boot: boot, kernel: make(map[string]nat.Object, len(objs))}
	for _, o := range objs {
		r.kernel[o.UID] = o
	}
	return r
}

// Name implements engine.Backend.
func (r *Backend) Name() nat.DataplaneName { return r.name }

// Load implements engine.Backend.
func (r *Backend) Load(context.Context) ([]nat.Object, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.boot == "" {
		b, err := engine.NewBootID()
		if err != nil {
			return nil, "", err
		}
		r.boot = b
	}
	return r.objects(), r.boot, nil
}

// Commit implements engine.Backend. An error set by FailNext is returned
// instead; when it wraps nat.ErrUnknownState the change is taken anyway (a
// kernel that applied the batch but whose ack was lost).
func (r *Backend) Commit(_ context.Context, c engine.Commit) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.failNext; err != nil {
		r.failNext = nil
		if errors.Is(err, nat.ErrUnknownState) {
			r.apply(c)
		}
		return err
	}
	r.commits++
	r.apply(c)
	return nil
}

func (r *Backend) apply(c engine.Commit) {
	if c.Full {
		want := c.Desired()
		r.kernel = make(map[string]nat.Object, len(want))
		for _, o := range want {
			r.kernel[o.UID] = o
		}
		return
	}
	for _, o := range c.Removed {
		delete(r.kernel, o.UID)
	}
	for _, o := range c.Added {
		r.kernel[o.UID] = o
	}
}

// ForgetFlows implements engine.Backend: it records the EIPs whose
// conntrack entries a real backend would delete.
func (r *Backend) ForgetFlows(_ context.Context, eips []netip.Addr) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgotten = append(r.forgotten, eips...)
	return nil
}

// ForgetDNATFlows implements engine.DNATFlowForgetter: it records the
// share DNATs whose own conntrack entries a real backend would delete.
func (r *Backend) ForgetDNATFlows(_ context.Context, dnats []nat.DNAT) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.forgottenDNATs = append(r.forgottenDNATs, dnats...)
	return nil
}

// ForgottenDNATs returns the DNATs ForgetDNATFlows was called with, in
// call order.
func (r *Backend) ForgottenDNATs() []nat.DNAT {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]nat.DNAT(nil), r.forgottenDNATs...)
}

// Close implements engine.Backend.
func (r *Backend) Close() error { return nil }

// FailNext makes the next Commit return err.
func (r *Backend) FailNext(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failNext = err
}

// Commits counts the transactions committed.
func (r *Backend) Commits() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.commits
}

// Forgotten returns the EIPs ForgetFlows was called with, in call order.
func (r *Backend) Forgotten() []netip.Addr {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]netip.Addr(nil), r.forgotten...)
}

// Lose empties the kernel and drops its boot id, as a flushed table or a
// replaced gateway pod would: the next Load (engine Reload) sees a new
// boot id and no objects.
func (r *Backend) Lose() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kernel, r.boot = map[string]nat.Object{}, ""
}

// Kernel returns what the kernel holds, in canonical order.
func (r *Backend) Kernel() []nat.Object {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.objects()
}

func (r *Backend) objects() []nat.Object {
	out := make([]nat.Object, 0, len(r.kernel))
	for _, o := range r.kernel {
		out = append(out, o)
	}
	nat.SortObjects(out)
	return out
}

// Dump renders what the kernel holds as text: a header line with the data
// plane's name and boot id, then one line per object in canonical order,
// its kind, UID and spec (JSON, every field).
func (r *Backend) Dump() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "# %s boot=%s objects=%d\n", r.name, r.boot, len(r.kernel))
	for _, o := range r.objects() {
		j, err := json.Marshal(spec(o))
		if err != nil {
			j = []byte(fmt.Sprintf("%q", err.Error()))
		}
		fmt.Fprintf(&b, "%s %s %s\n", o.Kind, o.UID, j)
	}
	return b.String()
}

// spec is the part of o that says what it programs.
func spec(o nat.Object) any {
	switch o.Kind {
	case nat.KindEIP:
		return o.EIP
	case nat.KindFIP:
		return o.FIP
	case nat.KindDNAT:
		return o.DNAT
	case nat.KindSNAT:
		return o.SNAT
	case nat.KindRoute:
		return o.Route
	}
	return nil
}

// Dataplane is the fake nat.Dataplane: natgw's engine over a Backend.
type Dataplane struct {
	*engine.Engine
	// Backend is the fake kernel, for fault injection and inspection.
	Backend *Backend
}

var _ nat.Dataplane = (*Dataplane)(nil)

// New returns a Dataplane named name ("" means "fake") over an empty
// kernel.
func New(name nat.DataplaneName) (*Dataplane, error) {
	return Over(NewBackend(name, ""))
}

// Over returns a Dataplane over r (e.g. a Backend made with objects, or
// one shared with an earlier Dataplane, as an agent restart would see it).
func Over(r *Backend) (*Dataplane, error) {
	e, err := engine.New(context.Background(), r, nil, logr.Discard())
	if err != nil {
		return nil, err
	}
	return &Dataplane{Engine: e, Backend: r}, nil
}

// Dump renders what the fake kernel holds (Backend.Dump).
func (d *Dataplane) Dump() string { return d.Backend.Dump() }
