package shape

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/natgw/natgw/nat"
)

// Dataplane is a nat.Dataplane whose EIP QoS is shaped by this package
// instead of policed by the wrapped data plane: EIP objects reach the
// wrapped one without their QoS, and the QoS of every EIP it holds is
// programmed with Set. List puts the QoS back, read from natgw_shape, so
// callers see the objects they applied. The shaping is read from the kernel
// at the first call (and after Reload or an error) and kept: like the
// wrapped data plane's index, it assumes one writer per gateway. Calls
// without EIP objects cost nothing more.
//
// Each change stays all-or-nothing: the objects are validated for both
// (the wrapped data plane's rules and Limit's), the shaping is set to what
// it must be after the change, then the wrapped data plane applies the
// change; if that fails, the shaping is set back to what it was. (After an
// error matching nat.ErrUnknownState the new shaping is kept: the change
// may be in the kernel, and the caller retries it.)
type Dataplane struct {
	inner nat.Dataplane
	cfg   nat.Config
	ids   nat.MarkIDs // nil: the inner data plane gives IPv6 EIPs no mark ids

	mu     sync.Mutex
	shaped shaping        // by EIP UID; nil: not read yet (or unknown after an error)
	k      *lastingKernel // dialed on first use, kept until Close or an error
}

// Wrap returns inner with EIP QoS shaped in cfg's gateway. inner must be
// the nftables data plane (the ingress classes are found by its ct mark).
// The QoS of an EIP with an IPv6 address is shaped only when inner gives
// IPv6 EIPs mark ids (nat.MarkIDs, and inner is the nftables data plane: the
// engine forwards MarkID6 for any backend); otherwise it stays with inner.
func Wrap(inner nat.Dataplane, cfg nat.Config) *Dataplane {
	d := &Dataplane{inner: inner, cfg: cfg.WithDefaults()}
	if m, ok := inner.(nat.MarkIDs); ok && inner.Name() == nat.DataplaneNftables {
		d.ids = m
	}
	return d
}

// Name is the wrapped data plane's.
func (d *Dataplane) Name() nat.DataplaneName { return d.inner.Name() }

// BootID is the wrapped data plane's.
func (d *Dataplane) BootID() string { return d.inner.BootID() }

// Close closes the wrapped data plane and the shaping's sockets; kernel
// state stays.
func (d *Dataplane) Close() error {
	d.mu.Lock()
	d.dropKernel()
	d.mu.Unlock()
	return d.inner.Close()
}

// withKernel runs fn over the Dataplane's kernel, dialed on first use and
// kept: every Sync reads and writes the shaping, and a socket dialed and
// closed per call costs more than the work when the gateway holds nothing
// to shape. Closing an nftables netlink socket that has sent a request
// waits (the kernel's NETLINK_URELEASE handler) for the deferred
// destruction of the namespace's last transaction that freed objects, an
// RCU grace period: 5–16 ms each on this project's VMs, several per Sync
// (strace -f -T of natgw serve in scenario 2; bench/results/lean-ab: the
// bulk load of 1k FIPs through serve 3.8 ms with --eip-qos=police, 8–12 ms
// with shape before the kernel was kept).
// After an error the kernel is dropped and the next call dials again.
// Called with d.mu held.
func (d *Dataplane) withKernel(ctx context.Context, fn func(k *kernel) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("shape: %w", err)
	}
	if d.k == nil {
		k, err := dialKernel(d.cfg)
		if err != nil {
			return err
		}
		d.k = k
	}
	d.k.ctx = ctx
	err := fn(&d.k.kernel)
	d.k.ctx = nil
	if err != nil {
		d.dropKernel()
	}
	return err
}

// dropKernel closes the Dataplane's kernel (d.mu held).
func (d *Dataplane) dropKernel() {
	if d.k != nil {
		d.k.close()
		d.k = nil
	}
}

// get is Get over the Dataplane's kernel.
func (d *Dataplane) get(ctx context.Context) (out []EIP, err error) {
	err = d.withKernel(ctx, func(k *kernel) error { out, err = k.get(); return err })
	return out, err
}

// set is Set over the Dataplane's kernel.
func (d *Dataplane) set(ctx context.Context, eips []EIP) error {
	if err := ValidateAll(eips); err != nil {
		return err
	}
	return d.withKernel(ctx, func(k *kernel) error { return k.set(eips) })
}

