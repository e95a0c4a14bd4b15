package netlab

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/netns"
)

// handle is a netlink handle bound to one namespace.
type handle struct {
	ns   string
	open *netns.NS
	h    *netlink.Handle
}

// withHandle runs fn with a netlink handle inside namespace ns.
func withHandle(ns string, fn func(h *handle) error) error {
	n, err := netns.Open(ns)
	if err != nil {
		return err
	}
	defer n.Close()
	h, err := netlink.NewHandleAt(vnetns.NsHandle(n.Fd()))
	if err != nil {
		return fmt.Errorf("netlink handle in %s: %w", ns, err)
	}
	defer h.Close()
	return fn(&handle{ns: ns, open: n, h: h})
}

func (h *handle) link(name string) (netlink.Link, error) {
	l, err := h.h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("link %s in %s: %w", name, h.ns, err)
	}
	return l, nil
}

func (h *handle) linkUp(name string) error {
	l, err := h.link(name)
	if err != nil {
		return err
	}
	if err := h.h.LinkSetUp(l); err != nil {
		return fmt.Errorf("set %s up in %s: %w", name, h.ns, err)
	}
	return nil
}

func (h *handle) addrAdd(dev string, p netip.Prefix) error {
	l, err := h.link(dev)
	if err != nil {
		return err
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
	if p.Addr().Is6() {
		// Usable at once: duplicate address detection would hold it
		// tentative for a second or more.
		a.Flags = unix.IFA_F_NODAD
	}
	if err := h.h.AddrReplace(l, a); err != nil {
		return fmt.Errorf("add %s to %s in %s: %w", p, dev, h.ns, err)
	}
	return nil
}

// End is one end of a veth pair: the namespace, the interface name inside it,
// the addresses to put on it and, optionally, its MAC address (nil: random).
type End struct {
	NS    string
	Name  string
	Addrs []netip.Prefix
	MAC   net.HardwareAddr
}

// Veth creates a veth pair between a.NS and b.NS with the given names,
// puts the addresses on and brings both ends up. Names only need to be
// unique inside their own namespace.
func Veth(a, b End) error {
	err := withHandle(a.NS, func(h *handle) error {
		peer, err := netns.Open(b.NS)
		if err != nil {
			return err
		}
		defer peer.Close()
		v := &netlink.Veth{
			LinkAttrs:        netlink.LinkAttrs{Name: a.Name, HardwareAddr: a.MAC},
			PeerName:         b.Name,
			PeerNamespace:    netlink.NsFd(peer.Fd()),
			PeerHardwareAddr: b.MAC,
		}
		if err := h.h.LinkAdd(v); err != nil {
			return fmt.Errorf("add veth %s/%s -- %s/%s: %w", a.NS, a.Name, b.NS, b.Name, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	for _, e := range []End{a, b} {
		if err := Configure(e); err != nil {
			return err
		}
	}
	return nil
}

// Configure puts e.Addrs on the existing interface e.Name in e.NS and brings
// it up.
func Configure(e End) error {
	err := withHandle(e.NS, func(h *handle) error {
		for _, p := range e.Addrs {
			if err := h.addrAdd(e.Name, p); err != nil {
				return err
			}
		}
		return h.linkUp(e.Name)
	})
	if err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	return nil
}

// Bridge creates bridge name in ns and brings it up.
func Bridge(ns, name string) error {
	err := withHandle(ns, func(h *handle) error {
		if err := h.h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			return fmt.Errorf("add bridge %s in %s: %w", name, ns, err)
		}
		return h.linkUp(name)
	})
	if err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	return nil
}

// Enslave attaches port to bridge, both in ns.
func Enslave(ns, port, bridge string) error {
	err := withHandle(ns, func(h *handle) error {
		p, err := h.link(port)
		if err != nil {
			return err
		}
		br, err := h.link(bridge)
		if err != nil {
			return err
		}
		if err := h.h.LinkSetMaster(p, br); err != nil {
			return fmt.Errorf("attach %s to %s in %s: %w", port, bridge, ns, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	return nil
}

// Stub creates interface name in ns with the given addresses, up, for
// tests that need an interface but no peer: one end of a veth pair whose
// other end ("<name>-peer", up, no address) stays in the same namespace.
// (Kernels without the dummy driver exist, e.g. some microVMs.)
func Stub(ns, name string, addrs ...netip.Prefix) error {
	return Veth(End{NS: ns, Name: name, Addrs: addrs}, End{NS: ns, Name: name + "-peer"})
}

// AddAddr adds (replaces) address p on dev in ns.
func AddAddr(ns, dev string, p netip.Prefix) error {
	if err := withHandle(ns, func(h *handle) error { return h.addrAdd(dev, p) }); err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	return nil
}

// Addrs returns the IPv4 addresses on dev in ns.
func Addrs(ns, dev string) ([]netip.Prefix, error) { return addrs(ns, dev, netlink.FAMILY_V4) }

// Addrs6 returns the IPv6 addresses on dev in ns, link-local ones left out.
func Addrs6(ns, dev string) ([]netip.Prefix, error) { return addrs(ns, dev, netlink.FAMILY_V6) }

func addrs(ns, dev string, family int) ([]netip.Prefix, error) {
	var out []netip.Prefix
	err := withHandle(ns, func(h *handle) error {
		l, err := h.link(dev)
		if err != nil {
			return err
		}
		as, err := h.h.AddrList(l, family)
		if err != nil {
			return fmt.Errorf("list addresses of %s in %s: %w", dev, ns, err)
		}
		for _, a := range as {
			ip, ok := netip.AddrFromSlice(a.IP)
			if !ok || (family == netlink.FAMILY_V6 && ip.IsLinkLocalUnicast()) {
				continue
			}
			ones, _ := a.Mask.Size()
			out = append(out, netip.PrefixFrom(ip.Unmap(), ones))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("netlab: %w", err)
	}
	return out, nil
}

// Route is an IPv4 route of the main table as Routes reports it.
type Route struct {
	Dst    netip.Prefix // 0.0.0.0/0 (::/0) for the default route
	Via    netip.Addr   // invalid when directly connected
	Dev    string
	OnLink bool
}

func (r Route) String() string {
	s := r.Dst.String()
	if r.Via.IsValid() {
		s += " via " + r.Via.String()
	}
	s += " dev " + r.Dev
	if r.OnLink {
		s += " onlink"
	}
	return s
}

// AddRoute adds dst via gw (through dev when dev is not "") in ns.
func AddRoute(ns string, dst netip.Prefix, via netip.Addr, dev string) error {
	err := withHandle(ns, func(h *handle) error {
		r := &netlink.Route{
			Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())},
			Gw:  via.AsSlice(),
		}
		if dev != "" {
			l, err := h.link(dev)
			if err != nil {
				return err
			}
			r.LinkIndex = l.Attrs().Index
		}
		if err := h.h.RouteReplace(r); err != nil {
			return fmt.Errorf("add route %s via %s in %s: %w", dst, via, ns, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	return nil
}

// Routes returns the IPv4 routes of ns's main table.
func Routes(ns string) ([]Route, error) { return routes(ns, netlink.FAMILY_V4) }

// Routes6 returns the IPv6 routes of ns's main table (::/0 for the
// default route).
func Routes6(ns string) ([]Route, error) { return routes(ns, netlink.FAMILY_V6) }

func routes(ns string, family int) ([]Route, error) {
	unspecified := netip.IPv4Unspecified()
	if family == netlink.FAMILY_V6 {
		unspecified = netip.IPv6Unspecified()
	}
	var out []Route
	err := withHandle(ns, func(h *handle) error {
		rs, err := h.h.RouteList(nil, family)
		if err != nil {
			return fmt.Errorf("list routes in %s: %w", ns, err)
		}
		names := map[int]string{}
		for _, r := range rs {
			rt := Route{Dst: netip.PrefixFrom(unspecified, 0), OnLink: r.Flags&int(netlink.FLAG_ONLINK) != 0}
			if r.Dst != nil {
				ip, _ := netip.AddrFromSlice(r.Dst.IP)
				ones, _ := r.Dst.Mask.Size()
				rt.Dst = netip.PrefixFrom(ip.Unmap(), ones)
			}
			if r.Gw != nil {
				rt.Via, _ = netip.AddrFromSlice(r.Gw)
				rt.Via = rt.Via.Unmap()
			}
			if _, ok := names[r.LinkIndex]; !ok {
				if l, err := h.h.LinkByIndex(r.LinkIndex); err == nil {
					names[r.LinkIndex] = l.Attrs().Name
				}
			}
			rt.Dev = names[r.LinkIndex]
			out = append(out, rt)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("netlab: %w", err)
	}
	return out, nil
}

// Sysctl writes value to the sysctl key (dotted, e.g.
// "net.ipv4.ip_forward") inside ns.
func Sysctl(ns, key, value string) error {
	path := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	err := netns.Do(ns, func() error {
		// /proc/sys/net resolves against the opening thread's namespace.
		return os.WriteFile(path, []byte(value), 0o644)
	})
	if err != nil {
		return fmt.Errorf("netlab: sysctl %s=%s in %s: %w", key, value, ns, err)
	}
	return nil
}

// LinkExists reports whether interface name exists in ns.
func LinkExists(ns, name string) (bool, error) {
	var found bool
	err := withHandle(ns, func(h *handle) error {
		_, err := h.h.LinkByName(name)
		var nf netlink.LinkNotFoundError
		switch {
		case err == nil:
			found = true
		case errors.As(err, &nf):
		default:
			return err
		}
		return nil
	})
	return found, err
}

// SetLink brings interface name in ns up (up true) or down.
func SetLink(ns, name string, up bool) error {
	err := withHandle(ns, func(h *handle) error {
		if up {
			return h.linkUp(name)
		}
		l, err := h.link(name)
		if err != nil {
			return err
		}
		if err := h.h.LinkSetDown(l); err != nil {
			return fmt.Errorf("set %s down in %s: %w", name, ns, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	return nil
}

// DeleteLink deletes interface name in ns (a veth's peer goes with it, at
// once); an interface that is already gone is not an error.
func DeleteLink(ns, name string) error {
	err := withHandle(ns, func(h *handle) error {
		l, err := h.h.LinkByName(name)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return nil
			}
			return fmt.Errorf("find %s in %s: %w", name, ns, err)
		}
		if err := h.h.LinkDel(l); err != nil {
			return fmt.Errorf("delete %s in %s: %w", name, ns, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netlab: %w", err)
	}
	return nil
}
