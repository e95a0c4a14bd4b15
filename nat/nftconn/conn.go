package nftconn

import (
	"context"
	"fmt"
	"runtime"
	"slices"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/natgw/natgw/nat/netns"
)

// Conn is a connection to one network namespace's nftables: it applies a
// Tx as one transaction and reads back what natgw needs to decide the
// next one. Netlink (Open, Current) and Fake implement it.
type Conn interface {
	// Apply sends tx as one batch: all of it or nothing.
	Apply(ctx context.Context, tx *Tx) error
	// Tables returns the names of the tables of family f.
	Tables(ctx context.Context, f nft.TableFamily) ([]string, error)
	// Rules returns the rules of chain in t, in order; an error if the
	// chain does not exist.
	Rules(ctx context.Context, t Table, chain ChainName) ([]RuleRef, error)
	// MapElements returns the elements of map name in t (key, value and
	// comment); an error if the map does not exist.
	MapElements(ctx context.Context, t Table, name MapName) ([]Element, error)
}

// Netlink is a Conn over netlink (google/nftables, one socket per call).
type Netlink struct {
	ns   *netns.NS // nil: the calling thread's namespace
	opts []nft.ConnOption
}

// Open returns a Conn to ns's nftables; ns must stay open while it is used.
func Open(ns *netns.NS) *Netlink {
	return &Netlink{ns: ns, opts: []nft.ConnOption{nft.WithNetNSFd(ns.Fd())}}
}

// Current returns a Conn to the nftables of the calling thread's network
// namespace (the thread that calls its methods).
func Current() *Netlink { return &Netlink{} }

func (n *Netlink) conn() (*nft.Conn, error) {
	c, err := nft.New(n.opts...)
	runtime.KeepAlive(n.ns)
	if err != nil {
		return nil, fmt.Errorf("nftables netlink: %w", err)
	}
	return c, nil
}

