package nftables

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"iter"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	nft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
)

// kernelState is what Load reads back from the kernel.
type kernelState struct {
	exists bool
	broken string // why the table must be recreated ("" if usable)
	boot   string

	elems map[string][][]nft.SetElement // by set name, in blocks
	snat  map[snatClass]bool            // CIDR SNAT maps present
	qos   map[qosKey]qosState           // policer chains/objects present

	// gen is the ruleset generation read before the sets (and again
	// after them: if it moved, the sets were read in full). mirror means
	// that the generation is the one natgw's last transaction stored in
	// natgw_meta: nothing changed the kernel since, so fip_snat, which
	// mirrors fip_dnat, was not read (elems holds no entry for it).
	gen    uint32
	mirror bool

	// torn is set by objects when a dump held an element twice: the
	// kernel resumes a set dump by counting elements, so a hash table
	// resize between two replies (the kernel grows a map in the
	// background after many adds) can repeat some elements and skip
	// others. Such a read must be repeated, never repaired from.
	torn bool

	owner map[elemRef]string // filled by objects: owner UID of every element
}

// readKernel reads natgw's table: sets and their elements, chains, limit
// objects. It never looks at other tables.
func (r *Renderer) readKernel() (*kernelState, error) {
	k := &kernelState{elems: map[string][][]nft.SetElement{}, snat: map[snatClass]bool{}, qos: map[qosKey]qosState{}}
	gen, err := r.generation()
	if err != nil {
		return nil, err
	}
	k.gen = gen
	tables, err := r.conn.ListTablesOfFamily(nft.TableFamilyIPv4)
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	for _, t := range tables {
		k.exists = k.exists || t.Name == TableName
	}
	if !k.exists {
		return k, nil
	}
	sets, err := r.conn.GetSets(r.table)
	if err != nil {
		return nil, fmt.Errorf("list sets: %w", err)
	}
	byName := map[string]*nft.Set{}
	for _, s := range sets {
		byName[s.Name] = s
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
	if err := r.dumpSet(setMeta, func(b []byte) error {
		m, err := decodeMeta(b)
		meta = append(meta, m)
		return err
	}); err != nil {
		return nil, fmt.Errorf("read set %s: %w", setMeta, err)
	}
	var stored uint32
	var hasGen bool
	if k.boot, stored, hasGen, k.broken = parseMeta(meta); k.broken != "" {
		return k, nil
	}
	k.mirror = hasGen && stored == gen
	chains, err := r.conn.ListChainsOfTableFamily(nft.TableFamilyIPv4)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	fixed := map[string]chainSpec{}
	for _, cs := range r.fixedChains() {
		fixed[cs.name] = cs
	}
	for _, c := range chains {
		if c.Table == nil || c.Table.Name != TableName {
			continue
		}
		if cs, ok := fixed[c.Name]; ok {
			if !sameHook(cs, c) {
				k.broken = "chain " + c.Name + " has another type or hook"
				return k, nil
			}
			continue
		}
		if q, ok := parseQoSName(c.Name); ok {
			st := k.qos[q]
			st.chain = true
			k.qos[q] = st
		}
	}
	objs, err := r.conn.GetNamedObjects(r.table)
	if err != nil {
		return nil, fmt.Errorf("list objects: %w", err)
	}
	for _, o := range objs {
		if no, ok := o.(*nft.NamedObj); ok && no.Type == nft.ObjTypeLimit {
			if q, ok := parseQoSName(no.Name); ok {
				st := k.qos[q]
				st.obj = true
				k.qos[q] = st
			}
		}
	}
	names := []string{}
	for _, spec := range elementSets {
		names = append(names, spec.name)
	}
	for name := range byName {
		if cl, ok := parseSNATSet(name); ok {
			k.snat[cl] = true
			names = append(names, name)
		}
	}
	for _, name := range names {
		if name == setFIPSNAT && k.mirror {
			continue
		}
		es, err := r.readElements(name)
		if err != nil {
			return nil, fmt.Errorf("read set %s: %w", name, err)
		}
		k.elems[name] = es
	}
	if k.mirror {
		// Did anything commit while the sets were read? Then the
		// mirror may differ: read it too.
		if k.gen, err = r.generation(); err != nil {
			return nil, err
		}
		if k.gen != gen {
			k.mirror = false
			es, err := r.readElements(setFIPSNAT)
			if err != nil {
				return nil, fmt.Errorf("read set %s: %w", setFIPSNAT, err)
			}
			k.elems[setFIPSNAT] = es
		}
	}
	return k, nil
}

// generation reads the namespace's ruleset generation (the kernel bumps it
// once per committed nf_tables transaction, whoever commits).
func (r *Renderer) generation() (uint32, error) {
	msgs, err := r.sock.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, fmt.Errorf("get generation: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		var gen uint32
		found := false
		if err := attrs(m.Data[4:], func(typ uint16, v []byte) error {
			if typ == unix.NFTA_GEN_ID && len(v) == 4 {
				gen, found = binary.BigEndian.Uint32(v), true
			}
			return nil
		}); err != nil {
			return 0, fmt.Errorf("get generation: %w", err)
		}
		if found {
			return gen, nil
		}
	}
	return 0, fmt.Errorf("get generation: no generation in the reply")
}

// setMismatch says how a kernel set differs from its spec ("" if it does not).
func setMismatch(spec setSpec, s *nft.Set) string {
	if s.IsMap != spec.isMap() {
		return "map flag differs"
	}
	if spec.val == nft.TypeVerdict {
		return "" // the library does not decode verdict map types
	}
	if s.KeyType.GetNFTMagic() != spec.key.GetNFTMagic() || s.KeyType.Bytes != spec.key.Bytes {
		return "key type differs"
	}
	if spec.isMap() && (s.DataType.GetNFTMagic() != spec.val.GetNFTMagic() || s.DataType.Bytes != spec.val.Bytes) {
		return "data type differs"
	}
	return ""
}

func sameHook(cs chainSpec, c *nft.Chain) bool {
	if (cs.hook == nil) != (c.Hooknum == nil) {
		return false
	}
	if cs.hook == nil {
		return true
	}
	return *cs.hook == *c.Hooknum && c.Priority != nil && *cs.prio == *c.Priority && cs.typ == c.Type
}

// metaElem is an element of natgw_meta.
type metaElem struct {
	key     []byte
	comment string
	gen     uint32
	hasGen  bool
}

// decodeMeta decodes one NFTA_LIST_ELEM of natgw_meta.
func decodeMeta(b []byte) (metaElem, error) {
	var m metaElem
	err := attrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_SET_ELEM_KEY:
			key, _, err := dataValue(v)
			m.key = key
			return err
		case unix.NFTA_SET_ELEM_USERDATA:
			m.comment = elemComment(v)
			if g := udataTLV(v, udataGen); len(g) == 4 {
				m.gen, m.hasGen = binary.BigEndian.Uint32(g), true
			}
		}
		return nil
	})
	if err != nil {
		return metaElem{}, fmt.Errorf("decode %s element: %w", setMeta, err)
	}
	return m, nil
}

