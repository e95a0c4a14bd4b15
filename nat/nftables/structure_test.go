package nftables

import (
	"context"
	"slices"
	"strings"
	"testing"

	nft "github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

// plannedStructure decodes, with Load's structure decoders, the sets,
// chains and limit objects of the batch that creates the golden table
// (the attributes natgw sends are the ones the kernel dumps back).
func plannedStructure(t *testing.T, cfg nat.Config) (map[string]kernelSet, map[string]kernelChain, []string) {
	t.Helper()
	tx, err := Plan(cfg, goldenObjects(), "b00t")
	if err != nil {
		t.Fatal(err)
	}
	b := nftconn.NewBatch(0, tx.SizeHint(), nil)
	if err := tx.Encode(b); err != nil {
		t.Fatal(err)
	}
	msgs, err := b.Messages()
	if err != nil {
		t.Fatal(err)
	}
	sets, chains := map[string]kernelSet{}, map[string]kernelChain{}
	var limits []string
	for _, m := range msgs {
		var err error
		switch uint16(m.Header.Type) {
		case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSET:
			var s kernelSet
			s, err = decodeSet(m.Data[4:])
			sets[s.name] = s
		case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWCHAIN:
			var c kernelChain
			c, err = decodeChain(m.Data[4:])
			if !c.ofNatgw {
				t.Errorf("chain %s: not of table %s", c.name, tableName)
			}
			chains[c.name] = c
		case unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWOBJ:
			var o kernelObj
			o, err = decodeObj(m.Data[4:])
			if o.kind == unix.NFT_OBJECT_LIMIT {
				limits = append(limits, o.name)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return sets, chains, limits
}

// TestStructureDecoders: the sets and chains natgw creates, decoded as
// Load decodes the kernel's dump of them, match their specs (setMismatch,
// sameHook find nothing), and a set or chain that differs in any checked
// attribute does not. Without a kernel.
func TestStructureDecoders(t *testing.T) {
	cfg := nat.Config{NetNS: "gw"}
	sets, chains, limits := plannedStructure(t, cfg)
	for _, spec := range fixedSets {
		s, ok := sets[spec.name]
		if !ok {
			t.Errorf("set %s: not decoded", spec.name)
			continue
		}
		if why := setMismatch(spec, s); why != "" {
			t.Errorf("set %s: %s", spec.name, why)
		}
		flipped := s
		flipped.isMap = !s.isMap
		if setMismatch(spec, flipped) == "" {
			t.Errorf("set %s: a map flag that differs passes", spec.name)
		}
		if spec.val == nft.TypeVerdict {
			continue
		}
		for what, change := range map[string]func(*kernelSet){
			"key type":    func(s *kernelSet) { s.keyType++ },
			"key length":  func(s *kernelSet) { s.keyLen++ },
			"data type":   func(s *kernelSet) { s.dataType++ },
			"data length": func(s *kernelSet) { s.dataLen++ },
		} {
			c := s
			change(&c)
			if got := setMismatch(spec, c); got == "" && (spec.isMap() || what[:3] == "key") {
				t.Errorf("set %s: a %s that differs passes", spec.name, what)
			}
		}
	}
	for _, cs := range fixedChains(cfg) {
		c, ok := chains[cs.name]
		if !ok {
			t.Errorf("chain %s: not decoded", cs.name)
			continue
		}
		if !sameHook(cs, c) {
			t.Errorf("chain %s: decoded %+v, not its spec", cs.name, c)
		}
		if cs.hook == nil {
			if c.base {
				t.Errorf("chain %s: decoded as a base chain", cs.name)
			}
			c.base, c.hasPrio, c.typ = true, true, "filter"
			if sameHook(cs, c) {
				t.Errorf("chain %s: a base chain passes for a regular one", cs.name)
			}
			continue
		}
		for what, change := range map[string]func(*kernelChain){
			"hook":        func(c *kernelChain) { c.hook++ },
			"priority":    func(c *kernelChain) { c.prio++ },
			"no priority": func(c *kernelChain) { c.hasPrio = false },
			"type":        func(c *kernelChain) { c.typ += "x" },
			"no hook":     func(c *kernelChain) { c.base = false },
		} {
			d := c
			change(&d)
			if sameHook(cs, d) {
				t.Errorf("chain %s: a %s that differs passes", cs.name, what)
			}
		}
	}
	if len(limits) == 0 {
		t.Error("no limit object decoded (the golden objects have policers)")
	}
	for _, name := range limits {
		if _, ok := parseQoSName(name); !ok {
			t.Errorf("limit object %q: not a policer's name", name)
		}
	}
}

// TestStructureMatchesLibrary: Load's reads of the table's structure over
// natgw's socket (tables, sets, chains, limit objects) find in the kernel
// what google/nftables' decoders find, with another table of each family
// beside natgw's (left out) and the legacy table ip natgw (found).
func TestStructureMatchesLibrary(t *testing.T) {
	cfg := gateway(t)
	dp := open(t, cfg, WithoutPlumbing())
	ctx := ctxT(t)
	if err := dp.Apply(ctx, goldenObjects()...); err != nil {
		t.Fatal(err)
	}
	nftExec(t, cfg.NetNS, "add table ip natgw\nadd table inet other\n"+
		"add chain inet other in { type filter hook input priority 5; }\nadd chain inet other plain\n"+
		"add set inet other s { type ipv4_addr; }\nadd limit inet other l { rate 10/second; }\n")
	r, err := NewBackend(cfg, WithoutPlumbing())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	lib, err := nft.New(nft.WithNetNSFd(r.ns.Fd()))
	if err != nil {
		t.Fatal(err)
	}

	inet, legacy, err := r.tableFamilies(ctx)
	if err != nil || !inet || !legacy {
		t.Errorf("tables: inet %v, legacy %v (%v); want both", inet, legacy, err)
	}

	sets, err := r.kernelSets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	libSets, err := lib.GetSets(&nft.Table{Family: tableFamily, Name: tableName})
	if err != nil {
		t.Fatal(err)
	}
	if len(sets) != len(libSets) {
		t.Errorf("%d sets, the library reads %d", len(sets), len(libSets))
	}
	for _, ls := range libSets {
		s, ok := sets[ls.Name]
		switch {
		case !ok:
			t.Errorf("set %s: not read", ls.Name)
		case s.isMap != ls.IsMap:
			t.Errorf("set %s: map %v, the library reads map %v", ls.Name, s.isMap, ls.IsMap)
		case ls.IsMap && s.dataType == unix.NFT_DATA_VERDICT:
			// The library reads a verdict map's key type as the
			// verdict's (see setMismatch).
		case s.keyLen != ls.KeyType.Bytes:
			t.Errorf("set %s: %+v, the library reads key length %d", ls.Name, s, ls.KeyType.Bytes)
		case s.keyType != ls.KeyType.GetNFTMagic() || (ls.IsMap && (s.dataType != ls.DataType.GetNFTMagic() || s.dataLen != ls.DataType.Bytes)):
			t.Errorf("set %s: %+v, the library reads key %#x, data %#x/%d", ls.Name, s, ls.KeyType.GetNFTMagic(), ls.DataType.GetNFTMagic(), ls.DataType.Bytes)
		}
	}

	chains, err := r.kernelChains(ctx)
	if err != nil {
		t.Fatal(err)
	}
	libChains, err := lib.ListChainsOfTableFamily(tableFamily)
	if err != nil {
		t.Fatal(err)
	}
	var want []kernelChain
	for _, c := range libChains {
		if c.Table.Name != tableName {
			continue
		}
		k := kernelChain{name: c.Name, ofNatgw: true, typ: string(c.Type)}
		if c.Hooknum != nil {
			k.base, k.hook = true, uint32(*c.Hooknum)
		}
		if c.Priority != nil {
			k.prio, k.hasPrio = int32(*c.Priority), true
		}
		want = append(want, k)
	}
	byName := func(a, b kernelChain) int { return strings.Compare(a.name, b.name) }
	slices.SortFunc(chains, byName)
	slices.SortFunc(want, byName)
	if !slices.Equal(chains, want) {
		t.Errorf("chains:\n%+v\nthe library reads:\n%+v", chains, want)
	}

	var limits, libLimits []string
	objs, err := r.kernelLimits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		limits = append(limits, o.name)
	}
	libObjs, err := lib.GetNamedObjects(&nft.Table{Family: tableFamily, Name: tableName})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range libObjs {
		if no, ok := o.(*nft.NamedObj); ok && no.Type == nft.ObjTypeLimit {
			libLimits = append(libLimits, no.Name)
		}
	}
	slices.Sort(limits)
	slices.Sort(libLimits)
	if len(limits) == 0 || !slices.Equal(limits, libLimits) {
		t.Errorf("limit objects %q, the library reads %q", limits, libLimits)
	}

	// Without natgw's tables the reads find none.
	nftExec(t, cfg.NetNS, "delete table ip natgw\ndelete table inet natgw\n")
	if inet, legacy, err := r.tableFamilies(context.Background()); err != nil || inet || legacy {
		t.Errorf("tables after their delete: inet %v, legacy %v (%v); want neither", inet, legacy, err)
	}
}