// Reload re-reads the wrapped data plane's kernel state (and the shaping,
// at the next call).
func (d *Dataplane) Reload(ctx context.Context) error {
	d.mu.Lock()
	d.shaped = nil
	d.mu.Unlock()
	return d.inner.Reload(ctx)
}

// QoSToLimits converts an EIP's nat.QoS (whole Mbit/s, burst in Mbit of
// 125,000 bytes) to Limits in upstream's units (burst in MB of 2^20 bytes).
func QoSToLimits(q *nat.QoS) (in, out Limit) {
	if q == nil {
		return Limit{}, Limit{}
	}
	mb := func(mbit uint32) float64 { return float64(mbit) * 125_000 / BytesPerMB }
	return Limit{RateMbps: float64(q.IngressRateMbps), BurstMB: mb(q.IngressBurstMbit)},
		Limit{RateMbps: float64(q.EgressRateMbps), BurstMB: mb(q.EgressBurstMbit)}
}

// limitsToQoS is QoSToLimits' inverse (nil for no limit).
func limitsToQoS(in, out Limit) *nat.QoS {
	if in == (Limit{}) && out == (Limit{}) {
		return nil
	}
	mbit := func(mb float64) uint32 { return uint32(math.Round(mb * BytesPerMB / 125_000)) }
	return &nat.QoS{
		IngressRateMbps: uint32(math.Round(in.RateMbps)), IngressBurstMbit: mbit(in.BurstMB),
		EgressRateMbps: uint32(math.Round(out.RateMbps)), EgressBurstMbit: mbit(out.BurstMB),
	}
}

// shaped reports whether o's QoS is shaped: an EIP with QoS, and with
// ipv6 (the wrapped data plane gives IPv6 EIPs mark ids) also one with an
// IPv6 address. Shaping classifies ingress by the connection's ct mark, so
// without an IPv6 mark id an EIP with an IPv6 address keeps its QoS in the
// NAT table, policed there for both families by one policer per direction.
func shaped(o nat.Object, ipv6 bool) bool {
	return o.Kind == nat.KindEIP && o.EIP != nil && o.EIP.QoS != nil && (ipv6 || !o.EIP.V6Address.IsValid())
}

// strip returns objs with the QoS of shaped EIPs removed (copies; objs is
// not changed) and checks that every such QoS can be shaped (a
// *nat.FieldError naming the object and its field otherwise); ipv6 as for
// shaped.
func strip(objs []nat.Object, ipv6 bool) ([]nat.Object, error) {
	out := make([]nat.Object, len(objs))
	for i, o := range objs {
		out[i] = o
		if !shaped(o, ipv6) {
			continue
		}
		q := o.EIP.QoS
		in, eg := QoSToLimits(q)
		for _, c := range []struct {
			l           Limit
			dir         string
			rate, burst uint32
		}{{in, "ingress", q.IngressRateMbps, q.IngressBurstMbit}, {eg, "egress", q.EgressRateMbps, q.EgressBurstMbit}} {
			var fe *nat.FieldError
			if err := c.l.Validate(c.dir); errors.As(err, &fe) {
				// Name nat.QoS's field and value, not Limit's.
				burst := strings.HasSuffix(fe.Field, ".burstMB")
				fe.UID, fe.Field, fe.Value = o.UID, "eip.qos."+c.dir+"RateMbps", fmt.Sprint(c.rate)
				if burst {
					fe.Field, fe.Value = "eip.qos."+c.dir+"BurstMbit", fmt.Sprint(c.burst)
				}
				return nil, fe
			} else if err != nil {
				return nil, err
			}
		}
		e := *o.EIP
		e.QoS = nil
		out[i].EIP = &e
	}
	return out, nil
}

// shaping is the shaping of objs' EIPs, by UID (Mark6 left 0: marked
// fills it in).
type shaping map[string]EIP

func shapingOf(objs []nat.Object, ipv6 bool) shaping {
	s := shaping{}
	for _, o := range objs {
		if shaped(o, ipv6) {
			in, eg := QoSToLimits(o.EIP.QoS)
			s[o.UID] = EIP{Address: o.EIP.Address, V6Address: o.EIP.V6Address, Ingress: in, Egress: eg}
		}
	}
	return s
}

