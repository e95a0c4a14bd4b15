package nftconn

import (
	"bytes"
	"encoding/binary"
	"fmt"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/nlsock"
)

// The one decoder of nf_tables netlink answers in natgw: every read of a
// table (Conn's Tables, Rules and MapElements here, nat/nftables' Load)
// walks the answers with these functions and decodes only the attributes
// it uses, in place (no message tree, nothing kept of the buffer unless
// copied).

// Attrs walks the netlink attributes in b, calling fn with each type (the
// nested and byte-order flag bits cleared) and payload. An attribute
// whose length runs past b is an error (no panic on any input); the
// payload is valid as long as b is.
func Attrs(b []byte, fn func(typ uint16, v []byte) error) error {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		typ := binary.NativeEndian.Uint16(b[2:4]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < 4 || l > len(b) {
			return fmt.Errorf("bad attribute length %d (%d bytes left)", l, len(b))
		}
		if err := fn(typ, b[4:l]); err != nil {
			return err
		}
		l = (l + 3) &^ 3
		if l > len(b) {
			l = len(b)
		}
		b = b[l:]
	}
	return nil
}

// CString returns the NUL-terminated string attribute v (all of v if it
// has no NUL).
func CString(v []byte) string { return string(cBytes(v)) }

// cBytes returns v up to its first NUL.
func cBytes(v []byte) []byte {
	if i := bytes.IndexByte(v, 0); i >= 0 {
		return v[:i]
	}
	return v
}

// cStringIs reports whether the string attribute v is s, without making a
// string of v.
func cStringIs(v []byte, s string) bool { return string(cBytes(v)) == s }

// BE32 returns the big-endian uint32 attribute v.
func BE32(v []byte) (uint32, error) {
	if len(v) != 4 {
		return 0, fmt.Errorf("attribute of %d bytes, want 4", len(v))
	}
	return binary.BigEndian.Uint32(v), nil
}

// DumpEnd checks the messages of one answer datagram to request seq: it
// reports whether the datagram ends the answer (the NLMSG_DONE of a dump,
// the ack of a request sent with NLM_F_ACK, or an error answer) and
// returns an error answer as an error wrapping its errno (ENOENT for a
// missing table, chain or set). Messages of other requests (stale sequence
// numbers) are skipped.
func DumpEnd(b []byte, seq uint32) (bool, error) {
	var bad error
	for h, m := range nlsock.Messages(b, &bad) {
		if h.Seq != seq {
			continue
		}
		switch h.Type {
		case unix.NLMSG_DONE:
			return true, nil
		case unix.NLMSG_ERROR:
			if len(m) >= 4 {
				if code := int32(binary.NativeEndian.Uint32(m)); code != 0 {
					return true, fmt.Errorf("receive: %w", unix.Errno(-code))
				}
			}
			return true, nil
		}
	}
	if bad != nil {
		return false, fmt.Errorf("receive: %w", bad)
	}
	return false, nil
}

// DecodeReply calls msg with the family (nfgenmsg's) and the attributes of
// each nf_tables message of type typ (NFT_MSG_NEWSETELEM, NEWSET, ...) in
// one answer datagram; other messages are skipped.
func DecodeReply(b []byte, typ uint16, msg func(family uint8, attrs []byte) error) error {
	var bad error
	for h, m := range nlsock.Messages(b, &bad) {
		if h.Type != unix.NFNL_SUBSYS_NFTABLES<<8|typ {
			continue
		}
		if len(m) < 4 {
			return fmt.Errorf("short message of type %d (%d bytes)", typ, len(m))
		}
		if err := msg(m[0], m[4:]); err != nil {
			return err
		}
	}
	return bad
}

// ElemList calls elem with each NFTA_LIST_ELEM of one NEWSETELEM message's
// attributes.
func ElemList(b []byte, elem func(b []byte) error) error {
	return Attrs(b, func(typ uint16, v []byte) error {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return nil
		}
		return Attrs(v, func(typ uint16, v []byte) error {
			if typ != unix.NFTA_LIST_ELEM {
				return nil
			}
			return elem(v)
		})
	})
}

// DataValue returns the NFTA_DATA_VALUE in a nested nft_data attribute,
// and the verdict if it holds one instead.
func DataValue(b []byte) (val []byte, verdict *expr.Verdict, err error) {
	err = Attrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_DATA_VALUE:
			val = v
		case unix.NFTA_DATA_VERDICT:
			verdict = &expr.Verdict{}
			return Attrs(v, func(typ uint16, v []byte) error {
				switch typ {
				case unix.NFTA_VERDICT_CODE:
					if len(v) < 4 {
						return fmt.Errorf("short verdict code")
					}
					verdict.Kind = expr.VerdictKind(int32(binary.BigEndian.Uint32(v)))
				case unix.NFTA_VERDICT_CHAIN:
					verdict.Chain = CString(v)
				}
				return nil
			})
		}
		return nil
	})
	return val, verdict, err
}

// DecodeElem decodes one NFTA_LIST_ELEM: the attributes natgw's sets and
// maps use (key, value or verdict, flags, comment; natgw's sets have no
// intervals). Key and Val point into b (no copy): a caller that keeps
// them beyond b's life copies them.
func DecodeElem(b []byte) (nft.SetElement, error) {
	var e nft.SetElement
	var udata []byte
	err := Attrs(b, func(typ uint16, v []byte) error {
		var err error
		switch typ {
		case unix.NFTA_SET_ELEM_KEY:
			e.Key, _, err = DataValue(v)
		case unix.NFTA_SET_ELEM_DATA:
			e.Val, e.VerdictData, err = DataValue(v)
		case unix.NFTA_SET_ELEM_FLAGS:
			if len(v) >= 4 {
				e.IntervalEnd = binary.BigEndian.Uint32(v)&unix.NFT_SET_ELEM_INTERVAL_END != 0
			}
		case unix.NFTA_SET_ELEM_USERDATA:
			udata = v
		}
		return err
	})
	if err != nil {
		return nft.SetElement{}, fmt.Errorf("decode element: %w", err)
	}
	e.Comment = ElemComment(udata)
	return e, nil
}

// ElemComment returns the comment TLV of element userdata ("" if none).
func ElemComment(u []byte) string {
	if v := UdataTLV(u, userdata.NFTNL_UDATA_SET_ELEM_COMMENT); v != nil {
		return CString(v)
	}
	return ""
}

// UdataTLV returns the value of the first TLV of type typ in element
// userdata, nil if there is none (bounds-checked, unlike userdata.Get).
func UdataTLV(u []byte, typ userdata.Type) []byte {
	for len(u) >= 2 {
		t, l := userdata.Type(u[0]), int(u[1])
		if 2+l > len(u) {
			return nil
		}
		if t == typ {
			return u[2 : 2+l]
		}
		u = u[2+l:]
	}
	return nil
}