// Apply implements Conn.
func (n *Netlink) Apply(ctx context.Context, tx *Tx) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if tx.Len() == 0 {
		return nil
	}
	c, err := n.conn()
	if err != nil {
		return err
	}
	// The maps added in this transaction, by table and name: elements and
	// lookups refer to them by the ID AddSet gives them.
	sets := map[string]*nft.Set{}
	setOf := func(t *nft.Table, tb Table, name MapName) *nft.Set {
		if s := sets[tb.String()+" "+string(name)]; s != nil {
			return s
		}
		return &nft.Set{Table: t, Name: string(name), IsMap: true}
	}
	for _, o := range tx.ops {
		t := &nft.Table{Name: string(o.table.Name), Family: o.table.Family}
		ch := &nft.Chain{Name: string(o.chain.Name), Table: t}
		switch o.kind {
		case opAddTable:
			c.AddTable(t)
		case opDeleteTable:
			c.DelTable(t)
		case opAddChain:
			ch.Type, ch.Hooknum, ch.Priority = o.chain.Type, o.chain.Hook, o.chain.Priority
			c.AddChain(ch)
		case opFlushChain:
			c.FlushChain(ch)
		case opAppendRule:
			c.AddRule(&nft.Rule{Table: t, Chain: ch, Exprs: withSetIDs(o.rule.Exprs, o.table, sets), UserData: []byte(o.rule.Tag)})
		case opInsertRule:
			c.InsertRule(&nft.Rule{Table: t, Chain: ch, Exprs: withSetIDs(o.rule.Exprs, o.table, sets), UserData: []byte(o.rule.Tag)})
		case opDeleteRule:
			if err := c.DelRule(&nft.Rule{Table: t, Chain: ch, Handle: o.handle}); err != nil {
				return fmt.Errorf("nftables: delete rule %d of %s %s: %w", o.handle, t.Name, ch.Name, err)
			}
		case opAddMap:
			s := &nft.Set{Table: t, Name: string(o.set.Name), IsMap: true, KeyType: o.set.KeyType, DataType: o.set.DataType}
			if err := c.AddSet(s, nil); err != nil {
				return fmt.Errorf("nftables: add map %s %s: %w", o.table, o.set.Name, err)
			}
			sets[o.table.String()+" "+string(o.set.Name)] = s
		case opFlushMap:
			c.FlushSet(setOf(t, o.table, o.set.Name))
		case opAddElements:
			els := make([]nft.SetElement, len(o.elements))
			for i, e := range o.elements {
				els[i] = nft.SetElement{Key: e.Key, Val: e.Val, Comment: e.Comment}
			}
			if err := c.SetAddElements(setOf(t, o.table, o.set.Name), els); err != nil {
				return fmt.Errorf("nftables: add elements to map %s %s: %w", o.table, o.set.Name, err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables transaction: %w", err)
	}
	return nil
}

// Tables implements Conn.
func (n *Netlink) Tables(ctx context.Context, f nft.TableFamily) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := n.conn()
	if err != nil {
		return nil, err
	}
	tables, err := c.ListTablesOfFamily(f)
	if err != nil {
		return nil, fmt.Errorf("nftables: list %s tables: %w", FamilyName(f), err)
	}
	names := make([]string, 0, len(tables))
	for _, t := range tables {
		names = append(names, t.Name)
	}
	return names, nil
}

// Rules implements Conn.
func (n *Netlink) Rules(ctx context.Context, t Table, chain ChainName) ([]RuleRef, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := n.conn()
	if err != nil {
		return nil, err
	}
	tb := &nft.Table{Name: string(t.Name), Family: t.Family}
	rules, err := c.GetRules(tb, &nft.Chain{Name: string(chain), Table: tb})
	if err != nil {
		return nil, fmt.Errorf("nftables: list %s %s: %w", t, chain, err)
	}
	refs := make([]RuleRef, 0, len(rules))
	for _, r := range rules {
		refs = append(refs, RuleRef{Handle: r.Handle, Tag: string(r.UserData)})
	}
	return refs, nil
}

// withSetIDs returns exprs with each lookup of a map added in this
// transaction (sets, by table and name) given the map's ID, as the kernel
// wants a lookup of a map that does not exist yet; exprs itself is not
// changed.
func withSetIDs(exprs []expr.Any, t Table, sets map[string]*nft.Set) []expr.Any {
	out, cloned := exprs, false
	for i, e := range exprs {
		l, ok := e.(*expr.Lookup)
		if !ok {
			continue
		}
		s := sets[t.String()+" "+l.SetName]
		if s == nil || l.SetID == s.ID {
			continue
		}
		if !cloned {
			out, cloned = slices.Clone(exprs), true
		}
		c := *l
		c.SetID = s.ID
		out[i] = &c
	}
	return out
}

// MapElements implements Conn.
func (n *Netlink) MapElements(ctx context.Context, t Table, name MapName) ([]Element, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := n.conn()
	if err != nil {
		return nil, err
	}
	s, err := c.GetSetByName(&nft.Table{Name: string(t.Name), Family: t.Family}, string(name))
	if err != nil {
		return nil, fmt.Errorf("nftables: map %s %s: %w", t, name, err)
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		return nil, fmt.Errorf("nftables: map %s %s elements: %w", t, name, err)
	}
	out := make([]Element, 0, len(els))
	for _, e := range els {
		out = append(out, Element{Key: e.Key, Val: e.Val, Comment: e.Comment})
	}
	return out, nil
}

// FindRule returns the handle of the first rule of chain tagged tag (ok
// false if none).
func FindRule(ctx context.Context, c Conn, t Table, chain ChainName, tag string) (handle uint64, ok bool, err error) {
	rules, err := c.Rules(ctx, t, chain)
	if err != nil {
		return 0, false, err
	}
	for _, r := range rules {
		if r.Tag == tag {
			return r.Handle, true, nil
		}
	}
	return 0, false, nil
}

// AddRuleOnce adds r to chain (first with insert, else last) in one
// transaction unless a rule tagged r.Tag is there; added says whether it
// added it.
func AddRuleOnce(ctx context.Context, c Conn, t Table, chain ChainName, r Rule, insert bool) (added bool, err error) {
	if _, found, err := FindRule(ctx, c, t, chain, r.Tag); err != nil || found {
		return false, err
	}
	tx := &Tx{}
	if insert {
		tx.InsertRule(t, chain, r)
	} else {
		tx.AppendRule(t, chain, r)
	}
	if err := c.Apply(ctx, tx); err != nil {
		return false, err
	}
	return true, nil
}

// HasTable reports whether table t exists.
func HasTable(ctx context.Context, c Conn, t Table) (bool, error) {
	names, err := c.Tables(ctx, t.Family)
	if err != nil {
		return false, err
	}
	for _, n := range names {
		if n == string(t.Name) {
			return true, nil
		}
	}
	return false, nil
}
