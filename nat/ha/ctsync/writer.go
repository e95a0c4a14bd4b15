package ctsync

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nlsock"
)

// ctnetlink message and attribute numbers
// (linux/netfilter/nfnetlink_conntrack.h).
const (
	msgCtNew    = 0
	msgCtDelete = 2

	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaStatus     = 3
	ctaProtoinfo  = 4
	ctaNATSrc     = 6
	ctaTimeout    = 7
	ctaMark       = 8
	ctaNATDst     = 13

	ctaTupleIP    = 1
	ctaTupleProto = 2
	ctaIPv4Src    = 1
	ctaIPv4Dst    = 2
	ctaIPv6Src    = 3
	ctaIPv6Dst    = 4

	ctaProtoNum      = 1
	ctaProtoSrcPort  = 2
	ctaProtoDstPort  = 3
	ctaProtoICMPID   = 4
	ctaProtoICMPType = 5
	ctaProtoICMPCode = 6

	ctaProtoICMPv6ID   = 7
	ctaProtoICMPv6Type = 8
	ctaProtoICMPv6Code = 9

	ctaProtoinfoTCP       = 1
	ctaProtoinfoTCPState  = 1
	ctaProtoinfoTCPWSOrig = 2
	ctaProtoinfoTCPWSRepl = 3
	ctaProtoinfoTCPFlOrig = 4
	ctaProtoinfoTCPFlRepl = 5

	ctaNATV4MinIP      = 1
	ctaNATV4MaxIP      = 2
	ctaNATProto        = 3
	ctaNATV6MinIP      = 4
	ctaNATV6MaxIP      = 5
	ctaProtoNATPortMin = 1
	ctaProtoNATPortMax = 2

	nlaNested = 0x8000

	// tcpBeLiberal is IP_CT_TCP_FLAG_BE_LIBERAL as struct nf_ct_tcp_flags
	// {flags, mask} read big endian: flag and mask bit 0x08.
	tcpBeLiberal = 0x0808

	// statusKernelOnly are the status bits the kernel sets itself (NAT,
	// NAT done, expected, dying, seq adjust, template, untracked,
	// offload); the kernel refuses a status that differs from the entry's
	// in IPS_CONFIRMED, which every entry user space writes has.
	statusKernelOnly = 1<<0 | 1<<4 | 1<<5 | 1<<6 | 1<<7 | 1<<8 | 1<<9 | 1<<11 | 1<<12 | 1<<14 | 1<<15
	statusConfirmed  = 1 << 3
)

// Writer writes replicated entries into one namespace's conntrack table
// over a ctnetlink socket. It sends many entries per system call.
type Writer struct {
	nl  *nlsock.Socket
	seq uint32
	req []byte
	buf []byte
}

// NewWriter dials ctnetlink in ns (nil: the caller's namespace).
func NewWriter(ns *netns.NS) (*Writer, error) {
	nl, err := nlsock.Dial(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("ctsync: writer: %w", err)
	}
	if err := nl.CapAcks(); err != nil {
		nl.Close()
		return nil, fmt.Errorf("ctsync: writer: %w", err)
	}
	if err := nl.SetBuffers(4<<20, 4<<20); err != nil {
		nl.Close()
		return nil, fmt.Errorf("ctsync: writer: %w", err)
	}
	return &Writer{nl: nl, buf: make([]byte, 1<<20)}, nil
}

// Close closes the socket.
func (w *Writer) Close() error { return w.nl.Close() }

