package nftables

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	nft "github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/engine"
	"github.com/natgw/natgw/nat/nftconn"
	"github.com/natgw/natgw/nat/nlsock"
)

// kernelState is what Load reads back from the kernel.
type kernelState struct {
	exists bool
	legacy bool   // table ip natgw (layouts 1-3) exists
	broken string // why the table must be recreated ("" if usable)
	boot   string

	snat map[snatClass]bool  // CIDR SNAT maps present
	qos  map[qosKey]qosState // policer chains/objects present

	// gen is the ruleset generation read before the sets (and again
	// after them: if it moved, the sets were read again in full). mirror
	// means that the generation is the one natgw's last transaction
	// stored in natgw_meta: nothing changed the kernel since, so
	// fip_snat, which mirrors fip_dnat, was not read.
	gen    uint32
	mirror bool
	// snap is the index snapshot natgw_meta names when the mirror
	// condition holds (0 otherwise: then no snapshot is known to equal
	// the FIP maps); fromSnap says the FIPs came from its file, not from
	// the FIP maps (see nat/README.md, "The index snapshot").
	snap     uint64
	fromSnap bool
	// rules is the fixed rules' fingerprint natgw_meta stores (see
	// udataRules) when the mirror condition holds (0 otherwise: then
	// nothing says what the fixed chains hold).
	rules uint64

	// rebuilt holds the objects readKernel rebuilt from the elements
	// while it read them (see rebuild); objects finishes it.
	rebuilt *rebuild
	// elems are elements by set name, in blocks, for objects to rebuild
	// from when readKernel did not (a kernelState made by hand in tests).
	elems map[string][][]nft.SetElement

	// torn is set by objects when a dump held an element twice: the
	// kernel resumes a set dump by counting elements, so a hash table
	// resize between two replies (the kernel grows a map in the
	// background after many adds) can repeat some elements and skip
	// others. Such a read must be repeated, never repaired from.
	torn bool

	// marks6 holds the valid mark ids of the IPv6 EIPs (set by objects).
	marks6 map[netip.Addr]markID
}

// readKernel reads natgw's table over natgw's socket: which tables exist,
// its sets (their types, then their elements), chains and limit objects
// (see structure.go). Of other tables it looks at nothing but their names.
func (r *Backend) readKernel(ctx context.Context) (*kernelState, error) {
	k := &kernelState{snat: map[snatClass]bool{}, qos: map[qosKey]qosState{}}
	gen, err := r.generation(ctx)
	if err != nil {
		return nil, err
	}
	k.gen = gen
	// Layouts 1-3 kept table ip natgw (IPv4 only): Load replaces it in
	// the transaction that creates or repairs the inet table.
	if k.exists, k.legacy, err = r.tableFamilies(ctx); err != nil {
		return nil, err
	}
	if !k.exists {
		return k, nil
	}
	byName, err := r.kernelSets(ctx)
	if err != nil {
		return nil, err
	}
	for _, spec := range fixedSets {
		s, ok := byName[spec.name]
		if !ok {
			k.broken = "set " + spec.name + " missing"
			return k, nil
		}
		if why := setMismatch(spec, s); why != "" {
			k.broken = "set " + spec.name + ": " + why
			return k, nil
		}
	}
	var meta []metaElem
	if err := r.dumpSet(ctx, setMeta, func(b []byte) error {
		m, err := decodeMeta(b)
		meta = append(meta, m)
		return err
	}); err != nil {
		return nil, fmt.Errorf("read set %s: %w", setMeta, err)
	}
	m, broken := parseMeta(meta)
	if broken != "" {
		k.broken = broken
		return k, nil
	}
	k.boot = m.boot
	k.mirror = m.hasGen && m.gen == gen
	if k.mirror {
		k.snap, k.rules = m.snap, m.rules
	}
	chains, err := r.kernelChains(ctx)
	if err != nil {
		return nil, err
	}
	fixed := map[string]chainSpec{}
	for _, cs := range fixedChains(r.cfg) {
		fixed[cs.name] = cs
	}
	for _, c := range chains {
		if cs, ok := fixed[c.name]; ok {
			if !sameHook(cs, c) {
				k.broken = "chain " + c.name + " has another type or hook"
				return k, nil
			}
			continue
		}
		if q, ok := parseQoSName(c.name); ok {
			st := k.qos[q]
			st.chain = true
			k.qos[q] = st
		}
	}
	limits, err := r.kernelLimits(ctx)
	if err != nil {
		return nil, err
	}
	for _, o := range limits {
		if q, ok := parseQoSName(o.name); ok {
			st := k.qos[q]
			st.obj = true
			k.qos[q] = st
		}
	}
	for name := range byName {
		if cl, ok := parseSNATSet(name); ok {
			k.snat[cl] = true
		}
	}
	names := elementOrder(slices.Sorted(maps.Keys(byName)))
	if k.rebuilt, k.fromSnap = r.readSnapshot(k); !k.fromSnap {
		k.rebuilt = newRebuild(k.mirror, 0)
	}
	if err = r.readSets(ctx, k.rebuilt, names); err != nil {
		return nil, err
	}
	if k.mirror {
		// Did anything commit while the sets were read? Then the
		// mirror may differ: read everything again, fip_snat too, and
		// check it all (rare: another commit in the namespace during
		// the read).
		if k.gen, err = r.generation(ctx); err != nil {
			return nil, err
		}
		if k.gen != gen {
			k.mirror, k.snap, k.fromSnap, k.rules = false, 0, false, 0
			k.rebuilt = newRebuild(false, 0)
			if err = r.readSets(ctx, k.rebuilt, names); err != nil {
				return nil, err
			}
		}
	}
	return k, nil
}

