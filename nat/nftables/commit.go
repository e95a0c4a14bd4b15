package nftables

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"

	nft "github.com/google/nftables"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/engine"
)

// qosState is what the kernel holds of one policer.
type qosState struct {
	chain, obj bool
	val        qosVal
}

// change is one transaction, fully computed (and validated) before anything
// is queued on the connection.
type change struct {
	dropTable   bool   // delete the table first (broken layout)
	createTable bool   // create table, fixed sets and the meta element
	bootID      string // with createTable
	fixedChains bool   // (re)create the fixed chains and rewrite their rules

	full  bool     // flush these sets before adding (Sync)
	flush []string // with full
	del   setElems // element deletes (keys only)
	add   setElems

	qosBefore map[qosKey]qosState // affected policers as in the kernel
	qosAfter  map[qosKey]qosVal   // affected policers as wanted (absent: none)
	qosForce  bool                // replace even unchanged policers (Load)

	snatBefore map[snatClass]bool // CIDR SNAT maps in the kernel
	snatAfter  map[snatClass]bool // CIDR SNAT maps wanted
}

func sortedKeys[K comparable, V any](m map[K]V, less func(a, b K) int) []K {
	ks := slices.Collect(maps.Keys(m))
	slices.SortFunc(ks, less)
	return ks
}

func cmpQoSKey(a, b qosKey) int {
	if a.dir != b.dir {
		if a.dir < b.dir {
			return -1
		}
		return 1
	}
	return a.eip.Compare(b.eip)
}

// emit queues ch on the connection, in an order the kernel accepts within
// one transaction: deletes before the deletion of what they referenced,
// creations before their references. It returns the first queueing error;
// the caller must then drop the connection.
func (r *Renderer) emit(ch *change) error {
	c := r.conn
	if ch.dropTable {
		c.DelTable(r.table)
	}
	if ch.createTable {
		c.CreateTable(r.table)
		for _, spec := range fixedSets {
			if err := c.AddSet(r.newSet(spec), nil); err != nil {
				return fmt.Errorf("add set %s: %w", spec.name, err)
			}
		}
		meta := nft.SetElement{Key: metaKey, Comment: fmt.Sprintf("natgw layout=%d boot=%s", LayoutVersion, ch.bootID)}
		if err := c.SetAddElements(r.set(fixedSets[0]), []nft.SetElement{meta}); err != nil {
			return fmt.Errorf("add boot id: %w", err)
		}
	}
	// 1. Elements out.
	if ch.full {
		for _, name := range ch.flush {
			c.FlushSet(&nft.Set{Table: r.table, Name: name})
		}
	}
	for _, name := range slices.Sorted(maps.Keys(ch.del)) {
		s := &nft.Set{Table: r.table, Name: name}
		for _, part := range chunks(ch.del[name]) {
			if err := c.SetDeleteElements(s, part); err != nil {
				return fmt.Errorf("delete elements of %s: %w", name, err)
			}
		}
	}
	// 2. Fixed chains exist (snat_cidr before the rule that jumps to it).
	var chains []chainSpec
	if ch.fixedChains {
		chains = r.fixedChains()
		for _, cs := range chains {
			c.AddChain(&nft.Chain{Name: cs.name, Table: r.table, Hooknum: cs.hook, Priority: cs.prio, Type: cs.typ})
		}
	}
	// 3. Policers.
	keys := map[qosKey]bool{}
	for k := range ch.qosBefore {
		keys[k] = true
	}
	for k := range ch.qosAfter {
		keys[k] = true
	}
	for _, k := range sortedKeys(keys, cmpQoSKey) {
		b := ch.qosBefore[k]
		a, want := ch.qosAfter[k]
		if !ch.qosForce && b.chain && b.obj && want && b.val == a {
			continue
		}
		if b.chain {
			c.FlushChain(r.chain(k.name()))
			if !want {
				c.DelChain(r.chain(k.name()))
			}
		}
		if b.obj {
			c.DeleteObject(&nft.NamedObj{Table: r.table, Name: k.name(), Type: nft.ObjTypeLimit})
		}
		if want {
			c.AddObj(r.qosObj(k, a))
			if !b.chain {
				c.AddChain(r.chain(k.name()))
			}
			r.addRule(k.name(), qosRule(k))
		}
	}
	// 4. CIDR SNAT maps in, then the rules.
	for _, cl := range sortedSNAT(ch.snatAfter) {
		if !ch.snatBefore[cl] {
			if err := c.AddSet(r.newSet(cl.spec()), nil); err != nil {
				return fmt.Errorf("add set %s: %w", cl.setName(), err)
			}
		}
	}
	if ch.fixedChains {
		for _, cs := range chains {
			if cs.name == chainSNATCIDR {
				continue
			}
			if !ch.createTable {
				c.FlushChain(r.chain(cs.name))
			}
			for _, rs := range cs.rules {
				r.addRule(cs.name, rs)
			}
		}
	}
	if ch.fixedChains || !slices.Equal(sortedSNAT(ch.snatBefore), sortedSNAT(ch.snatAfter)) {
		if !ch.createTable {
			c.FlushChain(r.chain(chainSNATCIDR))
		}
		for _, cl := range sortedSNAT(ch.snatAfter) {
			r.addRule(chainSNATCIDR, snatRule(cl))
		}
	}
	// 5. CIDR SNAT maps out (no rule refers to them any more).
	for _, cl := range sortedSNAT(ch.snatBefore) {
		if !ch.snatAfter[cl] {
			c.DelSet(&nft.Set{Table: r.table, Name: cl.setName()})
		}
	}
	// 6. Elements in.
	for _, name := range slices.Sorted(maps.Keys(ch.add)) {
		s := &nft.Set{Table: r.table, Name: name}
		for _, part := range chunks(ch.add[name]) {
			if err := c.SetAddElements(s, part); err != nil {
				return fmt.Errorf("add elements to %s: %w", name, err)
			}
		}
	}
	return nil
}

