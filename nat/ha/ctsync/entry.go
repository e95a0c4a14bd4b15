// Package ctsync replicates a gateway's NATed conntrack entries from the
// active replica to the standby: the active reads ctnetlink events
// (new/update/destroy) and a full dump at every (re)connect, and streams
// them in batches over TCP; the standby writes each entry into its own
// conntrack table with its NAT bindings (the SNAT port the active's kernel
// chose included), so that after a takeover established connections find
// their entry and keep their translation.
//
// Both families are replicated: IPv4 and IPv6 entries (TCP, UDP, ICMP and
// ICMPv6), each with its NAT bindings.
//
// The wire format is natgw's own (records of a fixed size per family, see
// Entry.append); both ends run the same binary.
package ctsync

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	ct "github.com/ti-mo/conntrack"
)

// Op is what happens to an entry.
type Op uint8

// Entry operations.
const (
	// OpUpsert creates the entry or updates its state and timeout.
	OpUpsert Op = 1
	// OpDelete removes the entry.
	OpDelete Op = 2
)

// Entry is one conntrack entry as replicated: both tuples (the reply tuple
// carries the NAT bindings), status, timeout, ct mark and TCP state.
type Entry struct {
	Op    Op
	Proto uint8 // 6 tcp, 17 udp, 1 icmp, 58 icmpv6
	// Orig and Reply are the tuples' addresses and ports, all four of one
	// family (IPv4 or IPv6). For ICMP and ICMPv6 the source port holds the
	// echo id and the destination port type<<8|code.
	OrigSrc, OrigDst   netip.AddrPort
	ReplySrc, ReplyDst netip.AddrPort
	Status             uint32
	Timeout            uint32 // seconds
	Mark               uint32
	TCPState           uint8
	WScaleOrig         uint8
	WScaleReply        uint8
	FlagsOrig          uint16
	FlagsReply         uint16
}

// entrySize is the encoded size of an IPv4 Entry, entrySize6 of an IPv6
// one: op, protocol and TCP state bytes, four addresses with their ports,
// status, timeout, mark and TCP flags.
const (
	entrySize  = 5 + 4*(4+2) + 4*3 + 2*2
	entrySize6 = 5 + 4*(16+2) + 4*3 + 2*2
)

// opIPv6 is set in the op byte of an IPv6 record (its addresses are 16
// bytes).
const opIPv6 = 0x80

// Protocol numbers the replication carries.
const (
	protoICMP   = 1
	protoTCP    = 6
	protoUDP    = 17
	protoICMPv6 = 58
)

// isICMP says whether proto is ICMP or ICMPv6 (ports hold id and
// type<<8|code).
func isICMP(proto uint8) bool { return proto == protoICMP || proto == protoICMPv6 }

// replicatedProto says whether entries of protocol proto in family v6 are
// replicated: TCP and UDP, and ICMP in IPv4, ICMPv6 in IPv6.
func replicatedProto(proto uint8, v6 bool) bool {
	switch proto {
	case protoTCP, protoUDP:
		return true
	case protoICMP:
		return !v6
	case protoICMPv6:
		return v6
	}
	return false
}

// Replicated reports whether a flow is one the standby needs: an IPv4 or
// IPv6 TCP, UDP or ICMP(v6) entry the gateway translated (source or
// destination NAT). Untranslated flows (the replicas' own heartbeats,
// routed traffic) are picked up mid-stream by the kernel and need no copy.
func Replicated(f *ct.Flow) bool {
	if f == nil || f.Status&ct.StatusNATMask == 0 {
		return false
	}
	a := f.TupleOrig.IP.SourceAddress
	if !a.Is4() && (!a.Is6() || a.Is4In6()) {
		return false
	}
	return replicatedProto(f.TupleOrig.Proto.Protocol, a.Is6())
}

func tupleAP(t ct.Tuple) (src, dst netip.AddrPort) {
	sp, dp := t.Proto.SourcePort, t.Proto.DestinationPort
	if isICMP(t.Proto.Protocol) {
		sp, dp = t.Proto.ICMPID, uint16(t.Proto.ICMPType)<<8|uint16(t.Proto.ICMPCode)
	}
	return netip.AddrPortFrom(t.IP.SourceAddress, sp), netip.AddrPortFrom(t.IP.DestinationAddress, dp)
}

