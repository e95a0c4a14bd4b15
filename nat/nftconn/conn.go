package nftconn

import (
	"context"
	"fmt"
	"runtime"

	nft "github.com/google/nftables"

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

// Netlink is a Conn over netlink, one Socket per call, dialed in its
// namespace: Apply sends its own encoding (Tx.Encode, Socket.Commit), the
// reads are dumps decoded by this package (read.go).
type Netlink struct {
	ns *netns.NS // nil: the calling thread's namespace
}

// Open returns a Conn to ns's nftables; ns must stay open while it is used.
func Open(ns *netns.NS) *Netlink { return &Netlink{ns: ns} }

// Current returns a Conn to the nftables of the calling thread's network
// namespace (the thread that calls its methods).
func Current() *Netlink { return &Netlink{} }

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

// read runs fn over a Socket dialed for the call (the system's buffer
// sizes), unless ctx is done.
func (n *Netlink) read(ctx context.Context, fn func(s *Socket) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s, err := DialSocket(n.ns, nlsock.DefaultTimeout, 0, 0)
	runtime.KeepAlive(n.ns)
	if err != nil {
		return fmt.Errorf("nftables netlink: %w", err)
	}
	defer s.Close()
	return fn(s)
}

// Tables implements Conn.
func (n *Netlink) Tables(ctx context.Context, f nft.TableFamily) (names []string, err error) {
	err = n.read(ctx, func(s *Socket) error { names, err = readTables(ctx, s, f); return err })
	return names, err
}

// Rules implements Conn.
func (n *Netlink) Rules(ctx context.Context, t Table, chain ChainName) (refs []RuleRef, err error) {
	err = n.read(ctx, func(s *Socket) error { refs, err = readRules(ctx, s, t, chain); return err })
	return refs, err
}

// MapElements implements Conn.
func (n *Netlink) MapElements(ctx context.Context, t Table, name MapName) (els []Element, err error) {
	err = n.read(ctx, func(s *Socket) error { els, err = readMapElements(ctx, s, t, name); return err })
	return els, err
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
