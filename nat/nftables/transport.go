package nftables

import (
	"context"
	"time"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
	"github.com/natgw/natgw/nat/nlsock"
)

// transport carries transactions to the kernel and reads the table back,
// over an nftconn.Lasting in the gateway's namespace: its nftconn.Socket
// (natgw's own, over nlsock: nl) carries the batches and every read of
// Load (the structure's and the sets' dumps, the ruleset generation).
// nl is nil after a failure until redialed. It knows nothing of the
// layout: it sends what an nftconn.Tx says (send) and answers reads.
type transport struct {
	ns      *netns.NS // kept open for the sockets' life
	nsName  string    // for errors
	timeout time.Duration
	log     logr.Logger

	lasting *nftconn.Lasting
	nl      *nlsock.Socket // lasting's Socket's, for dumps
}

// send encodes tx into one netlink batch (sized once from its elements)
// and commits it on the Socket: one kernel transaction, all or nothing.
// It reports whether the batch held any message. A rejected batch (an
// errno in an answer) changed nothing; anything else (ENOBUFS on the
// answers, a timeout, a broken socket) leaves the outcome unknown
// (nat.ErrUnknownState). Either way the sockets are replaced, since
// answers may be left on them. An encoding error sends nothing.
func (tr *transport) send(ctx context.Context, tx *nftconn.Tx) (sent bool, err error) {
	fast := tr.lasting.Socket()
	b := fast.NewBatch(tx.SizeHint())
	if err := tx.Encode(b); err != nil {
		return false, err
	}
	sent, err = fast.Commit(ctx, b)
	if err == nil {
		return sent, nil
	}
	if rerr := tr.redial(); rerr != nil {
		tr.log.Error(rerr, "redial after failed transaction")
	}
	return false, err
}

// dial opens natgw's own socket in the namespace (nftconn.Lasting), with
// buffers sized for large transactions (see nftconn.DialSocket) and short
// error answers.
func (tr *transport) dial() error {
	if tr.lasting == nil {
		l, err := nftconn.DialLasting(tr.ns, tr.nsName, tr.timeout, sendBuffer, recvBuffer)
		if err != nil {
			return err
		}
		tr.lasting = l
	}
	err := tr.lasting.Ready()
	tr.nl = nil
	if s := tr.lasting.Socket(); s != nil {
		tr.nl = s.NL()
	}
	return err
}

// closeSockets closes the sockets (kernel state stays).
func (tr *transport) closeSockets() error {
	if tr.lasting == nil {
		return nil
	}
	err := tr.lasting.Close()
	tr.nl = nil
	return err
}

// redial drops the connection (queued messages, a sticky queueing error or
// stray acks go with it) and dials a new one.
func (tr *transport) redial() error {
	_ = tr.closeSockets()
	return tr.dial()
}

// ready makes sure there is a connection.
func (tr *transport) ready() error {
	if tr.nl != nil {
		return nil
	}
	return tr.dial()
}

// classify wraps a failed commit (see nftconn.Classify).
func classify(err error) error { return nftconn.Classify(err) }

// request encodes one nf_tables request with the socket's next sequence
// number, which it returns (see nftconn.Socket.Request).
func (tr *transport) request(typ, flags uint16, family uint8, attrs []byte) ([]byte, uint32) {
	return tr.lasting.Socket().Request(typ, flags, family, attrs)
}

// dumps returns the Socket the reads of Load go over (see
// nftconn.Socket.Dump).
func (tr *transport) dumps() *nftconn.Socket { return tr.lasting.Socket() }

// buffer returns the socket's receive buffer for answers.
func (tr *transport) buffer() []byte { return tr.lasting.Socket().Buffer() }