func sortedSNAT(m map[snatClass]bool) []snatClass {
	var cs []snatClass
	for c, ok := range m {
		if ok {
			cs = append(cs, c)
		}
	}
	sortSNATClasses(cs)
	return cs
}

// run queues and commits ch as one transaction.
func (r *Renderer) run(ctx context.Context, ch *change) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := r.ready(); err != nil {
		return err
	}
	if err := r.emit(ch); err != nil {
		// Earlier messages are queued and an error may stick to the
		// Conn: drop it.
		if rerr := r.redial(); rerr != nil {
			r.log.Error(rerr, "redial after queueing error")
		}
		return fmt.Errorf("nftables: %w", err)
	}
	return r.flush(ctx)
}

// Commit implements engine.Renderer.
func (r *Renderer) Commit(ctx context.Context, c engine.Commit) error {
	if c.Full {
		return r.commitFull(ctx, c.Want)
	}
	ch := &change{del: setElems{}, add: setElems{}, qosBefore: map[qosKey]qosState{}, qosAfter: map[qosKey]qosVal{}}
	snatCount := map[snatClass]int{}
	// The kernel holds exactly the rendering of the objects (Load makes
	// it so, every Commit keeps it so): removed objects are deleted by
	// the keys they render to.
	for _, o := range c.Removed {
		if err := render(o, ch.del); err != nil {
			return fmt.Errorf("nftables: %w", err)
		}
		if cl, ok := snatClassOf(o); ok {
			snatCount[cl]--
		}
		pol, _ := qosOf(o)
		for k := range pol {
			if v, ok := r.qos[k]; ok {
				ch.qosBefore[k] = qosState{chain: true, obj: true, val: v}
			}
		}
	}
	for set, es := range ch.del {
		for i := range es {
			es[i] = nft.SetElement{Key: es[i].Key}
		}
		ch.del[set] = es
	}
	for _, o := range c.Added {
		if err := render(o, ch.add); err != nil {
			return fmt.Errorf("nftables: %w", err)
		}
		if cl, ok := snatClassOf(o); ok {
			snatCount[cl]++
		}
		pol, _ := qosOf(o)
		for k, v := range pol {
			ch.qosAfter[k] = v
			if v0, ok := r.qos[k]; ok {
				ch.qosBefore[k] = qosState{chain: true, obj: true, val: v0}
			}
		}
	}
	ch.snatBefore, ch.snatAfter = map[snatClass]bool{}, map[snatClass]bool{}
	for cl, n := range r.snat {
		ch.snatBefore[cl] = n > 0
		ch.snatAfter[cl] = n > 0
	}
	for cl, d := range snatCount {
		ch.snatAfter[cl] = r.snat[cl]+d > 0
		ch.snatBefore[cl] = r.snat[cl] > 0
	}
	if err := r.run(ctx, ch); err != nil {
		return err
	}
	for cl, d := range snatCount {
		if r.snat[cl] += d; r.snat[cl] <= 0 {
			delete(r.snat, cl)
		}
	}
	for k := range ch.qosBefore {
		delete(r.qos, k)
	}
	maps.Copy(r.qos, ch.qosAfter)
	return nil
}

// commitFull makes the kernel hold exactly want: every element set is
// flushed and refilled in the same transaction, and the policers and CIDR
// SNAT maps are brought to what want needs.
func (r *Renderer) commitFull(ctx context.Context, want []nat.Object) error {
	ch, snat, qos, err := r.fullChange(want, r.snatPresent(), r.qosPresent(), false)
	if err != nil {
		return err
	}
	if err := r.run(ctx, ch); err != nil {
		return err
	}
	r.snat, r.qos = snat, qos
	return nil
}

func (r *Renderer) snatPresent() map[snatClass]bool {
	m := map[snatClass]bool{}
	for cl, n := range r.snat {
		m[cl] = n > 0
	}
	return m
}

