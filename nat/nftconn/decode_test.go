package nftconn

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/nlsock"
)

// answers builds datagrams of nf_tables answer messages with the
// package's own encoder (Batch: the batch begin message it starts with is
// not an answer and is skipped by the readers, as any other message).
type answers struct{ b *Batch }

func newAnswers() *answers { return &answers{NewBatch(0, 0, nil)} }

// msg appends one answer message of type typ (NFT_MSG_NEWRULE, ...) whose
// attributes fill writes.
func (a *answers) msg(typ uint16, fill func(b *Batch)) *answers {
	start := a.b.Header(unix.NFNL_SUBSYS_NFTABLES<<8|typ, unix.NLM_F_MULTI, unix.NFPROTO_IPV4, 0)
	fill(a.b)
	a.b.Finish(start)
	return a
}

// done appends the dump's NLMSG_DONE and returns the datagram and the
// sequence number of the request it answers.
func (a *answers) done() ([]byte, uint32) {
	seq := a.b.seq
	a.b.Finish(a.b.Header(unix.NLMSG_DONE, unix.NLM_F_MULTI, 0, 0))
	return a.b.Bytes(), seq
}

// cut returns the datagram so far and the sequence number of the
// messages to come (a dump's part that does not end it).
func (a *answers) cut() ([]byte, uint32) { return a.b.Bytes(), a.b.seq }

// nlMsg is one netlink message in literal bytes: header and payload.
func nlMsg(typ uint16, seq uint32, payload ...byte) []byte {
	b := binary.NativeEndian.AppendUint32(nil, uint32(unix.SizeofNlMsghdr+len(payload)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, 0)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	return append(b, payload...)
}

// errAnswer is the kernel's error answer e to request seq.
func errAnswer(seq uint32, e unix.Errno) []byte {
	return nlMsg(unix.NLMSG_ERROR, seq, append(binary.NativeEndian.AppendUint32(nil, uint32(-int32(e))), nlMsg(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_GETSETELEM, seq)...)...)
}

// rule writes a NEWRULE answer's attributes: table t, chain c, handle h
// (none if 0), user data u (none if nil) and one expression.
func rule(t, c string, h uint64, u []byte) func(b *Batch) {
	return func(b *Batch) {
		b.AttrStr(unix.NFTA_RULE_TABLE, t)
		b.AttrStr(unix.NFTA_RULE_CHAIN, c)
		if h != 0 {
			b.Attr(unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, h))
		}
		list := b.Nest(unix.NFTA_RULE_EXPRESSIONS)
		e := b.Nest(unix.NFTA_LIST_ELEM)
		b.AttrStr(unix.NFTA_EXPR_NAME, "masq")
		b.End(e)
		b.End(list)
		if u != nil {
			b.Attr(unix.NFTA_RULE_USERDATA, u)
		}
	}
}