// readSets dumps the element sets names in order into b (without
// fip_snat in mirror mode, without any FIP map when b holds the FIPs of
// the index snapshot) and rebuilds their objects while they are read: the
// dump goroutine decodes and rebuilds each reply while the kernel walks
// the set for the next one, so at 100,000 elements the rebuild costs
// little more than the kernel's walk. No element is kept.
func (r *Backend) readSets(ctx context.Context, b *rebuild, names []string) error {
	for _, name := range names {
		if (b.mirror && isFIPSNATMap(name)) || (b.fromSnap && isFIPMap(name)) {
			continue
		}
		if err := r.dumpSet(ctx, name, func(v []byte) error {
			e, err := nftconn.DecodeElem(v)
			if err != nil {
				return err
			}
			b.add(name, e)
			return nil
		}); err != nil {
			return fmt.Errorf("read set %s: %w", name, err)
		}
	}
	return nil
}

// readSnapshot returns a rebuild holding the FIPs of the index snapshot
// natgw_meta names (k.snap), and true, when the file in the state
// directory is that snapshot, undamaged, and its FIPs go into a nat.State
// without conflict; else false (the FIP maps are read from the kernel).
func (r *Backend) readSnapshot(k *kernelState) (*rebuild, bool) {
	if k.snap == 0 || r.snapDir == "" {
		return nil, false
	}
	path := filepath.Join(r.snapDir, snapFile)
	f, err := os.ReadFile(path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			r.log.Error(err, "read index snapshot, reading the FIP maps instead")
		}
		return nil, false
	}
	b, err := snapshotRebuild(f, k.boot, k.snap)
	if err != nil {
		r.log.Info("index snapshot not used, reading the FIP maps", "file", path, "reason", err.Error())
		return nil, false
	}
	b.fromSnap = true
	r.log.V(1).Info("FIPs from the index snapshot", "file", path, "fips", b.st.Len())
	return b, true
}

// snapshotRebuild returns a mirror rebuild holding the FIPs of snapshot
// file f (checked against boot and id). Their nat.State is built in bulk
// as they are decoded (nat.StateBuilder: the checksum and ids prove the
// file is natgw's own, the builder still validates every FIP and finds
// any conflict); when it finds one, the file is decoded again into
// Insert for the reason (an error wrapping errSnapshot).
func snapshotRebuild(f []byte, boot string, id uint64) (*rebuild, error) {
	var sb *nat.StateBuilder
	err := decodeSnapshot(f, boot, id, func(n int) { sb = nat.NewStateBuilder(n) }, func(o nat.Object) error {
		if !sb.Add(o) {
			return errBulk
		}
		return nil
	})
	if errors.Is(err, errBulk) {
		st := nat.NewState()
		err = decodeSnapshot(f, boot, id, func(int) {}, st.Insert)
		if err == nil {
			err = errors.New("the bulk State refused a FIP that Insert took") // a bug of nat.StateBuilder
		}
		return nil, fmt.Errorf("%w: %w", errSnapshot, err)
	}
	if err != nil {
		return nil, err
	}
	st, _ := sb.State()
	b := newRebuild(true, 0)
	b.st = st
	return b, nil
}

