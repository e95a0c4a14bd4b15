package netlab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"
)

// Ping sends count ICMP echo requests from inside ns to dst, one every
// interval, and returns the round-trip time of each answered one, in the
// order sent (lost requests are left out: len(result) < count means loss).
// A reply counts for its request until wait after the last request was
// sent. It uses a raw ICMP socket (root), not the ping binary (the image
// has none).
func Ping(ctx context.Context, ns string, dst netip.Addr, count int, interval, wait time.Duration) ([]time.Duration, error) {
	if !dst.Is4() {
		return nil, fmt.Errorf("netlab: ping %s: want an IPv4 address", dst)
	}
	if count <= 0 {
		return nil, fmt.Errorf("netlab: ping %s: count %d, want at least 1", dst, count)
	}
	var c net.PacketConn
	err := inNS(ns, func() error {
		var err error
		c, err = (&net.ListenConfig{}).ListenPacket(ctx, "ip4:icmp", "0.0.0.0")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("netlab: ping %s from %s: %w", dst, ns, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()

	id := uint16(os.Getpid()) ^ uint16(time.Now().UnixNano())
	sent := make([]time.Time, count)
	rtt := make([]time.Duration, count)
	got := make([]bool, count)
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 1500)
		n := 0
		for n < count {
			k, _, err := c.ReadFrom(buf)
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					err = nil
				}
				done <- err
				return
			}
			now := time.Now()
			// net.IPConn strips the IPv4 header of what a raw
			// socket reads.
			p := buf[:k]
			if len(p) < 8 || p[0] != 0 || binary.BigEndian.Uint16(p[4:]) != id {
				continue // not an echo reply of ours
			}
			seq := int(binary.BigEndian.Uint16(p[6:]))
			if seq < count && !got[seq] && !sent[seq].IsZero() {
				got[seq], rtt[seq] = true, now.Sub(sent[seq])
				n++
			}
		}
		done <- nil
	}()
	dstAddr := &net.IPAddr{IP: dst.AsSlice()}
	var werr error
	for i := 0; i < count && ctx.Err() == nil; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(interval):
			}
		}
		msg := echoRequest(id, uint16(i))
		sent[i] = time.Now()
		if _, err := c.WriteTo(msg, dstAddr); err != nil && werr == nil {
			werr = err
		}
	}
	// The reader owns got/rtt until it returns: end it at the deadline.
	_ = c.SetReadDeadline(time.Now().Add(wait))
	rerr := <-done
	if err := errors.Join(werr, rerr, ctx.Err()); err != nil {
		return nil, fmt.Errorf("netlab: ping %s from %s: %w", dst, ns, err)
	}
	var out []time.Duration
	for i := range count {
		if got[i] {
			out = append(out, rtt[i])
		}
	}
	return out, nil
}

// echoRequest is an ICMP echo request with 56 bytes of payload, as ping's.
func echoRequest(id, seq uint16) []byte {
	b := make([]byte, 8+56)
	b[0] = 8 // echo request
	binary.BigEndian.PutUint16(b[4:], id)
	binary.BigEndian.PutUint16(b[6:], seq)
	binary.BigEndian.PutUint16(b[2:], inetChecksum(b))
	return b
}

// inetChecksum is the Internet checksum (RFC 1071) of b.
func inetChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
