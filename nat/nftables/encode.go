package nftables

import (
	"encoding/binary"
	"fmt"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/nftconn"
)

// encode appends the netlink messages of tx to the batch. Structural
// messages (table, sets, chains, rules, limit objects) are built with
// mdlayher/netlink's attribute encoder and google/nftables' public
// expression marshaller, in the same bytes as google/nftables' Conn would
// send (TestEncodeMatchesLibrary). Element messages, the bulk of a large
// transaction, are appended by txn.elements and txn.stamp straight into the
// batch buffer (see txn.elements for the measured gain).
func (t *txn) encode(tx *Tx) error {
	for i := range tx.ops {
		o := &tx.ops[i]
		var err error
		switch o.kind {
		case opCreateTable:
			err = t.msg(unix.NFT_MSG_NEWTABLE, unix.NLM_F_EXCL, "create table", tableAttrs)
		case opDeleteTable:
			err = t.msg(unix.NFT_MSG_DELTABLE, 0, "delete table", tableAttrs)
		case opDeleteLegacyTable:
			err = t.msgOf(unix.AF_INET, unix.NFT_MSG_DELTABLE, 0, "delete table ip "+tableName, tableAttrs)
		case opAddSet:
			err = t.msg(unix.NFT_MSG_NEWSET, unix.NLM_F_CREATE, "add set "+o.name, func(ae *netlink.AttributeEncoder) { setAttrs(ae, o.set) })
		case opAddChain:
			err = t.msg(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_CREATE, "add chain "+o.name, func(ae *netlink.AttributeEncoder) { chainAttrs(ae, o.chain) })
		case opFlushSet, opDeleteSet, opFlushChain, opDeleteChain:
			n := byName[o.kind]
			err = t.msg(n.typ, 0, n.what+" "+o.name, func(ae *netlink.AttributeEncoder) {
				ae.String(n.tableAttr, tableName)
				ae.String(n.nameAttr, o.name)
			})
		case opAddRule:
			err = t.msg(unix.NFT_MSG_NEWRULE, unix.NLM_F_CREATE|unix.NLM_F_ECHO|unix.NLM_F_APPEND, "add rule to "+o.name,
				func(ae *netlink.AttributeEncoder) { ruleAttrs(ae, o.name, o.rule) })
		case opAddLimit:
			err = t.msg(unix.NFT_MSG_NEWOBJ, unix.NLM_F_CREATE, "add limit "+o.name, func(ae *netlink.AttributeEncoder) { limitAttrs(ae, o.name, &o.limit) })
		case opDeleteLimit:
			err = t.msg(unix.NFT_MSG_DELOBJ, 0, "delete limit "+o.name, func(ae *netlink.AttributeEncoder) { limitAttrs(ae, o.name, nil) })
		case opAddElements:
			t.elements(false, o.excl, o.name, o.elems)
		case opDeleteElements:
			t.elements(true, false, o.name, o.elems)
		case opStamp:
			t.stamp(o.comment, o.gen, o.snap)
		default:
			err = fmt.Errorf("unknown operation %d on %q", o.kind, o.name)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// msg appends one acknowledged nf_tables message of natgw's table's
// family (see nftconn.Batch.Msg).
func (t *txn) msg(typ, flags uint16, what string, attrs func(*netlink.AttributeEncoder)) error {
	return t.Msg(nfFamily, typ, flags, what, attrs)
}

// msgOf is msg for a message of another family than the table's (the
// delete of the legacy table ip natgw).
func (t *txn) msgOf(family uint8, typ, flags uint16, what string, attrs func(*netlink.AttributeEncoder)) error {
	return t.Msg(family, typ, flags, what, attrs)
}

func tableAttrs(ae *netlink.AttributeEncoder) {
	ae.String(unix.NFTA_TABLE_NAME, tableName)
	ae.Uint32(unix.NFTA_TABLE_FLAGS, 0)
}

// byName are the operations that are one message naming a set or chain.
var byName = map[opKind]struct {
	typ                 uint16
	what                string
	tableAttr, nameAttr uint16
}{
	opFlushSet:    {unix.NFT_MSG_DELSETELEM, "flush set", unix.NFTA_SET_TABLE, unix.NFTA_SET_NAME},
	opDeleteSet:   {unix.NFT_MSG_DELSET, "delete set", unix.NFTA_SET_TABLE, unix.NFTA_SET_NAME},
	opFlushChain:  {unix.NFT_MSG_DELRULE, "flush chain", unix.NFTA_RULE_TABLE, unix.NFTA_RULE_CHAIN},
	opDeleteChain: {unix.NFT_MSG_DELCHAIN, "delete chain", unix.NFTA_CHAIN_TABLE, unix.NFTA_CHAIN_NAME},
}

// nested encodes attrs as the payload of an attribute.
func nested(attrs func(*netlink.AttributeEncoder)) func() ([]byte, error) {
	return func() ([]byte, error) {
		ae := netlink.NewAttributeEncoder()
		ae.ByteOrder = binary.BigEndian
		attrs(ae)
		return ae.Encode()
	}
}

// nftSetConcat is NFTA_SET_FLAGS' NFT_SET_CONCAT (not in x/sys/unix).
const nftSetConcat = 0x80

// nftaSetDescConcat is NFTA_SET_DESC_CONCAT (not in x/sys/unix).
const nftaSetDescConcat = 2

// setAttrs encodes a set or map of the table.
func setAttrs(ae *netlink.AttributeEncoder, s setSpec) {
	var flags uint32
	if s.isMap() {
		flags |= unix.NFT_SET_MAP
	}
	if s.concat {
		flags |= nftSetConcat
	}
	ae.String(unix.NFTA_SET_TABLE, tableName)
	ae.String(unix.NFTA_SET_NAME, s.name)
	ae.Uint32(unix.NFTA_SET_FLAGS, flags)
	ae.Uint32(unix.NFTA_SET_KEY_TYPE, s.key.GetNFTMagic())
	ae.Uint32(unix.NFTA_SET_KEY_LEN, s.key.Bytes)
	ae.Uint32(unix.NFTA_SET_ID, nftconn.SetIDs.Add(1)+1<<20)
	if s.isMap() {
		dt := s.val.GetNFTMagic()
		if s.val.Name == nft.TypeVerdict.Name {
			dt = unix.NFT_DATA_VERDICT
		}
		ae.Uint32(unix.NFTA_SET_DATA_TYPE, dt)
		ae.Uint32(unix.NFTA_SET_DATA_LEN, s.val.Bytes)
	}
	if s.concat {
		// The length of each field of the key (the kernel needs them to
		// walk a concatenation; nft needs them to list the set).
		ae.Do(unix.NLA_F_NESTED|unix.NFTA_SET_DESC, nested(func(desc *netlink.AttributeEncoder) {
			desc.Do(unix.NLA_F_NESTED|nftaSetDescConcat, nested(func(cat *netlink.AttributeEncoder) {
				for _, f := range nft.ConcatSetTypeElements(s.key) {
					cat.Do(unix.NFTA_SET_DESC_SIZE, nested(func(v *netlink.AttributeEncoder) {
						v.Uint32(unix.NFTA_DATA_VALUE, f.Bytes)
					}))
				}
			}))
		}))
	}
	// The key's byte order, for nft's listing (1 host, 2 network).
	order := uint32(2)
	if s.key.Name == nft.TypeMark.Name {
		order = 1
	}
	ae.Bytes(unix.NFTA_SET_USERDATA, userdata.AppendUint32(nil, userdata.NFTNL_UDATA_SET_KEYBYTEORDER, order))
}

// chainAttrs encodes a chain of the table (see nftconn.ChainAttrs).
func chainAttrs(ae *netlink.AttributeEncoder, c chainSpec) {
	nftconn.ChainAttrs(ae, tableName, c.conn())
}

// ruleAttrs encodes a rule appended to chain, its comment in userdata.
func ruleAttrs(ae *netlink.AttributeEncoder, chain string, r ruleSpec) {
	ae.String(unix.NFTA_RULE_TABLE, tableName)
	ae.String(unix.NFTA_RULE_CHAIN, chain)
	ae.Nested(unix.NFTA_RULE_EXPRESSIONS, func(list *netlink.AttributeEncoder) error {
		for _, e := range r.exprs {
			list.Do(unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM, func() ([]byte, error) { return expr.Marshal(nfFamily, e) })
		}
		return nil
	})
	ae.Bytes(unix.NFTA_RULE_USERDATA, userdata.AppendString(nil, userdata.TypeComment, r.comment))
}

// limitAttrs encodes a named limit object; v nil for a delete.
func limitAttrs(ae *netlink.AttributeEncoder, name string, v *qosVal) {
	ae.String(unix.NFTA_OBJ_TABLE, tableName)
	ae.String(unix.NFTA_OBJ_NAME, name)
	ae.Uint32(unix.NFTA_OBJ_TYPE, uint32(nft.ObjTypeLimit))
	if v == nil {
		ae.Do(unix.NLA_F_NESTED|unix.NFTA_OBJ_DATA, func() ([]byte, error) { return nil, nil })
		return
	}
	ae.Do(unix.NLA_F_NESTED|unix.NFTA_OBJ_DATA, func() ([]byte, error) { return expr.MarshalExprData(nfFamily, limitExpr(*v)) })
}
