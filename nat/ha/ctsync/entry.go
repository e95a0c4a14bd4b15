// Package ctsync replicates a gateway's NATed conntrack entries from the
// active replica to the standby: the active reads ctnetlink events
// (new/update/destroy) and a full dump at every (re)connect, and streams
// them in batches over TCP; the standby writes each entry into its own
// conntrack table with its NAT bindings (the SNAT port the active's kernel
// chose included), so that after a takeover established connections find
// their entry and keep their translation.
//
// The wire format is natgw's own (fixed-size records, see Entry.append);
// both ends run the same binary.
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
	Proto uint8 // 6 tcp, 17 udp, 1 icmp
	// Orig and Reply are the tuples' addresses and ports. For ICMP the
	// source port holds the echo id and the destination port type<<8|code.
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

// entrySize is the encoded size of one Entry.
const entrySize = 5 + 4*6 + 4*3 + 2*2

// Replicated reports whether a flow is one the standby needs: an IPv4
// TCP, UDP or ICMP entry the gateway translated (source or destination
// NAT). Untranslated flows (the replicas' own heartbeats, routed traffic)
// are picked up mid-stream by the kernel and need no copy.
func Replicated(f *ct.Flow) bool {
	if f == nil || f.Status&ct.StatusNATMask == 0 || !f.TupleOrig.IP.SourceAddress.Is4() {
		return false
	}
	switch f.TupleOrig.Proto.Protocol {
	case 6, 17, 1:
		return true
	}
	return false
}

func tupleAP(t ct.Tuple) (src, dst netip.AddrPort) {
	sp, dp := t.Proto.SourcePort, t.Proto.DestinationPort
	if t.Proto.Protocol == 1 {
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

// appendAP appends an IPv4 address and port; anything but IPv4 is sent as
// 0.0.0.0.
func appendAP(b []byte, ap netip.AddrPort) []byte {
	var a [4]byte
	if ap.Addr().Is4() {
		a = ap.Addr().As4()
	}
	b = append(b, a[:]...)
	return binary.BigEndian.AppendUint16(b, ap.Port())
}

// append encodes e (entrySize bytes).
func (e Entry) append(b []byte) []byte {
	b = append(b, byte(e.Op), e.Proto, e.TCPState, e.WScaleOrig, e.WScaleReply)
	for _, ap := range []netip.AddrPort{e.OrigSrc, e.OrigDst, e.ReplySrc, e.ReplyDst} {
		b = appendAP(b, ap)
	}
	b = binary.BigEndian.AppendUint32(b, e.Status)
	b = binary.BigEndian.AppendUint32(b, e.Timeout)
	b = binary.BigEndian.AppendUint32(b, e.Mark)
	b = binary.BigEndian.AppendUint16(b, e.FlagsOrig)
	return binary.BigEndian.AppendUint16(b, e.FlagsReply)
}

var errShort = errors.New("ctsync: short entry")

// decodeEntry decodes one entry from b (at least entrySize bytes).
func decodeEntry(b []byte) (Entry, error) {
	if len(b) < entrySize {
		return Entry{}, errShort
	}
	e := Entry{Op: Op(b[0]), Proto: b[1], TCPState: b[2], WScaleOrig: b[3], WScaleReply: b[4]}
	if e.Op != OpUpsert && e.Op != OpDelete {
		return Entry{}, fmt.Errorf("ctsync: entry op %d: want 1 (upsert) or 2 (delete)", e.Op)
	}
	b = b[5:]
	ap := func() netip.AddrPort {
		a := netip.AddrFrom4([4]byte(b[:4]))
		p := binary.BigEndian.Uint16(b[4:6])
		b = b[6:]
		return netip.AddrPortFrom(a, p)
	}
	e.OrigSrc, e.OrigDst, e.ReplySrc, e.ReplyDst = ap(), ap(), ap(), ap()
	e.Status = binary.BigEndian.Uint32(b)
	e.Timeout = binary.BigEndian.Uint32(b[4:])
	e.Mark = binary.BigEndian.Uint32(b[8:])
	e.FlagsOrig = binary.BigEndian.Uint16(b[12:])
	e.FlagsReply = binary.BigEndian.Uint16(b[14:])
	return e, nil
}
