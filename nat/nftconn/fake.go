package nftconn

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	nft "github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// Fake is a Conn that keeps the tables in memory, for tests without a
// kernel or root: Apply checks a transaction as the kernel would for the
// operations Tx has (a missing table, chain, set, map, limit, rule or
// element to delete, a created table that exists, an element created
// with a key that is there or added with another value, fails it and
// changes nothing; it does not model references, so a delete of a chain
// another chain jumps to, or of a set or limit a rule uses, is not
// refused; it refuses to add a limit that exists, which the kernel may
// update), and Dump renders the tables as `nft list ruleset` lists them,
// each rule by its Text. It is safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	tables map[Table]*fakeTable
	handle uint64
	// Applied are the transactions applied, in order, as text.
	Applied []string
}

type fakeTable struct {
	limits []fakeLimit
	maps   []*fakeMap // maps (AddMap) and sets (AddSet), in the order added
	chains []*fakeChain
}

type fakeLimit struct {
	name, text string
}

// fakeMap is a map added with AddMap (spec) or a set or map added with
// AddSet (set non-nil).
type fakeMap struct {
	spec     Map
	set      *Set
	elements []fakeElem
}

// fakeElem is an element and its value as compared on an add (the value
// bytes, or the verdict's text).
type fakeElem struct {
	Element
	value string
}

type fakeChain struct {
	spec  Chain
	rules []fakeRule
}

type fakeRule struct {
	handle uint64
	rule   Rule
}

// NewFake returns a Fake without tables.
func NewFake() *Fake { return &Fake{tables: map[Table]*fakeTable{}} }

func (t *fakeTable) chain(name ChainName) *fakeChain {
	for _, c := range t.chains {
		if c.spec.Name == name {
			return c
		}
	}
	return nil
}

func (t *fakeTable) set(name MapName) *fakeMap {
	for _, m := range t.maps {
		if m.spec.Name == name {
			return m
		}
	}
	return nil
}

func (t *fakeTable) limit(name string) int {
	return slices.IndexFunc(t.limits, func(l fakeLimit) bool { return l.name == name })
}

func (f *Fake) clone() map[Table]*fakeTable {
	out := make(map[Table]*fakeTable, len(f.tables))
	for k, t := range f.tables {
		nt := &fakeTable{limits: slices.Clone(t.limits)}
		for _, m := range t.maps {
			nt.maps = append(nt.maps, &fakeMap{spec: m.spec, set: m.set, elements: slices.Clone(m.elements)})
		}
		for _, c := range t.chains {
			nt.chains = append(nt.chains, &fakeChain{spec: c.spec, rules: slices.Clone(c.rules)})
		}
		out[k] = nt
	}
	return out
}

func missing(what string) error { return fmt.Errorf("%s: %w", what, unix.ENOENT) }

// Apply implements Conn.
func (f *Fake) Apply(ctx context.Context, tx *Tx) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	tables, handle := f.clone(), f.handle
	for i, o := range tx.ops {
		t := tables[o.table]
		var err error
		switch o.kind {
		case opAddTable:
			if t == nil {
				tables[o.table] = &fakeTable{}
			}
		case opDeleteTable:
			if t == nil {
				err = missing("table " + o.table.String())
			}
			delete(tables, o.table)
		case opCreateTable:
			if t != nil {
				err = fmt.Errorf("table %s: %w", o.table, unix.EEXIST)
				break
			}
			tables[o.table] = &fakeTable{}
		case opAddChain:
			switch {
			case t == nil:
				err = missing("table " + o.table.String())
			case t.chain(o.chain.Name) == nil:
				t.chains = append(t.chains, &fakeChain{spec: o.chain})
			}
		case opAddMap:
			switch {
			case t == nil:
				err = missing("table " + o.table.String())
			case t.set(o.set.Name) == nil:
				t.maps = append(t.maps, &fakeMap{spec: o.set})
			}
		case opFlushMap, opAddElements:
			var m *fakeMap
			if t != nil {
				m = t.set(o.set.Name)
			}
			if m == nil {
				err = missing("map " + o.table.String() + " " + string(o.set.Name))
				break
			}
			if o.kind == opFlushMap {
				m.elements = nil
				break
			}
			err = m.add(o.elements)
		case opFlushChain, opDeleteChain, opAppendRule, opInsertRule, opDeleteRule:
			var c *fakeChain
			if t != nil {
				c = t.chain(o.chain.Name)
			}
			if c == nil {
				err = missing("chain " + o.table.String() + " " + string(o.chain.Name))
				break
			}
			switch o.kind {
			case opFlushChain:
				c.rules = nil
			case opDeleteChain:
				t.chains = slices.DeleteFunc(t.chains, func(x *fakeChain) bool { return x == c })
			case opAppendRule:
				handle++
				c.rules = append(c.rules, fakeRule{handle, o.rule})
			case opInsertRule:
				handle++
				c.rules = slices.Insert(c.rules, 0, fakeRule{handle, o.rule})
			case opDeleteRule:
				j := slices.IndexFunc(c.rules, func(r fakeRule) bool { return r.handle == o.handle })
				if j < 0 {
					err = missing(fmt.Sprintf("rule handle %d in %s %s", o.handle, o.table, o.chain.Name))
					break
				}
				c.rules = slices.Delete(c.rules, j, j+1)
			}
		default:
			err = applySetOp(tables, &o)
		}
		if err != nil {
			return fmt.Errorf("nftables transaction (fake): operation %d: %w", i+1, err)
		}
	}
	f.tables, f.handle = tables, handle
	f.Applied = append(f.Applied, tx.String())
	return nil
}