// TestReadDecoders runs Conn's readers (read.go) on answer datagrams as
// the kernel sends them, through the loop that reads a Socket's answers
// (readAnswers): tables, rules with and without user data (a tag, an nft
// comment) and of another chain, elements with key, value and comment,
// a concatenated key, a verdict, the kernel's ENOENT for a missing
// object, a malformed rule (the rest of the dump is still read).
func TestReadDecoders(t *testing.T) {
	concat := []byte{192, 0, 2, 10, 0, 0, 0x1f, 0x90, 6, 0, 0, 0} // ipv4_addr . inet_service . inet_proto
	comment := userdata.AppendString(nil, userdata.TypeComment, "an nft comment")
	type datagram struct {
		b   []byte
		seq uint32
	}
	for _, tc := range []struct {
		name  string
		reply uint16
		dgs   func() []datagram // the answers, in order; the last one's seq is the request's
		read  func() (msg func(uint8, []byte) error, got func() any)
		want  any
		err   string     // a substring of the error, "" for none
		errIs unix.Errno // the errno the error wraps, 0 for none
		reads int        // datagrams read (all of them when 0)
	}{
		{
			name: "tables", reply: unix.NFT_MSG_NEWTABLE,
			dgs: func() []datagram {
				a := newAnswers()
				for _, n := range []string{"natgw", "natgw_lbsvc"} {
					a.msg(unix.NFT_MSG_NEWTABLE, func(b *Batch) {
						b.AttrStr(unix.NFTA_TABLE_NAME, n)
						b.Attr(unix.NFTA_TABLE_FLAGS, []byte{0, 0, 0, 0})
					})
				}
				b, seq := a.done()
				return []datagram{{b, seq}}
			},
			read: func() (func(uint8, []byte) error, func() any) {
				var r tableReader
				return r.msg, func() any { return r.names }
			},
			want: []string{"natgw", "natgw_lbsvc"},
		},
		{
			name: "rules over two datagrams", reply: unix.NFT_MSG_NEWRULE,
			dgs: func() []datagram {
				a := newAnswers().msg(unix.NFT_MSG_NEWRULE, rule("t", "c", 5, []byte("natgw lbsvc dnat 10.0.0.1")))
				first, seq := a.cut()
				a = newAnswers().
					msg(unix.NFT_MSG_NEWRULE, rule("t", "c", 6, nil)).
					msg(unix.NFT_MSG_NEWRULE, rule("t", "other", 7, []byte("elsewhere"))).
					msg(unix.NFT_MSG_NEWRULE, rule("u", "c", 8, []byte("another table"))).
					msg(unix.NFT_MSG_NEWRULE, rule("t", "c", 9, comment))
				second, _ := a.done()
				return []datagram{{first, seq}, {second, seq}}
			},
			read: func() (func(uint8, []byte) error, func() any) {
				r := ruleReader{table: "t", chain: "c"}
				return r.msg, func() any { return r.refs }
			},
			want: []RuleRef{{Handle: 5, Tag: "natgw lbsvc dnat 10.0.0.1"}, {Handle: 6}, {Handle: 9, Tag: string(comment)}},
		},
		{
			name: "a rule without a handle; the rest is read", reply: unix.NFT_MSG_NEWRULE,
			dgs: func() []datagram {
				first, seq := newAnswers().msg(unix.NFT_MSG_NEWRULE, rule("t", "c", 0, []byte("x"))).cut()
				second, _ := newAnswers().msg(unix.NFT_MSG_NEWRULE, rule("t", "c", 3, []byte("y"))).done()
				return []datagram{{first, seq}, {second, seq}}
			},
			read: func() (func(uint8, []byte) error, func() any) {
				r := ruleReader{table: "t", chain: "c"}
				return r.msg, func() any { return r.refs }
			},
			want: []RuleRef(nil), err: "no handle",
		},
		{
			name: "a chain asked for: the chain, then the ack", reply: unix.NFT_MSG_NEWCHAIN,
			dgs: func() []datagram {
				b, seq := newAnswers().msg(unix.NFT_MSG_NEWCHAIN, func(b *Batch) {
					b.AttrStr(unix.NFTA_CHAIN_TABLE, "t")
					b.AttrStr(unix.NFTA_CHAIN_NAME, "c")
				}).cut()
				return []datagram{{b, seq}, {nlMsg(unix.NLMSG_ERROR, seq, make([]byte, 4+unix.SizeofNlMsghdr)...), seq}}
			},
			read: func() (func(uint8, []byte) error, func() any) {
				n := 0
				return func(uint8, []byte) error { n++; return nil }, func() any { return n }
			},
			want: 1,
		},
		{
			name: "elements", reply: unix.NFT_MSG_NEWSETELEM,
			dgs: func() []datagram {
				a := newAnswers()
				a.b.Elements(unix.NFPROTO_INET, "natgw_shape", "m", false, false, []nft.SetElement{
					{Key: []byte{10, 0, 0, 1}, Val: []byte{1, 0, 0x47, 0x4e}, Comment: "natgw lim=1"},
					{Key: concat, Val: []byte{2, 0, 0x47, 0x4e}, Comment: "concat"},
					{Key: []byte{10, 0, 0, 3}, Val: []byte{3, 0, 0x47, 0x4e}},
					{Key: []byte{10, 0, 0, 4}, VerdictData: &expr.Verdict{Kind: expr.VerdictGoto, Chain: "qos"}, Comment: "verdict"},
				})
				b, seq := a.done()
				return []datagram{{b, seq}}
			},
			read: func() (func(uint8, []byte) error, func() any) {
				var r elemReader
				return r.msg, func() any { return r.els }
			},
			want: []Element{
				{Key: []byte{10, 0, 0, 1}, Val: []byte{1, 0, 0x47, 0x4e}, Comment: "natgw lim=1"},
				{Key: concat, Val: []byte{2, 0, 0x47, 0x4e}, Comment: "concat"},
				{Key: []byte{10, 0, 0, 3}, Val: []byte{3, 0, 0x47, 0x4e}},
				{Key: []byte{10, 0, 0, 4}, Comment: "verdict"},
			},
		},
		{
			name: "a missing map", reply: unix.NFT_MSG_NEWSETELEM,
			dgs: func() []datagram { return []datagram{{errAnswer(4, unix.ENOENT), 4}} },
			read: func() (func(uint8, []byte) error, func() any) {
				var r elemReader
				return r.msg, func() any { return r.els }
			},
			want: []Element(nil), errIs: unix.ENOENT,
		},
		{
			name: "a malformed answer", reply: unix.NFT_MSG_NEWTABLE,
			dgs: func() []datagram {
				b, seq := newAnswers().msg(unix.NFT_MSG_NEWTABLE, func(b *Batch) { b.AttrStr(unix.NFTA_TABLE_NAME, "natgw") }).done()
				binary.NativeEndian.PutUint32(b[len(b)-NlHdrLen:], NlHdrLen+100) // the DONE runs past the datagram
				return []datagram{{b, seq}, {nlMsg(unix.NLMSG_DONE, seq, 0, 0, 0, 0), seq}}
			},
			read: func() (func(uint8, []byte) error, func() any) {
				var r tableReader
				return r.msg, func() any { return r.names }
			},
			want: []string(nil), err: "bad message length", reads: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dgs := tc.dgs()
			msg, got := tc.read()
			buf := make([]byte, 64<<10)
			n := 0
			err := readAnswers(buf, dgs[len(dgs)-1].seq, tc.reply, msg, func(b []byte) (int, error) {
				if n == len(dgs) {
					return 0, fmt.Errorf("read past the last answer")
				}
				n++
				return copy(b, dgs[n-1].b), nil
			})
			switch {
			case tc.err == "" && tc.errIs == 0 && err != nil:
				t.Fatalf("error %v, want none", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want %q", err, tc.err)
			case tc.errIs != 0 && !errors.Is(err, tc.errIs):
				t.Fatalf("error %v, want %v", err, tc.errIs)
			}
			if want := cmp.Or(tc.reads, len(dgs)); n != want {
				t.Errorf("%d datagrams read, want %d", n, want)
			}
			for i := range buf {
				buf[i] = 0xff // the next answers: nothing kept may point here
			}
			if g := got(); !reflect.DeepEqual(g, tc.want) {
				t.Errorf("got %+v\nwant %+v", g, tc.want)
			}
		})
	}
}