// attr appends a netlink attribute header + payload (padded to 4 bytes).
func attr(b []byte, typ uint16, payload []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(payload)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// nest appends a nested attribute whose body fill writes.
func nest(b []byte, typ uint16, fill func([]byte) []byte) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	b = fill(b)
	binary.NativeEndian.PutUint16(b[start:], uint16(len(b)-start))
	binary.NativeEndian.PutUint16(b[start+2:], typ|nlaNested)
	return b
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func ip4(a netip.Addr) []byte {
	var x [4]byte
	if a.Is4() {
		x = a.As4()
	}
	return x[:]
}

// ipAttr is an address attribute of a's family: the IPv4 attribute v4
// with 4 bytes, or with v6 the IPv6 attribute v6attr with 16.
func ipAttr(b []byte, v6 bool, v4attr, v6attr uint16, a netip.Addr) []byte {
	if v6 {
		return attr(b, v6attr, a.AsSlice())
	}
	return attr(b, v4attr, ip4(a))
}

func tuple(b []byte, typ uint16, proto uint8, src, dst netip.AddrPort) []byte {
	v6 := src.Addr().Is6()
	return nest(b, typ, func(b []byte) []byte {
		b = nest(b, ctaTupleIP, func(b []byte) []byte {
			b = ipAttr(b, v6, ctaIPv4Src, ctaIPv6Src, src.Addr())
			return ipAttr(b, v6, ctaIPv4Dst, ctaIPv6Dst, dst.Addr())
		})
		return nest(b, ctaTupleProto, func(b []byte) []byte {
			b = attr(b, ctaProtoNum, []byte{proto})
			if isICMP(proto) {
				id, ty, code := uint16(ctaProtoICMPID), uint16(ctaProtoICMPType), uint16(ctaProtoICMPCode)
				if proto == protoICMPv6 {
					id, ty, code = ctaProtoICMPv6ID, ctaProtoICMPv6Type, ctaProtoICMPv6Code
				}
				b = attr(b, id, be16(src.Port()))
				b = attr(b, ty, []byte{byte(dst.Port() >> 8)})
				return attr(b, code, []byte{byte(dst.Port())})
			}
			b = attr(b, ctaProtoSrcPort, be16(src.Port()))
			return attr(b, ctaProtoDstPort, be16(dst.Port()))
		})
	})
}

func natAttr(b []byte, typ uint16, proto uint8, to netip.AddrPort) []byte {
	return nest(b, typ, func(b []byte) []byte {
		v6 := to.Addr().Is6()
		b = ipAttr(b, v6, ctaNATV4MinIP, ctaNATV6MinIP, to.Addr())
		b = ipAttr(b, v6, ctaNATV4MaxIP, ctaNATV6MaxIP, to.Addr())
		if isICMP(proto) {
			return b
		}
		return nest(b, ctaNATProto, func(b []byte) []byte {
			b = attr(b, ctaProtoNATPortMin, be16(to.Port()))
			return attr(b, ctaProtoNATPortMax, be16(to.Port()))
		})
	})
}

// message appends one ctnetlink message for e and returns its sequence
// number. create asks for a new entry with its NAT bindings (the kernel
// takes NAT only at creation); otherwise it updates an existing one.
func (w *Writer) message(b []byte, e Entry, create bool) ([]byte, uint32) {
	w.seq++
	start := len(b)
	typ, flags := uint16(msgCtNew), uint16(unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	if e.Op == OpDelete {
		typ = msgCtDelete
	} else if create {
		flags |= unix.NLM_F_CREATE | unix.NLM_F_EXCL
	}
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = binary.NativeEndian.AppendUint16(b, unix.NFNL_SUBSYS_CTNETLINK<<8|typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, w.seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	fam := byte(unix.AF_INET)
	if e.v6() {
		fam = unix.AF_INET6
	}
	b = append(b, fam, 0, 0, 0)
	b = tuple(b, ctaTupleOrig, e.Proto, e.OrigSrc, e.OrigDst)
	if e.Op == OpUpsert {
		status := e.Status
		if create {
			// The kernel wants a reply tuple, but NAT is set up from
			// the untranslated one (the inverse of the original):
			// given the translated reply, it would see nothing left to
			// translate and set no NAT status, and packets would pass
			// untranslated. The NAT attributes then translate it.
			rs, rd := untranslatedReply(e)
			b = tuple(b, ctaTupleReply, e.Proto, rs, rd)
			// The reply tuple says what the active's kernel translated:
			// a destination NAT answers from another address than the
			// original destination, a source NAT is answered to another
			// address than the original source.
			if e.ReplySrc != e.OrigDst {
				b = natAttr(b, ctaNATDst, e.Proto, e.ReplySrc)
			}
			if e.ReplyDst != e.OrigSrc {
				b = natAttr(b, ctaNATSrc, e.Proto, e.ReplyDst)
			}
		}
		b = attr(b, ctaStatus, be32(status&^statusKernelOnly|statusConfirmed))
		timeout := e.Timeout
		if timeout == 0 {
			timeout = 1
		}
		b = attr(b, ctaTimeout, be32(timeout))
		if e.Mark != 0 {
			b = attr(b, ctaMark, be32(e.Mark))
		}
		if e.Proto == 6 && e.TCPState != 0 {
			b = nest(b, ctaProtoinfo, func(b []byte) []byte {
				return nest(b, ctaProtoinfoTCP, func(b []byte) []byte {
					b = attr(b, ctaProtoinfoTCPState, []byte{e.TCPState})
					b = attr(b, ctaProtoinfoTCPWSOrig, []byte{e.WScaleOrig})
					b = attr(b, ctaProtoinfoTCPWSRepl, []byte{e.WScaleReply})
					// The standby never saw the segments, so its window
					// tracking knows nothing: like conntrackd, mark both
					// directions liberal (no out-of-window drops; an
					// invalid packet would reach the now-local EIP and
					// be answered with a reset).
					b = attr(b, ctaProtoinfoTCPFlOrig, be16(e.FlagsOrig|tcpBeLiberal))
					return attr(b, ctaProtoinfoTCPFlRepl, be16(e.FlagsReply|tcpBeLiberal))
				})
			})
		}
	}
	binary.NativeEndian.PutUint32(b[start:], uint32(len(b)-start))
	return b, w.seq
}

// maxBatch bounds the messages sent in one system call.
const maxBatch = 256

// Apply writes entries: upserts create the entry with its NAT bindings
// or, when it exists, update its status, timeout, mark and TCP state (an
// existing entry the kernel will not update in place, with another NAT
// binding or status bits an update may not clear, is deleted and created
// again as the active has it);
// deletes remove it (a missing entry is no error). It returns how many
// entries failed and the first error.
func (w *Writer) Apply(ctx context.Context, entries []Entry) (failed int, err error) {
	for len(entries) > 0 {
		n := min(len(entries), maxBatch)
		f, e := w.apply(ctx, entries[:n])
		failed += f
		if err == nil {
			err = e
		}
		entries = entries[n:]
	}
	return failed, err
}

func (w *Writer) apply(ctx context.Context, entries []Entry) (int, error) {
	codes, err := w.exchange(ctx, entries, true)
	if err != nil {
		return len(entries), err
	}
	var again []Entry
	failed := 0
	var first error
	for i, code := range codes {
		switch {
		case code == 0:
		case code == unix.EEXIST && entries[i].Op == OpUpsert:
			again = append(again, entries[i])
		case code == unix.ENOENT && entries[i].Op == OpDelete:
		default:
			failed++
			if first == nil {
				first = fmt.Errorf("ctsync: write %s: %w", entries[i], code)
			}
		}
	}
	if len(again) == 0 {
		return failed, first
	}
	codes, err = w.exchange(ctx, again, false)
	if err != nil {
		return failed + len(again), err
	}
	var replace []Entry
	for i, code := range codes {
		switch code {
		case 0, unix.ENOENT: // ENOENT: the entry went away between the two messages.
		case unix.EBUSY:
			replace = append(replace, again[i])
		default:
			failed++
			if first == nil {
				first = fmt.Errorf("ctsync: update %s: %w", again[i], code)
			}
		}
	}
	f, err := w.replace(ctx, replace)
	if first == nil {
		first = err
	}
	return failed + f, first
}

// replace deletes and creates again entries whose update the kernel
// refused with EBUSY: the entry this kernel holds under the same original
// tuple cannot take the active's version in place (its status has bits an
// update may not clear, such as SEEN_REPLY or ASSURED, and its NAT binding
// can only be set at creation). That is a leftover of this replica's own
// past (a connection it carried as the active, or one that reused the
// tuple since), and the active's entry is the one that must be here when
// this replica takes over.
func (w *Writer) replace(ctx context.Context, entries []Entry) (int, error) {
	if len(entries) == 0 {
		return 0, nil
	}
	del := make([]Entry, len(entries))
	for i, e := range entries {
		del[i] = e
		del[i].Op = OpDelete
	}
	codes, err := w.exchange(ctx, del, false)
	if err != nil {
		return len(entries), err
	}
	for i, code := range codes {
		if code != 0 && code != unix.ENOENT {
			return len(entries), fmt.Errorf("ctsync: replace %s: delete: %w", entries[i], code)
		}
	}
	codes, err = w.exchange(ctx, entries, true)
	if err != nil {
		return len(entries), err
	}
	failed := 0
	var first error
	for i, code := range codes {
		if code != 0 {
			failed++
			if first == nil {
				first = fmt.Errorf("ctsync: replace %s: create: %w", entries[i], code)
			}
		}
	}
	return failed, first
}

// exchange sends one message per entry in one system call and returns each
// one's answer code.
func (w *Writer) exchange(ctx context.Context, entries []Entry, create bool) ([]unix.Errno, error) {
	w.req = w.req[:0]
	first := w.seq + 1
	for _, e := range entries {
		w.req, _ = w.message(w.req, e, create)
	}
	if err := w.nl.Send(ctx, w.req); err != nil {
		return nil, fmt.Errorf("ctsync: send %d entries: %w", len(entries), err)
	}
	codes := make([]unix.Errno, len(entries))
	left := len(entries)
	for left > 0 {
		n, err := w.nl.Recv(ctx, w.buf)
		if err != nil {
			return nil, fmt.Errorf("ctsync: read answers (%d of %d missing): %w", left, len(entries), err)
		}
		var bad error
		for h, m := range nlsock.Messages(w.buf[:n], &bad) {
			if h.Type != unix.NLMSG_ERROR {
				continue
			}
			code, seq, ok := nlsock.Errno(m)
			if !ok || seq < first || seq >= first+uint32(len(entries)) {
				continue
			}
			codes[seq-first] = code
			left--
		}
		if bad != nil {
			return nil, errors.Join(errors.New("ctsync: bad answer"), bad)
		}
	}
	return codes, nil
}

// untranslatedReply returns the reply tuple of e as if nothing were
// translated: the original one reversed. For ICMP (source port = echo id,
// destination port = type<<8|code) the id stays and the type is the
// reply's (echo 8 → 0, timestamp 13 → 14, info 15 → 16, mask 17 → 18;
// ICMPv6: echo 128 → 129, node information 139 → 140).
func untranslatedReply(e Entry) (src, dst netip.AddrPort) {
	if !isICMP(e.Proto) {
		return e.OrigDst, e.OrigSrc
	}
	typ, code := uint8(e.OrigDst.Port()>>8), uint8(e.OrigDst.Port())
	switch {
	case e.Proto == protoICMP && typ == 8:
		typ = 0
	case e.Proto == protoICMP && (typ == 13 || typ == 15 || typ == 17):
		typ++
	case e.Proto == protoICMPv6 && (typ == 128 || typ == 139):
		typ++
	}
	return netip.AddrPortFrom(e.OrigDst.Addr(), e.OrigSrc.Port()), netip.AddrPortFrom(e.OrigSrc.Addr(), uint16(typ)<<8|uint16(code))
}
