// Package conntrack removes the connection-tracking entries of NAT mappings
// that went away, in a gateway's network namespace, over two lasting
// ctnetlink sockets: one of github.com/ti-mo/conntrack for dumps and deletes
// of single entries, one of package nlsock for flushes by mark.
package conntrack

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"runtime"
	"slices"
	"sync"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nlsock"
)

// Cleaner deletes conntrack entries in one namespace. It keeps its sockets
// open: closing a netfilter socket right after a delete blocks for an RCU
// grace period (~8 ms), so a Cleaner is meant to live as long as its backend.
type Cleaner struct {
	mu   sync.Mutex
	ns   *netns.NS // kept open for the sockets' life
	conn *ct.Conn  // dumps and deletes of single entries
	nl   *nlsock.Socket
	seq  uint32
	buf  []byte
}

// Open dials ctnetlink in ns (nil: the caller's namespace).
func Open(ns *netns.NS) (*Cleaner, error) {
	cfg := &netlink.Config{}
	if ns != nil {
		cfg.NetNS = ns.Fd()
	}
	c, err := ct.Dial(cfg)
	runtime.KeepAlive(ns)
	if err != nil {
		return nil, fmt.Errorf("conntrack: dial: %w", err)
	}
	// Dumps of a busy table need room; the default buffer overruns.
	_ = c.SetReadBuffer(4 << 20)
	nl, err := nlsock.Dial(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("conntrack: %w", err)
	}
	return &Cleaner{ns: ns, conn: c, nl: nl, buf: make([]byte, 4096)}, nil
}

// The range of IPv6 EIPs' mark ids (see MarkOf), which the nftables data
// plane allocates (nat.MarkIDs). Every IPv4 EIP's mark is above
// MarkID6Max, as 0.0.0.0/8 is never an EIP (nat.ParseUnicastIPv4); a share
// identity's slot count (1..8, 256..65536) sits in the ct mark while its
// first packet passes chain share/share6, so the ids start above 65536.
const (
	MarkID6Min = 0x00010001
	MarkID6Max = 0x00ffffff
)

