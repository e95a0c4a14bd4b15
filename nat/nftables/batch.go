package nftables

import (
	"encoding/binary"

	nft "github.com/google/nftables"
	"golang.org/x/sys/unix"
)

// txn is one transaction being encoded: one netlink batch in one buffer
// (see encode.go).
type txn struct {
	buf     []byte
	seq     uint32   // sequence number of the next message
	base    uint32   // sequence number of the first message
	what    []string // what each message does, by seq-base (for errors)
	start   []int    // where each message starts in buf, by seq-base
	stamped bool     // holds the natgw_meta element (see stamp)
}

// nlHdrLen is the size of a netlink message header plus nfgenmsg.
const nlHdrLen = unix.SizeofNlMsghdr + 4

// newTxn starts a batch whose messages are numbered from seq; size is a
// hint of the bytes it will hold. The batch is built in buf if it has room
// (see Backend.txBuf).
func newTxn(seq uint32, size int, buf []byte) *txn {
	if cap(buf) < size+2*nlHdrLen {
		buf = make([]byte, 0, size+2*nlHdrLen)
	}
	t := &txn{buf: buf[:0], seq: seq}
	t.control(unix.NFNL_MSG_BATCH_BEGIN) // seq: base-1
	t.seq++
	t.base = t.seq
	return t
}

