package ctsync

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nlsock"
)

// ctnetlink event groups (NFNLGRP_CONNTRACK_NEW, _UPDATE, _DESTROY).
const (
	groupNew     = 1
	groupUpdate  = 2
	groupDestroy = 3
)

// eventReader reads conntrack events from a netlink socket outside the Go
// runtime's poller, with a receive buffer past the system limit, and
// decodes only what Entry holds, without allocating per event. (A generic
// decoder costs a peek, a page-sized allocation and a full Flow per event:
// at 10,000 new flows/s on a loaded machine it fell seconds behind.)
type eventReader struct {
	nl  *nlsock.Socket
	buf []byte
}

func newEventReader(ns *netns.NS) (*eventReader, error) {
	nl, err := nlsock.Dial(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("ctsync: event socket: %w", err)
	}
	nl.SetTimeout(24 * time.Hour) // events come when they come; ctx ends the wait
	if err := nl.SetBuffers(0, 64<<20); err != nil {
		nl.Close()
		return nil, fmt.Errorf("ctsync: event socket: %w", err)
	}
	if err := nl.Join(groupNew, groupUpdate, groupDestroy); err != nil {
		nl.Close()
		return nil, fmt.Errorf("ctsync: event socket: %w", err)
	}
	return &eventReader{nl: nl, buf: make([]byte, 64<<10)}, nil
}

func (r *eventReader) Close() error { return r.nl.Close() }

// read waits for the next datagram and appends the replicated entries it
// carries to out. ENOBUFS (the kernel dropped events) is returned as an
// error; the socket stays usable.
func (r *eventReader) read(ctx context.Context, out []Entry) ([]Entry, error) {
	n, err := r.nl.Recv(ctx, r.buf)
	if err != nil {
		return out, err
	}
	var bad error
	for h, m := range nlsock.Messages(r.buf[:n], &bad) {
		if h.Type>>8 != unix.NFNL_SUBSYS_CTNETLINK {
			continue
		}
		var op Op
		switch h.Type & 0xff {
		case msgCtNew:
			op = OpUpsert
		case msgCtDelete:
			op = OpDelete
		default:
			continue
		}
		if len(m) < 4 || (m[0] != unix.AF_INET && m[0] != unix.AF_INET6) {
			continue
		}
		e, ok := decodeEvent(m[4:])
		if !ok || e.Status&(1<<4|1<<5) == 0 || e.v6() != (m[0] == unix.AF_INET6) || !replicatedProto(e.Proto, e.v6()) {
			continue
		}
		e.Op = op
		out = append(out, e)
	}
	if bad != nil {
		return out, fmt.Errorf("ctsync: event: %w", bad)
	}
	return out, nil
}

// attrs iterates netlink attributes: type (without the nested and byte
// order flags) and payload. A bad length ends it.
func attrs(b []byte, fn func(typ uint16, p []byte)) bool {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:]) & 0x3fff
		if l < 4 || l > len(b) {
			return false
		}
		fn(typ, b[4:l])
		b = b[min((l+3)&^3, len(b)):]
	}
	return true
}

func decodeTuple(b []byte) (proto uint8, src, dst netip.AddrPort, ok bool) {
	var sa, da netip.Addr
	var sp, dp, id uint16
	var it, ic uint8
	ok = attrs(b, func(typ uint16, p []byte) {
		switch typ {
		case ctaTupleIP:
			attrs(p, func(typ uint16, p []byte) {
				switch {
				case typ == ctaIPv4Src && len(p) == 4:
					sa = netip.AddrFrom4([4]byte(p))
				case typ == ctaIPv4Dst && len(p) == 4:
					da = netip.AddrFrom4([4]byte(p))
				case typ == ctaIPv6Src && len(p) == 16:
					sa = netip.AddrFrom16([16]byte(p))
				case typ == ctaIPv6Dst && len(p) == 16:
					da = netip.AddrFrom16([16]byte(p))
				}
			})
		case ctaTupleProto:
			attrs(p, func(typ uint16, p []byte) {
				switch {
				case typ == ctaProtoNum && len(p) >= 1:
					proto = p[0]
				case typ == ctaProtoSrcPort && len(p) >= 2:
					sp = binary.BigEndian.Uint16(p)
				case typ == ctaProtoDstPort && len(p) >= 2:
					dp = binary.BigEndian.Uint16(p)
				case (typ == ctaProtoICMPID || typ == ctaProtoICMPv6ID) && len(p) >= 2:
					id = binary.BigEndian.Uint16(p)
				case (typ == ctaProtoICMPType || typ == ctaProtoICMPv6Type) && len(p) >= 1:
					it = p[0]
				case (typ == ctaProtoICMPCode || typ == ctaProtoICMPv6Code) && len(p) >= 1:
					ic = p[0]
				}
			})
		}
	})
	if isICMP(proto) {
		sp, dp = id, uint16(it)<<8|uint16(ic)
	}
	return proto, netip.AddrPortFrom(sa, sp), netip.AddrPortFrom(da, dp), ok && sa.IsValid() && da.IsValid()
}

// decodeEvent decodes the attributes of one ctnetlink event.
func decodeEvent(b []byte) (Entry, bool) {
	var e Entry
	var okO, okR bool
	ok := attrs(b, func(typ uint16, p []byte) {
		switch typ {
		case ctaTupleOrig:
			e.Proto, e.OrigSrc, e.OrigDst, okO = decodeTuple(p)
		case ctaTupleReply:
			_, e.ReplySrc, e.ReplyDst, okR = decodeTuple(p)
		case ctaStatus:
			if len(p) == 4 {
				e.Status = binary.BigEndian.Uint32(p)
			}
		case ctaTimeout:
			if len(p) == 4 {
				e.Timeout = binary.BigEndian.Uint32(p)
			}
		case ctaMark:
			if len(p) == 4 {
				e.Mark = binary.BigEndian.Uint32(p)
			}
		case ctaProtoinfo:
			attrs(p, func(typ uint16, p []byte) {
				if typ != ctaProtoinfoTCP {
					return
				}
				attrs(p, func(typ uint16, p []byte) {
					switch {
					case typ == ctaProtoinfoTCPState && len(p) >= 1:
						e.TCPState = p[0]
					case typ == ctaProtoinfoTCPWSOrig && len(p) >= 1:
						e.WScaleOrig = p[0]
					case typ == ctaProtoinfoTCPWSRepl && len(p) >= 1:
						e.WScaleReply = p[0]
					case typ == ctaProtoinfoTCPFlOrig && len(p) >= 2:
						e.FlagsOrig = binary.BigEndian.Uint16(p)
					case typ == ctaProtoinfoTCPFlRepl && len(p) >= 2:
						e.FlagsReply = binary.BigEndian.Uint16(p)
					}
				})
			})
		}
	})
	return e, ok && okO && okR
}