// MarkOf returns the ct mark natgw's nftables rules give the IPv4
// connections NATed through eip: the IPv4 address as a big-endian 32-bit
// number. An IPv6 address does not fit a mark: IPv6 connections carry
// their EIP's mark id instead (MarkID6Min..MarkID6Max, disjoint from every
// IPv4 EIP's mark). eip must be an IPv4 address.
func MarkOf(eip netip.Addr) uint32 {
	b := eip.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// ctnetlink message and attribute numbers (linux/netfilter/nfnetlink_conntrack.h).
const (
	ipctnlMsgCtDelete = 2
	ctaMark           = 8
	ctaMarkMask       = 21
)

// FlushMark deletes, inside the kernel, every entry of family (unix.AF_INET
// or unix.AF_INET6) whose ct mark matches mark under mask. This is the
// cheap path: no dump. It is one ctnetlink delete without a tuple,
// filtered by family (nfgenmsg version 1: the family is honoured) and
// mark, exchanged on a socket the Go runtime's poller does not watch (see
// package nlsock).
func (c *Cleaner) FlushMark(ctx context.Context, family uint8, mark, mask uint32) error {
	if family != unix.AF_INET && family != unix.AF_INET6 {
		return fmt.Errorf("conntrack: flush mark %#x/%#x: family %d is neither AF_INET nor AF_INET6", mark, mask, family)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	req := binary.NativeEndian.AppendUint32(make([]byte, 0, 36), 0) // length, below
	req = binary.NativeEndian.AppendUint16(req, unix.NFNL_SUBSYS_CTNETLINK<<8|ipctnlMsgCtDelete)
	req = binary.NativeEndian.AppendUint16(req, unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	req = binary.NativeEndian.AppendUint32(req, c.seq)
	req = binary.NativeEndian.AppendUint32(req, 0)
	req = append(req, family, 1, 0, 0)
	for _, a := range [][2]uint32{{ctaMark, mark}, {ctaMarkMask, mask}} {
		req = binary.NativeEndian.AppendUint16(req, 8)
		req = binary.NativeEndian.AppendUint16(req, uint16(a[0]))
		req = binary.BigEndian.AppendUint32(req, a[1])
	}
	binary.NativeEndian.PutUint32(req, uint32(len(req)))
	if err := c.answer(ctx, req, c.seq); err != nil {
		return fmt.Errorf("conntrack: flush family %d mark %#x/%#x: %w", family, mark, mask, err)
	}
	return nil
}

// answer sends req and reads until the ack or error of message seq.
// Called with c.mu held.
func (c *Cleaner) answer(ctx context.Context, req []byte, seq uint32) error {
	if err := c.nl.Send(ctx, req); err != nil {
		return err
	}
	for {
		n, err := c.nl.Recv(ctx, c.buf)
		if err != nil {
			return err
		}
		var bad error
		for h, m := range nlsock.Messages(c.buf[:n], &bad) {
			if h.Type != unix.NLMSG_ERROR {
				continue
			}
			if code, s, ok := nlsock.Errno(m); ok && s == seq {
				if code != 0 {
					return code
				}
				return nil
			}
		}
		if bad != nil {
			return bad
		}
	}
}

// DeleteByAddr dumps the table (the IPv4 entries, the IPv6 ones, or both,
// by the families of addrs) and deletes every entry whose original or
// reply tuple has one of addrs as source or destination, like
// `conntrack -D -d ADDR` plus the reply side of SNATed flows. It returns how
// many entries it deleted. Entries that vanish meanwhile are not errors.
func (c *Cleaner) DeleteByAddr(addrs []netip.Addr) (int, error) {
	return c.DeleteByAddrVisit(addrs, nil)
}

// DeleteByAddrVisit is DeleteByAddr that also shows visit every entry of
// the dump it leaves (its original destination, its reply destination and
// its ct mark), from the same one dump: the caller learns what else the
// table holds without a second walk.
func (c *Cleaner) DeleteByAddrVisit(addrs []netip.Addr, visit func(origDst, replyDst netip.Addr, mark uint32)) (int, error) {
	if len(addrs) == 0 {
		return 0, nil
	}
	want := addrSet(addrs)
	c.mu.Lock()
	defer c.mu.Unlock()
	flows, err := c.dump(slices.Values(addrs))
	if err != nil {
		return 0, err
	}
	return c.deleteFlows(flows, func(f ct.Flow) bool {
		if carries(f, want) {
			return true
		}
		if visit != nil {
			visit(f.TupleOrig.IP.DestinationAddress, f.TupleReply.IP.DestinationAddress, f.Mark)
		}
		return false
	})
}

// deleteFlows deletes the flows that keep selects (every flow when keep is
// nil); entries that vanished meanwhile are not errors. Caller holds mu.
func (c *Cleaner) deleteFlows(flows []ct.Flow, keep func(ct.Flow) bool) (int, error) {
	n := 0
	for _, f := range flows {
		if keep != nil && !keep(f) {
			continue
		}
		if err := c.conn.Delete(f); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return n, fmt.Errorf("conntrack: delete %s: %w", f.TupleOrig, err)
		}
		n++
	}
	return n, nil
}

// DeleteDNAT dumps the table (the families of the DNATs' EIPs) and deletes the entries DNATed through
// one of dnats: original destination the DNAT's EIP and external port,
// reply source its internal address and port, its protocol. It leaves
// every other connection of the EIP alone (the other backends of a share
// identity keep theirs) and returns how many entries it deleted.
func (c *Cleaner) DeleteDNAT(dnats []nat.DNAT) (int, error) {
	if len(dnats) == 0 {
		return 0, nil
	}
	type key struct {
		eip, in       netip.Addr
		proto         uint8
		extPort, port uint16
	}
	want := make(map[key]bool, len(dnats))
	for _, d := range dnats {
		want[key{d.EIP, d.InternalIP, d.Protocol.Number(), d.ExternalPort, d.InternalPort}] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	flows, err := c.dump(slices.Values(dnatEIPs(dnats)))
	if err != nil {
		return 0, err
	}
	return c.deleteFlows(flows, func(f ct.Flow) bool {
		o, r := f.TupleOrig, f.TupleReply
		return want[key{o.IP.DestinationAddress, r.IP.SourceAddress, o.Proto.Protocol, o.Proto.DestinationPort, r.Proto.SourcePort}]
	})
}

// ForgetDNAT is a backend's forgetting of removed share DNAT backends'
// flows (engine.DNATFlowForgetter): DeleteDNAT of dnats, nothing for none,
// after checking ctx, with the count in the error.
func (c *Cleaner) ForgetDNAT(ctx context.Context, dnats []nat.DNAT) error {
	if len(dnats) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := c.DeleteDNAT(dnats); err != nil {
		return fmt.Errorf("forget flows of %d share DNAT backends: %w", len(dnats), err)
	}
	return nil
}

// dnatEIPs returns the EIPs of dnats.
func dnatEIPs(dnats []nat.DNAT) []netip.Addr {
	out := make([]netip.Addr, len(dnats))
	for i, d := range dnats {
		out[i] = d.EIP
	}
	return out
}

// dump dumps the entries of the families of addrs (IPv4, IPv6 or both).
// Called with c.mu held.
func (c *Cleaner) dump(addrs iter.Seq[netip.Addr]) ([]ct.Flow, error) {
	var v4, v6 bool
	for a := range addrs {
		v4, v6 = v4 || a.Is4(), v6 || a.Is6()
	}
	var out []ct.Flow
	for _, f := range []struct {
		want bool
		fam  netfilter.ProtoFamily
	}{{v4, netfilter.ProtoIPv4}, {v6, netfilter.ProtoIPv6}} {
		if !f.want {
			continue
		}
		flows, err := c.conn.DumpFilter(ct.NewFilter().Family(f.fam), nil)
		if err != nil {
			return nil, fmt.Errorf("conntrack: dump: %w", err)
		}
		out = append(out, flows...)
	}
	return out, nil
}

// Count returns how many entries (of the families of addrs) have one of
// addrs in either tuple.
func (c *Cleaner) Count(addrs []netip.Addr) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	flows, err := c.matching(addrs)
	return len(flows), err
}

// matching dumps the entries that carry one of addrs. Called with c.mu held.
func (c *Cleaner) matching(addrs []netip.Addr) ([]ct.Flow, error) {
	want := addrSet(addrs)
	flows, err := c.dump(slices.Values(addrs))
	if err != nil {
		return nil, err
	}
	out := flows[:0]
	for _, f := range flows {
		if carries(f, want) {
			out = append(out, f)
		}
	}
	return out, nil
}

// addrSet is addrs as a set.
func addrSet(addrs []netip.Addr) map[netip.Addr]bool {
	want := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		want[a] = true
	}
	return want
}

// carries reports whether f has one of want as source or destination of
// its original or reply tuple.
func carries(f ct.Flow, want map[netip.Addr]bool) bool {
	o, r := f.TupleOrig.IP, f.TupleReply.IP
	return want[o.SourceAddress] || want[o.DestinationAddress] || want[r.SourceAddress] || want[r.DestinationAddress]
}

// Close closes the socket. The namespace handle given to Open stays open.
func (c *Cleaner) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return errors.Join(c.conn.Close(), c.nl.Close())
}
