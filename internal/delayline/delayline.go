// Package delayline is a test fixture that adds delay to a path between
// network namespaces where the kernel has no netem: a user-space relay that
// reads every Ethernet frame arriving on one interface (AF_PACKET) and
// writes it out of another after a fixed delay, both ways. The two
// interfaces live in a namespace of their own (the "middle"), have no
// addresses and are not bridged: the relay is the only path between them,
// so an end-to-end round trip gets twice the one-way delay.
//
//	a (eth0) ── veth ── (A) middle (B) ── veth ── (eth0) b
//	                      └─ Line ─┘
//
// Frames keep their offload metadata (PACKET_VNET_HDR), so TCP segments
// offloaded as one large frame (GSO) cross as one frame and are not
// re-segmented. Frames are queued without a limit of their own beyond
// QueueFrames; a full queue drops (counted in Stats).
//
// The caller must be root (AF_PACKET sockets in another namespace).
package delayline

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/netns"
)

// QueueFrames is how many frames each direction holds in flight.
const QueueFrames = 1 << 16

// maxFrame bounds one frame with its virtio-net header: a 64 KiB GSO
// frame plus headers.
const maxFrame = 10 + 14 + 65536 + 256

// pollEvery is how often a blocked read wakes to see whether the line
// was closed.
const pollEvery = 100 * time.Millisecond

// Options of a Line.
type Options struct {
	// NS is the middle namespace (a name under /run/netns or a path).
	NS string
	// A and B are the two interfaces in NS the line joins.
	A, B string
	// Delay is added to every frame, each way (a round trip gets twice it).
	// Zero relays frames at once.
	Delay time.Duration
}

// Stats counts frames of both directions.
type Stats struct {
	Relayed uint64 // frames written out of the other interface
	Dropped uint64 // frames lost: queue full or the write failed
}

// Line is a running delay line. Close stops it.
type Line struct {
	opts    Options
	fds     [2]int
	closed  atomic.Bool
	wg      sync.WaitGroup
	relayed atomic.Uint64
	dropped atomic.Uint64
	once    sync.Once
}

type frame struct {
	due time.Time
	b   []byte
}

// Start opens packet sockets on opts.A and opts.B inside opts.NS and relays
// frames between them until Close (or ctx ends).
func Start(ctx context.Context, opts Options) (*Line, error) {
	if opts.NS == "" || opts.A == "" || opts.B == "" || opts.A == opts.B {
		return nil, fmt.Errorf("delayline: want a namespace and two distinct interfaces, got ns=%q a=%q b=%q", opts.NS, opts.A, opts.B)
	}
	if opts.Delay < 0 {
		return nil, fmt.Errorf("delayline: delay %v: want at least 0", opts.Delay)
	}
	l := &Line{opts: opts, fds: [2]int{-1, -1}}
	for i, name := range []string{opts.A, opts.B} {
		fd, err := openPacket(opts.NS, name)
		if err != nil {
			l.closeFDs()
			return nil, err
		}
		l.fds[i] = fd
	}
	for _, dir := range [][2]int{{0, 1}, {1, 0}} {
		q := make(chan frame, QueueFrames)
		l.wg.Add(2)
		go l.read(l.fds[dir[0]], q)
		go l.write(l.fds[dir[1]], q)
	}
	if ctx.Done() != nil {
		go func() {
			<-ctx.Done()
			l.Close()
		}()
	}
	return l, nil
}

// openPacket opens an AF_PACKET socket on interface name in ns, with
// virtio-net headers and without the frames it sends itself.
func openPacket(ns, name string) (int, error) {
	fd := -1
	err := netns.Do(ns, func() error {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		proto := htons(unix.ETH_P_ALL)
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto))
		if err != nil {
			return fmt.Errorf("socket: %w", err)
		}
		for _, o := range []struct {
			level, opt, val int
			what            string
		}{
			{unix.SOL_PACKET, unix.PACKET_VNET_HDR, 1, "PACKET_VNET_HDR"},
			{unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1, "PACKET_IGNORE_OUTGOING"},
			{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16 << 20, "SO_RCVBUFFORCE"},
			{unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 16 << 20, "SO_SNDBUFFORCE"},
		} {
			if err := unix.SetsockoptInt(fd, o.level, o.opt, o.val); err != nil {
				return fmt.Errorf("%s: %w", o.what, err)
			}
		}
		tv := unix.NsecToTimeval(pollEvery.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return fmt.Errorf("SO_RCVTIMEO: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}); err != nil {
			return fmt.Errorf("bind: %w", err)
		}
		return nil
	})
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("delayline: packet socket on %s in %s: %w", name, ns, err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// read queues every frame arriving on fd, stamped with when it is due.
func (l *Line) read(fd int, q chan<- frame) {
	defer l.wg.Done()
	defer close(q)
	buf := make([]byte, maxFrame)
	for !l.closed.Load() {
		n, err := unix.Read(fd, buf)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		f := frame{due: time.Now().Add(l.opts.Delay), b: append([]byte(nil), buf[:n]...)}
		select {
		case q <- f:
		default:
			l.dropped.Add(1)
		}
	}
}

// write sends each queued frame out of fd when it is due.
func (l *Line) write(fd int, q <-chan frame) {
	defer l.wg.Done()
	for f := range q {
		if d := time.Until(f.due); d > 0 {
			time.Sleep(d)
		}
		if l.closed.Load() {
			continue // drain so that the reader is not blocked
		}
		if _, err := unix.Write(fd, f.b); err != nil {
			l.dropped.Add(1)
			continue
		}
		l.relayed.Add(1)
	}
}

// Stats returns the frame counts so far.
func (l *Line) Stats() Stats {
	return Stats{Relayed: l.relayed.Load(), Dropped: l.dropped.Load()}
}

// Close stops the relay and closes its sockets. It is idempotent.
func (l *Line) Close() error {
	l.once.Do(func() {
		l.closed.Store(true)
		l.wg.Wait()
		l.closeFDs()
	})
	return nil
}

func (l *Line) closeFDs() {
	for i, fd := range l.fds {
		if fd >= 0 {
			unix.Close(fd)
			l.fds[i] = -1
		}
	}
}
