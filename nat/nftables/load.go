package nftables

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	nft "github.com/google/nftables"

	"github.com/natgw/natgw/nat"
)

// kernelState is what Load reads back from the kernel.
type kernelState struct {
	exists bool
	broken string // why the table must be recreated ("" if usable)
	boot   string

	elems map[string][]nft.SetElement // by set name
	snat  map[snatClass]bool          // CIDR SNAT maps present
	qos   map[qosKey]qosState         // policer chains/objects present

	owner map[elemRef]string // filled by objects: owner UID of every element
}

// readKernel reads natgw's table: sets and their elements, chains, limit
// objects. It never looks at other tables.
func (r *Renderer) readKernel() (*kernelState, error) {
	k := &kernelState{elems: map[string][]nft.SetElement{}, snat: map[snatClass]bool{}, qos: map[qosKey]qosState{}}
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
	meta, err := r.readElements(setMeta)
	if err != nil {
		return nil, fmt.Errorf("read set %s: %w", setMeta, err)
	}
	if k.boot, k.broken = parseMeta(meta); k.broken != "" {
		return k, nil
	}
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
		es, err := r.readElements(name)
		if err != nil {
			return nil, fmt.Errorf("read set %s: %w", name, err)
		}
		k.elems[name] = es
	}
	return k, nil
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

// parseMeta reads the boot id and checks the layout version.
func parseMeta(es []nft.SetElement) (boot, broken string) {
	for _, e := range es {
		if !bytes.Equal(e.Key, metaKey) {
			continue
		}
		f := strings.Fields(e.Comment)
		if len(f) != 3 || f[0] != "natgw" || f[1] != fmt.Sprintf("layout=%d", LayoutVersion) {
			return "", fmt.Sprintf("meta element %q: not layout %d", e.Comment, LayoutVersion)
		}
		boot, ok := strings.CutPrefix(f[2], "boot=")
		if !ok || boot == "" {
			return "", fmt.Sprintf("meta element %q: no boot id", e.Comment)
		}
		return boot, ""
	}
	return "", "no boot id"
}

// objects rebuilds the objects from the elements read, and reports whether
// the kernel holds exactly the elements those objects render to (no stray,
// missing or conflicting element). Objects that cannot be rebuilt or that
// conflict with earlier ones are left out.
func (k *kernelState) objects(log logr.Logger) ([]nat.Object, bool) {
	total := 0
	for _, es := range k.elems {
		total += len(es)
	}
	k.owner = make(map[elemRef]string, total)
	objs := make(map[string]nat.Object, total/2+1)
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
		for _, e := range k.elems[set] {
			uid, o, err := parseElem(set, e)
			if err != nil {
				bad = append(bad, fmt.Sprintf("set %s: %v", set, err))
				continue
			}
			k.owner[refOf(set, e.Key)] = uid
			if o == nil {
				continue
			}
			if prev, ok := objs[uid]; ok {
				if !prev.Equal(*o) {
					bad = append(bad, fmt.Sprintf("uid %s: %s and %s", uid, prev, o))
				}
				continue
			}
			objs[uid] = *o
		}
	}
	list := make([]nat.Object, 0, len(objs))
	for _, o := range objs {
		list = append(list, o)
	}
	// A deterministic order (kind, then UID) decides which of two
	// conflicting objects stays. (nat.SortObjects is a stable sort, slow
	// at 100k objects; UIDs are unique, so any sort gives this order.)
	rank := map[nat.Kind]int{}
	for i, kd := range nat.Kinds {
		rank[kd] = i
	}
	slices.SortFunc(list, func(a, b nat.Object) int {
		if a.Kind != b.Kind {
			return rank[a.Kind] - rank[b.Kind]
		}
		return strings.Compare(a.UID, b.UID)
	})
	st := nat.NewStateSize(len(list))
	kept := list[:0]
	for _, o := range list {
		if err := st.Insert(o); err != nil {
			bad = append(bad, err.Error())
			continue
		}
		kept = append(kept, o)
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
	return kept, len(bad) == 0
}
