package nftables

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/go-logr/logr"
	nft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nlsock"
)

// transport carries transactions to the kernel and reads the table back,
// over two lasting sockets in the gateway's namespace: google/nftables'
// connection, which reads the table's structure at Load, and natgw's own
// (nlsock) for batches, set dumps and the ruleset generation. Both are nil
// after a failure until redialed. It knows nothing of the layout: it sends
// what a Tx says (send) and answers reads.
type transport struct {
	ns      *netns.NS // kept open for the sockets' life
	nsName  string    // for errors
	timeout time.Duration
	log     logr.Logger

	conn   *nft.Conn
	sock   *netlink.Conn // conn's socket, for deadlines
	nl     *nlsock.Socket
	seq    uint32 // next request or batch message sequence number
	ackBuf []byte
	txBuf  []byte // the last small transaction's batch buffer, reused
}

// send encodes tx into one netlink batch and commits it: one kernel
// transaction, all or nothing. It reports whether the batch held any
// message and whether it stored the generation in natgw_meta. A rejected
// batch (an errno in an answer) changed nothing; anything else (ENOBUFS on
// the answers, a timeout, a broken socket) leaves the outcome unknown
// (nat.ErrUnknownState). Either way the sockets are replaced, since
// answers may be left on them. An encoding error sends nothing.
func (tr *transport) send(ctx context.Context, tx *Tx) (sent, stamped bool, err error) {
	t := newTxn(tr.seq, tx.elemBytes(), tr.txBuf)
	if cap(t.buf) <= keepTxBuf {
		defer func() { tr.txBuf = t.buf[:0] }()
	}
	if err := t.encode(tx); err != nil {
		return false, false, err
	}
	err = tr.exchange(ctx, t)
	tr.seq = t.seq + 1
	if err == nil {
		return t.seq != t.base, t.stamped, nil
	}
	if rerr := tr.redial(); rerr != nil {
		tr.log.Error(rerr, "redial after failed transaction")
	}
	return false, false, classify(err)
}

// keepTxBuf bounds the batch buffer the transport keeps for the next
// transaction. A fresh buffer per transaction cost a small one page faults
// (its first touch of fresh memory; ~18 µs each on the bench VM), more than
// half of an agent's faults per request; a bulk transaction's buffer is not
// kept.
const keepTxBuf = 256 << 10

// dial opens the library's lasting connection and natgw's own socket in
// the namespace. The own socket gets buffers sized for large transactions
// (the FORCE variants pass the sysctl caps; they need CAP_NET_ADMIN) and
// short error answers.
func (tr *transport) dial() error {
	var sock *netlink.Conn
	c, err := nft.New(nft.AsLasting(), nft.WithNetNSFd(tr.ns.Fd()), nft.WithSockOptions(func(nc *netlink.Conn) error {
		sock = nc
		return nil
	}))
	runtime.KeepAlive(tr.ns)
	if err != nil {
		if sock != nil {
			sock.Close() // the library does not close it when an option fails
		}
		return fmt.Errorf("nftables: dial netlink in netns %q: %w", tr.nsName, err)
	}
	nl, err := nlsock.Dial(tr.ns, unix.NETLINK_NETFILTER)
	if err == nil {
		nl.SetTimeout(tr.timeout)
		err = errors.Join(nl.SetBuffers(sendBuffer, recvBuffer), nl.CapAcks())
		if err != nil {
			nl.Close()
		}
	}
	if err != nil {
		_ = c.CloseLasting()
		return fmt.Errorf("nftables: netns %q: %w", tr.nsName, err)
	}
	tr.conn, tr.sock, tr.nl = c, sock, nl
	return nil
}

// closeSockets closes both sockets (kernel state stays).
func (tr *transport) closeSockets() error {
	var errs []error
	if tr.conn != nil {
		errs = append(errs, tr.conn.CloseLasting())
	}
	if tr.nl != nil {
		errs = append(errs, tr.nl.Close())
	}
	tr.conn, tr.sock, tr.nl = nil, nil, nil
	return errors.Join(errs...)
}

// redial drops the connection (queued messages, a sticky queueing error or
// stray acks go with it) and dials a new one.
func (tr *transport) redial() error {
	_ = tr.closeSockets()
	return tr.dial()
}

// ready makes sure there is a connection.
func (tr *transport) ready() error {
	if tr.conn != nil {
		return nil
	}
	return tr.dial()
}

// deadline bounds the next kernel operations by ctx's deadline (or the
// default timeout) and interrupts them when ctx is cancelled. The returned
// function lifts the bound.
func (tr *transport) deadline(ctx context.Context) func() {
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Now().Add(tr.timeout)
	}
	sock := tr.sock
	_ = sock.SetDeadline(d)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		_ = sock.SetDeadline(time.Now())
	})
	return func() {
		if !stop() {
			<-fired // the cancellation ran: let it finish before lifting
		}
		_ = sock.SetDeadline(time.Time{})
	}
}

// classify wraps a failed Flush: an errno delivered in an ack (or by the
// send) means the kernel refused the batch and changed nothing; ENOBUFS
// (acks dropped), a timeout or an error without errno leave the outcome
// unknown.
func classify(err error) error {
	var errno unix.Errno
	if errors.Is(err, unix.ENOBUFS) || errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &errno) {
		return fmt.Errorf("nftables transaction: %w: %w", err, nat.ErrUnknownState)
	}
	return fmt.Errorf("nftables transaction rejected: %w", err)
}

// exchange sends the batch in one sendmsg and reads the kernel's answers
// up to the one for the last message (see close). An errno in an answer is
// returned as a unix.Errno (the kernel refused the batch); any other
// failure (ENOBUFS, deadline) leaves the outcome unknown. The kernel
// processes the batch within sendmsg, so its answers are queued by the time
// it returns; once an error has been read, answers still missing are not
// waited for.
func (tr *transport) exchange(ctx context.Context, t *txn) error {
	n := t.close()
	if n == 0 {
		return nil
	}
	if err := tr.nl.Send(ctx, t.buf); err != nil {
		return err
	}
	buf := tr.buffer()
	last := uint32(n - 1)
	var (
		errs []error
		err  error
	)
	for answered := false; !answered; {
		var rn int
		if len(errs) == 0 {
			if rn, err = tr.nl.Recv(ctx, buf); err != nil {
				return fmt.Errorf("read acks: %w", err)
			}
		} else {
			// The kernel sent what it had; the errors are known.
			ok := false
			if rn, ok, err = tr.nl.TryRecv(buf); err != nil || !ok {
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
			if seq == t.base-1 && code != 0 {
				// An error about the batch as a whole: nothing more comes.
				return errors.Join(append(errs, fmt.Errorf("batch: %w", code))...)
			}
			i := seq - t.base
			if i > last {
				continue // not ours (the batch header, or stale)
			}
			if code != 0 {
				errs = append(errs, fmt.Errorf("%s (message %d of %d): %w", t.what[i], i+1, n, code))
			}
			answered = answered || i == last
		}
		if bad != nil {
			return errors.Join(append(errs, fmt.Errorf("read acks: %w", bad))...)
		}
	}
	return errors.Join(errs...)
}

// buffer returns the Backend's receive buffer for answers.
func (tr *transport) buffer() []byte {
	if cap(tr.ackBuf) == 0 {
		tr.ackBuf = make([]byte, 64<<10)
	}
	return tr.ackBuf[:cap(tr.ackBuf)]
}
