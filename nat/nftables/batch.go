package nftables

import (
	"encoding/binary"

	nft "github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/nftconn"
)

// txn is one transaction of natgw's table being encoded: an nftconn.Batch
// (one netlink batch in one buffer) and whether it stores the generation.
type txn struct {
	*nftconn.Batch
	stamped bool // holds the natgw_meta element (see stamp)
}

// newTxn starts a batch whose messages are numbered from seq; size is a
// hint of the bytes it will hold (tests and benchmarks; the transport
// starts its batches on its socket).
func newTxn(seq uint32, size int, buf []byte) *txn {
	return &txn{Batch: nftconn.NewBatch(seq, size, buf)}
}

// elements appends NEWSETELEM (or, with del, DELSETELEM) messages for es
// in set of natgw's table (see nftconn.Batch.Elements).
func (t *txn) elements(del, excl bool, set string, es []nft.SetElement) {
	t.Elements(nfFamily, tableName, set, del, excl, es)
}

// stamp flushes natgw_meta and adds its element again with comment and the
// generation gen in userdata (see udataGen), and the index snapshot id
// snap unless 0 (see udataSnap). A flush, not a delete, so that it works
// even if the element was deleted by hand.
func (t *txn) stamp(comment string, gen uint32, snap uint64) {
	start := t.Header(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_DELSETELEM, unix.NLM_F_REQUEST|unix.NLM_F_ACK, nfFamily, 0)
	t.AttrStr(unix.NFTA_SET_ELEM_LIST_TABLE, tableName)
	t.AttrStr(unix.NFTA_SET_ELEM_LIST_SET, setMeta)
	t.Finish(start)
	t.Acked(start, "flush "+setMeta)
	start = t.Header(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSETELEM, unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE, nfFamily, 0)
	t.AttrStr(unix.NFTA_SET_ELEM_LIST_TABLE, tableName)
	t.AttrStr(unix.NFTA_SET_ELEM_LIST_SET, setMeta)
	list := t.Nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	el := t.Nest(unix.NFTA_LIST_ELEM)
	k := t.Nest(unix.NFTA_SET_ELEM_KEY)
	t.Attr(unix.NFTA_DATA_VALUE, metaKey)
	t.End(k)
	ud := append([]byte{0 /* comment */, byte(len(comment) + 1)}, comment...)
	ud = append(ud, 0, udataGen, 4)
	ud = binary.BigEndian.AppendUint32(ud, gen)
	if snap != 0 {
		ud = append(ud, udataSnap, 8)
		ud = binary.BigEndian.AppendUint64(ud, snap)
	}
	t.Attr(unix.NFTA_SET_ELEM_USERDATA, ud)
	t.End(el)
	t.End(list)
	t.Finish(start)
	t.Acked(start, "add element to "+setMeta)
	t.stamped = true
}
