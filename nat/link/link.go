// Package link programs a gateway's addresses and routes over netlink: EIP
// addresses on the external interface (IPv4 with a gratuitous ARP, like
// upstream's `ip addr replace` + `arping -U`; IPv6 without duplicate address
// detection and with an unsolicited neighbour advertisement), static routes
// (`ip route replace`), and IPv4 and IPv6 forwarding. It execs nothing.
package link

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
)

// Plumber programs addresses and routes in one gateway namespace over a
// lasting rtnetlink handle.
type Plumber struct {
	mu  sync.Mutex
	cfg nat.Config
	ns  *netns.NS
	h   *netlink.Handle
}

// New opens cfg's namespace, turns on IPv4 forwarding there and returns a
// Plumber for its interfaces.
func New(cfg nat.Config) (*Plumber, error) {
	cfg = cfg.WithDefaults()
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("link: %w", err)
	}
	h, err := netlink.NewHandleAt(vnetns.NsHandle(ns.Fd()))
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("link: netlink handle in %q: %w", cfg.NetNS, err)
	}
	p := &Plumber{cfg: cfg, ns: ns, h: h}
	if err := p.enableForwarding(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *Plumber) enableForwarding() error {
	err := p.ns.Do(func() error {
		// /proc/sys/net follows the namespace of the thread that opens it.
		return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644)
	})
	if err != nil {
		return fmt.Errorf("link: enable ip_forward in %q: %w", p.cfg.NetNS, err)
	}
	err = p.ns.Do(func() error {
		err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1\n"), 0o644)
		if errors.Is(err, os.ErrNotExist) {
			return nil // IPv6 disabled in this kernel: nothing to forward
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("link: enable IPv6 forwarding in %q: %w", p.cfg.NetNS, err)
	}
	return nil
}

func (p *Plumber) device(d nat.RouteDevice) string {
	if d == nat.DeviceExternal {
		return p.cfg.ExternalInterface
	}
	return p.cfg.InternalInterface
}

// Check verifies that the added EIP and Route objects can be programmed
// (their interfaces exist) before anything is changed.
func (p *Plumber) Check(added []nat.Object) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, o := range added {
		var dev string
		switch o.Kind {
		case nat.KindEIP:
			dev = p.cfg.ExternalInterface
		case nat.KindRoute:
			dev = p.device(o.Route.Device)
		default:
			continue
		}
		if _, err := p.h.LinkByName(dev); err != nil {
			return fmt.Errorf("%s: interface %q in netns %q: %w", o, dev, p.cfg.NetNS, err)
		}
	}
	return nil
}

// Key identifies what an EIP or Route object puts in the kernel ("addr
// A/LEN", "route D via N dev I"), so that an update which keeps it (e.g. a
// QoS change of an EIP) does not touch it; "" for other kinds.
func Key(o nat.Object) string {
	switch o.Kind {
	case nat.KindEIP:
		k := "addr"
		for _, a := range o.EIP.Prefixes() {
			k += " " + a.String()
		}
		return k
	case nat.KindRoute:
		return fmt.Sprintf("route %s via %s dev %s", o.Route.Destination, o.Route.NextHop, o.Route.Device)
	}
	return ""
}

// Apply removes the addresses/routes of removed EIP and Route objects and
// adds those of added ones; idempotent. Other kinds are ignored. What an
// object keeps across an update is left in place.
func (p *Plumber) Apply(ctx context.Context, removed, added []nat.Object) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := map[string]int{}
	for _, o := range added {
		for _, it := range items(o) {
			kept[it.key]++
		}
	}
	for _, o := range removed {
		for _, it := range items(o) {
			if kept[it.key] > 0 {
				kept[it.key]--
				continue
			}
			if err := p.remove(o, it); err != nil {
				return err
			}
		}
	}
	gone := map[string]bool{}
	for _, o := range removed {
		for _, it := range items(o) {
			gone[it.key] = true
		}
	}
	for _, o := range added {
		if err := ctx.Err(); err != nil {
			return err
		}
		for _, it := range items(o) {
			if gone[it.key] {
				continue
			}
			if err := p.add(o, it); err != nil {
				return err
			}
		}
	}
	return nil
}

// item is one thing an EIP or Route object puts in the kernel: an address
// of an EIP (each of a dual-stack EIP's two separately, so that an update
// which adds or removes one leaves the other alone) or a route.
type item struct {
	key  string
	addr netip.Prefix // an EIP's address
}

