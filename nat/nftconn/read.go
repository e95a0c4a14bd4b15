package nftconn

import (
	"context"
	"encoding/binary"
	"fmt"

	nft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Conn's reads over a Socket (Netlink's, dialed per call; Lasting's): one
// dump each, decoded by this package's attribute walker (decode.go) into
// what RuleRef and Element carry and nothing else (a rule's expressions
// are skipped, not decoded).

// readTables returns the names of the tables of family f (every family's
// for NFPROTO_UNSPEC).
func readTables(ctx context.Context, s *Socket, f nft.TableFamily) ([]string, error) {
	var r tableReader
	if err := s.Dump(ctx, unix.NFT_MSG_GETTABLE, uint8(f), nil, unix.NFT_MSG_NEWTABLE, r.msg); err != nil {
		return nil, fmt.Errorf("nftables: list %s tables: %w", FamilyName(f), err)
	}
	return r.names, nil
}

// tableReader collects the names of a table dump's messages.
type tableReader struct{ names []string }

func (r *tableReader) msg(_ uint8, b []byte) error {
	return Attrs(b, func(typ uint16, v []byte) error {
		if typ == unix.NFTA_TABLE_NAME {
			r.names = append(r.names, CString(v))
		}
		return nil
	})
}

// readRules returns the rules of chain in t, in order; an error wrapping
// ENOENT if the chain (or the table) does not exist.
func readRules(ctx context.Context, s *Socket, t Table, chain ChainName) ([]RuleRef, error) {
	r := ruleReader{table: string(t.Name), chain: string(chain), refs: []RuleRef{}}
	err := s.Dump(ctx, unix.NFT_MSG_GETRULE, uint8(t.Family), []netlink.Attribute{
		{Type: unix.NFTA_RULE_TABLE, Data: cAttr(string(t.Name))},
		{Type: unix.NFTA_RULE_CHAIN, Data: cAttr(string(chain))},
	}, unix.NFT_MSG_NEWRULE, r.msg)
	if err == nil && len(r.refs) == 0 {
		// The kernel's rule dump filtered by chain answers a missing chain
		// (or table) with no rules, not an error: ask for the chain.
		err = chainExists(ctx, s, t, chain)
	}
	if err != nil {
		return nil, fmt.Errorf("nftables: list %s %s: %w", t, chain, err)
	}
	return r.refs, nil
}

// ruleReader collects the rules of a rule dump's messages that are in
// table's chain (the kernel filters the dump by them; a message of
// another chain is left out all the same).
type ruleReader struct {
	table, chain string
	refs         []RuleRef
}

func (r *ruleReader) msg(_ uint8, b []byte) error {
	var (
		ref                 RuleRef
		hasHandle, in, inCh bool
	)
	err := Attrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_RULE_TABLE:
			in = cStringIs(v, r.table)
		case unix.NFTA_RULE_CHAIN:
			inCh = cStringIs(v, r.chain)
		case unix.NFTA_RULE_HANDLE:
			if len(v) != 8 {
				return fmt.Errorf("rule handle of %d bytes, want 8", len(v))
			}
			ref.Handle, hasHandle = binary.BigEndian.Uint64(v), true
		case unix.NFTA_RULE_USERDATA:
			ref.Tag = string(v)
		}
		return nil
	})
	switch {
	case err != nil:
		return fmt.Errorf("decode rule: %w", err)
	case !in || !inCh:
		return nil
	case !hasHandle:
		return fmt.Errorf("decode rule: no handle")
	}
	r.refs = append(r.refs, ref)
	return nil
}

// chainExists returns nil if chain is in t, the kernel's error answer
// (ENOENT, as Fake's) if it or t is not: one GETCHAIN.
func chainExists(ctx context.Context, s *Socket, t Table, chain ChainName) error {
	found := false
	err := s.Get(ctx, unix.NFT_MSG_GETCHAIN, uint8(t.Family), []netlink.Attribute{
		{Type: unix.NFTA_CHAIN_TABLE, Data: cAttr(string(t.Name))},
		{Type: unix.NFTA_CHAIN_NAME, Data: cAttr(string(chain))},
	}, unix.NFT_MSG_NEWCHAIN, func(uint8, []byte) error { found = true; return nil })
	switch {
	case err != nil:
		return fmt.Errorf("chain: %w", err)
	case !found:
		return fmt.Errorf("chain: acknowledged without the chain")
	}
	return nil
}

// readMapElements returns the elements of map name in t (key, value and
// comment, copied out of the answer buffer); an error wrapping ENOENT if
// the map (or the table) does not exist.
func readMapElements(ctx context.Context, s *Socket, t Table, name MapName) ([]Element, error) {
	r := elemReader{els: []Element{}}
	err := s.Dump(ctx, unix.NFT_MSG_GETSETELEM, uint8(t.Family), []netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: cAttr(string(t.Name))},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: cAttr(string(name))},
	}, unix.NFT_MSG_NEWSETELEM, r.msg)
	if err != nil {
		return nil, fmt.Errorf("nftables: map %s %s: %w", t, name, err)
	}
	return r.els, nil
}

// elemReader collects the elements of an element dump's messages, their
// keys and values copied into chunks it allocates (arena), not one
// allocation each.
type elemReader struct {
	els   []Element
	arena []byte
}

func (r *elemReader) msg(_ uint8, b []byte) error {
	return ElemList(b, func(v []byte) error {
		e, err := DecodeElem(v)
		if err != nil {
			return err
		}
		r.els = append(r.els, Element{Key: r.keep(e.Key), Val: r.keep(e.Val), Comment: e.Comment})
		return nil
	})
}

// keep returns a copy of v in the arena (nil for nil), capped so that an
// append to it cannot reach the next copy.
func (r *elemReader) keep(v []byte) []byte {
	if v == nil {
		return nil
	}
	if cap(r.arena)-len(r.arena) < len(v) {
		r.arena = make([]byte, 0, max(arenaChunk, len(v)))
	}
	n := len(r.arena)
	r.arena = append(r.arena, v...)
	return r.arena[n:len(r.arena):len(r.arena)]
}

// arenaChunk is the size of one chunk of elemReader's copies (a few
// hundred keys and values).
const arenaChunk = 4 << 10

// cAttr is the NUL-terminated string attribute value s.
func cAttr(s string) []byte { return append([]byte(s), 0) }