// errBulk stops a snapshot's decode at the first FIP nat.StateBuilder
// refuses.
var errBulk = errors.New("refused by the bulk State")

// generation reads the namespace's ruleset generation (the kernel bumps it
// once per committed nf_tables transaction, whoever commits).
func (r *Backend) generation(ctx context.Context) (uint32, error) {
	req, seq := r.request(unix.NFT_MSG_GETGEN, unix.NLM_F_REQUEST, unix.AF_UNSPEC, nil)
	if err := r.nl.Send(ctx, req); err != nil {
		return 0, fmt.Errorf("get generation: %w", err)
	}
	// The answer is read into the large ack buffer: the kernel sizes later
	// dump replies on the largest receive buffer it has seen (up to
	// dumpChunk), so this also makes set dumps come in big replies.
	buf := r.buffer()
	for {
		n, err := r.nl.Recv(ctx, buf)
		if err != nil {
			return 0, fmt.Errorf("get generation: %w", err)
		}
		var bad error
		for h, m := range nlsock.Messages(buf[:n], &bad) {
			if h.Seq != seq {
				continue // stale
			}
			if h.Type == unix.NLMSG_ERROR {
				code, _, _ := nlsock.Errno(m)
				return 0, fmt.Errorf("get generation: %w", code)
			}
			if len(m) < 4 {
				continue
			}
			var gen uint32
			found := false
			if err := nftconn.Attrs(m[4:], func(typ uint16, v []byte) error {
				if typ == unix.NFTA_GEN_ID && len(v) == 4 {
					gen, found = binary.BigEndian.Uint32(v), true
				}
				return nil
			}); err != nil {
				return 0, fmt.Errorf("get generation: %w", err)
			}
			if !found {
				return 0, fmt.Errorf("get generation: no generation in the reply")
			}
			return gen, nil
		}
		if bad != nil {
			return 0, fmt.Errorf("get generation: %w", bad)
		}
	}
}

// setMismatch says how a kernel set differs from its spec ("" if it does not).
func setMismatch(spec setSpec, s kernelSet) string {
	if s.isMap != spec.isMap() {
		return "map flag differs"
	}
	if spec.val == nft.TypeVerdict {
		return "" // the key type of a verdict map is not checked (google/nftables did not decode it)
	}
	if s.keyType != spec.key.GetNFTMagic() || s.keyLen != spec.key.Bytes {
		return "key type differs"
	}
	if spec.isMap() && (s.dataType != spec.val.GetNFTMagic() || s.dataLen != spec.val.Bytes) {
		return "data type differs"
	}
	return ""
}

// sameHook reports whether kernel chain c has the type, hook and priority
// of spec cs (a regular chain: no hook).
func sameHook(cs chainSpec, c kernelChain) bool {
	if (cs.hook == nil) != !c.base {
		return false
	}
	if cs.hook == nil {
		return true
	}
	return uint32(*cs.hook) == c.hook && c.hasPrio && int32(*cs.prio) == c.prio && string(cs.typ) == c.typ
}

// metaElem is an element of natgw_meta: decodeMeta fills all but boot,
// parseMeta finds the one natgw wrote and reads boot from its comment.
type metaElem struct {
	key     []byte
	comment string // "natgw layout=N boot=ID" (see metaComment)
	boot    string // the boot id of comment (set by parseMeta)
	gen     uint32 // the ruleset generation natgw's last transaction stored
	hasGen  bool   // gen was stored (see udataGen)
	snap    uint64 // the index snapshot it names (0: none)
	rules   uint64 // the fixed rules' fingerprint it stores (0: none)
}

