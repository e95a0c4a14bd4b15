package nftables

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"maps"
	"net/netip"
	"slices"

	nft "github.com/google/nftables"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/conntrack"
)

// IPv6 EIPs' conntrack mark ids. An IPv6 address does not fit a 32-bit ct
// mark, so every IPv6 EIP object gets a mark id of its own, held in the
// kernel as its eip_marks6 element (address : id, comment its UID), and
// natgw's rules put it in the ct mark of the EIP's IPv6 connections (see
// Conntrack in nat/README.md). The ids never collide with the other values
// natgw puts in a ct mark: an IPv4 EIP's mark is its address, and
// 0.0.0.0/8 is never an EIP (nat.ParseUnicastIPv4), so every id is below
// 0x01000000; a share identity's slot count (1..8, 256..65536) sits in
// the ct mark while its first packet passes chain share/share6, so the
// ids start above 65536.
const (
	markID6Min = conntrack.MarkID6Min
	markID6Max = conntrack.MarkID6Max
)

// markID is an IPv6 EIP's mark id and the UID of the EIP object that
// holds it.
type markID struct {
	uid string
	id  uint32
}

// eip6Of is the IPv6 address of an EIP object, if it has one.
func eip6Of(o nat.Object) (netip.Addr, bool) {
	if o.Kind != nat.KindEIP || o.EIP == nil || !o.EIP.V6Address.IsValid() {
		return netip.Addr{}, false
	}
	return o.EIP.V6Address, true
}

// markElem is the eip_marks6 element of IPv6 address a with m (the value a
// mark in host order, as ct mark takes it from a register).
func markElem(a netip.Addr, m markID) nft.SetElement {
	return nft.SetElement{Key: a16(a), Val: binary.NativeEndian.AppendUint32(nil, m.id), Comment: m.uid}
}

// markAlloc hands out ids that are neither in use (held, the Backend's
// marksUsed) nor taken by the change being planned. An EIP's id is its
// home (markHome: a hash of its address) unless that is taken, then the
// next free one after it: the id follows from the address and the table's
// state (the ids held in eip_marks6), so an agent that restarts reads the
// same ids back at Load, and two tables holding the same EIPs (the
// replicas of a two-replica gateway, whose conntrack entries ctsync copies
// with their marks) give each EIP the same id unless two of its EIPs' homes
// are equal or adjacent (about n²/16.7 million for n IPv6 EIPs).
type markAlloc struct {
	used  map[uint32]netip.Addr
	taken map[uint32]bool
}

// markSpan is the number of mark ids.
const markSpan = markID6Max - markID6Min + 1

// markHome is the id IPv6 address a takes when it is free: FNV-1a of its
// 16 bytes, folded into the id range.
func markHome(a netip.Addr) uint32 {
	h := fnv.New32a()
	b := a.As16()
	h.Write(b[:])
	return markID6Min + h.Sum32()%markSpan
}

// take returns o's id, or an error naming the EIP when every id is in use.
func (a *markAlloc) take(o nat.Object) (uint32, error) {
	id, ok := a.firstFree(markHome(o.EIP.V6Address))
	if !ok {
		return 0, &nat.FieldError{UID: o.UID, Field: "eip.v6Address", Value: o.EIP.V6Address.String(),
			Reason: fmt.Sprintf("no free IPv6 conntrack mark id (all %d in use)", markSpan)}
	}
	a.taken[id] = true
	return id, nil
}

// firstFree is the first id at or after home (wrapping from the range's
// last id to its first) that is neither used nor taken.
func (a *markAlloc) firstFree(home uint32) (uint32, bool) {
	for i := uint32(0); i < markSpan; i++ {
		id := markID6Min + (home-markID6Min+i)%markSpan
		if _, used := a.used[id]; !used && !a.taken[id] {
			return id, true
		}
	}
	return 0, false
}

// markDelta is what a change does to the held mark ids: ids set (added,
// or kept by an EIP that changed) and addresses whose id goes.
type markDelta struct {
	full bool // every id replaced by set
	set  map[netip.Addr]markID
	del  []netip.Addr
}