// TestReadCopies: the elements read keep their own copies (an append to
// one key does not reach the next one's bytes) and a value-less element
// has a nil Val, as google/nftables' decoder gives.
func TestReadCopies(t *testing.T) {
	a := newAnswers()
	a.b.Elements(unix.NFPROTO_IPV4, "t", "s", false, false, []nft.SetElement{{Key: []byte{1, 1, 1, 1}}, {Key: []byte{2, 2, 2, 2}}})
	b, _ := a.done()
	var r elemReader
	if err := DecodeReply(b, unix.NFT_MSG_NEWSETELEM, r.msg); err != nil {
		t.Fatal(err)
	}
	if len(r.els) != 2 || r.els[0].Val != nil {
		t.Fatalf("elements %+v, want two without a value", r.els)
	}
	_ = append(r.els[0].Key, 9)
	if !bytes.Equal(r.els[1].Key, []byte{2, 2, 2, 2}) {
		t.Errorf("an append to the first key changed the second: %x", r.els[1].Key)
	}
}

// TestDumpEnd: a dump ends at its own NLMSG_DONE or error answer, a
// request at its ack; answers of other requests (stale sequence numbers)
// do not end it; an errno ends it with that error; a bad length is an
// error.
func TestDumpEnd(t *testing.T) {
	elem := nlMsg(unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSETELEM, 7, 2, 0, 0, 0)
	for _, tc := range []struct {
		name    string
		b       []byte
		end     bool
		wantErr error
		badLen  bool
	}{
		{"elements only", elem, false, nil, false},
		{"done", append(elem, nlMsg(unix.NLMSG_DONE, 7, 0, 0, 0, 0)...), true, nil, false},
		{"done of another dump", nlMsg(unix.NLMSG_DONE, 6, 0, 0, 0, 0), false, nil, false},
		{"error", errAnswer(7, unix.ENOENT), true, unix.ENOENT, false},
		{"ack", nlMsg(unix.NLMSG_ERROR, 7, 0, 0, 0, 0), true, nil, false},
		{"bad length", func() []byte { b := nlMsg(unix.NLMSG_DONE, 7); binary.NativeEndian.PutUint32(b, 3); return b }(), false, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			end, err := DumpEnd(tc.b, 7)
			if end != tc.end {
				t.Errorf("end %v, want %v", end, tc.end)
			}
			switch {
			case tc.badLen:
				if err == nil || !strings.Contains(err.Error(), "bad message length") {
					t.Errorf("err %v, want a bad length", err)
				}
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Errorf("err %v, want %v", err, tc.wantErr)
				}
			case err != nil:
				t.Errorf("err %v, want none", err)
			}
		})
	}
}

