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
// operations Tx has (a missing table, chain or rule, or a created table
// that exists, fails it and changes nothing; it does not model jumps, so
// a delete of a chain another chain jumps to is not refused), and Dump renders the tables as `nft list ruleset` lists them,
// each rule by its Text. It is safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	tables map[Table]*fakeTable
	handle uint64
	// Applied are the transactions applied, in order, as text.
	Applied []string
}

type fakeTable struct {
	maps   []*fakeMap
	chains []*fakeChain
}

type fakeMap struct {
	spec     Map
	elements []Element
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

func (f *Fake) clone() map[Table]*fakeTable {
	out := make(map[Table]*fakeTable, len(f.tables))
	for k, t := range f.tables {
		nt := &fakeTable{}
		for _, m := range t.maps {
			nt.maps = append(nt.maps, &fakeMap{spec: m.spec, elements: slices.Clone(m.elements)})
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
		j := slices.IndexFunc(m.elements, func(x Element) bool { return slices.Equal(x.Key, e.Key) })
		switch {
		case j < 0:
			m.elements = append(m.elements, e)
		case !slices.Equal(m.elements[j].Val, e.Val):
			return fmt.Errorf("map %s: element %q with another value: %w", m.spec.Name, e.Text, unix.EBUSY)
		}
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
	return slices.Clone(m.elements), nil
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
// ruleset: maps then chains, each in the order they were added, a map's
// elements by their Text on one line, each rule by its Text with its tag
// as a # comment.
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
		for _, m := range f.tables[k].maps {
			fmt.Fprintf(&b, "%s\tmap %s {\n\t\ttype %s : %s\n", sep, m.spec.Name, m.spec.KeyType.Name, m.spec.DataType.Name)
			if len(m.elements) > 0 {
				fmt.Fprintf(&b, "\t\telements = { %s }\n", elementsText(m.elements))
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
	for _, m := range ft.maps {
		if rest, ok := block("map", string(m.spec.Name)); ok {
			texts := make([]string, len(m.elements))
			for i, e := range m.elements {
				texts[i] = e.Text
			}
			find(rest, string(m.spec.Name), "", texts, false)
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