func items(o nat.Object) []item {
	switch {
	case o.Kind == nat.KindEIP && o.EIP != nil:
		ps := o.EIP.Prefixes()
		out := make([]item, len(ps))
		for i, a := range ps {
			out[i] = item{key: "addr " + a.String(), addr: a}
		}
		return out
	case o.Kind == nat.KindRoute && o.Route != nil:
		return []item{{key: Key(o)}}
	}
	return nil
}

// eipAddr is the netlink address of an EIP's address; an IPv6 one without
// duplicate address detection (the EIP is the gateway's to use at once, as
// an IPv4 one is; DAD would hold it tentative, unusable, for a second or
// more), as upstream's IPv4 `ip addr replace` has none either.
func eipAddr(a netip.Prefix) *netlink.Addr {
	na := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.Addr().AsSlice()), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}}
	if a.Addr().Is6() {
		na.Flags = unix.IFA_F_NODAD
	}
	return na
}

func (p *Plumber) linkOf(o nat.Object, dev string) (netlink.Link, error) {
	l, err := p.h.LinkByName(dev)
	if err != nil {
		return nil, fmt.Errorf("%s: interface %q: %w", o, dev, err)
	}
	return l, nil
}

func (p *Plumber) route(o nat.Object) (*netlink.Route, error) {
	r := o.Route
	l, err := p.linkOf(o, p.device(r.Device))
	if err != nil {
		return nil, err
	}
	rt := &netlink.Route{
		LinkIndex: l.Attrs().Index,
		Dst:       prefixNet(r.Destination),
		Gw:        net.IP(r.NextHop.AsSlice()),
	}
	if r.Device == nat.DeviceExternal {
		rt.Flags = int(netlink.FLAG_ONLINK)
	}
	return rt, nil
}

func (p *Plumber) add(o nat.Object, it item) error {
	switch o.Kind {
	case nat.KindEIP:
		l, err := p.linkOf(o, p.cfg.ExternalInterface)
		if err != nil {
			return err
		}
		if err := p.h.AddrReplace(l, eipAddr(it.addr)); err != nil {
			return fmt.Errorf("%s: add address %s on %s: %w", o, it.addr, p.cfg.ExternalInterface, err)
		}
		if err := p.announceAddr(l, it.addr.Addr()); err != nil {
			return fmt.Errorf("%s: on %s: %w", o, p.cfg.ExternalInterface, err)
		}
	case nat.KindRoute:
		rt, err := p.route(o)
		if err != nil {
			return err
		}
		if err := p.h.RouteReplace(rt); err != nil {
			return fmt.Errorf("%s: replace route: %w", o, err)
		}
	}
	return nil
}

func (p *Plumber) remove(o nat.Object, it item) error {
	switch o.Kind {
	case nat.KindEIP:
		l, err := p.linkOf(o, p.cfg.ExternalInterface)
		if err != nil {
			if isGone(err) {
				return nil
			}
			return err
		}
		if err := p.h.AddrDel(l, eipAddr(it.addr)); err != nil && !isGone(err) {
			return fmt.Errorf("%s: delete address %s on %s: %w", o, it.addr, p.cfg.ExternalInterface, err)
		}
	case nat.KindRoute:
		rt, err := p.route(o)
		if err != nil {
			if isGone(err) {
				return nil
			}
			return err
		}
		if err := p.h.RouteDel(rt); err != nil && !isGone(err) {
			return fmt.Errorf("%s: delete route: %w", o, err)
		}
	}
	return nil
}

// announceAddr tells l's neighbours that addr, on l, is here now: a
// gratuitous ARP for an IPv4 address; for an IPv6 one, once it is usable
// (waitUsable), an unsolicited neighbour advertisement (skipped while the
// link cannot send multicast yet, naNotYet). The one announcement of both
// an EIP's plumbing (Apply) and a floating address's (Claim, Announce).
func (p *Plumber) announceAddr(l netlink.Link, addr netip.Addr) error {
	if addr.Is6() {
		if err := p.waitUsable(l, addr); err != nil {
			return fmt.Errorf("address %s: %w", addr, err)
		}
		if err := p.unsolicitedNA(l, addr); err != nil && !naNotYet(err) {
			return fmt.Errorf("unsolicited neighbour advertisement of %s: %w", addr, err)
		}
		return nil
	}
	if err := p.gratuitousARP(l, addr); err != nil {
		return fmt.Errorf("gratuitous ARP for %s: %w", addr, err)
	}
	return nil
}