// decodeMeta decodes one NFTA_LIST_ELEM of natgw_meta. The result keeps
// nothing of b.
func decodeMeta(b []byte) (metaElem, error) {
	var m metaElem
	err := nftconn.Attrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_SET_ELEM_KEY:
			key, _, err := nftconn.DataValue(v)
			m.key = bytes.Clone(key) // b is a dump buffer, reused
			return err
		case unix.NFTA_SET_ELEM_USERDATA:
			m.comment = nftconn.ElemComment(v)
			if g := nftconn.UdataTLV(v, udataGen); len(g) == 4 {
				m.gen, m.hasGen = binary.BigEndian.Uint32(g), true
			}
			if s := nftconn.UdataTLV(v, udataSnap); len(s) == 8 {
				m.snap = binary.BigEndian.Uint64(s)
			}
			if r := nftconn.UdataTLV(v, udataRules); len(r) == 8 {
				m.rules = binary.BigEndian.Uint64(r)
			}
		}
		return nil
	})
	if err != nil {
		return metaElem{}, fmt.Errorf("decode %s element: %w", setMeta, err)
	}
	return m, nil
}

// parseMeta returns the element of es with natgw's meta key (metaKey),
// its boot id read from its comment, once it checked that the comment
// names this layout version. Otherwise it returns why the table is not
// usable (the second result; "" when the element is returned).
func parseMeta(es []metaElem) (metaElem, string) {
	for _, e := range es {
		if !bytes.Equal(e.key, metaKey) {
			continue
		}
		f := strings.Fields(e.comment)
		if len(f) != 3 || f[0] != "natgw" || f[1] != fmt.Sprintf("layout=%d", LayoutVersion) {
			return metaElem{}, fmt.Sprintf("meta element %q: not layout %d", e.comment, LayoutVersion)
		}
		boot, ok := strings.CutPrefix(f[2], "boot=")
		if !ok || boot == "" {
			return metaElem{}, fmt.Sprintf("meta element %q: no boot id", e.comment)
		}
		e.boot = boot
		return e, ""
	}
	return metaElem{}, "no boot id"
}

// objects finishes the rebuild of the objects from the elements read (see
// rebuild): it returns the nat.State of the objects kept, the kept objects
// other than FIPs (those the table's structure depends on: its CIDR SNAT
// maps and policers), and whether the kernel holds exactly the elements the
// kept objects render to (no stray, missing or conflicting element).
// Objects that cannot be rebuilt or that conflict with earlier ones are left
// out. It sets k.torn if a set held an element twice.
func (k *kernelState) objects(log logr.Logger) (*nat.State, []nat.Object, bool) {
	b := k.rebuilt
	if b == nil {
		total := 0
		for _, blocks := range k.elems {
			for _, es := range blocks {
				total += len(es)
			}
		}
		b = newRebuild(k.mirror, total)
		for _, set := range elementOrder(slices.Sorted(maps.Keys(k.elems))) {
			for _, e := range all(k.elems[set]) {
				b.add(set, e)
			}
		}
	}
	st, others, consistent := b.finish(log)
	k.torn = b.torn
	k.marks6 = b.marksOK
	return st, others, consistent
}

// elementOrder returns the element sets in the order their elements are
// rebuilt: the fixed sets, then the CIDR SNAT maps among sets, in the order
// given.
func elementOrder(sets []string) []string {
	order := []string{}
	for _, spec := range elementSets {
		order = append(order, spec.name)
	}
	for _, name := range sets {
		if _, ok := parseSNATSet(name); ok {
			order = append(order, name)
		}
	}
	return order
}

// rebuild turns kernel elements into objects: add takes them one set after
// the other (in elementOrder), as they are read; finish checks the result.
//
// With the mirror untouched since natgw wrote it (mirror), fip_snat is not
// read, and each FIP comes from one fip_dnat element, which is exactly what
// that FIP renders to there: parsing it, the UID check and the conflict
// checks are the whole check. Otherwise every element is checked against
// the rendering of the objects.
//
// Memory is what start-up time goes to beyond the kernel's walk of the
// sets (a fresh agent pays for every page it touches), so in mirror mode a
// FIP is held once, in the nat.State, and nowhere else.
type rebuild struct {
	mirror bool
	// fromSnap: the FIPs came from the index snapshot (in st), the FIP
	// maps are not read.
	fromSnap bool
	owner    map[elemRef]string // owner UID of every checked element

	// Without mirror, a FIP is rebuilt from two elements (fip_dnat,
	// fip_snat): objects are collected by UID (objs), and inserted into a
	// nat.State by finish. In mirror mode every object comes from one
	// element and is inserted into st as it comes (insertAll's first
	// pass); list holds the objects other than FIPs. Once an insert fails,
	// st is nil and list holds every object (see add).
	objs map[string]sourced
	st   *nat.State
	list []nat.Object

	bad  []string
	torn bool // an element was read twice

	// shareMod holds share_mod's values (slot counts) by key;
	// shareSeen the backend rebuilt from the first share_backends
	// element of each UID (a backend has one element per slot it holds).
	shareMod  map[string]uint32
	shareSeen map[string]nat.Object

	// marks6 holds eip_marks6's elements (checked against the IPv6 EIPs
	// by finish); marksOK the ones finish found valid.
	marks6  map[netip.Addr]markID
	marksOK map[netip.Addr]markID
}

