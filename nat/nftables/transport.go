package nftables

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/go-logr/logr"
	nft "github.com/google/nftables"
	"github.com/mdlayher/netlink"

	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
	"github.com/natgw/natgw/nat/nlsock"
)

// transport carries transactions to the kernel and reads the table back,
// over two lasting sockets in the gateway's namespace: google/nftables'
// connection, which reads the table's structure at Load, and an
// nftconn.Socket (natgw's own, over nlsock) for batches, set dumps and the
// ruleset generation. Both are nil after a failure until redialed. It
// knows nothing of the layout: it sends what a Tx says (send) and answers
// reads.
type transport struct {
	ns      *netns.NS // kept open for the sockets' life
	nsName  string    // for errors
	timeout time.Duration
	log     logr.Logger

	conn *nft.Conn
	sock *netlink.Conn // conn's socket, for deadlines
	fast *nftconn.Socket
	nl   *nlsock.Socket // fast's socket, for dumps
}

// send encodes tx into one netlink batch and commits it: one kernel
// transaction, all or nothing. It reports whether the batch held any
// message and whether it stored the generation in natgw_meta. A rejected
// batch (an errno in an answer) changed nothing; anything else (ENOBUFS on
// the answers, a timeout, a broken socket) leaves the outcome unknown
// (nat.ErrUnknownState). Either way the sockets are replaced, since
// answers may be left on them. An encoding error sends nothing.
func (tr *transport) send(ctx context.Context, tx *Tx) (sent, stamped bool, err error) {
	t := &txn{Batch: tr.fast.NewBatch(tx.elemBytes())}
	if err := t.encode(tx); err != nil {
		return false, false, err
	}
	sent, err = tr.fast.Commit(ctx, t.Batch)
	if err == nil {
		return sent, t.stamped, nil
	}
	if rerr := tr.redial(); rerr != nil {
		tr.log.Error(rerr, "redial after failed transaction")
	}
	return false, false, err
}

// dial opens the library's lasting connection and natgw's own socket in
// the namespace. The own socket gets buffers sized for large transactions
// (see nftconn.DialSocket) and short error answers.
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
	fast, err := nftconn.DialSocket(tr.ns, tr.timeout, sendBuffer, recvBuffer)
	if err != nil {
		_ = c.CloseLasting()
		return fmt.Errorf("nftables: netns %q: %w", tr.nsName, err)
	}
	tr.conn, tr.sock, tr.fast, tr.nl = c, sock, fast, fast.NL()
	return nil
}

// closeSockets closes both sockets (kernel state stays).
func (tr *transport) closeSockets() error {
	var errs []error
	if tr.conn != nil {
		errs = append(errs, tr.conn.CloseLasting())
	}
	if tr.fast != nil {
		errs = append(errs, tr.fast.Close())
	}
	tr.conn, tr.sock, tr.fast, tr.nl = nil, nil, nil, nil
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

// classify wraps a failed commit (see nftconn.Classify).
func classify(err error) error { return nftconn.Classify(err) }

// request encodes one nf_tables request with the socket's next sequence
// number, which it returns (see nftconn.Socket.Request).
func (tr *transport) request(typ, flags uint16, family uint8, attrs []byte) ([]byte, uint32) {
	return tr.fast.Request(typ, flags, family, attrs)
}

// buffer returns the socket's receive buffer for answers.
func (tr *transport) buffer() []byte { return tr.fast.Buffer() }
