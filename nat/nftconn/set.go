package nftconn

import (
	"encoding/binary"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// SetName is the name of a set or map added with AddSet.
type SetName string

// Set is a set's or map's spec, as the main table (nat/nftables) lays
// them out: its key type, a concatenation of several types (Concat) or
// one, and for a map its data type. Unlike AddMap's, a Set's key byte
// order goes into the set's user data (nft lists a mark key in host
// order), and its elements carry no text: they are rendered from these
// types when the transaction is shown.
type Set struct {
	Name   SetName
	Key    nft.SetDatatype
	Data   nft.SetDatatype // no Name: a plain set
	Concat bool
}

// IsMap says whether s is a map (it has a data type).
func (s Set) IsMap() bool { return s.Data.Name != "" }

// word is how nft commands call s: set or map.
func (s Set) word() string {
	if s.IsMap() {
		return "map"
	}
	return "set"
}

// AddSet adds set s to t; a set that exists keeps its elements.
func (tx *Tx) AddSet(t Table, s Set) { tx.ops = append(tx.ops, op{kind: opAddSet, table: t, spec: s}) }

// FlushSet deletes every element of set s; the transaction fails if the
// set does not exist. s's types say how it is shown (flush set or map).
func (tx *Tx) FlushSet(t Table, s Set) {
	tx.ops = append(tx.ops, op{kind: opFlushSet, table: t, spec: s})
}

// DeleteSet deletes set s and its elements; the transaction fails if it
// does not exist or a rule refers to it.
func (tx *Tx) DeleteSet(t Table, s Set) {
	tx.ops = append(tx.ops, op{kind: opDeleteSet, table: t, spec: s})
}

// AddSetElements adds es to set s (added earlier in the transaction, or
// one that exists). Without excl an element whose key is there with the
// same value is kept (another value fails the transaction, EBUSY); with
// excl any element whose key is there fails it (EEXIST; nft's `create
// element`). tx keeps es as it is, without a copy (a bulk Sync adds
// 200,000): the caller leaves it unchanged until tx is sent. No elements,
// no operation.
func (tx *Tx) AddSetElements(t Table, s Set, es []nft.SetElement, excl bool) {
	if len(es) > 0 {
		tx.ops = append(tx.ops, op{kind: opAddSetElements, table: t, spec: s, elems: es, excl: excl})
	}
}

// DeleteSetElements deletes the elements of set s with es's keys (values
// are not sent); the transaction fails if one is not there. tx keeps es
// as AddSetElements does.
func (tx *Tx) DeleteSetElements(t Table, s Set, es []nft.SetElement) {
	if len(es) > 0 {
		tx.ops = append(tx.ops, op{kind: opDeleteSetElements, table: t, spec: s, elems: es})
	}
}

// AddElementUserData adds one element with key to set s whose user data is
// the comment TLV of comment (nft lists it) followed by extra, TLVs of the
// caller's own types (nft shows none of them); note says what extra
// holds, after a # in the transaction's text. The main table's generation
// stamp on natgw_meta is one.
func (tx *Tx) AddElementUserData(t Table, s Set, key []byte, comment string, extra []byte, note string) {
	tx.ops = append(tx.ops, op{kind: opAddElementUserData, table: t, spec: s,
		elems: []nft.SetElement{{Key: key, Comment: comment}}, userData: extra, note: note})
}

// AddLimit adds the named limit object name to t with l's rate, burst and
// over flag (nft's `add limit`); the transaction fails if it exists.
func (tx *Tx) AddLimit(t Table, name string, l expr.Limit) {
	tx.ops = append(tx.ops, op{kind: opAddLimit, table: t, object: name, limit: l})
}

// DeleteLimit deletes the limit object name of t; the transaction fails if
// it does not exist or a rule refers to it.
func (tx *Tx) DeleteLimit(t Table, name string) {
	tx.ops = append(tx.ops, op{kind: opDeleteLimit, table: t, object: name})
}

// nftSetConcat is NFTA_SET_FLAGS' NFT_SET_CONCAT (not in x/sys/unix).
const nftSetConcat = 0x80

// nftaSetDescConcat is NFTA_SET_DESC_CONCAT (not in x/sys/unix).
const nftaSetDescConcat = 2

// nested encodes attrs as the payload of an attribute.
func nested(attrs func(*netlink.AttributeEncoder)) func() ([]byte, error) {
	return func() ([]byte, error) {
		ae := netlink.NewAttributeEncoder()
		ae.ByteOrder = binary.BigEndian
		attrs(ae)
		return ae.Encode()
	}
}

// setAttrs encodes set s of table, numbered id, as google/nftables' AddSet
// does (with the key byte order and, for a concatenation, the field
// lengths).
func setAttrs(ae *netlink.AttributeEncoder, table string, s Set, id uint32) {
	var flags uint32
	if s.IsMap() {
		flags |= unix.NFT_SET_MAP
	}
	if s.Concat {
		flags |= nftSetConcat
	}
	ae.String(unix.NFTA_SET_TABLE, table)
	ae.String(unix.NFTA_SET_NAME, string(s.Name))
	ae.Uint32(unix.NFTA_SET_FLAGS, flags)
	ae.Uint32(unix.NFTA_SET_KEY_TYPE, s.Key.GetNFTMagic())
	ae.Uint32(unix.NFTA_SET_KEY_LEN, s.Key.Bytes)
	ae.Uint32(unix.NFTA_SET_ID, id)
	if s.IsMap() {
		ae.Uint32(unix.NFTA_SET_DATA_TYPE, dataType(s.Data))
		ae.Uint32(unix.NFTA_SET_DATA_LEN, s.Data.Bytes)
	}
	if s.Concat {
		// The length of each field of the key (the kernel needs them to
		// walk a concatenation; nft needs them to list the set).
		ae.Do(unix.NLA_F_NESTED|unix.NFTA_SET_DESC, nested(func(desc *netlink.AttributeEncoder) {
			desc.Do(unix.NLA_F_NESTED|nftaSetDescConcat, nested(func(cat *netlink.AttributeEncoder) {
				for _, f := range nft.ConcatSetTypeElements(s.Key) {
					cat.Do(unix.NFTA_SET_DESC_SIZE, nested(func(v *netlink.AttributeEncoder) {
						v.Uint32(unix.NFTA_DATA_VALUE, f.Bytes)
					}))
				}
			}))
		}))
	}
	// The key's byte order, for nft's listing (1 host, 2 network).
	order := uint32(2)
	if s.Key.Name == nft.TypeMark.Name {
		order = 1
	}
	ae.Bytes(unix.NFTA_SET_USERDATA, userdata.AppendUint32(nil, userdata.NFTNL_UDATA_SET_KEYBYTEORDER, order))
}

// limitAttrs encodes limit object name of table (family fam); l nil for
// a delete.
func limitAttrs(ae *netlink.AttributeEncoder, fam uint8, table, name string, l *expr.Limit) {
	ae.String(unix.NFTA_OBJ_TABLE, table)
	ae.String(unix.NFTA_OBJ_NAME, name)
	ae.Uint32(unix.NFTA_OBJ_TYPE, uint32(nft.ObjTypeLimit))
	if l == nil {
		ae.Do(unix.NLA_F_NESTED|unix.NFTA_OBJ_DATA, func() ([]byte, error) { return nil, nil })
		return
	}
	ae.Do(unix.NLA_F_NESTED|unix.NFTA_OBJ_DATA, func() ([]byte, error) { return expr.MarshalExprData(fam, l) })
}

// ElementUserData appends a NEWSETELEM message adding one element with key
// to set of table (of family) whose user data is ud, written straight into
// the buffer as Elements does.
func (b *Batch) ElementUserData(family uint8, table, set string, key, ud []byte) {
	start := b.Header(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSETELEM, unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE, family, 0)
	b.AttrStr(unix.NFTA_SET_ELEM_LIST_TABLE, table)
	b.AttrStr(unix.NFTA_SET_ELEM_LIST_SET, set)
	list := b.Nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	el := b.Nest(unix.NFTA_LIST_ELEM)
	k := b.Nest(unix.NFTA_SET_ELEM_KEY)
	b.Attr(unix.NFTA_DATA_VALUE, key)
	b.End(k)
	b.Attr(unix.NFTA_SET_ELEM_USERDATA, ud)
	b.End(el)
	b.End(list)
	b.Finish(start)
	b.Acked(start, "add element to "+set)
}