// sourced is an object and the set of the first element it was rebuilt
// from.
type sourced struct {
	o   nat.Object
	set string
}

// newRebuild returns an empty rebuild; hint is the number of elements
// expected, if known.
func newRebuild(mirror bool, hint int) *rebuild {
	b := &rebuild{mirror: mirror, owner: map[elemRef]string{}, shareMod: map[string]uint32{}, shareSeen: map[string]nat.Object{},
		marks6: map[netip.Addr]markID{}}
	if mirror {
		b.st = nat.NewStateSize(hint)
	} else {
		b.objs = make(map[string]sourced, hint/2+1)
	}
	return b
}

// checked says whether the elements of set are checked against the
// rendering of the objects.
func (b *rebuild) checked(set string) bool {
	return !b.mirror || !isFIPMap(set)
}

// add rebuilds (a part of) an object from element e of set. It keeps
// nothing of e's Key and Val (they may point into a reused buffer).
func (b *rebuild) add(set string, e nft.SetElement) {
	uid, o, err := parseElem(set, e)
	if err != nil {
		b.bad = append(b.bad, fmt.Sprintf("set %s: %v", set, err))
		return
	}
	if b.checked(set) {
		ref := refOf(set, e.Key)
		if _, dup := b.owner[ref]; dup {
			b.torn = true
		}
		b.owner[ref] = uid
	}
	switch set {
	case setMarks6:
		if len(e.Val) == 4 && len(e.Key) == 16 {
			b.marks6[netip.AddrFrom16([16]byte(e.Key))] = markID{uid, binary.NativeEndian.Uint32(e.Val)}
		}
	case setShareMod, setShareMod6:
		if len(e.Val) == 4 {
			b.shareMod[string(e.Key)] = binary.NativeEndian.Uint32(e.Val)
		}
	case setShareBk, setShareBk6:
		if prev, ok := b.shareSeen[uid]; ok {
			if !prev.Equal(o) {
				b.bad = append(b.bad, fmt.Sprintf("uid %s: %s and %s", uid, prev, o))
			}
			return // another slot of the same backend
		}
		b.shareSeen[uid] = o
	}
	switch {
	case o.Kind == "":
		// A policer map element: it only names its owner.
	case b.mirror && b.st == nil:
		b.list = append(b.list, o)
	case b.mirror:
		if b.st.Insert(o) != nil {
			// A conflict (or an element read twice): finish sorts
			// every object and inserts them again (see insertAll).
			// Every object before this one is in st.
			b.list = append(b.st.Unordered(), o)
			b.st = nil
		} else if o.Kind != nat.KindFIP {
			b.list = append(b.list, o)
		}
	default:
		if prev, ok := b.objs[uid]; ok {
			if !prev.o.Equal(o) {
				b.bad = append(b.bad, fmt.Sprintf("uid %s: %s and %s", uid, prev.o, o))
			} else if prev.set == set {
				b.torn = true // the same element twice
			}
			return
		}
		b.objs[uid] = sourced{o, set}
	}
}

