package nftconn

import (
	"fmt"
	"sync/atomic"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Encode appends tx's operations to b as nf_tables messages, in the same
// bytes google/nftables' Conn sends for them (TestEncodeMatchesLibrary),
// up to the set IDs and a rule add's NLM_F_ECHO (LibraryOnlyFlags): a map
// added in tx gets an ID from this process's counter and the lookups of it
// in tx's rules carry that ID. Elements go through Batch.Elements. An
// encoding error leaves b unusable.
func (tx *Tx) Encode(b *Batch) error {
	ids := map[string]uint32{} // maps added in tx, by table and name
	for i := range tx.ops {
		o := &tx.ops[i]
		fam := uint8(o.table.Family)
		tn := string(o.table.Name)
		var err error
		switch o.kind {
		case opAddTable, opCreateTable, opDeleteTable:
			m := tableMsgs[o.kind]
			err = b.Msg(fam, m.typ, m.flags, m.what+" "+o.table.String(), func(ae *netlink.AttributeEncoder) {
				ae.String(unix.NFTA_TABLE_NAME, tn)
				ae.Uint32(unix.NFTA_TABLE_FLAGS, 0)
			})
		case opAddChain:
			err = b.Msg(fam, unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE, "add chain "+string(o.chain.Name), func(ae *netlink.AttributeEncoder) {
				ChainAttrs(ae, tn, o.chain)
			})
		case opFlushChain:
			err = b.Msg(fam, unix.NFT_MSG_DELRULE, 0, "flush chain "+string(o.chain.Name), func(ae *netlink.AttributeEncoder) {
				ae.String(unix.NFTA_RULE_TABLE, tn)
				ae.String(unix.NFTA_RULE_CHAIN, string(o.chain.Name))
			})
		case opDeleteChain:
			err = b.Msg(fam, unix.NFT_MSG_DELCHAIN, 0, "delete chain "+string(o.chain.Name), func(ae *netlink.AttributeEncoder) {
				ae.String(unix.NFTA_CHAIN_TABLE, tn)
				ae.String(unix.NFTA_CHAIN_NAME, string(o.chain.Name))
			})
		case opAppendRule, opInsertRule:
			if o.rule.Tag != "" && o.rule.Comment != "" {
				err = fmt.Errorf("add rule to %s: a rule has a tag or a comment, not both (tag %q, comment %q)", o.chain.Name, o.rule.Tag, o.rule.Comment)
				break
			}
			// No NLM_F_ECHO (google/nftables sets it): natgw learns
			// handles from dumps, and an echo per rule overran the
			// receive buffer of a batch of thousands (ENOBUFS).
			flags := uint16(unix.NLM_F_CREATE)
			if o.kind == opAppendRule {
				flags |= unix.NLM_F_APPEND
			}
			err = b.Msg(fam, unix.NFT_MSG_NEWRULE, flags, "add rule to "+string(o.chain.Name), func(ae *netlink.AttributeEncoder) {
				ae.String(unix.NFTA_RULE_TABLE, tn)
				ae.String(unix.NFTA_RULE_CHAIN, string(o.chain.Name))
				ae.Nested(unix.NFTA_RULE_EXPRESSIONS, func(list *netlink.AttributeEncoder) error {
					for _, e := range o.rule.Exprs {
						e := withSetID(e, tn, ids)
						list.Do(unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM, func() ([]byte, error) { return expr.Marshal(fam, e) })
					}
					return nil
				})
				switch {
				case o.rule.Comment != "":
					ae.Bytes(unix.NFTA_RULE_USERDATA, userdata.AppendString(nil, userdata.TypeComment, o.rule.Comment))
				case o.rule.Tag != "":
					ae.Bytes(unix.NFTA_RULE_USERDATA, []byte(o.rule.Tag))
				}
			})
		case opDeleteRule:
			err = b.Msg(fam, unix.NFT_MSG_DELRULE, 0, "delete rule of "+string(o.chain.Name), func(ae *netlink.AttributeEncoder) {
				ae.String(unix.NFTA_RULE_TABLE, tn)
				ae.String(unix.NFTA_RULE_CHAIN, string(o.chain.Name))
				ae.Uint64(unix.NFTA_RULE_HANDLE, o.handle)
			})
		case opAddMap:
			id := SetIDs.Add(1) + 1<<20
			ids[tn+" "+string(o.set.Name)] = id
			err = b.Msg(fam, unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, "add map "+string(o.set.Name), func(ae *netlink.AttributeEncoder) {
				ae.String(unix.NFTA_SET_TABLE, tn)
				ae.String(unix.NFTA_SET_NAME, string(o.set.Name))
				ae.Uint32(unix.NFTA_SET_FLAGS, unix.NFT_SET_MAP)
				ae.Uint32(unix.NFTA_SET_KEY_TYPE, o.set.KeyType.GetNFTMagic())
				ae.Uint32(unix.NFTA_SET_KEY_LEN, o.set.KeyType.Bytes)
				ae.Uint32(unix.NFTA_SET_ID, id)
				ae.Uint32(unix.NFTA_SET_DATA_TYPE, dataType(o.set.DataType))
				ae.Uint32(unix.NFTA_SET_DATA_LEN, o.set.DataType.Bytes)
			})
		case opFlushMap:
			err = b.Msg(fam, unix.NFT_MSG_DELSETELEM, 0, "flush map "+string(o.set.Name), func(ae *netlink.AttributeEncoder) {
				ae.String(unix.NFTA_SET_TABLE, tn)
				ae.String(unix.NFTA_SET_NAME, string(o.set.Name))
			})
		case opAddElements:
			els := make([]nft.SetElement, len(o.elements))
			for i, e := range o.elements {
				els[i] = nft.SetElement{Key: e.Key, Val: e.Val, Comment: e.Comment}
			}
			b.Elements(fam, tn, string(o.set.Name), false, false, els)
		default:
			err = o.encodeSet(b, fam, tn)
		}
		if err != nil {
			return fmt.Errorf("nftables: %w", err)
		}
	}
	return nil
}

// encodeSet appends the messages of an operation on a Set or a limit
// object. A Set added in the transaction gets an ID from SetIDs, but the
// lookups of it are not given it (the main table's rules name its sets;
// the kernel finds a set added in the same transaction by name).
func (o *op) encodeSet(b *Batch, fam uint8, tn string) error {
	name := string(o.spec.Name)
	switch o.kind {
	case opAddSet:
		return b.Msg(fam, unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, "add set "+name, func(ae *netlink.AttributeEncoder) {
			setAttrs(ae, tn, o.spec, SetIDs.Add(1)+1<<20)
		})
	case opFlushSet, opDeleteSet:
		typ, what := uint16(unix.NFT_MSG_DELSETELEM), "flush set "
		if o.kind == opDeleteSet {
			typ, what = unix.NFT_MSG_DELSET, "delete set "
		}
		return b.Msg(fam, typ, 0, what+name, func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_SET_TABLE, tn)
			ae.String(unix.NFTA_SET_NAME, name)
		})
	case opAddSetElements:
		b.Elements(fam, tn, name, false, o.excl, o.elems)
	case opDeleteSetElements:
		b.Elements(fam, tn, name, true, false, o.elems)
	case opAddElementUserData:
		e := o.elems[0]
		if len(e.Comment)+1 > 255 || len(e.Comment)+3+len(o.userData) > 0xffff-8 {
			return fmt.Errorf("add element to %s: user data of %d bytes and a comment of %d: too long", name, len(o.userData), len(e.Comment))
		}
		b.ElementUserData(fam, tn, name, e.Key, append(userdata.AppendString(nil, userdata.TypeComment, e.Comment), o.userData...))
	case opAddLimit:
		return b.Msg(fam, unix.NFT_MSG_NEWOBJ, unix.NLM_F_CREATE, "add limit "+o.object, func(ae *netlink.AttributeEncoder) {
			limitAttrs(ae, fam, tn, o.object, &o.limit)
		})
	case opDeleteLimit:
		return b.Msg(fam, unix.NFT_MSG_DELOBJ, 0, "delete limit "+o.object, func(ae *netlink.AttributeEncoder) {
			limitAttrs(ae, fam, tn, o.object, nil)
		})
	default:
		return fmt.Errorf("unknown operation %d on %s", o.kind, o.table)
	}
	return nil
}