// list is s's EIPs with a limit, sorted by key.
func (s shaping) list() []EIP {
	out := make([]EIP, 0, len(s))
	for _, e := range s {
		if e.Ingress != (Limit{}) || e.Egress != (Limit{}) {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b EIP) int { return a.key().Compare(b.key()) })
	return out
}

// ipv6 says whether EIPs with an IPv6 address are shaped.
func (d *Dataplane) ipv6() bool { return d.ids != nil }

// marked is s.list() with each IPv6 address's mark id as the wrapped data
// plane holds it now (0 when it holds none yet).
func (d *Dataplane) marked(s shaping) []EIP {
	out := s.list()
	for i, e := range out {
		if d.ids != nil && e.V6Address.IsValid() {
			out[i].Mark6, _ = d.ids.MarkID6(e.V6Address)
		}
	}
	return out
}

// addrKey is the address an EIP object is known by in the shaping (EIP.key).
func addrKey(e *nat.EIP) netip.Addr {
	return EIP{Address: e.Address, V6Address: e.V6Address}.key()
}

// load reads the shaping of the wrapped data plane's EIPs once: natgw_shape
// by address, matched to the EIP objects' UIDs. Nothing shaped costs one
// table listing and no List.
func (d *Dataplane) load(ctx context.Context) error {
	if d.shaped != nil {
		return nil
	}
	have, err := d.get(ctx)
	if err != nil {
		return err
	}
	s := shaping{}
	if len(have) > 0 {
		objs, err := d.inner.List(ctx)
		if err != nil {
			return err
		}
		by := map[netip.Addr]EIP{}
		for _, e := range have {
			e.Mark6 = 0
			by[e.key()] = e
		}
		for _, o := range objs {
			if o.Kind == nat.KindEIP && o.EIP != nil {
				if e, ok := by[addrKey(o.EIP)]; ok {
					s[o.UID] = e
				}
			}
		}
	}
	d.shaped = s
	return nil
}

// change sets the shaping to next, runs fn and sets it back if fn fails
// (unless the failure leaves the kernel state unknown: then the shaping is
// read again at the next call). The setting back runs even when ctx ended
// during fn (context.WithoutCancel): the shaping must not stay half-changed.
func (d *Dataplane) change(ctx context.Context, next shaping, force bool, fn func() error) error {
	if err := ValidateAll(next.list()); err != nil {
		return fmt.Errorf("shape: %w", err)
	}
	prev := d.shaped
	if !force && sameShaping(prev, next) {
		// Nothing to shape differently (e.g. EIPs without QoS).
		err := fn()
		if err == nil {
			d.shaped = next
		} else if errors.Is(err, nat.ErrUnknownState) {
			d.shaped = nil
		}
		return err
	}
	set := d.marked(next)
	if err := d.set(ctx, set); err != nil {
		d.shaped = nil
		return err
	}
	err := fn()
	switch {
	case err == nil:
		d.shaped = next
		// A new IPv6 EIP got its mark id in fn: classify its ingress now.
		if after := d.marked(next); !slices.Equal(after, set) {
			if serr := d.set(context.WithoutCancel(ctx), after); serr != nil {
				d.shaped = nil
				return fmt.Errorf("%w: shape: the IPv6 ingress of the applied change: %w", nat.ErrUnknownState, serr)
			}
		}
	case errors.Is(err, nat.ErrUnknownState):
		d.shaped = nil
	default:
		if rerr := d.set(context.WithoutCancel(ctx), prev.list()); rerr != nil {
			d.shaped = nil
			return errors.Join(err, fmt.Errorf("shape: restoring the shaping after the failed change: %w", rerr))
		}
	}
	return err
}

// sameShaping says whether a and b shape the same addresses the same way.
func sameShaping(a, b shaping) bool {
	key := func(s shaping) map[netip.Addr]EIP {
		m := map[netip.Addr]EIP{}
		for _, e := range s.list() {
			m[e.key()] = e
		}
		return m
	}
	ka, kb := key(a), key(b)
	if len(ka) != len(kb) {
		return false
	}
	for k, v := range ka {
		if kb[k] != v {
			return false
		}
	}
	return true
}

func (s shaping) clone() shaping {
	c := make(shaping, len(s))
	for k, v := range s {
		c[k] = v
	}
	return c
}

