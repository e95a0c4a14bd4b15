package nftconn

import (
	"context"
	"errors"
	"fmt"
	"time"

	nft "github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/netns"
)

// Lasting is a Conn that keeps its Socket for its life, for a writer that
// sends many transactions (a small one costs tens of µs: no dial, no
// close): its batches and Conn's reads (Tables, Rules, MapElements: dumps
// decoded by this package, read.go) go over it. The Socket is nil after
// Close or a failed read (redialed after a failed commit) until Ready or
// the next call dials again. Its methods are called one at a time.
type Lasting struct {
	ns               *netns.NS // not owned: the caller keeps it open
	name             string    // the namespace's name, for errors
	timeout          time.Duration
	sendBuf, recvBuf int

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

// Close closes the Socket (kernel state stays; the namespace is the
// caller's).
func (l *Lasting) Close() error {
	if l.fast == nil {
		return nil
	}
	err := l.fast.Close()
	l.fast = nil
	return err
}

// Redial drops the Socket (queued messages, a sticky queueing error or
// stray answers go with it) and dials a new one.
func (l *Lasting) Redial() error {
	_ = l.Close()
	return l.Ready()
}

// Apply implements Conn: tx is encoded into one Batch and committed on the
// Socket; after a failed commit the Socket is redialed (answers may be
// left on it), the redial's error joined to the commit's.
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

// read runs fn over the Socket (dialed unless it is there), bounded by
// ctx. A read that failed otherwise than by the kernel's ENOENT answer (a
// missing chain, map or table) may have left the rest of a dump on the
// Socket, which makes the kernel refuse the next dump: the Socket is
// closed, the next call dials a new one.
func (l *Lasting) read(ctx context.Context, fn func(s *Socket) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.Ready(); err != nil {
		return err
	}
	err := fn(l.fast)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		_ = l.Close()
	}
	return err
}

// Tables implements Conn.
func (l *Lasting) Tables(ctx context.Context, f nft.TableFamily) (names []string, err error) {
	err = l.read(ctx, func(s *Socket) error { names, err = readTables(ctx, s, f); return err })
	return names, err
}

// Rules implements Conn.
func (l *Lasting) Rules(ctx context.Context, t Table, chain ChainName) (refs []RuleRef, err error) {
	err = l.read(ctx, func(s *Socket) error { refs, err = readRules(ctx, s, t, chain); return err })
	return refs, err
}

// MapElements implements Conn.
func (l *Lasting) MapElements(ctx context.Context, t Table, name MapName) (els []Element, err error) {
	err = l.read(ctx, func(s *Socket) error { els, err = readMapElements(ctx, s, t, name); return err })
	return els, err
}

var _ Conn = (*Lasting)(nil)