// parseMeta reads the boot id and the stored generation, and checks the
// layout version.
func parseMeta(es []metaElem) (boot string, gen uint32, hasGen bool, broken string) {
	for _, e := range es {
		if !bytes.Equal(e.key, metaKey) {
			continue
		}
		f := strings.Fields(e.comment)
		if len(f) != 3 || f[0] != "natgw" || f[1] != fmt.Sprintf("layout=%d", LayoutVersion) {
			return "", 0, false, fmt.Sprintf("meta element %q: not layout %d", e.comment, LayoutVersion)
		}
		boot, ok := strings.CutPrefix(f[2], "boot=")
		if !ok || boot == "" {
			return "", 0, false, fmt.Sprintf("meta element %q: no boot id", e.comment)
		}
		return boot, e.gen, e.hasGen, ""
	}
	return "", 0, false, "no boot id"
}

// objects rebuilds the objects from the elements read, and reports whether
// the kernel holds exactly the elements those objects render to (no stray,
// missing or conflicting element). Objects that cannot be rebuilt or that
// conflict with earlier ones are left out. It also returns the nat.State of
// the objects kept.
func (k *kernelState) objects(log logr.Logger) ([]nat.Object, *nat.State, bool) {
	// With the mirror untouched since natgw wrote it, fip_snat was not
	// read, and each FIP comes from one fip_dnat element, which is exactly
	// what that FIP renders to there: parsing it, the UID check and the
	// conflict checks are the whole check. Otherwise every element is
	// checked against the rendering of the objects.
	checked := func(set string) bool { return !k.mirror || (set != setFIPDNAT && set != setFIPSNAT) }
	total := 0
	count := func(set string) int {
		n := 0
		for _, b := range k.elems[set] {
			n += len(b)
		}
		return n
	}
	for set := range k.elems {
		if checked(set) {
			total += count(set)
		}
	}
	k.owner = make(map[elemRef]string, total)
	type sourced struct {
		o   nat.Object
		set string // the set of the first element it was rebuilt from
	}
	// Only a FIP is rebuilt from two elements (fip_dnat, fip_snat); in
	// mirror mode every object comes from one element and goes straight
	// to the list (insertAll finds repeated UIDs).
	var objs map[string]sourced
	var list []nat.Object
	if k.mirror {
		list = make([]nat.Object, 0, total+count(setFIPDNAT))
	} else {
		objs = make(map[string]sourced, total/2+1)
	}
	var bad []string
	order := []string{}
	for _, spec := range elementSets {
		order = append(order, spec.name)
	}
	var snatSets []string
	for name := range k.elems {
		if _, ok := parseSNATSet(name); ok {
			snatSets = append(snatSets, name)
		}
	}
	slices.Sort(snatSets)
	order = append(order, snatSets...)
	for _, set := range order {
		for _, e := range all(k.elems[set]) {
			uid, o, err := parseElem(set, e)
			if err != nil {
				bad = append(bad, fmt.Sprintf("set %s: %v", set, err))
				continue
			}
			if checked(set) {
				ref := refOf(set, e.Key)
				if _, dup := k.owner[ref]; dup {
					k.torn = true
				}
				k.owner[ref] = uid
			}
			if o == nil {
				continue
			}
			if k.mirror {
				list = append(list, *o)
				continue
			}
			if prev, ok := objs[uid]; ok {
				if !prev.o.Equal(*o) {
					bad = append(bad, fmt.Sprintf("uid %s: %s and %s", uid, prev.o, o))
				} else if prev.set == set {
					k.torn = true // the same element twice
				}
				continue
			}
			objs[uid] = sourced{*o, set}
		}
	}
	if !k.mirror {
		list = make([]nat.Object, 0, len(objs))
		for _, so := range objs {
			list = append(list, so.o)
		}
	}
	st, kept, conflicts, repeated := insertAll(list)
	bad = append(bad, conflicts...)
	if repeated > 0 {
		k.torn = true // the same element twice in one set
	}
	// Every element the kept objects render to must be in the kernel with
	// the same owner, and nothing else may be. Each object is rendered
	// into a scratch buffer reused for the next one.
	matched := 0
	scratch := setElems{}
	for _, o := range kept {
		for set, es := range scratch {
			scratch[set] = es[:0]
		}
		if err := render(o, scratch); err != nil {
			bad = append(bad, err.Error())
			continue
		}
		for set, es := range scratch {
			if !checked(set) {
				continue
			}
			for _, e := range es {
				if k.owner[refOf(set, e.Key)] == o.UID {
					matched++
				} else {
					bad = append(bad, fmt.Sprintf("uid %s: element %x of set %s missing or owned by another UID", o.UID, e.Key, set))
				}
			}
		}
	}
	if matched != len(k.owner) {
		bad = append(bad, fmt.Sprintf("%d elements without a valid object", len(k.owner)-matched))
	}
	for i, b := range bad {
		if i == 10 {
			log.Info("more inconsistencies", "count", len(bad)-i)
			break
		}
		log.Info("inconsistent kernel state", "problem", b)
	}
	return kept, st, len(bad) == 0
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
// deterministic order (kind, then UID) decides which of two conflicting
// objects stays, so then it starts over in that order. (nat.SortObjects is
// that order; objects of one UID may come in any order, but they are equal
// or in conflict, which makes the Load inconsistent anyway.)
func insertAll(objs []nat.Object) (*nat.State, []nat.Object, []string, int) {
	st := nat.NewStateSize(len(objs))
	clean := true
	for _, o := range objs {
		if st.Insert(o) != nil {
			clean = false
			break
		}
	}
	if clean {
		return st, objs, nil, 0
	}
	nat.SortObjects(objs)
	st = nat.NewStateSize(len(objs))
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
