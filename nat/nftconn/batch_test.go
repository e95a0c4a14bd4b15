package nftconn

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// appendElement is the attribute by attribute encoding of one element
// (Nest, Attr, AttrStr, End) that Batch.element replaced with one write
// of the element's exact length: the reference it must match.
func appendElement(b *Batch, e nft.SetElement, keyOnly bool) {
	el := b.Nest(unix.NFTA_LIST_ELEM)
	k := b.Nest(unix.NFTA_SET_ELEM_KEY)
	b.Attr(unix.NFTA_DATA_VALUE, e.Key)
	b.End(k)
	if !keyOnly {
		switch {
		case e.VerdictData != nil:
			d := b.Nest(unix.NFTA_SET_ELEM_DATA)
			v := b.Nest(unix.NFTA_DATA_VERDICT)
			b.Attr(unix.NFTA_VERDICT_CODE, binary.BigEndian.AppendUint32(nil, uint32(e.VerdictData.Kind)))
			if e.VerdictData.Chain != "" {
				b.AttrStr(unix.NFTA_VERDICT_CHAIN, e.VerdictData.Chain)
			}
			b.End(v)
			b.End(d)
		case len(e.Val) > 0:
			d := b.Nest(unix.NFTA_SET_ELEM_DATA)
			b.Attr(unix.NFTA_DATA_VALUE, e.Val)
			b.End(d)
		}
		if e.Comment != "" {
			// google/nftables' own comment TLV, the one the rules use.
			b.Attr(unix.NFTA_SET_ELEM_USERDATA, userdata.AppendString(nil, userdata.TypeComment, e.Comment))
		}
	}
	b.End(el)
}

// TestElementBytes: Batch.element writes the bytes of the attribute by
// attribute encoding (appendElement) for keys, values, verdicts with and
// without a chain and comments of every length modulo 4, keys only or
// whole, and zeroes its padding in a reused buffer full of garbage; and
// Elements splits messages as Chunks does and ElemSize bounds each
// element.
func TestElementBytes(t *testing.T) {
	var es []nft.SetElement
	for kl := 1; kl <= 33; kl += 3 {
		key := bytes.Repeat([]byte{byte(kl)}, kl)
		for cl := 0; cl <= 9; cl++ {
			c := strings.Repeat("c", cl)
			es = append(es,
				nft.SetElement{Key: key, Comment: c},
				nft.SetElement{Key: key, Val: bytes.Repeat([]byte{7}, 1+kl%5), Comment: c},
				nft.SetElement{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "qos_in_" + c}, Comment: c},
				nft.SetElement{Key: key, VerdictData: &expr.Verdict{Kind: expr.VerdictAccept}, Comment: c},
			)
		}
	}
	garbage := bytes.Repeat([]byte{0xa5}, 1<<16)
	for _, keyOnly := range []bool{false, true} {
		for _, e := range es {
			want := NewBatch(1, 0, nil)
			appendElement(want, e, keyOnly)
			got := NewBatch(1, 0, garbage[:0:len(garbage)])
			got.element(&e, keyOnly)
			if !bytes.Equal(got.Bytes(), want.Bytes()) {
				t.Fatalf("element %+v (keys only %v):\n got  %x\n want %x", e, keyOnly, got.Bytes(), want.Bytes())
			}
			if n := len(want.Bytes()) - NlHdrLen; n != elemLen(&e, keyOnly) || n > ElemSize(e) {
				t.Fatalf("element %+v: %d bytes, elemLen %d, ElemSize %d", e, n, elemLen(&e, keyOnly), ElemSize(e))
			}
		}
	}
	// Messages: as many as Chunks makes, each with its chunk's elements.
	var many []nft.SetElement
	for i := range 5000 {
		many = append(many, es[i%len(es)])
	}
	b := NewBatch(1, 0, nil)
	b.Elements(unix.NFPROTO_INET, "t", "s", false, false, many)
	if got, want := b.Len(), len(Chunks(many)); got != want || want < 2 {
		t.Fatalf("%d messages, Chunks makes %d", got, want)
	}
	ref := NewBatch(1, 0, nil)
	for _, part := range Chunks(many) {
		start := ref.Header(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSETELEM, unix.NLM_F_REQUEST|unix.NLM_F_ACK|unix.NLM_F_CREATE, unix.NFPROTO_INET, 0)
		ref.AttrStr(unix.NFTA_SET_ELEM_LIST_TABLE, "t")
		ref.AttrStr(unix.NFTA_SET_ELEM_LIST_SET, "s")
		list := ref.Nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
		for _, e := range part {
			appendElement(ref, e, false)
		}
		ref.End(list)
		ref.Finish(start)
		ref.Acked(start, "add elements to s")
	}
	if !bytes.Equal(b.Bytes(), ref.Bytes()) {
		t.Fatal("Elements' messages differ from the chunk by chunk reference")
	}
}
