// Package nlsock is a netlink socket to the kernel for request/answer
// exchanges (nf_tables batches and dumps, ctnetlink flushes) that the Go
// runtime's network poller does not watch.
//
// The kernel answers these requests from within the send or receive call,
// so an exchange practically never waits. A socket in the poller's epoll set
// costs on every answer anyway: each one the kernel queues wakes a thread
// parked in epoll_wait, typically on another CPU. On the 2-vCPU gateway VMs
// measured here that wake-up was the largest single kernel cost of a FIP
// add. A Socket is non-blocking and used with direct system calls; when a
// call would block it waits in poll(2), bounded by the context. Measured
// when it replaced mdlayher/netlink's poller-watched connection (commit
// 0a63bbd, probe of one FIP delete in a gateway namespace): 380-420 µs
// before, 240-310 µs after.
package nlsock

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/netns"
)

// DefaultTimeout bounds a wait of a Socket whose context has no deadline
// (see SetTimeout).
const DefaultTimeout = 30 * time.Second

// pollSlice is the longest single poll(2): a cancelled context is noticed
// within it.
const pollSlice = 50 * time.Millisecond

// Socket is one netlink socket in one network namespace. Its methods may be
// called from one goroutine at a time, except Close.
type Socket struct {
	fd      int
	closed  atomic.Bool
	timeout time.Duration
}

// Dial opens a netlink socket of protocol proto (unix.NETLINK_NETFILTER)
// inside ns (nil: the caller's namespace). The socket stays in that
// namespace for its whole life.
func Dial(ns *netns.NS, proto int) (*Socket, error) {
	fd := -1
	open := func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, proto)
		return err
	}
	var err error
	if ns == nil {
		err = open()
	} else {
		err = ns.Do(open)
	}
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("netlink socket: bind: %w", err)
	}
	return &Socket{fd: fd, timeout: DefaultTimeout}, nil
}

// SetTimeout sets what bounds a wait when the context has no deadline
// (DefaultTimeout until set).
func (s *Socket) SetTimeout(d time.Duration) { s.timeout = d }

// SetBuffers sets the send and receive buffer sizes past the system's
// limits (SO_SNDBUFFORCE, SO_RCVBUFFORCE: needs CAP_NET_ADMIN); 0 leaves a
// size as it is.
func (s *Socket) SetBuffers(send, recv int) error {
	var errs []error
	if send > 0 {
		errs = append(errs, unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, send))
	}
	if recv > 0 {
		errs = append(errs, unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, recv))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("netlink socket buffers (needs CAP_NET_ADMIN): %w", err)
	}
	return nil
}

// CapAcks makes error answers carry only the failed message's header, not
// the whole message (NETLINK_CAP_ACK).
func (s *Socket) CapAcks() error {
	if err := unix.SetsockoptInt(s.fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1); err != nil {
		return fmt.Errorf("netlink socket: cap acks: %w", err)
	}
	return nil
}

// Send sends b, one or more netlink messages, to the kernel in one
// sendmsg.
func (s *Socket) Send(ctx context.Context, b []byte) error {
	for {
		// write(2) on the non-blocking socket: to the kernel (the socket
		// is not connected anywhere else), without the sockaddr that
		// sendmsg's Go wrapper allocates.
		_, err := unix.Write(s.fd, b)
		if err != unix.EAGAIN && err != unix.EINTR {
			if err != nil {
				return fmt.Errorf("send: %w", err)
			}
			return nil
		}
		if err == unix.EAGAIN {
			if err := s.wait(ctx, unix.POLLOUT); err != nil {
				return fmt.Errorf("send: %w", err)
			}
		}
	}
}

// Recv reads one datagram (one or more netlink messages) into b and
// returns its length.
func (s *Socket) Recv(ctx context.Context, b []byte) (int, error) {
	for {
		n, ok, err := s.TryRecv(b)
		if err != nil {
			return 0, err
		}
		if ok {
			return n, nil
		}
		if err := s.wait(ctx, unix.POLLIN); err != nil {
			return 0, fmt.Errorf("receive: %w", err)
		}
	}
}

// TryRecv is Recv without waiting: ok is false when nothing is queued.
func (s *Socket) TryRecv(b []byte) (n int, ok bool, err error) {
	for {
		// read(2): the datagram without the sender's address (always
		// the kernel here), which recvmsg's Go wrapper allocates.
		n, err := unix.Read(s.fd, b)
		switch err {
		case nil:
			return n, true, nil
		case unix.EAGAIN:
			return 0, false, nil
		case unix.EINTR:
			continue
		}
		return 0, false, fmt.Errorf("receive: %w", err)
	}
}

// wait blocks in poll(2) until the socket is ready for events, ctx is done
// or its deadline (the socket's timeout without one) passes.
func (s *Socket) wait(ctx context.Context, events int16) error {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(s.timeout)
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if s.closed.Load() {
			return unix.EBADF
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("no answer from the kernel: %w", context.DeadlineExceeded)
		}
		fds := []unix.PollFd{{Fd: int32(s.fd), Events: events}}
		n, err := unix.Poll(fds, int(min(left, pollSlice)/time.Millisecond)+1)
		if err != nil && err != unix.EINTR {
			return fmt.Errorf("poll: %w", err)
		}
		if n > 0 {
			return nil // ready, or an error the next call reports
		}
	}
}

// Close closes the socket.
func (s *Socket) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	return unix.Close(s.fd)
}

// Messages iterates the netlink messages of one datagram: each header and
// payload (after the header). A bad length ends the iteration and is left
// in *bad.
func Messages(b []byte, bad *error) iter.Seq2[Header, []byte] {
	return func(yield func(Header, []byte) bool) {
		for len(b) >= unix.SizeofNlMsghdr {
			h := Header{
				Len:   binary.NativeEndian.Uint32(b[0:4]),
				Type:  binary.NativeEndian.Uint16(b[4:6]),
				Flags: binary.NativeEndian.Uint16(b[6:8]),
				Seq:   binary.NativeEndian.Uint32(b[8:12]),
			}
			l := int(h.Len)
			if l < unix.SizeofNlMsghdr || l > len(b) {
				*bad = fmt.Errorf("bad message length %d", l)
				return
			}
			m := b[unix.SizeofNlMsghdr:l]
			b = b[min((l+3)&^3, len(b)):]
			if !yield(h, m) {
				return
			}
		}
	}
}

// Header is what Messages reports of a message's header.
type Header struct {
	Len   uint32
	Type  uint16
	Flags uint16
	Seq   uint32
}

// Errno returns the error code of an NLMSG_ERROR payload (0 for an ack)
// and the sequence number of the message it answers; ok is false when the
// payload is too short.
func Errno(payload []byte) (code unix.Errno, seq uint32, ok bool) {
	if len(payload) < 4+unix.SizeofNlMsghdr {
		return 0, 0, false
	}
	c := int32(binary.NativeEndian.Uint32(payload[0:4]))
	return unix.Errno(-c), binary.NativeEndian.Uint32(payload[4+8 : 4+12]), true
}

// Join subscribes the socket to multicast groups (NETLINK_ADD_MEMBERSHIP),
// e.g. ctnetlink's event groups.
func (s *Socket) Join(groups ...int) error {
	for _, g := range groups {
		if err := unix.SetsockoptInt(s.fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, g); err != nil {
			return fmt.Errorf("netlink socket: join group %d: %w", g, err)
		}
	}
	return nil
}
