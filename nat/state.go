package nat

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// ErrConflict is matched (errors.Is) by every *ConflictError.
var ErrConflict = errors.New("conflict")

// ConflictError says that an object cannot be programmed because another
// object already holds the same identity (an EIP of a FIP, a DNAT's
// EIP/protocol/port, ...).
type ConflictError struct {
	UID   string // the object that was refused
	Field string // the field that collides, e.g. "fip.eip"
	Value string // its value
	With  string // UID of the object holding it
	What  string // e.g. "EIP already has a floating IP"
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("object %s: %s %s: %s (held by %s)", e.UID, e.Field, e.Value, e.What, e.With)
}

// Is makes errors.Is(err, ErrConflict) true for every *ConflictError.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

type dnatKey struct {
	eip   v4
	proto Protocol
	port  uint16
}

type shareBackendKey struct {
	id   dnatKey
	ip   v4
	port uint16
}

// v4 is a valid object's address as a map key, of either family: two
// words hash and compare faster than a netip.Addr (24 bytes, with a zone
// pointer). An IPv4 address is keyed as its IPv4-mapped form, which
// Validate refuses as an IPv6 address, so the families never collide.
type v4 struct{ hi, lo uint64 }

func key4(a netip.Addr) v4 {
	b := a.As16()
	return v4{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// State is the in-memory model of one gateway: objects by UID plus the
// secondary indexes that enforce the conflict rules. Every backend keeps one,
// rebuilt from the kernel when it opens, and plans each operation on it, so
// the conflict rules live in one place. State is not safe for concurrent use;
// backends serialize operations.
type State struct {
	byUID map[string]Object

	eipByAddr     map[v4]string
	fipByEIP      map[v4]string
	fipByInternal map[v4]string
	dnatByKey     map[dnatKey]string          // exclusive DNATs
	shareByKey    map[dnatKey]map[string]bool // share DNATs (backends) per identity
	shareBackend  map[shareBackendKey]string  // a share identity's backend address
	dnatsByEIP    map[v4]int
	snatByCIDR    map[netip.Prefix]string
	routeByDest   map[netip.Prefix]string
}

// NewState returns an empty State.
func NewState() *State { return newState(0) }

// NewStateSize returns an empty State with room for n objects, so that
// inserting them does not grow its maps step by step (a reload of 100,000
// objects).
func NewStateSize(n int) *State { return newState(n) }

// newState returns an empty State with room for n objects of any kind.
func newState(n int) *State {
	return &State{
		byUID:         make(map[string]Object, n),
		eipByAddr:     map[v4]string{},
		fipByEIP:      make(map[v4]string, n),
		fipByInternal: make(map[v4]string, n),
		dnatByKey:     map[dnatKey]string{},
		shareByKey:    map[dnatKey]map[string]bool{},
		shareBackend:  map[shareBackendKey]string{},
		dnatsByEIP:    map[v4]int{},
		snatByCIDR:    map[netip.Prefix]string{},
		routeByDest:   map[netip.Prefix]string{},
	}
}

// Len returns the number of objects.
func (s *State) Len() int { return len(s.byUID) }

// Get returns the object with uid.
func (s *State) Get(uid string) (Object, bool) {
	o, ok := s.byUID[uid]
	return o, ok
}

// Objects returns every object in canonical order (see SortObjects).
func (s *State) Objects() []Object {
	out := s.Unordered()
	SortObjects(out)
	return out
}

// Unordered returns every object in no particular order (cheaper than
// Objects at 100,000 objects).
func (s *State) Unordered() []Object {
	out := make([]Object, 0, len(s.byUID))
	for _, o := range s.byUID {
		out = append(out, o)
	}
	return out
}

// Counts returns the number of objects per kind.
func (s *State) Counts() map[Kind]int {
	c := map[Kind]int{}
	for _, o := range s.byUID {
		c[o.Kind]++
	}
	return c
}

// Insert adds a valid object after checking it against the others. It does
// not replace an object with the same UID (that is an error).
func (s *State) Insert(o Object) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if _, ok := s.byUID[o.UID]; ok {
		return &ConflictError{UID: o.UID, Field: "uid", Value: o.UID, With: o.UID, What: "UID already present"}
	}
	if err := s.conflict(o); err != nil {
		return err
	}
	s.add(o)
	return nil
}

// NewStateOf returns a State holding objs, as if each were Inserted in
// turn into an empty State; on the first object Insert would refuse it
// returns that error ("object <index>: ..."), as PlanSync does. It is
// the bulk path (see StateBuilder): when none conflicts, each index entry
// is checked once, on insertion, instead of looked up and then inserted;
// any conflict or invalid object discards the bulk State and inserts objs
// one by one, so the error, and which object it names, is Insert's.
func NewStateOf(objs []Object) (*State, error) {
	b := NewStateBuilder(len(objs))
	for _, o := range objs {
		if !b.Add(o) {
			break
		}
	}
	if s, ok := b.State(); ok {
		return s, nil
	}
	s := newState(len(objs))
	for i, o := range objs {
		if err := s.Insert(o); err != nil {
			return nil, fmt.Errorf("object %d: %w", i, err)
		}
	}
	return s, nil
}

// StateBuilder builds a State from objects that are expected not to
// conflict (a reload of 100,000 FIPs, a Sync's desired set), one pass over
// them as they come (no list of them is kept): Add stores each index entry
// and sees a conflict by the index not growing (addFresh), instead of
// looking every entry up first as Insert does. It only says whether every
// object went in valid and without conflict; to learn which object
// conflicts and why, the caller inserts them again one by one (Insert) in
// a new State, as NewStateOf does.
type StateBuilder struct {
	s   *State
	bad bool
}

// NewStateBuilder returns a builder with room for n objects.
func NewStateBuilder(n int) *StateBuilder { return &StateBuilder{s: newState(n)} }

// Add adds o and reports whether it is valid and conflicts with none added
// before; after a false, the builder is spent (State says so).
func (b *StateBuilder) Add(o Object) bool {
	if b.bad || o.Validate() != nil || b.s.crossConflict(o) != nil || !b.s.addFresh(o) {
		b.bad = true
	}
	return !b.bad
}

// State returns the State built and true, or nil and false when an added
// object was invalid or conflicted.
func (b *StateBuilder) State() (*State, bool) {
	if b.bad {
		return nil, false
	}
	return b.s, true
}

// conflict returns the *ConflictError of adding o (a valid object whose
// UID is not present) to the State: an index entry o would take that
// another object holds (the uniqueness rules: each index is keyed by the
// identity it keeps unique, see add), else crossConflict's.
func (s *State) conflict(o Object) error {
	c := func(field, value, with, what string) error {
		return &ConflictError{UID: o.UID, Field: field, Value: value, With: with, What: what}
	}
	switch o.Kind {
	case KindEIP:
		if a := o.EIP.Address; a.IsValid() {
			if u, ok := s.eipByAddr[key4(a)]; ok {
				return c("eip.address", a.String(), u, "address already used by another EIP")
			}
		}
		if a := o.EIP.V6Address; a.IsValid() {
			if u, ok := s.eipByAddr[key4(a)]; ok {
				return c("eip.v6Address", a.String(), u, "address already used by another EIP")
			}
		}
	case KindFIP:
		f := o.FIP
		if u, ok := s.fipByEIP[key4(f.EIP)]; ok {
			return c("fip.eip", f.EIP.String(), u, "EIP already has a floating IP")
		}
		if err := s.crossConflict(o); err != nil {
			return err
		}
		if u, ok := s.fipByInternal[key4(f.InternalIP)]; ok {
			return c("fip.internalIP", f.InternalIP.String(), u, "internal IP already has a floating IP")
		}
	case KindDNAT:
		d := o.DNAT
		if err := s.crossConflict(o); err != nil {
			return err
		}
		k := dnatKey{key4(d.EIP), d.Protocol, d.ExternalPort}
		id := dnatID(d)
		if u, ok := s.dnatByKey[k]; ok && !d.Shared() {
			return c("dnat.externalPort", id, u, "EIP, protocol and port already forwarded")
		}
		if d.Shared() {
			b := shareBackendKey{k, key4(d.InternalIP), d.InternalPort}
			if u, ok := s.shareBackend[b]; ok {
				return c("dnat.internalIP", fmt.Sprintf("%s:%d", d.InternalIP, d.InternalPort), u, "already a backend of the shared identity "+id)
			}
		}
	case KindSNAT:
		if u, ok := s.snatByCIDR[o.SNAT.InternalCIDR]; ok {
			return c("snat.internalCIDR", o.SNAT.InternalCIDR.String(), u, "CIDR already has an SNAT")
		}
	case KindRoute:
		if u, ok := s.routeByDest[o.Route.Destination]; ok {
			return c("route.destination", o.Route.Destination.String(), u, "destination already routed")
		}
	}
	return nil
}

// crossConflict returns the *ConflictError of adding o (valid) when an
// object of another sort holds what o needs: a FIP's EIP used by a port
// DNAT, a DNAT's EIP used by a FIP, a DNAT identity held by DNATs of the
// other type (exclusive or share). These rules go both ways (whichever of
// the two objects comes second is refused), so checking each object
// against the ones before it, as NewStateOf does, finds every such
// conflict; the rules of one index entry per identity are add's.
func (s *State) crossConflict(o Object) error {
	c := func(field, value, with, what string) error {
		return &ConflictError{UID: o.UID, Field: field, Value: value, With: with, What: what}
	}
	switch o.Kind {
	case KindFIP:
		if e := key4(o.FIP.EIP); s.dnatsByEIP[e] > 0 {
			return c("fip.eip", o.FIP.EIP.String(), s.anyDNATOn(e), "EIP is used by a port DNAT")
		}
	case KindDNAT:
		d := o.DNAT
		if u, ok := s.fipByEIP[key4(d.EIP)]; ok {
			return c("dnat.eip", d.EIP.String(), u, "EIP is used by a floating IP")
		}
		k := dnatKey{key4(d.EIP), d.Protocol, d.ExternalPort}
		if u, ok := s.dnatByKey[k]; ok && d.Shared() {
			return c("dnat.type", string(DNATShare), u, "EIP, protocol and port "+dnatID(d)+" are held by an exclusive DNAT (every DNAT of a shared identity must have type share)")
		}
		if holders := s.shareByKey[k]; len(holders) > 0 && !d.Shared() {
			return c("dnat.type", string(DNATExclusive), anyKey(holders), "EIP, protocol and port "+dnatID(d)+" are shared by share DNATs (an exclusive DNAT needs the identity alone)")
		}
	}
	return nil
}

// dnatID names a DNAT's identity (EIP, port, protocol) in messages.
func dnatID(d *DNAT) string { return fmt.Sprintf("%s:%d/%s", d.EIP, d.ExternalPort, d.Protocol) }

func (s *State) anyDNATOn(eip v4) string {
	for k, u := range s.dnatByKey {
		if k.eip == eip {
			return u
		}
	}
	for k, us := range s.shareByKey {
		if k.eip == eip {
			return anyKey(us)
		}
	}
	return ""
}

// anyKey returns the smallest key of a UID set (for a stable message).
func anyKey(m map[string]bool) string {
	out := ""
	for u := range m {
		if out == "" || u < out {
			out = u
		}
	}
	return out
}

// ShareBackends returns the share DNATs of the identity (eip, proto, port)
// ordered by UID.
func (s *State) ShareBackends(eip netip.Addr, proto Protocol, port uint16) []Object {
	us := s.shareByKey[dnatKey{key4(eip), proto, port}]
	out := make([]Object, 0, len(us))
	for u := range us {
		out = append(out, s.byUID[u])
	}
	SortObjects(out)
	return out
}

// add stores o (valid, checked by conflict) and its index entries.
func (s *State) add(o Object) { s.addFresh(o) }

// addFresh stores o and its index entries, and reports whether each entry
// of a unique index (the UID, an EIP's addresses, a FIP's EIP and internal
// IP, an exclusive DNAT's identity, a share backend, an SNAT's CIDR, a
// route's destination) was new: false means o conflicts with an object
// already stored (conflict would have refused it, crossConflict's rules
// aside) and the State is damaged (an entry now names o): only StateBuilder,
// which then discards the State, calls it on an unchecked object.
func (s *State) addFresh(o Object) bool {
	fresh := putNew(s.byUID, o.UID, o)
	switch o.Kind {
	case KindEIP:
		for _, a := range o.EIP.Addrs() {
			fresh = putNew(s.eipByAddr, key4(a), o.UID) && fresh
		}
	case KindFIP:
		fresh = putNew(s.fipByEIP, key4(o.FIP.EIP), o.UID) && fresh
		fresh = putNew(s.fipByInternal, key4(o.FIP.InternalIP), o.UID) && fresh
	case KindDNAT:
		d := o.DNAT
		k := dnatKey{key4(d.EIP), d.Protocol, d.ExternalPort}
		if d.Shared() {
			us := s.shareByKey[k]
			if us == nil {
				us = map[string]bool{}
				s.shareByKey[k] = us
			}
			us[o.UID] = true
			fresh = putNew(s.shareBackend, shareBackendKey{k, key4(d.InternalIP), d.InternalPort}, o.UID) && fresh
		} else {
			fresh = putNew(s.dnatByKey, k, o.UID) && fresh
		}
		s.dnatsByEIP[key4(d.EIP)]++
	case KindSNAT:
		fresh = putNew(s.snatByCIDR, o.SNAT.InternalCIDR, o.UID) && fresh
	case KindRoute:
		fresh = putNew(s.routeByDest, o.Route.Destination, o.UID) && fresh
	}
	return fresh
}

// putNew sets m[k] to v and reports whether k was not in m before (one
// hash lookup, not two).
func putNew[K comparable, V any](m map[K]V, k K, v V) bool {
	n := len(m)
	m[k] = v
	return len(m) > n
}

func (s *State) remove(uid string) (Object, bool) {
	o, ok := s.byUID[uid]
	if !ok {
		return Object{}, false
	}
	delete(s.byUID, uid)
	switch o.Kind {
	case KindEIP:
		for _, a := range o.EIP.Addrs() {
			delete(s.eipByAddr, key4(a))
		}
	case KindFIP:
		delete(s.fipByEIP, key4(o.FIP.EIP))
		delete(s.fipByInternal, key4(o.FIP.InternalIP))
	case KindDNAT:
		d := o.DNAT
		k := key4(d.EIP)
		dk := dnatKey{k, d.Protocol, d.ExternalPort}
		if d.Shared() {
			if us := s.shareByKey[dk]; us != nil {
				delete(us, o.UID)
				if len(us) == 0 {
					delete(s.shareByKey, dk)
				}
			}
			delete(s.shareBackend, shareBackendKey{dk, key4(d.InternalIP), d.InternalPort})
		} else {
			delete(s.dnatByKey, dk)
		}
		if s.dnatsByEIP[k]--; s.dnatsByEIP[k] <= 0 {
			delete(s.dnatsByEIP, k)
		}
	case KindSNAT:
		delete(s.snatByCIDR, o.SNAT.InternalCIDR)
	case KindRoute:
		delete(s.routeByDest, o.Route.Destination)
	}
	return o, true
}

// Change is a planned change of a State: the objects that leave the kernel
// (deleted objects and the old spec of updated ones) and the objects that
// enter it (new objects and the new spec of updated ones). A backend renders
// Removed then Added as one kernel transaction, then calls Commit; if the
// kernel refuses, it calls Rollback and the State is as before.
type Change struct {
	Removed []Object
	Added   []Object

	s        *State
	replaced *State // Sync: the whole state to restore on rollback
	done     bool
}

// Empty reports whether the change leaves the kernel as it is.
func (c *Change) Empty() bool { return len(c.Removed) == 0 && len(c.Added) == 0 }

// Commit makes the change final.
func (c *Change) Commit() { c.done = true }

// Rollback restores the State as it was before the change was planned. It is
// a no-op after Commit.
func (c *Change) Rollback() {
	if c.done {
		return
	}
	c.done = true
	if c.replaced != nil {
		*c.s = *c.replaced
		return
	}
	for i := len(c.Added) - 1; i >= 0; i-- {
		c.s.remove(c.Added[i].UID)
	}
	for _, o := range c.Removed {
		c.s.add(o)
	}
}

// PlanApply validates objs, checks them against each other and against the
// State, and applies them to the State, returning the Change. An object equal
// to the one already stored is a no-op; an object whose UID is stored with
// another spec is an update (old out, new in). On error the State is
// unchanged. A UID may appear only once in objs.
func (s *State) PlanApply(objs []Object) (*Change, error) {
	seen := make(map[string]bool, len(objs))
	for i, o := range objs {
		if err := o.Validate(); err != nil {
			return nil, fmt.Errorf("object %d: %w", i, err)
		}
		if seen[o.UID] {
			return nil, fmt.Errorf("object %d: %w", i, &FieldError{UID: o.UID, Field: "uid", Value: o.UID, Reason: "appears twice in one request"})
		}
		seen[o.UID] = true
	}
	c := &Change{s: s}
	var todo []Object
	for _, o := range objs {
		old, ok := s.byUID[o.UID]
		if ok && old.Equal(o) {
			continue
		}
		if ok {
			s.remove(o.UID)
			c.Removed = append(c.Removed, old)
		}
		todo = append(todo, o)
	}
	for _, o := range todo {
		if err := s.conflict(o); err != nil {
			c.Rollback()
			return nil, err
		}
		s.add(o)
		c.Added = append(c.Added, o)
	}
	return c, nil
}

// PlanDelete removes the objects with the given UIDs from the State; unknown
// UIDs are ignored, so deleting twice is a no-op.
func (s *State) PlanDelete(uids []string) *Change {
	c := &Change{s: s}
	for _, uid := range uids {
		if o, ok := s.remove(uid); ok {
			c.Removed = append(c.Removed, o)
		}
	}
	return c
}

// PlanChange deletes the objects with the given UIDs and applies objs (as
// PlanApply does) as one Change, for one kernel transaction; a UID may be
// both deleted and applied. On error the State is unchanged.
func (s *State) PlanChange(objs []Object, uids []string) (*Change, error) {
	d := s.PlanDelete(uids)
	a, err := s.PlanApply(objs)
	if err != nil {
		d.Rollback()
		return nil, err
	}
	// Rollback removes Added and re-adds Removed: undoing the apply, then
	// the delete.
	return &Change{s: s, Removed: append(d.Removed, a.Removed...), Added: a.Added}, nil
}

// holdsExactly says whether desired is the State's objects, each once and
// each Equal to the one held with its UID (with its kind's payload only,
// as Validate wants), in any order; it builds no index but a set of
// UIDs, and only once every object was found equal. A first difference
// ends it (a Sync that changes something pays up to it).
func (s *State) holdsExactly(desired []Object) bool {
	if len(desired) != len(s.byUID) || len(desired) == 0 {
		return false
	}
	for _, o := range desired {
		old, ok := s.byUID[o.UID]
		if !ok || !o.Equal(old) || !o.onlyPayload() {
			return false
		}
	}
	seen := make(map[string]struct{}, len(desired))
	for _, o := range desired {
		seen[o.UID] = struct{}{}
	}
	return len(seen) == len(desired)
}

// onlyPayload says whether o holds no payload but its kind's (Equal
// compares that one only).
func (o Object) onlyPayload() bool {
	n := 0
	for _, p := range [...]bool{o.EIP != nil, o.FIP != nil, o.DNAT != nil, o.SNAT != nil, o.Route != nil} {
		if p {
			n++
		}
	}
	return n == 1
}

// PlanSync replaces the whole State with desired: objects not in desired are
// removed, changed ones updated, new ones added (Removed is in no particular
// order, Added in the order of desired; from an empty State, Added shares
// desired's array, so the caller leaves desired unchanged until the Change
// is done). desired is validated and checked for conflicts on its own; on
// error the State is unchanged.
func (s *State) PlanSync(desired []Object) (*Change, error) {
	if s.holdsExactly(desired) {
		// A Sync that changes nothing (a resync of a gateway that
		// holds its objects): no new index. desired is valid and free
		// of conflicts, being the State's own objects.
		return &Change{s: s}, nil
	}
	next, err := NewStateOf(desired)
	if err != nil {
		return nil, err
	}
	c := &Change{s: s, replaced: &State{}}
	*c.replaced = *s
	switch {
	case len(s.byUID) == 0:
		// From nothing (a resync into a new table): everything is
		// added; Added is desired itself, not a copy (100,000 objects
		// are 7 MB), capped so that an append cannot write into it.
		c.Added = desired[:len(desired):len(desired)]
	case len(desired) == 0:
		// To nothing: everything is removed, in one allocation (appending
		// 100,000 objects one by one reallocated ~40 MB).
		c.Removed = s.Unordered()
	default:
		for uid, old := range s.byUID {
			if n, ok := next.byUID[uid]; !ok || !n.Equal(old) {
				c.Removed = append(c.Removed, old)
			}
		}
		for _, n := range desired { // UIDs are unique in desired (Insert checked)
			if old, ok := s.byUID[n.UID]; !ok || !n.Equal(old) {
				c.Added = append(c.Added, n)
			}
		}
	}
	*s = *next
	return c, nil
}