// finish inserts the objects into a nat.State (unless add did), checks
// that the kernel holds exactly what the kept objects render to, and logs
// the inconsistencies found. It returns what kernelState.objects does.
func (b *rebuild) finish(log logr.Logger) (*nat.State, []nat.Object, bool) {
	var (
		st        *nat.State
		kept      []nat.Object // to check: all, or all but the FIPs
		conflicts []string
		repeated  int
	)
	switch {
	case b.mirror && b.st != nil:
		st, kept = b.st, b.list // every insert succeeded
	case b.mirror:
		st, kept, conflicts, repeated = insertSorted(b.list)
	default:
		list := make([]nat.Object, 0, len(b.objs))
		for _, so := range b.objs {
			list = append(list, so.o)
		}
		st, kept, conflicts, repeated = insertAll(list)
	}
	bad := append(b.bad, conflicts...)
	if repeated > 0 {
		b.torn = true // the same element twice in one set
	}
	// Every element the kept objects render to must be in the kernel with
	// the same owner, and nothing else may be. Each object is rendered
	// into a scratch buffer reused for the next one.
	matched := 0
	scratch := setElems{}
	var others []nat.Object
	for _, o := range kept {
		if o.Kind == nat.KindFIP && b.mirror {
			// Its elements are in the FIP maps only, which are not
			// checked; and a valid UID (at most nat.MaxUIDLen
			// characters) fits an element comment.
			continue
		}
		if o.Kind != nat.KindFIP {
			others = append(others, o)
		}
		for set, es := range scratch {
			scratch[set] = es[:0]
		}
		if err := render(o, scratch); err != nil {
			bad = append(bad, err.Error())
			continue
		}
		for set, es := range scratch {
			if !b.checked(set) {
				continue
			}
			for _, e := range es {
				if b.owner[refOf(set, e.Key)] == o.UID {
					matched++
				} else {
					bad = append(bad, fmt.Sprintf("uid %s: element %x of set %s missing or owned by another UID", o.UID, e.Key, set))
				}
			}
		}
	}
	// A share identity's elements depend on all its backends: slot i of
	// share_backends holds backend i mod n by UID, and share_mod holds its
	// slot count.
	for k, bs := range shareWanted(slices.Values(kept)) {
		for i, e := range shareElems(k, bs) {
			if b.owner[refOf(k.bkSet(), e.Key)] == e.Comment {
				matched++
			} else {
				bad = append(bad, fmt.Sprintf("uid %s: slot %d of share DNAT %s missing or owned by another UID", e.Comment, i, k))
			}
		}
		if b.owner[refOf(k.modSet(), k.modKey())] == shareComment {
			matched++
		} else {
			bad = append(bad, fmt.Sprintf("share DNAT %s: element of %s missing", k, k.modSet()))
		}
		if got, want := b.shareMod[string(k.modKey())], shareSlots(len(bs)); got != uint32(want) {
			bad = append(bad, fmt.Sprintf("share DNAT %s: %d slots in %s, want %d", k, got, k.modSet(), want))
		}
	}
	// Every IPv6 EIP holds its mark id in eip_marks6: an id of the
	// range, no other EIP's.
	b.marksOK = map[netip.Addr]markID{}
	ids := map[uint32]netip.Addr{}
	for _, o := range kept {
		a, ok := eip6Of(o)
		if !ok {
			continue
		}
		m, ok := b.marks6[a]
		switch {
		case !ok || b.owner[refOf(setMarks6, a16(a))] != o.UID:
			bad = append(bad, fmt.Sprintf("uid %s: element %s of set %s missing or owned by another UID", o.UID, a, setMarks6))
			continue
		case m.id < markID6Min || m.id > markID6Max:
			bad = append(bad, fmt.Sprintf("uid %s: mark id %#x of %s outside %#x..%#x", o.UID, m.id, a, markID6Min, markID6Max))
		case ids[m.id].IsValid():
			bad = append(bad, fmt.Sprintf("uid %s: mark id %#x of %s is also %s's", o.UID, m.id, a, ids[m.id]))
		default:
			ids[m.id] = a
			b.marksOK[a] = m
		}
		matched++
	}
	if matched != len(b.owner) {
		bad = append(bad, fmt.Sprintf("%d elements without a valid object", len(b.owner)-matched))
	}
	for i, m := range bad {
		if i == 10 {
			log.Info("more inconsistencies", "count", len(bad)-i)
			break
		}
		log.Info("inconsistent kernel state", "problem", m)
	}
	return st, others, len(bad) == 0
}

