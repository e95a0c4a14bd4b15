package scenario

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
)

// udpSender sends single UDP datagrams with any source port through a raw
// socket created in a namespace: each new (source port, destination port)
// pair is a new conntrack flow on the gateway, whose NAT rules are evaluated
// for its first packet.
//
// IPv4 datagrams are written whole (IPPROTO_RAW, the header included, UDP
// checksum 0 = none). IPv6 has no checksum-less UDP (conntrack would count
// such a datagram invalid and never translate it), so an IPv6 sender is a
// raw IPPROTO_UDP socket bound to src that writes the UDP header and
// payload, the kernel adding the IPv6 header and the UDP checksum
// (IPV6_CHECKSUM at offset 6).
type udpSender struct {
	fd  int
	src netip.Addr
	pkt [20 + 8 + 18]byte // IPv4 header, UDP header, payload
}

// newUDPSender opens a raw socket in the namespace ns; datagrams leave from
// src (IPv4 or IPv6: the sender sends to addresses of src's family).
func newUDPSender(ns string, src netip.Addr) (*udpSender, error) {
	s := &udpSender{fd: -1, src: src}
	err := netns.Do(ns, func() error {
		if src.Is6() {
			return s.open6()
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		if err != nil {
			return err
		}
		s.fd = fd
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("raw socket in %s: %w", ns, err)
	}
	if src.Is6() {
		u := s.pkt[20:]
		binary.BigEndian.PutUint16(u[4:6], uint16(len(u))) // UDP length; the kernel fills in the checksum
		copy(u[8:], "natgw-bench-flow..")
		return s, nil
	}
	h := s.pkt[:]
	h[0] = 0x45 // IPv4, 20-byte header
	h[8] = 64   // TTL
	h[9] = unix.IPPROTO_UDP
	src4 := src.As4()
	copy(h[12:16], src4[:])
	binary.BigEndian.PutUint16(h[24:26], uint16(len(s.pkt)-20)) // UDP length; checksum 0 = none
	copy(h[28:], "natgw-bench-flow..")
	return s, nil
}

// open6 opens the IPv6 sender's socket in the current namespace.
func (s *udpSender) open6() error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return err
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_CHECKSUM, 6); err != nil {
		unix.Close(fd)
		return fmt.Errorf("IPV6_CHECKSUM: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet6{Addr: s.src.As16()}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("bind %s: %w", s.src, err)
	}
	s.fd = fd
	return nil
}

// Send sends one datagram to dst:dport from s.src:sport. For IPv4 the
// kernel fills in the IP total length, ID and checksum (IP_HDRINCL); for
// IPv6 the IPv6 header and the UDP checksum. dst must be of src's family.
func (s *udpSender) Send(dst netip.Addr, sport, dport uint16) error {
	if dst.Is6() != s.src.Is6() {
		return fmt.Errorf("send udp to %s: the sender is %s (from %s)", dst, nat.Family(s.src), s.src)
	}
	h := s.pkt[:]
	var to unix.Sockaddr
	if dst.Is6() {
		h = s.pkt[20:]
		binary.BigEndian.PutUint16(h[0:2], sport)
		binary.BigEndian.PutUint16(h[2:4], dport)
		to = &unix.SockaddrInet6{Addr: dst.As16()}
	} else {
		d := dst.As4()
		copy(h[16:20], d[:])
		binary.BigEndian.PutUint16(h[20:22], sport)
		binary.BigEndian.PutUint16(h[22:24], dport)
		to = &unix.SockaddrInet4{Addr: d}
	}
	for {
		err := unix.Sendto(s.fd, h, 0, to)
		switch err {
		case nil:
			return nil
		case unix.EINTR:
			continue
		case unix.ENOBUFS, unix.EAGAIN:
			// Queue full for a moment: the receiving side is behind.
			time.Sleep(50 * time.Microsecond)
			continue
		}
		return fmt.Errorf("send udp to %s:%d: %w", dst, dport, err)
	}
}

func (s *udpSender) Close() error {
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	return err
}

// ctTable reads a namespace's conntrack table over a lasting socket.
type ctTable struct {
	ns *netns.NS
	c  *conntrack.Conn
}

func openCT(ns string) (*ctTable, error) {
	n, err := netns.Open(ns)
	if err != nil {
		return nil, err
	}
	c, err := conntrack.Dial(&netlink.Config{NetNS: n.Fd()})
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("conntrack in %s: %w", ns, err)
	}
	return &ctTable{ns: n, c: c}, nil
}

// Count returns how many flows have eip as original destination, and how
// many of those were translated to internal (reply source).
func (t *ctTable) Count(eip, internal netip.Addr) (toEIP, natted int, err error) {
	flows, err := t.c.Dump(nil)
	if err != nil {
		return 0, 0, fmt.Errorf("conntrack dump: %w", err)
	}
	for _, f := range flows {
		if f.TupleOrig.IP.DestinationAddress == eip {
			toEIP++
			if f.TupleReply.IP.SourceAddress == internal {
				natted++
			}
		}
	}
	return toEIP, natted, nil
}

// Flush deletes every conntrack entry of the namespace.
func (t *ctTable) Flush() error {
	if err := t.c.Flush(); err != nil {
		return fmt.Errorf("conntrack flush: %w", err)
	}
	return nil
}

// WaitCount polls until at least want flows go to eip, or ctx/timeout ends.
func (t *ctTable) WaitCount(ctx context.Context, eip, internal netip.Addr, want int, timeout time.Duration) (toEIP, natted int, err error) {
	deadline := time.Now().Add(timeout)
	for {
		toEIP, natted, err = t.Count(eip, internal)
		if err != nil || toEIP >= want {
			return toEIP, natted, err
		}
		if time.Now().After(deadline) {
			return toEIP, natted, fmt.Errorf("%d conntrack flows to %s after %s, want %d", toEIP, eip, timeout, want)
		}
		select {
		case <-ctx.Done():
			return toEIP, natted, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

func (t *ctTable) Close() error {
	err := t.c.Close()
	t.ns.Close()
	return err
}