// tentativeWait bounds waitUsable.
const tentativeWait = 5 * time.Second

// waitUsable waits until the IPv6 address addr on l is no longer
// tentative. Even without DAD (IFA_F_NODAD) the kernel clears the
// tentative flag in a work queue after the address is added, not within
// the add; until then the address can neither receive packets nor be the
// source of the advertisement (sendmsg: EINVAL). On a busy machine that
// takes milliseconds.
func (p *Plumber) waitUsable(l netlink.Link, addr netip.Addr) error {
	deadline := time.Now().Add(tentativeWait)
	for {
		as, err := p.h.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			return fmt.Errorf("list addresses: %w", err)
		}
		tentative, found := true, false
		for _, a := range as {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip == addr {
				tentative, found = a.Flags&unix.IFA_F_TENTATIVE != 0, true
			}
		}
		if !found {
			return errors.New("not on the interface")
		}
		if !tentative {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still tentative after %v", tentativeWait)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// unsolicitedNA announces addr on l to all nodes (ff02::1): a neighbour
// advertisement with the override flag and l's link-layer address, sent
// from addr itself (RFC 4861 7.2.6), so neighbours update their cache
// for the EIP's new home, as the gratuitous ARP does for IPv4.
func (p *Plumber) unsolicitedNA(l netlink.Link, addr netip.Addr) error {
	mac := l.Attrs().HardwareAddr
	if len(mac) != 6 || l.Attrs().Flags&net.FlagUp == 0 {
		return nil // no Ethernet address, or down: nobody to tell
	}
	ifi := &net.Interface{Index: l.Attrs().Index, MTU: l.Attrs().MTU, Name: l.Attrs().Name, HardwareAddr: mac, Flags: l.Attrs().Flags}
	return p.ns.Do(func() error {
		// The socket is made, and the interface's addresses read, in the
		// gateway's namespace (this thread's).
		c, _, err := ndp.Listen(ifi, ndp.Addr(addr.String()))
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.SetWriteDeadline(time.Now().Add(time.Second)); err != nil {
			return err
		}
		na := &ndp.NeighborAdvertisement{
			Override:      true,
			TargetAddress: addr,
			Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: mac}},
		}
		return c.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes())
	})
}

// naNotYet reports whether an unsolicited NA failed because the link cannot
// send IPv6 multicast yet (a link just brought up, or without carrier, has
// no ff00::/8 route for a while: sendmsg answers EINVAL, ENETUNREACH or
// EADDRNOTAVAIL). The address is in place then and nobody on the link has
// a stale entry for it to correct; the apply goes on. A clean-clone make
// test met EINVAL in nat/nftables' kernel tests.
func naNotYet(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EADDRNOTAVAIL)
}

// gratuitousARP announces addr on l (an ARP request with sender = target =
// addr, to the broadcast address), so neighbours learn the EIP's new home.
func (p *Plumber) gratuitousARP(l netlink.Link, addr netip.Addr) error {
	mac := l.Attrs().HardwareAddr
	if len(mac) != 6 || l.Attrs().Flags&net.FlagUp == 0 {
		return nil // no Ethernet address, or down: nobody to tell
	}
	pkt := make([]byte, 28)
	binary.BigEndian.PutUint16(pkt[0:], 1)      // hardware type: Ethernet
	binary.BigEndian.PutUint16(pkt[2:], 0x0800) // protocol: IPv4
	pkt[4], pkt[5] = 6, 4
	binary.BigEndian.PutUint16(pkt[6:], 1) // request
	ip := addr.As4()
	copy(pkt[8:], mac)
	copy(pkt[14:], ip[:])
	// target hardware address stays zero
	copy(pkt[24:], ip[:])
	return p.ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
		if err != nil {
			return fmt.Errorf("packet socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{
			Protocol: htons(unix.ETH_P_ARP),
			Ifindex:  l.Attrs().Index,
			Halen:    6,
			Addr:     [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
		}
		return unix.Sendto(fd, pkt, 0, to)
	})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func isGone(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ESRCH) || errors.Is(err, unix.ENODEV)
}

// Close releases the netlink handle and the namespace.
func (p *Plumber) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.h.Close()
	return p.ns.Close()
}
