// Package conntrack removes the connection-tracking entries of NAT mappings
// that went away, in a gateway's network namespace, over one lasting
// ctnetlink socket (github.com/ti-mo/conntrack).
package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/netns"
)

// Cleaner deletes conntrack entries in one namespace. It keeps its socket
// open: closing a netfilter socket right after a delete blocks for an RCU
// grace period (~8 ms), so a Cleaner is meant to live as long as its backend.
type Cleaner struct {
	mu   sync.Mutex
	ns   *netns.NS // kept open for the socket's life
	conn *ct.Conn
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
	return &Cleaner{ns: ns, conn: c}, nil
}

// MarkOf returns the ct mark natgw's nftables rules give the connections
// NATed through eip: the IPv4 address as a big-endian 32-bit number.
func MarkOf(eip netip.Addr) uint32 {
	b := eip.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// FlushMark deletes, inside the kernel, every IPv4 entry whose ct mark
// matches mark under mask. This is the cheap path: no dump.
func (c *Cleaner) FlushMark(mark, mask uint32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := ct.NewFilter().Family(netfilter.ProtoIPv4).Mark(mark).MarkMask(mask)
	if err := c.conn.FlushFilter(f); err != nil {
		return fmt.Errorf("conntrack: flush mark %#x/%#x: %w", mark, mask, err)
	}
	return nil
}

// DeleteByAddr dumps the IPv4 table and deletes every entry whose original or
// reply tuple has one of addrs as source or destination, like
// `conntrack -D -d ADDR` plus the reply side of SNATed flows. It returns how
// many entries it deleted. Entries that vanish meanwhile are not errors.
func (c *Cleaner) DeleteByAddr(addrs []netip.Addr) (int, error) {
	if len(addrs) == 0 {
		return 0, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	flows, err := c.matching(addrs)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, f := range flows {
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

// Count returns how many IPv4 entries have one of addrs in either tuple.
func (c *Cleaner) Count(addrs []netip.Addr) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	flows, err := c.matching(addrs)
	return len(flows), err
}

// matching dumps the IPv4 entries that carry one of addrs. Called with c.mu held.
func (c *Cleaner) matching(addrs []netip.Addr) ([]ct.Flow, error) {
	want := make(map[netip.Addr]bool, len(addrs))
	for _, a := range addrs {
		want[a] = true
	}
	flows, err := c.conn.DumpFilter(ct.NewFilter().Family(netfilter.ProtoIPv4), nil)
	if err != nil {
		return nil, fmt.Errorf("conntrack: dump: %w", err)
	}
	out := flows[:0]
	for _, f := range flows {
		o, r := f.TupleOrig.IP, f.TupleReply.IP
		if want[o.SourceAddress] || want[o.DestinationAddress] || want[r.SourceAddress] || want[r.DestinationAddress] {
			out = append(out, f)
		}
	}
	return out, nil
}

// Close closes the socket. The namespace handle given to Open stays open.
func (c *Cleaner) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn.Close()
}