// markChange puts in ch the eip_marks6 element operations of a change that
// removes removed and adds added. An EIP that keeps its IPv6 address (an
// update) keeps its id, so its connections stay found; a new one gets the
// first id from its home on that is free before and after the change (an
// id freed by this change is not given out again until the ForgetFlows
// that follows it has flushed it). Its cost follows the change, not the number of EIPs.
func (r *Backend) markChange(ch *change, removed, added []nat.Object) (markDelta, error) {
	d := markDelta{}
	var touched []netip.Addr
	after := map[netip.Addr]markID{}
	for _, o := range removed {
		if a, ok := eip6Of(o); ok {
			touched = append(touched, a)
		}
	}
	var fresh []nat.Object
	for _, o := range added {
		a, ok := eip6Of(o)
		if !ok {
			continue
		}
		touched = append(touched, a)
		if m, ok := r.marks6[a]; ok {
			after[a] = markID{o.UID, m.id}
			continue
		}
		fresh = append(fresh, o)
	}
	if len(touched) == 0 {
		return d, nil
	}
	alloc := &markAlloc{used: r.marksUsed, taken: map[uint32]bool{}}
	for _, m := range after {
		alloc.taken[m.id] = true
	}
	for _, o := range fresh {
		id, err := alloc.take(o)
		if err != nil {
			return d, fmt.Errorf("nftables: %w", err)
		}
		after[o.EIP.V6Address] = markID{o.UID, id}
	}
	slices.SortFunc(touched, netip.Addr.Compare)
	touched = slices.Compact(touched)
	for _, a := range touched {
		b, had := r.marks6[a]
		m, has := after[a]
		if had && has && b == m {
			continue
		}
		if had {
			ch.del.add(setMarks6, nft.SetElement{Key: a16(a)})
			if !has {
				d.del = append(d.del, a)
			}
		}
		if has {
			ch.add.add(setMarks6, markElem(a, m))
			if d.set == nil {
				d.set = map[netip.Addr]markID{}
			}
			d.set[a] = m
		}
	}
	return d, nil
}

// markFull puts in ch (a full change: eip_marks6 is flushed) the
// eip_marks6 elements of every IPv6 EIP of want, keeping the id of an
// address that has one.
func (r *Backend) markFull(ch *change, want []nat.Object) (markDelta, error) {
	d := markDelta{full: true, set: map[netip.Addr]markID{}}
	var fresh []nat.Object
	alloc := &markAlloc{used: r.marksUsed, taken: map[uint32]bool{}}
	for _, o := range want {
		a, ok := eip6Of(o)
		if !ok {
			continue
		}
		if m, ok := r.marks6[a]; ok {
			d.set[a] = markID{o.UID, m.id}
			alloc.taken[m.id] = true
			continue
		}
		fresh = append(fresh, o)
	}
	nat.SortObjects(fresh)
	for _, o := range fresh {
		id, err := alloc.take(o)
		if err != nil {
			return d, fmt.Errorf("nftables: %w", err)
		}
		d.set[o.EIP.V6Address] = markID{o.UID, id}
	}
	for _, a := range slices.SortedFunc(maps.Keys(d.set), netip.Addr.Compare) {
		ch.add.add(setMarks6, markElem(a, d.set[a]))
	}
	return d, nil
}

// commitMarks records d after its change committed, and the ids it freed
// (for the ForgetFlows that follows).
func (r *Backend) commitMarks(d markDelta) {
	prev := r.marks6
	r.forgotten6 = nil
	forget := func(a netip.Addr, id uint32) {
		if r.forgotten6 == nil {
			r.forgotten6 = map[netip.Addr]uint32{}
		}
		r.forgotten6[a] = id
		delete(r.marksUsed, id)
	}
	if d.full {
		for a, m := range r.marks6 {
			if n, ok := d.set[a]; !ok || n.id != m.id {
				forget(a, m.id)
			}
		}
		r.marks6, r.marksUsed = map[netip.Addr]markID{}, map[uint32]netip.Addr{}
	}
	if r.marks6 == nil {
		r.marks6, r.marksUsed = map[netip.Addr]markID{}, map[uint32]netip.Addr{}
	}
	for _, a := range d.del {
		if m, ok := r.marks6[a]; ok {
			delete(r.marks6, a)
			forget(a, m.id)
		}
	}
	for a, m := range d.set {
		if old, ok := prev[a]; !ok || old.id != m.id {
			r.unmarked6 = true // connections of a may predate the id
		}
		r.marks6[a] = m
		r.marksUsed[m.id] = a
	}
}

// setMarks replaces the held ids (Load).
func (r *Backend) setMarks(held map[netip.Addr]markID) {
	r.marks6, r.marksUsed, r.forgotten6 = map[netip.Addr]markID{}, map[uint32]netip.Addr{}, nil
	r.commitMarks(markDelta{set: held})
}

// markOf6 is the mark id of IPv6 EIP address a: held by its EIP object, or
// freed by the last commit (the EIP went with it). ok is false where no
// mark can be known: an address used by FIPs, DNATs or SNATs without an
// IPv6 EIP object.
func (r *Backend) markOf6(a netip.Addr) (uint32, bool) {
	if m, ok := r.marks6[a]; ok {
		return m.id, true
	}
	id, ok := r.forgotten6[a]
	return id, ok
}

// MarkID6 returns the conntrack mark id natgw's rules give the
// connections of IPv6 EIP address a (its eip_marks6 element; see
// Conntrack in nat/README.md), and false when no EIP object holds a. It
// reads the Backend's index: call it between changes, not during one
// (nat/shape classifies an IPv6 EIP's ingress by it).
func (r *Backend) MarkID6(a netip.Addr) (uint32, bool) {
	m, ok := r.marks6[a]
	return m.id, ok
}
