package link

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// Floating addresses are the ones a highly available gateway moves between
// its replicas (EIPs on the external interface, the lanIp on the internal
// one): only the active replica holds them.

// Claim puts each prefix on dev (replacing it if present) and announces
// its address (announceAddr: IPv4 with a gratuitous ARP, IPv6 without DAD
// and with an unsolicited neighbour advertisement, as an EIP's addresses
// are plumbed), so that neighbours and bridges send its traffic here from
// now on.
func (p *Plumber) Claim(dev string, addrs []netip.Prefix) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, err := p.h.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("link: claim on %q: %w", dev, err)
	}
	for _, a := range addrs {
		if err := p.h.AddrReplace(l, eipAddr(a)); err != nil {
			return fmt.Errorf("link: add %s on %s: %w", a, dev, err)
		}
	}
	return p.announce(l, addrs)
}

// Announce announces each address on dev again (a gratuitous ARP, an
// unsolicited neighbour advertisement for IPv6), e.g. to repair a
// neighbour that missed the first one. Every address must be on dev.
func (p *Plumber) Announce(dev string, addrs []netip.Prefix) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, err := p.h.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("link: announce on %q: %w", dev, err)
	}
	return p.announce(l, addrs)
}

func (p *Plumber) announce(l netlink.Link, addrs []netip.Prefix) error {
	for _, a := range addrs {
		if err := p.announceAddr(l, a.Addr()); err != nil {
			return fmt.Errorf("link: announce on %s: %w", l.Attrs().Name, err)
		}
	}
	return nil
}

// Unclaim deletes each prefix from dev; one that is not there (or a
// missing dev) is no error.
func (p *Plumber) Unclaim(dev string, addrs []netip.Prefix) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, err := p.h.LinkByName(dev)
	if err != nil {
		if isGone(err) {
			return nil
		}
		return fmt.Errorf("link: unclaim on %q: %w", dev, err)
	}
	for _, a := range addrs {
		if err := p.h.AddrDel(l, eipAddr(a)); err != nil && !isGone(err) {
			return fmt.Errorf("link: delete %s from %s: %w", a, dev, err)
		}
	}
	return nil
}

// Up reports whether dev is administratively up and its operational state
// is up (a veth whose peer is down, or a link without carrier, is not).
func (p *Plumber) Up(dev string) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, err := p.h.LinkByName(dev)
	if err != nil {
		if isGone(err) {
			return false, nil
		}
		return false, fmt.Errorf("link: state of %q: %w", dev, err)
	}
	a := l.Attrs()
	return a.Flags&net.FlagUp != 0 && (a.OperState == netlink.OperUp || a.OperState == netlink.OperUnknown), nil
}
