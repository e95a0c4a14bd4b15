package nftconn

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	nft "github.com/google/nftables"
	"github.com/mdlayher/netlink"

	"github.com/natgw/natgw/nat/netns"
)

// Lasting is a Conn that keeps its sockets for its life, for a writer that
// sends many transactions (a small one costs tens of µs: no dial, no
// close): a Socket for batches and dumps, and google/nftables' lasting
// connection for Conn's reads (Tables, Rules, MapElements), dialed at the
// first of them: a user that reads over the Socket only (nat/nftables'
// transport) never dials it. Both are nil after Close or a failed Redial
// until Ready (the Socket) or a read (the library's) dials again. Its
// methods are called one at a time.
type Lasting struct {
	ns               *netns.NS // not owned: the caller keeps it open
	name             string    // the namespace's name, for errors
	timeout          time.Duration
	sendBuf, recvBuf int

	conn *nft.Conn
	sock *netlink.Conn // conn's socket, for deadlines
	fast *Socket
}

// DialLasting dials a Lasting's Socket in ns (named name in errors);
// timeout bounds an operation whose context has no deadline; the Socket's
// buffers are sendBuf and recvBuf bytes (see DialSocket; 0 keeps the
// system's).
func DialLasting(ns *netns.NS, name string, timeout time.Duration, sendBuf, recvBuf int) (*Lasting, error) {
	l := &Lasting{ns: ns, name: name, timeout: timeout, sendBuf: sendBuf, recvBuf: recvBuf}
	if err := l.Ready(); err != nil {
		return nil, err
	}
	return l, nil
}

// Socket returns the batch and dump socket (nil until Ready).
func (l *Lasting) Socket() *Socket { return l.fast }

// Ready dials the Socket unless it is there.
func (l *Lasting) Ready() error {
	if l.fast != nil {
		return nil
	}
	fast, err := DialSocket(l.ns, l.timeout, l.sendBuf, l.recvBuf)
	if err != nil {
		return fmt.Errorf("nftables: netns %q: %w", l.name, err)
	}
	l.fast = fast
	return nil
}

// library dials google/nftables' lasting connection unless it is there.
func (l *Lasting) library() error {
	if l.conn != nil {
		return nil
	}
	var sock *netlink.Conn
	c, err := nft.New(nft.AsLasting(), nft.WithNetNSFd(l.ns.Fd()), nft.WithSockOptions(func(nc *netlink.Conn) error {
		sock = nc
		return nil
	}))
	runtime.KeepAlive(l.ns)
	if err != nil {
		if sock != nil {
			sock.Close() // the library does not close it when an option fails
		}
		return fmt.Errorf("nftables: dial netlink in netns %q: %w", l.name, err)
	}
	l.conn, l.sock = c, sock
	return nil
}

// Close closes both sockets (kernel state stays; the namespace is the
// caller's).
func (l *Lasting) Close() error {
	var errs []error
	if l.conn != nil {
		errs = append(errs, l.conn.CloseLasting())
	}
	if l.fast != nil {
		errs = append(errs, l.fast.Close())
	}
	l.conn, l.sock, l.fast = nil, nil, nil
	return errors.Join(errs...)
}

// Redial drops both sockets (queued messages, a sticky queueing error or
// stray answers go with them) and dials a new Socket.
func (l *Lasting) Redial() error {
	_ = l.Close()
	return l.Ready()
}

// deadline bounds the next operations on the library's connection by
// ctx's deadline (or the timeout) and interrupts them when ctx is
// cancelled. The returned function lifts the bound. library must have
// succeeded.
func (l *Lasting) deadline(ctx context.Context) func() {
	d, ok := ctx.Deadline()
	if !ok {
		d = time.Now().Add(l.timeout)
	}
	sock := l.sock
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

// Apply implements Conn: tx is encoded into one Batch and committed on the
// Socket; after a failed commit both sockets are redialed (answers may be
// left on them), the redial's error joined to the commit's.
func (l *Lasting) Apply(ctx context.Context, tx *Tx) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if tx.Len() == 0 {
		return nil
	}
	if err := l.Ready(); err != nil {
		return err
	}
	b := l.fast.NewBatch(4096)
	if err := tx.Encode(b); err != nil {
		return err
	}
	if _, err := l.fast.Commit(ctx, b); err != nil {
		if rerr := l.Redial(); rerr != nil {
			return errors.Join(err, fmt.Errorf("redial: %w", rerr))
		}
		return err
	}
	return nil
}

// read runs fn over the library's connection, bounded by ctx.
func (l *Lasting) read(ctx context.Context, fn func(c *nft.Conn) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.library(); err != nil {
		return err
	}
	done := l.deadline(ctx)
	defer done()
	return fn(l.conn)
}

// Tables implements Conn.
func (l *Lasting) Tables(ctx context.Context, f nft.TableFamily) (names []string, err error) {
	err = l.read(ctx, func(c *nft.Conn) error { names, err = listTables(c, f); return err })
	return names, err
}

// Rules implements Conn.
func (l *Lasting) Rules(ctx context.Context, t Table, chain ChainName) (refs []RuleRef, err error) {
	err = l.read(ctx, func(c *nft.Conn) error { refs, err = listRules(c, t, chain); return err })
	return refs, err
}

// MapElements implements Conn.
func (l *Lasting) MapElements(ctx context.Context, t Table, name MapName) (els []Element, err error) {
	err = l.read(ctx, func(c *nft.Conn) error { els, err = listMapElements(c, t, name); return err })
	return els, err
}

var _ Conn = (*Lasting)(nil)
