package nftconn

import (
	"context"
	"fmt"
	"runtime"

	nft "github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nlsock"
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

// Netlink is a Conn over netlink, one socket per call: Apply sends its own
// encoding (Encode, Socket), reads go through google/nftables.
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

// Apply implements Conn: tx is encoded into one Batch (Tx.Encode) and
// committed over a Socket dialed for the call (buffers as the system
// sets them, the send buffer raised for a batch beyond them; raising it
// needs CAP_NET_ADMIN).
func (n *Netlink) Apply(ctx context.Context, tx *Tx) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if tx.Len() == 0 {
		return nil
	}
	b := NewBatch(0, 4096, nil)
	if err := tx.Encode(b); err != nil {
		return err
	}
	send := 0
	if l := len(b.Bytes()); l > smallBatch {
		send = 2 * l
	}
	s, err := DialSocket(n.ns, nlsock.DefaultTimeout, send, 0)
	runtime.KeepAlive(n.ns)
	if err != nil {
		return fmt.Errorf("nftables netlink: %w", err)
	}
	defer s.Close()
	if _, err := s.Commit(ctx, b); err != nil {
		return err
	}
	return nil
}

// smallBatch is a batch that fits any netlink socket's default send
// buffer (net.core.wmem_default is 208 KiB or more).
const smallBatch = 128 << 10

// reader returns a library connection for one read, unless ctx is done.
func (n *Netlink) reader(ctx context.Context) (*nft.Conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return n.conn()
}

// Tables implements Conn.
func (n *Netlink) Tables(ctx context.Context, f nft.TableFamily) ([]string, error) {
	c, err := n.reader(ctx)
	if err != nil {
		return nil, err
	}
	return listTables(c, f)
}

// Rules implements Conn.
func (n *Netlink) Rules(ctx context.Context, t Table, chain ChainName) ([]RuleRef, error) {
	c, err := n.reader(ctx)
	if err != nil {
		return nil, err
	}
	return listRules(c, t, chain)
}

// MapElements implements Conn.
func (n *Netlink) MapElements(ctx context.Context, t Table, name MapName) ([]Element, error) {
	c, err := n.reader(ctx)
	if err != nil {
		return nil, err
	}
	return listMapElements(c, t, name)
}

// listTables returns the names of the tables of family f, read over c.
func listTables(c *nft.Conn, f nft.TableFamily) ([]string, error) {
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

// listRules returns the rules of chain in t, read over c.
func listRules(c *nft.Conn, t Table, chain ChainName) ([]RuleRef, error) {
	tb := &nft.Table{Name: string(t.Name), Family: t.Family}
	rules, err := c.GetRules(tb, &nft.Chain{Name: string(chain), Table: tb})
	if err != nil {
		return nil, fmt.Errorf("nftables: list %s %s: %w", t, chain, err)
	}
	if len(rules) == 0 {
		// The kernel's rule dump filtered by chain answers a missing chain
		// (or table) with no rules, not an error: ask for the chain.
		if err := chainExists(c, tb, chain); err != nil {
			return nil, fmt.Errorf("nftables: list %s %s: %w", t, chain, err)
		}
	}
	refs := make([]RuleRef, 0, len(rules))
	for _, r := range rules {
		refs = append(refs, RuleRef{Handle: r.Handle, Tag: string(r.UserData)})
	}
	return refs, nil
}

// chainExists returns nil if chain is in tb, an error wrapping ENOENT (as
// Fake's) if it is not. One GETCHAIN asks; google/nftables reports its
// failure without the errno, so a failed one is settled by the table
// family's chain dump.
func chainExists(c *nft.Conn, tb *nft.Table, chain ChainName) error {
	if _, err := c.ListChain(tb, string(chain)); err == nil {
		return nil
	}
	chains, err := c.ListChainsOfTableFamily(tb.Family)
	if err != nil {
		return fmt.Errorf("list chains: %w", err)
	}
	for _, ch := range chains {
		if ch.Name == string(chain) && ch.Table != nil && ch.Table.Name == tb.Name {
			return nil
		}
	}
	return fmt.Errorf("chain: %w", unix.ENOENT)
}

// listMapElements returns the elements of map name in t, read over c.
func listMapElements(c *nft.Conn, t Table, name MapName) ([]Element, error) {
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