// Apply applies objs, their EIPs' QoS shaped. A call without EIP objects
// goes straight to the wrapped data plane.
func (d *Dataplane) Apply(ctx context.Context, objs ...nat.Object) error {
	hasEIP := false
	for _, o := range objs {
		hasEIP = hasEIP || o.Kind == nat.KindEIP
	}
	if !hasEIP {
		return d.inner.Apply(ctx, objs...)
	}
	return d.applyShaped(ctx, objs, nil, func(stripped []nat.Object) error { return d.inner.Apply(ctx, stripped...) })
}

// Delete deletes uids and the shaping of those that are shaped EIPs.
func (d *Dataplane) Delete(ctx context.Context, uids ...string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.load(ctx); err != nil {
		return err
	}
	next := d.next(uids, nil)
	if len(next) == len(d.shaped) {
		return d.inner.Delete(ctx, uids...)
	}
	return d.change(ctx, next, false, func() error { return d.inner.Delete(ctx, uids...) })
}

// Change deletes uids and applies objs in one transaction of the wrapped
// data plane (nat/engine's Change; an error if it has none), their EIPs'
// QoS shaped.
func (d *Dataplane) Change(ctx context.Context, objs []nat.Object, uids []string) error {
	ch, ok := d.inner.(interface {
		Change(ctx context.Context, objs []nat.Object, uids []string) error
	})
	if !ok {
		return fmt.Errorf("the %s data plane cannot delete and apply in one transaction", d.inner.Name())
	}
	return d.applyShaped(ctx, objs, uids, func(stripped []nat.Object) error { return ch.Change(ctx, stripped, uids) })
}

// applyShaped strips objs of their QoS and, with d.mu held and the
// shaping loaded, runs run on the stripped objects as d.change's step
// towards the shaping after deleting uids and applying objs.
func (d *Dataplane) applyShaped(ctx context.Context, objs []nat.Object, uids []string, run func(stripped []nat.Object) error) error {
	stripped, err := strip(objs, d.ipv6())
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.load(ctx); err != nil {
		return err
	}
	next := d.next(uids, objs)
	return d.change(ctx, next, false, func() error { return run(stripped) })
}

// next is the shaping after deleting uids and applying objs: the current
// one without uids and objs' EIPs, plus objs' shaped EIPs. d.mu is held.
func (d *Dataplane) next(uids []string, objs []nat.Object) shaping {
	next := d.shaped.clone()
	for _, u := range uids {
		delete(next, u)
	}
	for _, o := range objs {
		if o.Kind == nat.KindEIP {
			delete(next, o.UID)
		}
	}
	for k, v := range shapingOf(objs, d.ipv6()) {
		next[k] = v
	}
	return next
}

// Counts is the wrapped data plane's count of objects by kind (nil if it
// keeps none).
func (d *Dataplane) Counts() map[nat.Kind]int {
	if c, ok := d.inner.(interface{ Counts() map[nat.Kind]int }); ok {
		return c.Counts()
	}
	return nil
}

// Sync makes the gateway hold exactly desired, its EIPs' QoS shaped; the
// shaping is read from the kernel again and written whole (what changed
// behind the wrapper's back is repaired).
func (d *Dataplane) Sync(ctx context.Context, desired []nat.Object) error {
	stripped, err := strip(desired, d.ipv6())
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// A sync is the repair: read the shaping again and always write it.
	d.shaped = nil
	if err := d.load(ctx); err != nil {
		return err
	}
	return d.change(ctx, shapingOf(desired, d.ipv6()), true, func() error { return d.inner.Sync(ctx, stripped) })
}

// List returns the wrapped data plane's objects with their EIPs' QoS as
// shaped.
func (d *Dataplane) List(ctx context.Context) ([]nat.Object, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.load(ctx); err != nil {
		return nil, err
	}
	objs, err := d.inner.List(ctx)
	if err != nil {
		return nil, err
	}
	for i, o := range objs {
		e, ok := d.shaped[o.UID]
		if !ok || o.EIP == nil {
			continue
		}
		c := *o.EIP
		c.QoS = limitsToQoS(e.Ingress, e.Egress)
		objs[i].EIP = &c
	}
	return objs, nil
}

var _ nat.Dataplane = (*Dataplane)(nil)