// all iterates the elements of blocks.
func all(blocks [][]nft.SetElement) iter.Seq2[int, nft.SetElement] {
	return func(yield func(int, nft.SetElement) bool) {
		i := 0
		for _, b := range blocks {
			for _, e := range b {
				if !yield(i, e) {
					return
				}
				i++
			}
		}
	}
}

// insertAll inserts objs into a new nat.State and returns it with the
// objects kept, the conflicts of those left out, and how many were left out
// because an equal object was inserted already (the same element read
// twice). Without conflicts the order does not matter; with conflicts a
// deterministic order decides which of two conflicting objects stays, so
// then it starts over in that order (see insertSorted).
func insertAll(objs []nat.Object) (*nat.State, []nat.Object, []string, int) {
	st := nat.NewStateSize(len(objs))
	for _, o := range objs {
		if st.Insert(o) != nil {
			return insertSorted(objs)
		}
	}
	return st, objs, nil, 0
}

// insertSorted is insertAll for objects that conflict: it sorts objs by
// kind, then UID (nat.SortObjects), and inserts them in that order into a
// new nat.State, so that the first of two conflicting objects in that order
// stays. (Objects of one UID may come in any order, but they are equal or
// in conflict, which makes the Load inconsistent anyway.)
func insertSorted(objs []nat.Object) (*nat.State, []nat.Object, []string, int) {
	nat.SortObjects(objs)
	st := nat.NewStateSize(len(objs))
	var bad []string
	repeated := 0
	kept := objs[:0:0]
	for _, o := range objs {
		if err := st.Insert(o); err != nil {
			if prev, ok := st.Get(o.UID); ok && prev.Equal(o) {
				repeated++
				continue
			}
			bad = append(bad, err.Error())
			continue
		}
		kept = append(kept, o)
	}
	return st, kept, bad, repeated
}

// Load implements engine.Backend. See nat/README.md, "Start".
func (r *Backend) Load(ctx context.Context) ([]nat.Object, string, error) {
	st, boot, err := r.LoadState(ctx)
	if err != nil {
		return nil, "", err
	}
	return st.Objects(), boot, nil
}

