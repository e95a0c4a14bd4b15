package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"

	nft "github.com/google/nftables"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/engine"
	"golang.org/x/sys/unix"
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
	dropLegacy  bool   // delete table ip natgw (layouts 1-3) first
	createTable bool   // create table, fixed sets and the meta element
	bootID      string // with createTable
	fixedChains bool   // (re)create the fixed chains and rewrite their rules
	// keepRules: with fixedChains, the fixed chains' rules are known to
	// be those of r.rules (Load: the mirror condition and the stored
	// fingerprint say so): the chains are added (a no-op on existing
	// ones) but their rules not rewritten, except snat_cidr's.
	keepRules bool

	full  bool     // flush these sets before adding (Sync)
	flush []string // with full
	del   setElems // element deletes (keys only)
	add   setElems
	excl  bool // adds fail on an existing key (NLM_F_EXCL)
	stamp bool // store the generation in natgw_meta (see Settle)
	// snap is the index snapshot id a stamp stores (Settle's, written
	// just before); 0: the Backend's snapID, unless the transaction
	// touches the FIP maps.
	snap uint64

	qosBefore map[qosKey]qosState // affected policers as in the kernel
	qosAfter  map[qosKey]qosVal   // affected policers as wanted (absent: none)
	qosForce  bool                // replace even unchanged policers (Load)

	snatBefore map[snatClass]bool // CIDR SNAT maps in the kernel
	snatAfter  map[snatClass]bool // CIDR SNAT maps wanted

	shareBefore map[shareKey][]nat.Object // affected share identities' backends in the kernel, by UID (absent: none, or flushed)
	shareAfter  map[shareKey][]nat.Object // their backends as wanted, by UID (absent: none)
}