// elemPayload returns the attributes of the one NEWSETELEM message
// Batch.Elements writes for es.
func elemPayload(t *testing.T, es ...nft.SetElement) []byte {
	t.Helper()
	b := NewBatch(0, 0, nil)
	b.Elements(unix.NFPROTO_INET, "natgw", "x", false, false, es)
	var bad error
	for h, m := range nlsock.Messages(b.Bytes(), &bad) {
		if h.Type == unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSETELEM {
			return m[4:]
		}
	}
	t.Fatalf("no element message (%v)", bad)
	return nil
}

// decodeAll decodes every element of one NEWSETELEM payload.
func decodeAll(b []byte) ([]nft.SetElement, error) {
	var es []nft.SetElement
	err := ElemList(b, func(b []byte) error {
		e, err := DecodeElem(b)
		if err == nil {
			es = append(es, e)
		}
		return err
	})
	return es, err
}

// TestDecodeElemList decodes elements as the kernel encodes them, and
// refuses (without panicking) every truncation of one.
func TestDecodeElemList(t *testing.T) {
	for _, tc := range []struct {
		name         string
		key, val     []byte
		chain, cmt   string
		wantVerdict  bool
		wantValueNil bool
	}{
		{name: "map", key: []byte{192, 0, 2, 10}, val: []byte{198, 51, 100, 10}, cmt: "uid-1"},
		{name: "set", key: []byte{192, 0, 2, 10}, cmt: "uid-2 plen=24", wantValueNil: true},
		{name: "verdict map", key: []byte{192, 0, 2, 10}, chain: "qos_in_192_0_2_10", cmt: "uid-3", wantVerdict: true, wantValueNil: true},
		{name: "concatenated key", key: []byte{192, 0, 2, 10, 0, 0, 0x1f, 0x90, 6, 0, 0, 0}, val: []byte{198, 51, 100, 10, 0, 0, 0x1f, 0x90}, cmt: "uid-4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := nft.SetElement{Key: tc.key, Val: tc.val, Comment: tc.cmt}
			if tc.chain != "" {
				e.VerdictData = &expr.Verdict{Kind: expr.VerdictGoto, Chain: tc.chain}
			}
			b := elemPayload(t, e)
			es, err := decodeAll(b)
			if err != nil {
				t.Fatal(err)
			}
			if len(es) != 1 {
				t.Fatalf("got %d elements, want 1", len(es))
			}
			g := es[0]
			if !bytes.Equal(g.Key, tc.key) || g.Comment != tc.cmt || (g.Val == nil) != tc.wantValueNil || (tc.val != nil && !bytes.Equal(g.Val, tc.val)) {
				t.Errorf("got key %x val %x comment %q, want %x %x %q", g.Key, g.Val, g.Comment, tc.key, tc.val, tc.cmt)
			}
			if tc.wantVerdict && (g.VerdictData == nil || g.VerdictData.Chain != tc.chain || g.VerdictData.Kind != expr.VerdictGoto) {
				t.Errorf("verdict %+v, want goto %s", g.VerdictData, tc.chain)
			}
			// Every truncation decodes without a panic; one that cuts
			// into the element must not yield it intact.
			for n := range len(b) {
				es, err := decodeAll(b[:n])
				if err == nil && len(es) > 0 && n < len(b)-3 { // more than the trailing padding cut
					t.Errorf("truncated to %d of %d bytes: decoded intact", n, len(b))
				}
			}
		})
	}
}
