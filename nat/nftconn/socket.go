package nftconn

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nlsock"
)

// Socket is a lasting nf_tables netlink socket in one namespace: it
// commits Batches (one sendmsg each, one ack read for the whole batch)
// and numbers the requests a caller sends on it (Request) for dumps. Its
// methods are called one at a time. After a failed Commit the socket may
// hold stray answers: the caller closes it and dials a new one.
type Socket struct {
	nl     *nlsock.Socket
	seq    uint32 // next request or batch message sequence number
	ackBuf []byte
	txBuf  []byte // the last small batch's buffer, reused
}

// DialSocket opens a Socket in ns with a send buffer of sendBuf bytes (it
// bounds one batch, which goes out in one sendmsg) and a receive buffer of
// recvBuf (the error answers of a large rejected batch, dump replies); the
// FORCE variants pass the sysctl caps, which needs CAP_NET_ADMIN. timeout
// bounds one operation whose context has no deadline.
func DialSocket(ns *netns.NS, timeout time.Duration, sendBuf, recvBuf int) (*Socket, error) {
	nl, err := nlsock.Dial(ns, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, err
	}
	nl.SetTimeout(timeout)
	if err := errors.Join(nl.SetBuffers(sendBuf, recvBuf), nl.CapAcks()); err != nil {
		nl.Close()
		return nil, err
	}
	return &Socket{nl: nl}, nil
}

// NL returns the underlying socket, for dumps.
func (s *Socket) NL() *nlsock.Socket { return s.nl }

// Close closes the socket (kernel state stays).
func (s *Socket) Close() error { return s.nl.Close() }

// NewBatch starts a batch numbered from the socket's next sequence number
// (reusing the last small batch's buffer); size is a hint of its bytes.
func (s *Socket) NewBatch(size int) *Batch { return NewBatch(s.seq, size, s.txBuf) }

// keepTxBuf bounds the batch buffer the Socket keeps for the next batch.
// A fresh buffer per transaction cost a small one page faults (its first
// touch of fresh memory; ~18 µs each on the bench VM), more than half of
// an agent's faults per request; a bulk batch's buffer is not kept.
const keepTxBuf = 256 << 10

// Commit closes b and sends it as one kernel transaction, all or nothing,
// and reads the kernel's answers. It reports whether the batch held any
// message. A rejected batch (an errno in an answer) changed nothing;
// anything else (ENOBUFS on the answers, a timeout, a broken socket)
// leaves the outcome unknown (nat.ErrUnknownState). See Classify.
func (s *Socket) Commit(ctx context.Context, b *Batch) (sent bool, err error) {
	if cap(b.buf) <= keepTxBuf {
		defer func() { s.txBuf = b.buf[:0] }()
	}
	err = s.exchange(ctx, b)
	s.seq = b.seq + 1
	if err != nil {
		return false, Classify(err)
	}
	return b.seq != b.base, nil
}

// Classify wraps a failed commit: an errno delivered in an ack (or by the
// send) means the kernel refused the batch and changed nothing; ENOBUFS
// (acks dropped), a timeout or an error without errno leave the outcome
// unknown (nat.ErrUnknownState).
func Classify(err error) error {
	var errno unix.Errno
	if errors.Is(err, unix.ENOBUFS) || errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &errno) {
		return fmt.Errorf("nftables transaction: %w: %w", err, nat.ErrUnknownState)
	}
	return fmt.Errorf("nftables transaction rejected: %w", err)
}

// exchange sends the batch in one sendmsg and reads the kernel's answers
// up to the one for the last message (see Batch.Close). An errno in an
// answer is returned as a unix.Errno (the kernel refused the batch); any
// other failure (ENOBUFS, deadline) leaves the outcome unknown. The kernel
// processes the batch within sendmsg, so its answers are queued by the
// time it returns; once an error has been read, answers still missing are
// not waited for.
func (s *Socket) exchange(ctx context.Context, b *Batch) error {
	n := b.Close()
	if n == 0 {
		return nil
	}
	if err := s.nl.Send(ctx, b.buf); err != nil {
		return err
	}
	buf := s.Buffer()
	last := uint32(n - 1)
	var (
		errs []error
		err  error
	)
	for answered := false; !answered; {
		var rn int
		if len(errs) == 0 {
			if rn, err = s.nl.Recv(ctx, buf); err != nil {
				return fmt.Errorf("read acks: %w", err)
			}
		} else {
			// The kernel sent what it had; the errors are known.
			ok := false
			if rn, ok, err = s.nl.TryRecv(buf); err != nil || !ok {
				return errors.Join(append(errs, err)...)
			}
		}
		var bad error
		for h, m := range nlsock.Messages(buf[:rn], &bad) {
			if h.Type != unix.NLMSG_ERROR {
				continue
			}
			code, seq, ok := nlsock.Errno(m)
			if !ok {
				continue
			}
			if seq == b.base-1 && code != 0 {
				// An error about the batch as a whole: nothing more comes.
				return errors.Join(append(errs, fmt.Errorf("batch: %w", code))...)
			}
			i := seq - b.base
			if i > last {
				continue // not ours (the batch header, or stale)
			}
			if code != 0 {
				errs = append(errs, fmt.Errorf("%s (message %d of %d): %w", b.what[i], i+1, n, code))
			}
			answered = answered || i == last
		}
		if bad != nil {
			return errors.Join(append(errs, fmt.Errorf("read acks: %w", bad))...)
		}
	}
	return errors.Join(errs...)
}

// Buffer returns the socket's receive buffer for answers (64 KiB, reused).
func (s *Socket) Buffer() []byte {
	if cap(s.ackBuf) == 0 {
		s.ackBuf = make([]byte, 64<<10)
	}
	return s.ackBuf[:cap(s.ackBuf)]
}

// Request encodes one nf_tables request (header, nfgenmsg, attributes)
// with the socket's next sequence number, which it returns.
func (s *Socket) Request(typ, flags uint16, family uint8, attrs []byte) ([]byte, uint32) {
	seq := s.seq
	s.seq++
	b := make([]byte, 0, NlHdrLen+len(attrs))
	b = binary.NativeEndian.AppendUint32(b, uint32(NlHdrLen+len(attrs)))
	b = binary.NativeEndian.AppendUint16(b, unix.NFNL_SUBSYS_NFTABLES<<8|typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0) // port id: the kernel's
	b = append(b, family, unix.NFNETLINK_V0, 0, 0)
	return append(b, attrs...), seq
}