// tableMsgs are the message type, flags and text of each table operation.
var tableMsgs = map[opKind]struct {
	typ, flags uint16
	what       string
}{
	opAddTable:    {unix.NFT_MSG_NEWTABLE, unix.NLM_F_CREATE, "add table"},
	opCreateTable: {unix.NFT_MSG_NEWTABLE, unix.NLM_F_EXCL, "create table"},
	opDeleteTable: {unix.NFT_MSG_DELTABLE, 0, "delete table"},
}

// SetIDs numbers the sets this process creates in a Batch (one counter for
// every table), instead of google/nftables' unsynchronized global one.
var SetIDs atomic.Uint32

// dataType is a map's NFTA_SET_DATA_TYPE: a verdict map's is
// NFT_DATA_VERDICT, not the datatype's magic.
func dataType(t nft.SetDatatype) uint32 {
	if t.Name == nft.TypeVerdict.Name {
		return unix.NFT_DATA_VERDICT
	}
	return t.GetNFTMagic()
}

// ChainAttrs encodes chain c of table; a base chain with its hook and
// type.
func ChainAttrs(ae *netlink.AttributeEncoder, table string, c Chain) {
	ae.String(unix.NFTA_CHAIN_TABLE, table)
	ae.String(unix.NFTA_CHAIN_NAME, string(c.Name))
	if c.Hook == nil || c.Priority == nil {
		return
	}
	ae.Nested(unix.NFTA_CHAIN_HOOK, func(h *netlink.AttributeEncoder) error {
		h.Uint32(unix.NFTA_HOOK_HOOKNUM, uint32(*c.Hook))
		h.Uint32(unix.NFTA_HOOK_PRIORITY, uint32(*c.Priority))
		return nil
	})
	ae.String(unix.NFTA_CHAIN_TYPE, string(c.Type))
}

// withSetID returns e, a lookup of a map added in this transaction (ids,
// by table and name) given the map's ID; any other e as it is.
func withSetID(e expr.Any, table string, ids map[string]uint32) expr.Any {
	l, ok := e.(*expr.Lookup)
	if !ok {
		return e
	}
	id, ok := ids[table+" "+l.SetName]
	if !ok || l.SetID == id {
		return e
	}
	c := *l
	c.SetID = id
	return &c
}
