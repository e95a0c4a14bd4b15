package nftables

import (
	"context"
	"encoding/binary"
	"fmt"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/nlsock"
)

// dumpSet dumps the elements of one set of natgw's table over natgw's own
// socket (r.nl), calling elem with each NFTA_LIST_ELEM payload (in another
// goroutine than the reads: the kernel walks the set for the next reply
// while the previous one is decoded). The payload is valid only during the
// call: its buffer is reused. It does what (*nft.Conn).GetSetElements does
// for the attributes natgw uses (key, value or verdict, flags, comment;
// natgw's sets have no intervals; see decodeElem) with a decoder that
// allocates little per element: at 100,000 elements the library's decoder
// allocates ~190 MB, most of it garbage at once.
func (r *Backend) dumpSet(ctx context.Context, set string, elem func(b []byte) error) error {
	data, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: []byte(tableName + "\x00")},
		{Type: unix.NFTA_SET_NAME, Data: []byte(set + "\x00")},
	})
	if err != nil {
		return err
	}
	req, seq := r.request(unix.NFT_MSG_GETSETELEM, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, nfFamily, data)
	if err := r.nl.Send(ctx, req); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	free := make(chan []byte, maxDumpBufs)
	full := make(chan []byte, maxDumpBufs)
	decoded := make(chan error, 1)
	go func() {
		var derr error
		for b := range full {
			if derr == nil {
				derr = decodeReply(b, unix.NFT_MSG_NEWSETELEM, func(_ uint8, m []byte) error {
					return decodeElemList(m, elem)
				})
			}
			free <- b[:cap(b)]
		}
		decoded <- derr
	}()
	rerr := r.readDump(ctx, seq, free, full)
	close(full)
	if derr := <-decoded; rerr == nil {
		rerr = derr
	}
	return rerr
}

// maxDumpBufs bounds the receive buffers of one dump (of 2*dumpChunk bytes
// each: 4 MiB in all). The kernel walks a set for the next reply only when
// the previous one is received, so the reads must not wait for the
// decoding: a buffer is taken from free if one is there, else allocated,
// up to this bound.
const maxDumpBufs = 64

// readDump reads the replies of one dump with sequence number seq, passing
// each datagram to full, until NLMSG_DONE. Its buffers come from free (the
// ones the decoding is done with) or are allocated while free is empty, up
// to maxDumpBufs.
func (r *Backend) readDump(ctx context.Context, seq uint32, free <-chan []byte, full chan<- []byte) error {
	bufs := 0
	next := func() []byte {
		select {
		case b := <-free:
			return b
		default:
		}
		if bufs < maxDumpBufs {
			bufs++
			return make([]byte, 2*dumpChunk)
		}
		return <-free
	}
	for {
		buf := next()
		n, err := r.nl.Recv(ctx, buf)
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		b := buf[:n]
		end, err := dumpEnd(b, seq)
		if err != nil {
			return err
		}
		full <- b
		if end {
			return nil
		}
	}
}

// dumpEnd checks the messages of one dump datagram: it reports whether it
// holds the NLMSG_DONE of the dump seq, and returns an error reply as an
// error.
func dumpEnd(b []byte, seq uint32) (bool, error) {
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

// dumpSmall dumps objects of a kind with few of them (tables, sets,
// chains, limit objects; a few KB in all) over natgw's own socket (r.nl):
// it sends request typ for family with the request's attributes, reads
// the replies into the socket's answer buffer, and calls msg with the
// family and the attributes of each reply message of type reply (see
// decodeReply), in the reading goroutine. The attributes are valid only
// during the call. Set elements, which come by the 100,000, go through
// dumpSet instead.
func (r *Backend) dumpSmall(ctx context.Context, typ uint16, family uint8, attrs []netlink.Attribute, reply uint16, msg func(family uint8, attrs []byte) error) error {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	req, seq := r.request(typ, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, family, data)
	if err := r.nl.Send(ctx, req); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	buf := r.buffer()
	for {
		n, err := r.nl.Recv(ctx, buf)
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		end, err := dumpEnd(buf[:n], seq)
		if err != nil {
			return err
		}
		if err := decodeReply(buf[:n], reply, msg); err != nil {
			return err
		}
		if end {
			return nil
		}
	}
}

// decodeReply calls msg with the family (nfgenmsg's) and the attributes of
// each nf_tables message of type typ (NFT_MSG_NEWSETELEM, NEWSET, ...) in
// one dump datagram.
func decodeReply(b []byte, typ uint16, msg func(family uint8, attrs []byte) error) error {
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

// attrs walks the netlink attributes in b, calling fn with each type (flag
// bits cleared) and payload.
func attrs(b []byte, fn func(typ uint16, v []byte) error) error {
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

// decodeElemList calls elem with each NFTA_LIST_ELEM of one NEWSETELEM
// message's payload.
func decodeElemList(b []byte, elem func(b []byte) error) error {
	return attrs(b, func(typ uint16, v []byte) error {
		if typ != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			return nil
		}
		return attrs(v, func(typ uint16, v []byte) error {
			if typ != unix.NFTA_LIST_ELEM {
				return nil
			}
			return elem(v)
		})
	})
}

// dataValue returns the NFTA_DATA_VALUE in a nested nft_data attribute, and
// the verdict if it holds one instead.
func dataValue(b []byte) (val []byte, verdict *expr.Verdict, err error) {
	err = attrs(b, func(typ uint16, v []byte) error {
		switch typ {
		case unix.NFTA_DATA_VALUE:
			val = v
		case unix.NFTA_DATA_VERDICT:
			verdict = &expr.Verdict{}
			return attrs(v, func(typ uint16, v []byte) error {
				switch typ {
				case unix.NFTA_VERDICT_CODE:
					if len(v) < 4 {
						return fmt.Errorf("short verdict code")
					}
					verdict.Kind = expr.VerdictKind(int32(binary.BigEndian.Uint32(v)))
				case unix.NFTA_VERDICT_CHAIN:
					verdict.Chain = cString(v)
				}
				return nil
			})
		}
		return nil
	})
	return val, verdict, err
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// decodeElem decodes one NFTA_LIST_ELEM. Key and Val point into b (no
// copy): callers that keep them beyond b's life copy them.
func decodeElem(b []byte) (nft.SetElement, error) {
	var e nft.SetElement
	var udata []byte
	err := attrs(b, func(typ uint16, v []byte) error {
		var err error
		switch typ {
		case unix.NFTA_SET_ELEM_KEY:
			e.Key, _, err = dataValue(v)
		case unix.NFTA_SET_ELEM_DATA:
			e.Val, e.VerdictData, err = dataValue(v)
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
	e.Comment = elemComment(udata)
	return e, nil
}

// elemComment returns the comment TLV of element userdata.
func elemComment(u []byte) string {
	if v := udataTLV(u, userdata.NFTNL_UDATA_SET_ELEM_COMMENT); v != nil {
		return cString(v)
	}
	return ""
}

// udataTLV returns the value of the first TLV of type typ in element
// userdata, nil if there is none (bounds-checked, unlike userdata.Get).
func udataTLV(u []byte, typ userdata.Type) []byte {
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