// control appends a batch begin/end message (not acknowledged).
func (t *txn) control(typ uint16) {
	start := t.header(typ, unix.NLM_F_REQUEST, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	t.finish(start)
}

// header appends a message header and nfgenmsg, returning the message start.
func (t *txn) header(typ, flags uint16, family uint8, resID uint16) int {
	start := len(t.buf)
	t.buf = binary.NativeEndian.AppendUint32(t.buf, 0) // length, set by finish
	t.buf = binary.NativeEndian.AppendUint16(t.buf, typ)
	t.buf = binary.NativeEndian.AppendUint16(t.buf, flags)
	t.buf = binary.NativeEndian.AppendUint32(t.buf, t.seq)
	t.buf = binary.NativeEndian.AppendUint32(t.buf, 0) // port id
	t.buf = append(t.buf, family, unix.NFNETLINK_V0)
	t.buf = binary.BigEndian.AppendUint16(t.buf, resID)
	return start
}

func (t *txn) finish(start int) {
	binary.NativeEndian.PutUint32(t.buf[start:], uint32(len(t.buf)-start))
}

// acked counts one message of the transaction, which starts at start in
// t.buf and was encoded with NLM_F_ACK (close keeps the flag on the last
// one only).
func (t *txn) acked(start int, what string) {
	t.what = append(t.what, what)
	t.start = append(t.start, start)
	t.seq++
}

func pad(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// attr appends one attribute.
func (t *txn) attr(typ uint16, v []byte) {
	t.buf = binary.NativeEndian.AppendUint16(t.buf, uint16(4+len(v)))
	t.buf = binary.NativeEndian.AppendUint16(t.buf, typ)
	t.buf = pad(append(t.buf, v...))
}

// attrStr appends a NUL-terminated string attribute.
func (t *txn) attrStr(typ uint16, s string) {
	t.buf = binary.NativeEndian.AppendUint16(t.buf, uint16(4+len(s)+1))
	t.buf = binary.NativeEndian.AppendUint16(t.buf, typ)
	t.buf = append(t.buf, s...)
	t.buf = pad(append(t.buf, 0))
}

// nest opens a nested attribute; end closes it.
func (t *txn) nest(typ uint16) int {
	start := len(t.buf)
	t.buf = binary.NativeEndian.AppendUint32(t.buf, 0)
	binary.NativeEndian.PutUint16(t.buf[start+2:], typ|unix.NLA_F_NESTED)
	return start
}

func (t *txn) end(start int) {
	binary.NativeEndian.PutUint16(t.buf[start:], uint16(len(t.buf)-start))
}

// elements appends NEWSETELEM (or, with del, DELSETELEM: keys only)
// messages for es in set, as many elements per message as fit (see
// chunks); with excl, adding an element whose key exists is an error.
//
// A measured fast path: it writes the attributes straight into the batch
// buffer. BenchmarkEncodeElements, 200,000 elements (100,000 FIPs), median
// of 3 runs on the 2-CPU bench VM: 50 ms, 16 MB (the batch itself) and 37
// allocations here, against 766 ms, 201 MB and 2.8 million allocations for
// the same messages built with mdlayher/netlink's attribute encoder (15x
// faster, 12x less memory).
func (t *txn) elements(del, excl bool, set string, es []nft.SetElement) {
	typ, flags, what := uint16(unix.NFT_MSG_NEWSETELEM), uint16(unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE), "add elements to "+set
	if excl {
		flags |= unix.NLM_F_EXCL
	}
	if del {
		typ, flags, what = unix.NFT_MSG_DELSETELEM, unix.NLM_F_REQUEST|unix.NLM_F_ACK, "delete elements of "+set
	}
	for _, part := range chunks(es) {
		start := t.header(unix.NFNL_SUBSYS_NFTABLES<<8|typ, flags, nfFamily, 0)
		t.attrStr(unix.NFTA_SET_ELEM_LIST_TABLE, tableName)
		t.attrStr(unix.NFTA_SET_ELEM_LIST_SET, set)
		list := t.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		for _, e := range part {
			t.element(e, del)
		}
		t.end(list)
		t.finish(start)
		t.acked(start, what)
	}
}

// stamp flushes natgw_meta and adds its element again with comment and the
// generation gen in userdata (see udataGen). A flush, not a delete, so
// that it works even if the element was deleted by hand.
func (t *txn) stamp(comment string, gen uint32) {
	start := t.header(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_DELSETELEM, unix.NLM_F_REQUEST|unix.NLM_F_ACK, nfFamily, 0)
	t.attrStr(unix.NFTA_SET_ELEM_LIST_TABLE, tableName)
	t.attrStr(unix.NFTA_SET_ELEM_LIST_SET, setMeta)
	t.finish(start)
	t.acked(start, "flush "+setMeta)
	start = t.header(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSETELEM, unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE, nfFamily, 0)
	t.attrStr(unix.NFTA_SET_ELEM_LIST_TABLE, tableName)
	t.attrStr(unix.NFTA_SET_ELEM_LIST_SET, setMeta)
	list := t.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
	el := t.nest(unix.NFTA_LIST_ELEM)
	k := t.nest(unix.NFTA_SET_ELEM_KEY)
	t.attr(unix.NFTA_DATA_VALUE, metaKey)
	t.end(k)
	ud := append([]byte{0 /* comment */, byte(len(comment) + 1)}, comment...)
	ud = append(ud, 0, udataGen, 4)
	ud = binary.BigEndian.AppendUint32(ud, gen)
	t.attr(unix.NFTA_SET_ELEM_USERDATA, ud)
	t.end(el)
	t.end(list)
	t.finish(start)
	t.acked(start, "add element to "+setMeta)
	t.stamped = true
}

// element appends one NFTA_LIST_ELEM.
func (t *txn) element(e nft.SetElement, keyOnly bool) {
	el := t.nest(unix.NFTA_LIST_ELEM)
	k := t.nest(unix.NFTA_SET_ELEM_KEY)
	t.attr(unix.NFTA_DATA_VALUE, e.Key)
	t.end(k)
	if !keyOnly {
		switch {
		case e.VerdictData != nil:
			d := t.nest(unix.NFTA_SET_ELEM_DATA)
			v := t.nest(unix.NFTA_DATA_VERDICT)
			t.attr(unix.NFTA_VERDICT_CODE, binary.BigEndian.AppendUint32(nil, uint32(e.VerdictData.Kind)))
			if e.VerdictData.Chain != "" {
				t.attrStr(unix.NFTA_VERDICT_CHAIN, e.VerdictData.Chain)
			}
			t.end(v)
			t.end(d)
		case len(e.Val) > 0:
			d := t.nest(unix.NFTA_SET_ELEM_DATA)
			t.attr(unix.NFTA_DATA_VALUE, e.Val)
			t.end(d)
		}
		if e.Comment != "" {
			// userdata: one comment TLV (type, length incl. NUL, text, NUL).
			t.buf = binary.NativeEndian.AppendUint16(t.buf, uint16(4+2+len(e.Comment)+1))
			t.buf = binary.NativeEndian.AppendUint16(t.buf, unix.NFTA_SET_ELEM_USERDATA)
			t.buf = append(t.buf, 0 /* NFTNL_UDATA_SET_ELEM_COMMENT */, byte(len(e.Comment)+1))
			t.buf = append(t.buf, e.Comment...)
			t.buf = pad(append(t.buf, 0))
		}
	}
	t.end(el)
}

// close ends the batch; it returns the number of messages in it (batch
// begin and end not counted). Only the last message keeps NLM_F_ACK: the
// kernel reports an error for every message that fails whether it asked for
// an ack or not, and it processes the whole batch before it answers, in
// message order, so the last message's answer ends the kernel's reply. One
// ack instead of one per message saves a read per message, and a bulk
// transaction cannot overrun the receive buffer with acks: kept for the
// latter, which TestTinyReceiveBuffer proves (acks of an applied batch can
// no longer be lost), more than for the reads saved.
func (t *txn) close() int {
	for _, start := range t.start[:max(len(t.start)-1, 0)] {
		flags := t.buf[start+6 : start+8]
		binary.NativeEndian.PutUint16(flags, binary.NativeEndian.Uint16(flags)&^unix.NLM_F_ACK)
	}
	t.control(unix.NFNL_MSG_BATCH_END)
	return int(t.seq - t.base)
}