// FromFlow returns the Entry of a kernel flow.
func FromFlow(op Op, f *ct.Flow) Entry {
	e := Entry{Op: op, Proto: f.TupleOrig.Proto.Protocol, Status: uint32(f.Status), Timeout: f.Timeout, Mark: f.Mark}
	e.OrigSrc, e.OrigDst = tupleAP(f.TupleOrig)
	e.ReplySrc, e.ReplyDst = tupleAP(f.TupleReply)
	if t := f.ProtoInfo.TCP; t != nil {
		e.TCPState, e.WScaleOrig, e.WScaleReply, e.FlagsOrig, e.FlagsReply = t.State, t.OriginalWindowScale, t.ReplyWindowScale, t.OriginalFlags, t.ReplyFlags
	}
	return e
}

// Key identifies the entry in a table: its original tuple.
type Key struct {
	Proto    uint8
	Src, Dst netip.AddrPort
}

// Key returns e's key.
func (e Entry) Key() Key { return Key{e.Proto, e.OrigSrc, e.OrigDst} }

func (e Entry) String() string {
	return fmt.Sprintf("op=%d proto=%d %s->%s reply %s->%s status=%#x timeout=%d mark=%#x", e.Op, e.Proto, e.OrigSrc, e.OrigDst, e.ReplySrc, e.ReplyDst, e.Status, e.Timeout, e.Mark)
}

// v6 says whether e is an IPv6 entry (by its original source).
func (e Entry) v6() bool { return e.OrigSrc.Addr().Is6() }

// appendAP appends an address of the record's family and a port: with v6
// 16 bytes (an IPv4 address as ::), else 4 (an IPv6 address as 0.0.0.0).
func appendAP(b []byte, ap netip.AddrPort, v6 bool) []byte {
	a := ap.Addr()
	switch {
	case v6 && a.Is6():
		x := a.As16()
		b = append(b, x[:]...)
	case v6:
		b = append(b, make([]byte, 16)...)
	case a.Is4():
		x := a.As4()
		b = append(b, x[:]...)
	default:
		b = append(b, 0, 0, 0, 0)
	}
	return binary.BigEndian.AppendUint16(b, ap.Port())
}

// append encodes e: entrySize bytes for an IPv4 entry, entrySize6 for an
// IPv6 one (opIPv6 set in its op byte).
func (e Entry) append(b []byte) []byte {
	v6, op := e.v6(), byte(e.Op)
	if v6 {
		op |= opIPv6
	}
	b = append(b, op, e.Proto, e.TCPState, e.WScaleOrig, e.WScaleReply)
	for _, ap := range []netip.AddrPort{e.OrigSrc, e.OrigDst, e.ReplySrc, e.ReplyDst} {
		b = appendAP(b, ap, v6)
	}
	b = binary.BigEndian.AppendUint32(b, e.Status)
	b = binary.BigEndian.AppendUint32(b, e.Timeout)
	b = binary.BigEndian.AppendUint32(b, e.Mark)
	b = binary.BigEndian.AppendUint16(b, e.FlagsOrig)
	return binary.BigEndian.AppendUint16(b, e.FlagsReply)
}

var errShort = errors.New("ctsync: short entry")

// decodeEntry decodes the entry at the start of b and returns it and its
// encoded size.
func decodeEntry(b []byte) (Entry, int, error) {
	if len(b) < 1 {
		return Entry{}, 0, errShort
	}
	v6, size, width := b[0]&opIPv6 != 0, entrySize, 4
	if v6 {
		size, width = entrySize6, 16
	}
	if len(b) < size {
		return Entry{}, 0, errShort
	}
	e := Entry{Op: Op(b[0] &^ opIPv6), Proto: b[1], TCPState: b[2], WScaleOrig: b[3], WScaleReply: b[4]}
	if e.Op != OpUpsert && e.Op != OpDelete {
		return Entry{}, 0, fmt.Errorf("ctsync: entry op %d: want 1 (upsert) or 2 (delete), with 0x80 for IPv6", b[0])
	}
	b = b[5:]
	ap := func() netip.AddrPort {
		var a netip.Addr
		if v6 {
			a = netip.AddrFrom16([16]byte(b[:16]))
		} else {
			a = netip.AddrFrom4([4]byte(b[:4]))
		}
		p := binary.BigEndian.Uint16(b[width : width+2])
		b = b[width+2:]
		return netip.AddrPortFrom(a, p)
	}
	e.OrigSrc, e.OrigDst, e.ReplySrc, e.ReplyDst = ap(), ap(), ap(), ap()
	e.Status = binary.BigEndian.Uint32(b)
	e.Timeout = binary.BigEndian.Uint32(b[4:])
	e.Mark = binary.BigEndian.Uint32(b[8:])
	e.FlagsOrig = binary.BigEndian.Uint16(b[12:])
	e.FlagsReply = binary.BigEndian.Uint16(b[14:])
	return e, size, nil
}