func sameBackends(a, b []nat.Object) bool {
	return slices.EqualFunc(a, b, func(x, y nat.Object) bool { return x.Equal(y) })
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

// plan is the layout step: it turns ch into the transaction that makes
// it, in an order the kernel accepts within one transaction (deletes
// before the deletion of what they referenced, creations before their
// references). It does not touch the kernel.
func (r *Backend) plan(ch *change) *txPlan {
	tx := r.spare // the last small transaction's, reused (see exec)
	if tx == nil {
		tx = &txPlan{}
	}
	r.spare = nil
	if ch.dropLegacy {
		tx.deleteLegacyTable()
	}
	if ch.dropTable {
		tx.deleteTable()
	}
	if ch.createTable {
		tx.createTable()
		for _, spec := range fixedSets {
			tx.addSet(spec)
		}
	}
	// 1. Elements out.
	if ch.full {
		for _, name := range ch.flush {
			tx.flushSet(name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(ch.del)) {
		tx.deleteElements(name, ch.del[name])
	}
	// 2. Fixed chains exist (snat_cidr before the rule that jumps to it).
	var chains []chainSpec
	if ch.fixedChains {
		chains = fixedChains(r.cfg)
		for _, cs := range chains {
			tx.addChain(cs)
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
			tx.flushChain(k.name())
			if !want {
				tx.deleteChain(k.name())
			}
		}
		if b.obj {
			tx.deleteLimit(k.name())
		}
		if want {
			tx.addLimit(k, a)
			if !b.chain {
				tx.addChain(chainSpec{name: k.name()})
			}
			tx.addRule(k.name(), qosRule(k))
		}
	}
	// 3b. Share DNAT identities: elements of share_mod and
	// share_backends only.
	planShare(tx, ch)
	// 4. CIDR SNAT maps in, then the rules.
	for _, cl := range sortedSNAT(ch.snatAfter) {
		if !ch.snatBefore[cl] {
			tx.addSet(cl.spec())
		}
	}
	if ch.fixedChains {
		for _, cs := range chains {
			if cs.name == chainSNATCIDR || ch.keepRules {
				continue
			}
			if !ch.createTable {
				tx.flushChain(cs.name)
			}
			for _, rs := range cs.rules {
				tx.addRule(cs.name, rs)
			}
		}
	}
	if ch.fixedChains || !slices.Equal(sortedSNAT(ch.snatBefore), sortedSNAT(ch.snatAfter)) {
		if !ch.createTable {
			tx.flushChain(chainSNATCIDR)
		}
		for _, cl := range sortedSNAT(ch.snatAfter) {
			tx.addRule(chainSNATCIDR, snatRule(cl))
		}
	}
	// 5. CIDR SNAT maps out (no rule refers to them any more).
	for _, cl := range sortedSNAT(ch.snatBefore) {
		if !ch.snatAfter[cl] {
			tx.deleteSet(cl.setName())
		}
	}
	// 6. Elements in.
	for _, name := range slices.Sorted(maps.Keys(ch.add)) {
		tx.addElements(name, ch.add[name], ch.excl)
	}
	// 7. The meta element, with the generation this transaction will
	// have if nobody else commits first (see Load), in transactions that
	// create or rewrite the table and in Settle's.
	if ch.stamp {
		boot := r.boot
		if ch.createTable {
			boot = ch.bootID
		}
		snap := ch.snap
		if snap == 0 && !tx.touchesFIPs() {
			snap = r.snapID
		}
		tx.stamp(metaComment(boot), r.gen+1, snap, r.rules)
	}
	return tx
}

// planShare adds the element operations that bring every share identity
// of ch from shareBefore to shareAfter: the elements of share_mod and
// share_backends that change (a changed slot count rewrites the identity's
// share_mod element and its slots; an added or removed backend of an
// identity that keeps its slot count rewrites the slots that change). No
// chain, rule or set changes, whatever the identity.
func planShare(tx *txPlan, ch *change) {
	keys := map[shareKey]bool{}
	for k := range ch.shareBefore {
		keys[k] = true
	}
	for k := range ch.shareAfter {
		keys[k] = true
	}
	del, add := setElems{}, setElems{}
	for _, k := range sortedKeys(keys, cmpShareKey) {
		diffElems(shareRender(k, ch.shareBefore[k]), shareRender(k, ch.shareAfter[k]), del, add)
	}
	shareSets := []string{setShareMod, setShareBk, setShareMod6, setShareBk6}
	for _, set := range shareSets {
		if len(del[set]) > 0 {
			tx.deleteElements(set, del[set])
		}
	}
	for _, set := range shareSets {
		if len(add[set]) > 0 {
			tx.addElements(set, add[set], false)
		}
	}
}

// shareRender is the elements of identity k with backends (none: no
// elements).
func shareRender(k shareKey, backends []nat.Object) setElems {
	out := setElems{}
	if len(backends) == 0 {
		return out
	}
	out.add(k.modSet(), shareMod(k, len(backends)))
	for _, e := range shareElems(k, backends) {
		out.add(k.bkSet(), e)
	}
	return out
}

// diffElems adds to del the keys of before that after lacks or holds
// otherwise, and to add the elements of after that before lacks or holds
// otherwise.
func diffElems(before, after, del, add setElems) {
	for set, bs := range before {
		as := after[set]
		for i, b := range bs {
			if i >= len(as) || !sameElem(b, as[i]) {
				del.add(set, nft.SetElement{Key: b.Key})
			}
		}
	}
	for set, as := range after {
		bs := before[set]
		for i, a := range as {
			if i >= len(bs) || !sameElem(bs[i], a) {
				add.add(set, a)
			}
		}
	}
}

// sameElem says whether two elements of one set are the same (key, value,
// comment). Elements of an identity are rendered in key order, so equal
// positions hold equal keys when both exist.
func sameElem(a, b nft.SetElement) bool {
	return bytes.Equal(a.Key, b.Key) && bytes.Equal(a.Val, b.Val) && a.Comment == b.Comment
}

// shareChange fills ch's share identities for a change that removes
// removed and adds added (an Apply, a Delete, a Sync by difference).
func (r *Backend) shareChange(ch *change, removed, added []nat.Object) {
	ch.shareBefore, ch.shareAfter = map[shareKey][]nat.Object{}, map[shareKey][]nat.Object{}
	touch := func(k shareKey) {
		if _, ok := ch.shareBefore[k]; ok {
			return
		}
		cur := r.share[k]
		ch.shareBefore[k] = cur
		ch.shareAfter[k] = slices.Clone(cur)
	}
	for _, o := range removed {
		if k, ok := shareOf(o); ok {
			touch(k)
			ch.shareAfter[k] = slices.DeleteFunc(ch.shareAfter[k], func(x nat.Object) bool { return x.UID == o.UID })
		}
	}
	for _, o := range added {
		if k, ok := shareOf(o); ok {
			touch(k)
			ch.shareAfter[k] = append(ch.shareAfter[k], o)
		}
	}
	for k, a := range ch.shareAfter {
		nat.SortObjects(a)
		if len(a) == 0 {
			delete(ch.shareAfter, k)
		}
	}
}

// checkShare refuses identities of more than maxShareBackends backends,
// naming the first backend beyond the limit.
func checkShare(m map[shareKey][]nat.Object) error {
	for _, k := range sortedKeys(m, cmpShareKey) {
		if bs := m[k]; len(bs) > maxShareBackends {
			o := bs[maxShareBackends]
			return fmt.Errorf("nftables: %w", &nat.FieldError{UID: o.UID, Field: "dnat.type", Value: string(o.DNAT.Type),
				Reason: fmt.Sprintf("share identity %s would have %d backends; this data plane holds at most %d", k, len(bs), maxShareBackends)})
		}
	}
	return nil
}

// shareWanted returns the backends of every share identity among objs,
// each ordered by UID.
func shareWanted(objs iter.Seq[nat.Object]) map[shareKey][]nat.Object {
	m := map[shareKey][]nat.Object{}
	for o := range objs {
		if k, ok := shareOf(o); ok {
			m[k] = append(m[k], o)
		}
	}
	for _, a := range m {
		nat.SortObjects(a)
	}
	return m
}

// commitShare records the identities ch made.
func (r *Backend) commitShare(ch *change) {
	if r.share == nil {
		r.share = map[shareKey][]nat.Object{}
	}
	for k := range ch.shareBefore {
		delete(r.share, k)
	}
	maps.Copy(r.share, ch.shareAfter)
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

// run plans ch and commits it as one transaction.
func (r *Backend) run(ctx context.Context, ch *change) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := r.ready(); err != nil {
		return err
	}
	return r.exec(ctx, r.plan(ch))
}

// keepOps bounds the operations the Backend keeps room for in the next
// transaction (a one-FIP add allocated them twice as they grew).
const keepOps = 64

// recycle empties tx, sent, and keeps it for the next transaction (its
// operations' room, unless a bulk transaction's; not the elements).
func (r *Backend) recycle(tx *txPlan) {
	tx.tx.Reset(keepOps)
	*tx = txPlan{tx: tx.tx}
	r.spare = tx
}

// exec sends tx through the transport and keeps the generation count.
func (r *Backend) exec(ctx context.Context, tx *txPlan) error {
	if r.traceForTest != nil {
		r.traceForTest(&tx.tx)
	}
	touches, stamped, snap := tx.touchesFIPs(), tx.stamped, tx.snap
	sent, err := r.send(ctx, &tx.tx)
	r.recycle(tx)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	if sent {
		r.gen++
		r.stamped = stamped
		switch {
		case touches:
			r.snapID = 0
		case stamped:
			r.snapID = snap
		}
	}
	return nil
}

// Settle stores the ruleset generation of natgw's last transaction in the
// natgw_meta element, unless it is there already. Transactions that create
// or rewrite the table store it themselves; Apply, Delete and a Sync by
// difference leave it out: only the next Load needs it (to skip reading
// fip_snat, see Load), and it would cost the kernel two more messages in
// every small transaction. Close settles. After a crash the stored
// generation is stale and the next Load reads and checks everything.
//
// With a state directory (nat.Config.StateDir), Settle also writes the
// index snapshot when the kernel's FIP maps equal none known (after a
// full read or a change of FIPs), before the transaction that names it
// (see nat/README.md, "The index snapshot"); a snapshot that cannot be
// written is logged and the generation stored without one.
func (r *Backend) Settle(ctx context.Context) error {
	if r.boot == "" {
		return nil
	}
	snapshot := r.snapDir != "" && r.state != nil && r.snapID == 0
	if r.stamped && !snapshot {
		return nil
	}
	ch := &change{stamp: true}
	if snapshot {
		id, err := newSnapID()
		if err == nil {
			err = writeSnapshot(r.snapDir, r.boot, id, fipsOf(r.state))
		}
		if err != nil {
			r.log.Error(err, "the next start reads the FIP maps from the kernel")
		} else {
			ch.snap = id
		}
	}
	if err := r.run(ctx, ch); err != nil {
		return fmt.Errorf("nftables: store generation: %w", err)
	}
	return nil
}

// Commit implements engine.Backend. A Sync (c.Full) whose difference to
// the present objects is small sends only that difference, like an Apply,
// with adds that must not find their key in the kernel; if the kernel
// refuses it (its elements are not what the objects render to: a hand
// edit), or if the difference is large, every element set is flushed and
// refilled instead. Either way it is one transaction that commits.
func (r *Backend) Commit(ctx context.Context, c engine.Commit) error {
	if !c.Full {
		return r.commitDiff(ctx, c.Removed, c.Added, false)
	}
	if len(c.Removed)+len(c.Added) >= c.DesiredLen()/2 {
		return r.commitFull(ctx, c.Desired())
	}
	err := r.commitDiff(ctx, c.Removed, c.Added, true)
	var errno unix.Errno
	if err == nil || errors.Is(err, nat.ErrUnknownState) || ctx.Err() != nil || !errors.As(err, &errno) {
		return err
	}
	r.log.Info("sync: the kernel refused the difference (its elements are not what the objects render to), rewriting every element", "error", err)
	return r.commitFull(ctx, c.Desired())
}

// WantOnDemand implements engine.WantOnDemand: a Sync by difference needs
// no list of every object.
func (r *Backend) WantOnDemand() bool { return true }

// commitDiff deletes the elements of removed and adds those of added in
// one transaction; with exclusive, an added element whose key the kernel
// already holds makes the kernel refuse the transaction.
func (r *Backend) commitDiff(ctx context.Context, removed, added []nat.Object, exclusive bool) error {
	ch := &change{del: setElems{}, add: setElems{}, excl: exclusive, qosBefore: map[qosKey]qosState{}, qosAfter: map[qosKey]qosVal{}}
	c := engine.Commit{Removed: removed, Added: added}
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
	r.shareChange(ch, removed, added)
	if err := checkShare(ch.shareAfter); err != nil {
		return err
	}
	marks, err := r.markChange(ch, removed, added)
	if err != nil {
		return err
	}
	if err := r.run(ctx, ch); err != nil {
		return err
	}
	r.commitShare(ch)
	r.commitMarks(marks)
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
func (r *Backend) commitFull(ctx context.Context, want []nat.Object) error {
	ch, snat, qos, marks, err := r.fullChange(want, r.snatPresent(), r.qosPresent(), false)
	if err != nil {
		return err
	}
	if err := r.run(ctx, ch); err != nil {
		return err
	}
	r.commitMarks(marks)
	r.snat, r.qos = snat, qos
	r.share = map[shareKey][]nat.Object{}
	r.commitShare(ch)
	return nil
}

func (r *Backend) snatPresent() map[snatClass]bool {
	m := map[snatClass]bool{}
	for cl, n := range r.snat {
		m[cl] = n > 0
	}
	return m
}

func (r *Backend) qosPresent() map[qosKey]qosState {
	m := map[qosKey]qosState{}
	for k, v := range r.qos {
		m[k] = qosState{chain: true, obj: true, val: v}
	}
	return m
}

// fullChange computes the transaction that replaces the kernel state
// (present SNAT maps and policers as given) with want, and the bookkeeping
// that follows it.
// The share DNAT maps are flushed with the other element sets, so every
// identity of want is added whole; so is eip_marks6, refilled with the ids
// the IPv6 EIPs of want hold (a new one gets its home id, or the next free one after it).
func (r *Backend) fullChange(want []nat.Object, snatBefore map[snatClass]bool, qosBefore map[qosKey]qosState, force bool) (*change, map[snatClass]int, map[qosKey]qosVal, markDelta, error) {
	ch := &change{full: true, stamp: true, qosBefore: qosBefore, qosAfter: map[qosKey]qosVal{}, qosForce: force,
		snatBefore: snatBefore, shareBefore: map[shareKey][]nat.Object{}, shareAfter: shareWanted(slices.Values(want))}
	if err := checkShare(ch.shareAfter); err != nil {
		return nil, nil, nil, markDelta{}, err
	}
	add, err := renderBulk(want)
	if err != nil {
		return nil, nil, nil, markDelta{}, fmt.Errorf("nftables: %w", err)
	}
	ch.add = add
	marks, err := r.markFull(ch, want)
	if err != nil {
		return nil, nil, nil, markDelta{}, err
	}
	for _, s := range elementSets {
		ch.flush = append(ch.flush, s.name)
	}
	for _, cl := range sortedSNAT(snatBefore) {
		ch.flush = append(ch.flush, cl.setName())
	}
	snat := structureOf(slices.Values(want), ch)
	return ch, snat, maps.Clone(ch.qosAfter), marks, nil
}

// structureOf fills ch's wanted CIDR SNAT maps and policers for objs and
// returns the number of SNATs per map.
func structureOf(objs iter.Seq[nat.Object], ch *change) map[snatClass]int {
	ch.snatAfter = map[snatClass]bool{}
	snat := map[snatClass]int{}
	for o := range objs {
		if cl, ok := snatClassOf(o); ok {
			snat[cl]++
			ch.snatAfter[cl] = true
		}
		pol, _ := qosOf(o)
		maps.Copy(ch.qosAfter, pol)
	}
	return snat
}