func (r *Renderer) qosPresent() map[qosKey]qosState {
	m := map[qosKey]qosState{}
	for k, v := range r.qos {
		m[k] = qosState{chain: true, obj: true, val: v}
	}
	return m
}

// fullChange computes the transaction that replaces the kernel state
// (present SNAT maps and policers as given) with want, and the bookkeeping
// that follows it.
func (r *Renderer) fullChange(want []nat.Object, snatBefore map[snatClass]bool, qosBefore map[qosKey]qosState, force bool) (*change, map[snatClass]int, map[qosKey]qosVal, error) {
	ch := &change{full: true, add: presized(want), qosBefore: qosBefore, qosAfter: map[qosKey]qosVal{}, qosForce: force,
		snatBefore: snatBefore}
	for _, o := range want {
		if err := render(o, ch.add); err != nil {
			return nil, nil, nil, fmt.Errorf("nftables: %w", err)
		}
	}
	for _, s := range elementSets {
		ch.flush = append(ch.flush, s.name)
	}
	for _, cl := range sortedSNAT(snatBefore) {
		ch.flush = append(ch.flush, cl.setName())
	}
	snat := structureOf(want, ch)
	return ch, snat, maps.Clone(ch.qosAfter), nil
}

// presized returns a setElems with room for the fixed sets' elements of objs.
func presized(objs []nat.Object) setElems {
	n := map[string]int{}
	for _, o := range objs {
		switch o.Kind {
		case nat.KindEIP:
			n[setEIPs]++
		case nat.KindFIP:
			n[setFIPDNAT]++
			n[setFIPSNAT]++
		case nat.KindDNAT:
			n[setPortDNAT]++
		case nat.KindRoute:
			n[setRoutes]++
		}
	}
	es := setElems{}
	for set, c := range n {
		es[set] = make([]nft.SetElement, 0, c)
	}
	return es
}

// structureOf fills ch's wanted CIDR SNAT maps and policers for objs and
// returns the number of SNATs per map.
func structureOf(objs []nat.Object, ch *change) map[snatClass]int {
	ch.snatAfter = map[snatClass]bool{}
	snat := map[snatClass]int{}
	for _, o := range objs {
		if cl, ok := snatClassOf(o); ok {
			snat[cl]++
			ch.snatAfter[cl] = true
		}
		pol, _ := qosOf(o)
		maps.Copy(ch.qosAfter, pol)
	}
	return snat
}

// newBootID returns a fresh random boot id.
func newBootID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("nftables: boot id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Load implements engine.Renderer. See nat/README.md, "Start".
func (r *Renderer) Load(ctx context.Context) ([]nat.Object, string, error) {
	if err := ctx.Err(); err != nil {
		return nil, "", err
	}
	if err := r.ready(); err != nil {
		return nil, "", err
	}
	done := r.deadline(ctx)
	k, err := r.readKernel()
	done()
	if err != nil {
		// A read can leave partial dump replies on the socket.
		if rerr := r.redial(); rerr != nil {
			r.log.Error(rerr, "redial after failed read")
		}
		return nil, "", fmt.Errorf("nftables: read table: %w", err)
	}
	if !k.exists || k.broken != "" {
		if k.exists {
			r.log.Info("table layout not usable, recreating it (state is lost, boot id changes)", "reason", k.broken)
		}
		boot, err := newBootID()
		if err != nil {
			return nil, "", err
		}
		ch := &change{dropTable: k.exists, createTable: true, bootID: boot, fixedChains: true,
			snatBefore: map[snatClass]bool{}, snatAfter: map[snatClass]bool{}}
		if err := r.run(ctx, ch); err != nil {
			return nil, "", fmt.Errorf("nftables: create table: %w", err)
		}
		r.snat, r.qos, r.boot = map[snatClass]int{}, map[qosKey]qosVal{}, boot
		return nil, boot, nil
	}
	objs, consistent := k.objects(r.log)
	var ch *change
	var snat map[snatClass]int
	var qos map[qosKey]qosVal
	if consistent {
		// Keep the elements; rewrite every rule and policer and bring the
		// CIDR SNAT maps to what the objects need.
		ch = &change{fixedChains: true, qosBefore: k.qos, qosAfter: map[qosKey]qosVal{}, qosForce: true, snatBefore: k.snat}
		snat = structureOf(objs, ch)
		qos = maps.Clone(ch.qosAfter)
	} else {
		r.log.Info("kernel elements inconsistent with their objects, rewriting the table's elements", "objects", len(objs))
		if ch, snat, qos, err = r.fullChange(objs, k.snat, k.qos, true); err != nil {
			return nil, "", err
		}
		ch.fixedChains = true
	}
	if err := r.run(ctx, ch); err != nil {
		return nil, "", fmt.Errorf("nftables: repair table: %w", err)
	}
	r.snat, r.qos, r.boot = snat, qos, k.boot
	return objs, k.boot, nil
}