// add adds els as the kernel does: a key that is there with the same
// value is kept, with another value refused (EBUSY).
func (m *fakeMap) add(els []Element) error {
	for _, e := range els {
		if err := m.addOne(fakeElem{Element: e, value: string(e.Val)}, false); err != nil {
			return err
		}
	}
	return nil
}

// addOne adds e as the kernel does; with excl a key that is there is
// refused (EEXIST).
func (m *fakeMap) addOne(e fakeElem, excl bool) error {
	j := m.find(e.Key)
	switch {
	case j < 0:
		m.elements = append(m.elements, e)
	case excl:
		return fmt.Errorf("%s: element %q exists: %w", m.name(), e.Text, unix.EEXIST)
	case m.elements[j].value != e.value:
		return fmt.Errorf("%s: element %q with another value: %w", m.name(), e.Text, unix.EBUSY)
	}
	return nil
}

func (m *fakeMap) find(key []byte) int {
	return slices.IndexFunc(m.elements, func(x fakeElem) bool { return slices.Equal(x.Key, key) })
}

func (m *fakeMap) name() string {
	if m.set != nil {
		return m.set.word() + " " + string(m.set.Name)
	}
	return "map " + string(m.spec.Name)
}

// texts returns m's elements' Texts.
func (m *fakeMap) texts() []string {
	out := make([]string, len(m.elements))
	for i, e := range m.elements {
		out[i] = e.Text
	}
	return out
}

// applySetOp applies an operation on a Set or a limit object to tables.
func applySetOp(tables map[Table]*fakeTable, o *op) error {
	t := tables[o.table]
	if t == nil {
		return missing("table " + o.table.String())
	}
	switch o.kind {
	case opAddLimit:
		if t.limit(o.object) >= 0 {
			return fmt.Errorf("limit %s %s: %w", o.table, o.object, unix.EEXIST)
		}
		t.limits = append(t.limits, fakeLimit{o.object, LimitText(o.limit)})
		return nil
	case opDeleteLimit:
		j := t.limit(o.object)
		if j < 0 {
			return missing("limit " + o.table.String() + " " + o.object)
		}
		t.limits = slices.Delete(t.limits, j, j+1)
		return nil
	}
	m := t.set(MapName(o.spec.Name))
	if o.kind == opAddSet {
		if m == nil {
			s := o.spec
			t.maps = append(t.maps, &fakeMap{spec: Map{Name: MapName(s.Name)}, set: &s})
		}
		return nil
	}
	if m == nil || m.set == nil {
		return missing(o.spec.word() + " " + o.table.String() + " " + string(o.spec.Name))
	}
	switch o.kind {
	case opFlushSet:
		m.elements = nil
	case opDeleteSet:
		t.maps = slices.DeleteFunc(t.maps, func(x *fakeMap) bool { return x == m })
	case opDeleteSetElements:
		for _, e := range o.elems {
			j := m.find(e.Key)
			if j < 0 {
				return missing(fmt.Sprintf("%s: element %s", m.name(), m.set.KeyText(e.Key)))
			}
			m.elements = slices.Delete(m.elements, j, j+1)
		}
	case opAddSetElements, opAddElementUserData:
		for _, e := range o.elems {
			value := string(e.Val)
			if e.VerdictData != nil {
				value = verdictText(e.VerdictData)
			}
			fe := fakeElem{Element: Element{Key: e.Key, Val: e.Val, Comment: e.Comment, Text: m.set.ElementText(e)}, value: value}
			if err := m.addOne(fe, o.excl); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("unknown operation %d on %s", o.kind, o.table)
	}
	return nil
}

// MapElements implements Conn.
func (f *Fake) MapElements(ctx context.Context, t Table, name MapName) ([]Element, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var m *fakeMap
	if ft := f.tables[t]; ft != nil {
		m = ft.set(name)
	}
	if m == nil {
		return nil, fmt.Errorf("nftables (fake): map %s %s: %w", t, name, missing("map"))
	}
	out := make([]Element, len(m.elements))
	for i, e := range m.elements {
		out[i] = e.Element
	}
	return out, nil
}

// Tables implements Conn.
func (f *Fake) Tables(ctx context.Context, fam nft.TableFamily) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	for t := range f.tables {
		if t.Family == fam {
			names = append(names, string(t.Name))
		}
	}
	slices.Sort(names)
	return names, nil
}