// LoadState implements engine.StateLoader: Load, returning the objects as
// the nat.State the consistency check built.
func (r *Backend) LoadState(ctx context.Context) (*nat.State, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	if err := r.ready(); err != nil {
		return nil, "", err
	}
	// Openers of one gateway read, then create or repair the table one at a
	// time (an agent starting while `natgw list` runs): without it, two
	// could both find the layout broken and replace each other's table.
	unlock, err := r.ns.Lock(ctx)
	if err != nil {
		return nil, "", fmt.Errorf("nftables: %w", err)
	}
	defer unlock()
	var (
		k          *kernelState
		others     []nat.Object
		st         *nat.State
		consistent bool
	)
	for race := 0; ; race++ {
		if k, st, others, consistent, err = r.readObjects(ctx); err != nil {
			return nil, "", err
		}
		r.gen, r.snapID = k.gen, 0
		if k.exists && k.broken == "" {
			break
		}
		if k.exists {
			r.log.Info("table layout not usable, recreating it (state is lost, boot id changes)", "reason", k.broken)
		}
		if k.legacy {
			r.log.Info("replacing table ip " + tableName + " (layouts 1-3, IPv4 only) with table inet " + tableName + " in one transaction (state is lost, boot id changes)")
		}
		boot, err := engine.NewBootID()
		if err != nil {
			return nil, "", err
		}
		ch := &change{dropTable: k.exists, dropLegacy: k.legacy, createTable: true, bootID: boot, fixedChains: true, stamp: true,
			snatBefore: map[snatClass]bool{}, snatAfter: map[snatClass]bool{}}
		err = r.run(ctx, ch)
		if err == nil {
			r.snat, r.qos, r.boot, r.share = map[snatClass]int{}, map[qosKey]qosVal{}, boot, map[shareKey][]nat.Object{}
			r.setMarks(nil)
			r.state = nat.NewState()
			return r.state, boot, nil
		}
		// Something that does not take the namespace lock (nft by hand, an
		// older natgw) created the table between our read and our create:
		// the create is exclusive, so read again and adopt its table rather
		// than fail or replace it.
		if !k.exists && errors.Is(err, unix.EEXIST) && race < maxCreateRaces {
			r.log.V(1).Info("the table was created concurrently, reading it again")
			continue
		}
		return nil, "", fmt.Errorf("nftables: create table: %w", err)
	}
	var (
		ch    *change
		snat  map[snatClass]int
		qos   map[qosKey]qosVal
		marks = markDelta{full: true, set: k.marks6}
	)
	// The FIP maps equal the snapshot natgw_meta names while the mirror
	// condition holds: when its file served this Load, or when this
	// process has no state directory (it cannot check the file, and
	// keeps the name for the next process that has one: a repair
	// transaction leaves the FIP maps alone). A snapshot whose file
	// could not be used is forgotten, so that Settle writes a new one.
	if k.fromSnap || r.snapDir == "" {
		r.snapID = k.snap
	}
	if consistent {
		// Keep the elements; rewrite every rule and policer and bring the
		// CIDR SNAT maps to what the objects need.
		ch = &change{fixedChains: true, qosBefore: k.qos, qosAfter: map[qosKey]qosVal{}, qosForce: true, snatBefore: k.snat, stamp: true}
		// Nothing committed since natgw's last transaction, which stored
		// the fingerprint of the fixed rules it had written: when this
		// process would write the same, they are in place. Rewriting
		// them would cost the kernel a walk of every map a rule looks
		// up (it checks each element when it binds a map to a new rule:
		// ~50 ms of kernel time at 100k FIPs).
		ch.keepRules = k.mirror && k.rules == r.rules
		snat = structureOf(slices.Values(others), ch) // FIPs add nothing to it
		qos = maps.Clone(ch.qosAfter)
		// The share identities' elements are there (the check saw them).
		ch.shareAfter = shareWanted(slices.Values(others))
		ch.shareBefore = ch.shareAfter
	} else {
		r.log.Info("kernel elements inconsistent with their objects, rewriting the table's elements", "objects", st.Len())
		// The IPv6 EIPs keep the valid ids the kernel holds (their
		// connections carry them).
		r.setMarks(k.marks6)
		if ch, snat, qos, marks, err = r.fullChange(st.Unordered(), k.snat, k.qos, true); err != nil {
			return nil, "", err
		}
		ch.fixedChains = true
	}
	// A table ip natgw beside a usable inet one (an older agent ran
	// meanwhile) goes in the repair transaction.
	ch.dropLegacy = k.legacy
	r.boot = k.boot
	if err := r.run(ctx, ch); err != nil {
		return nil, "", fmt.Errorf("nftables: repair table: %w", err)
	}
	r.snat, r.qos = snat, qos
	r.share = map[shareKey][]nat.Object{}
	r.commitShare(ch)
	r.setMarks(marks.set)
	r.state = st
	return st, k.boot, nil
}

// maxCreateRaces bounds how often LoadState reads again after losing the
// race to create the table to another opener.
const maxCreateRaces = 3

// maxReads bounds the reads of readObjects (the pauses add up to ~15 s).
const maxReads = 20

// readObjects reads the table and rebuilds its objects (see
// kernelState.objects), reading again while a dump was torn (see
// kernelState.torn), with growing pauses.
func (r *Backend) readObjects(ctx context.Context) (*kernelState, *nat.State, []nat.Object, bool, error) {
	pause := 10 * time.Millisecond
	for try := 1; ; try++ {
		k, err := r.readKernel(ctx)
		if err != nil {
			// A read can leave partial dump replies on the socket.
			if rerr := r.redial(); rerr != nil {
				r.log.Error(rerr, "redial after failed read")
			}
			return nil, nil, nil, false, fmt.Errorf("nftables: read table: %w", err)
		}
		if !k.exists || k.broken != "" {
			return k, nil, nil, false, nil
		}
		st, others, consistent := k.objects(r.log)
		if !k.torn {
			return k, st, others, consistent, nil
		}
		if try == maxReads {
			return nil, nil, nil, false, fmt.Errorf("nftables: read table: %d set dumps in a row repeated elements", try)
		}
		r.log.Info("a set dump repeated elements (the kernel resized a map during the dump), reading again", "try", try)
		select {
		case <-ctx.Done():
			return nil, nil, nil, false, fmt.Errorf("nftables: read table: %w", ctx.Err())
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}