// Rules implements Conn.
func (f *Fake) Rules(ctx context.Context, t Table, chain ChainName) ([]RuleRef, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var c *fakeChain
	if ft := f.tables[t]; ft != nil {
		c = ft.chain(chain)
	}
	if c == nil {
		return nil, fmt.Errorf("nftables (fake): list %s %s: %w", t, chain, missing("chain"))
	}
	refs := make([]RuleRef, 0, len(c.rules))
	for _, r := range c.rules {
		refs = append(refs, RuleRef{Handle: r.handle, Tag: r.rule.Tag})
	}
	return refs, nil
}

// Dump renders every table, ordered by family then name, as nft lists a
// ruleset: limit objects, sets and maps, then chains, each in the order
// they were added, a map's elements by their Text on one line, each rule
// by its Text with its comment and its tag as a # comment.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]Table, 0, len(f.tables))
	for t := range f.tables {
		keys = append(keys, t)
	}
	slices.SortFunc(keys, func(a, b Table) int {
		return cmp.Or(cmp.Compare(FamilyName(a.Family), FamilyName(b.Family)), cmp.Compare(a.Name, b.Name))
	})
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "table %s {\n", k)
		sep := ""
		for _, l := range f.tables[k].limits {
			fmt.Fprintf(&b, "%s\tlimit %s {\n\t\t%s\n\t}\n", sep, l.name, l.text)
			sep = "\n"
		}
		for _, m := range f.tables[k].maps {
			if m.set != nil {
				fmt.Fprintf(&b, "%s\t%s %s {\n\t\ttype %s\n", sep, m.set.word(), m.set.Name, m.set.TypeText())
			} else {
				fmt.Fprintf(&b, "%s\tmap %s {\n\t\ttype %s : %s\n", sep, m.spec.Name, m.spec.KeyType.Name, m.spec.DataType.Name)
			}
			if len(m.elements) > 0 {
				fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(m.texts(), ", "))
			}
			b.WriteString("\t}\n")
			sep = "\n"
		}
		for _, c := range f.tables[k].chains {
			b.WriteString(sep)
			sep = "\n"
			fmt.Fprintf(&b, "\tchain %s {\n", c.spec.Name)
			if h := c.spec.Header(); h != "" {
				fmt.Fprintf(&b, "\t\t%s\n", h)
			}
			for _, r := range c.rules {
				fmt.Fprintf(&b, "\t\t%s\n", r.rule.line())
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	return b.String()
}

// NotListed compares the Fake's table t with listing, the kernel's `nft
// list table` of it (for a kernel test: the layout's Text says what its
// expressions do). It returns the Fake's rule texts that listing does not
// hold in the same chain in the same order, and its element texts that
// listing does not hold in the same map (nft orders a map's elements its
// own way); nil when all are there.
func (f *Fake) NotListed(t Table, listing string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ft := f.tables[t]
	if ft == nil {
		return []string{"table " + t.String() + " (not in the fake)"}
	}
	var out []string
	// block is the listing of "\tkind name {" up to its closing brace.
	block := func(kind, name string) (string, bool) {
		i := strings.Index(listing, "\t"+kind+" "+name+" {")
		if i < 0 {
			out = append(out, kind+" "+name)
			return "", false
		}
		rest := listing[i:]
		if end := strings.Index(rest, "\n\t}"); end >= 0 {
			rest = rest[:end]
		}
		return rest, true
	}
	// find adds to out the texts that rest does not hold (in order: each
	// after the one before it), each after prefix.
	find := func(rest, name, prefix string, texts []string, inOrder bool) {
		all := rest
		for _, text := range texts {
			j := strings.Index(rest, prefix+text)
			if j < 0 {
				out = append(out, name+": "+text)
				continue
			}
			if inOrder {
				rest = rest[j+len(prefix)+len(text):]
			} else {
				rest = all
			}
		}
	}
	for _, l := range ft.limits {
		if rest, ok := block("limit", l.name); ok {
			find(rest, l.name, "", []string{l.text}, false)
		}
	}
	for _, m := range ft.maps {
		word := "map"
		if m.set != nil {
			word = m.set.word()
		}
		if rest, ok := block(word, string(m.spec.Name)); ok {
			find(rest, string(m.spec.Name), "", m.texts(), false)
		}
	}
	for _, c := range ft.chains {
		if rest, ok := block("chain", string(c.spec.Name)); ok {
			texts := make([]string, len(c.rules))
			for i, r := range c.rules {
				texts[i] = r.rule.Text
			}
			find(rest, string(c.spec.Name), "\t", texts, true)
		}
	}
	return out
}
