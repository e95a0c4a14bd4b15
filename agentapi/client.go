package agentapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

// MaxResponseBytes bounds one response line read by Client (a list of a
// large gateway is bigger than any request).
const MaxResponseBytes = 4 * MaxLineBytes

// ErrClosed is matched by the errors of calls that failed because the stream
// to the agent broke or the Client was closed. Such a call may or may not
// have been carried out by the agent.
var ErrClosed = errors.New("agent connection closed")

// Client speaks the protocol to one agent over a byte stream (a pod-exec
// session's stdin/stdout, or a child process's pipes). It is safe for
// concurrent use: each call gets a fresh id, writes are serialized, and
// responses are matched to calls by id. When the stream breaks, every
// pending and later call fails with an error matching ErrClosed.
//
// How responses are read depends on r. When r supports read deadlines (an
// *os.File of a pipe, as for a local agent), a waiting call reads the
// responses itself, handing other calls' answers to them, so that a lone
// call costs no hand-off between goroutines (on an idle machine each one
// can mean waking another CPU); a call whose context ends stops its read
// with a deadline and leaves the stream intact. Then nothing reads between
// calls: a stream that ends while no call waits is noticed by the next
// call, or at once when the owner of the stream calls Broken (transports do
// when the agent process exits). Otherwise (a pod-exec stream) a goroutine
// reads responses and hands them to the calls, and ends the Client as soon
// as the stream ends.
type Client struct {
	w       io.Writer
	wsem    chan struct{} // one writer at a time, acquirable with a context
	maxLine int           // largest request line sent (MaxLineBytes)

	// Direct reading (r has deadlines): dr is r, lr reads its lines,
	// rtok is held by the call that reads. nil dr: readLoop reads.
	dr   deadlineReader
	lr   *lineReader
	rtok chan struct{}

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan Response
	err     error // set once the stream is broken
	done    chan struct{}
	skipped int // response lines that matched no call
}

// deadlineReader is a reader whose blocked reads a deadline can end.
type deadlineReader interface {
	io.Reader
	SetReadDeadline(time.Time) error
}

// NewClient starts a Client that writes requests to w and reads responses
// from r (see Client for the two ways it reads). A reading goroutine, when
// there is one, runs until r ends (for an agent: after Close, when the
// agent has exited).
func NewClient(r io.Reader, w io.Writer) *Client {
	c := &Client{
		w:       w,
		wsem:    make(chan struct{}, 1),
		maxLine: MaxLineBytes,
		pending: map[uint64]chan Response{},
		done:    make(chan struct{}),
	}
	if dr, ok := r.(deadlineReader); ok && dr.SetReadDeadline(time.Time{}) == nil {
		c.dr, c.lr, c.rtok = dr, newLineReader(r, MaxResponseBytes), make(chan struct{}, 1)
		return c
	}
	go c.readLoop(r)
	return c
}

func (c *Client) readLoop(r io.Reader) {
	lr := newLineReader(r, MaxResponseBytes)
	for {
		l, err := lr.next()
		if err != nil {
			c.fail(readError(err))
			return
		}
		c.dispatch(l)
		lr.release()
	}
}

func readError(err error) error {
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w: read response: %w", ErrClosed, err)
}

// dispatch decodes one response line and delivers it.
func (c *Client) dispatch(l line) {
	if l.overflow > 0 {
		id, ok := idFromPrefix(l.prefix, false)
		c.deliver(id, ok, Response{ID: id, Error: &Error{Code: CodeInternal,
			Message: fmt.Sprintf("response of %d bytes exceeds the client's limit of %d", l.overflow, MaxResponseBytes)}})
		return
	}
	if len(trimSpace(l.data)) == 0 {
		return
	}
	resp, ok := fastResponse(l.data)
	var err error
	if !ok {
		resp = Response{}
		err = json.Unmarshal(l.data, &resp)
	}
	if err != nil {
		id, ok := idFromPrefix(l.data, true)
		c.deliver(id, ok, Response{ID: id, Error: &Error{Code: CodeInternal,
			Message: "malformed response: " + err.Error()}})
		return
	}
	c.deliver(resp.ID, true, resp)
}

// readUntil reads and dispatches response lines until ch holds an answer
// (or is closed: the stream broke). The caller holds rtok. When ctx ends
// first, a read deadline stops the read (a partly read line is kept for the
// next reader) and ctx's error is returned.
func (c *Client) readUntil(ctx context.Context, ch chan Response) error {
	if len(ch) > 0 {
		return nil
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		_ = c.dr.SetReadDeadline(time.Unix(1, 0))
	})
	defer func() {
		if !stop() {
			<-fired // let the interruption finish before lifting it
		}
		_ = c.dr.SetReadDeadline(time.Time{})
	}()
	for len(ch) == 0 {
		if c.Err() != nil {
			return nil // failed: ch is closed
		}
		l, err := c.lr.next()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil {
				return ctx.Err()
			}
			c.fail(readError(err))
			return nil
		}
		c.dispatch(l)
		c.lr.release()
	}
	return nil
}

// deliver hands resp to the call waiting for id; lines that match no call
// (stray output, answers to calls given up on) are counted and dropped.
func (c *Client) deliver(id uint64, ok bool, resp Response) {
	c.mu.Lock()
	ch, found := c.pending[id]
	if ok && found {
		delete(c.pending, id)
	} else {
		c.skipped++
	}
	c.mu.Unlock()
	if ok && found {
		ch <- resp // buffered, never blocks
	}
}

func (c *Client) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	c.err = err
	for id, ch := range c.pending {
		delete(c.pending, id)
		close(ch)
	}
	close(c.done)
}

// Done is closed when the stream is broken or the Client closed.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns why the Client stopped, or nil while it works.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Broken ends the Client as if its stream broke with err: pending and later
// calls fail with ErrClosed and err. Transports call it when they learn
// first that the agent is gone (its process exited).
func (c *Client) Broken(err error) {
	c.fail(fmt.Errorf("%w: %w", ErrClosed, err))
}

// Close fails pending calls with ErrClosed and closes w (ending the agent's
// input, a clean shutdown for `natgw serve`) when it is an io.Closer.
func (c *Client) Close() error {
	c.fail(fmt.Errorf("%w: client closed", ErrClosed))
	if cl, ok := c.w.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

// Do sends req (its ID is replaced by a fresh one) and waits for the
// response. A response with OK false is returned together with its *Error
// as the error. When ctx ends first, Do returns ctx's error; the agent may
// still carry the request out (requests are idempotent: retry).
func (c *Client) Do(ctx context.Context, req Request) (Response, error) {
	ch := make(chan Response, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return Response{}, err
	}
	c.nextID++
	req.ID = c.nextID
	c.pending[req.ID] = ch
	c.mu.Unlock()

	b := appendRequest(make([]byte, 0, 64+len(req.Objects)*128+len(req.UIDs)*40), req)
	if len(b) > c.maxLine {
		c.forget(req.ID)
		return Response{}, &Error{Code: CodeBadRequest, Message: fmt.Sprintf("%s request of %d bytes exceeds the limit of %d bytes", req.Op, len(b), c.maxLine)}
	}
	b = append(b, '\n')

	select {
	case c.wsem <- struct{}{}:
	case <-ctx.Done():
		c.forget(req.ID)
		return Response{}, fmt.Errorf("%s request: %w", req.Op, ctx.Err())
	case <-c.done:
		return Response{}, c.Err()
	}
	// The caller writes the line itself (no goroutine per call: on an idle
	// gateway every hand-off can mean waking another CPU). So that a stuck
	// stream (an agent that stopped reading) cannot hold the caller past
	// its context, ctx ending mid-write closes the stream, which unblocks
	// the write. Once a line is partly written there is no taking it back:
	// giving up on a write breaks the stream for every call.
	var state atomic.Int32 // writing → written, or writing → abandoned
	const (
		writing = iota
		written
		abandoned
	)
	stopWatch := context.AfterFunc(ctx, func() {
		if state.CompareAndSwap(writing, abandoned) {
			c.fail(fmt.Errorf("%w: %s request %d abandoned while writing: %w", ErrClosed, req.Op, req.ID, ctx.Err()))
			if cl, ok := c.w.(io.Closer); ok {
				cl.Close()
			}
		}
	})
	_, werr := c.w.Write(b)
	<-c.wsem
	stopWatch()
	if !state.CompareAndSwap(writing, written) {
		return Response{}, fmt.Errorf("%s request %d: %w", req.Op, req.ID, ctx.Err())
	}
	if werr != nil {
		// A partial line may have been written: the stream is unusable.
		c.fail(fmt.Errorf("%w: write request: %w", ErrClosed, werr))
		return Response{}, c.Err()
	}

	return c.await(ctx, req, ch)
}

// await waits for the response to req on ch; in direct mode a call takes
// the read token when no other call reads and reads until its answer is in.
func (c *Client) await(ctx context.Context, req Request, ch chan Response) (Response, error) {
	for {
		var tok chan struct{} // nil unless reading directly: never ready
		if c.dr != nil {
			tok = c.rtok
		}
		select {
		case resp, ok := <-ch:
			if !ok {
				return Response{}, c.Err()
			}
			if !resp.OK {
				if resp.Error == nil {
					resp.Error = &Error{Code: CodeInternal, Message: "agent answered not ok without an error"}
				}
				return resp, resp.Error
			}
			return resp, nil
		case <-ctx.Done():
			c.forget(req.ID)
			return Response{}, fmt.Errorf("%s request %d: %w", req.Op, req.ID, ctx.Err())
		case tok <- struct{}{}:
			err := c.readUntil(ctx, ch)
			<-c.rtok
			if err != nil {
				c.forget(req.ID)
				return Response{}, fmt.Errorf("%s request %d: %w", req.Op, req.ID, err)
			}
		}
	}
}

func (c *Client) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// Apply adds or updates objects in one transaction.
func (c *Client) Apply(ctx context.Context, objs ...nat.Object) error {
	_, err := c.Do(ctx, Request{Op: OpApply, Objects: objs})
	return err
}

// Delete removes the objects with these UIDs in one transaction.
func (c *Client) Delete(ctx context.Context, uids ...string) error {
	_, err := c.Do(ctx, Request{Op: OpDelete, UIDs: uids})
	return err
}

// List returns every object on the gateway; fresh re-reads the kernel first.
func (c *Client) List(ctx context.Context, fresh bool) ([]nat.Object, error) {
	resp, err := c.Do(ctx, Request{Op: OpList, Fresh: fresh})
	return resp.Objects, err
}

// Sync makes the gateway hold exactly desired, in one transaction.
func (c *Client) Sync(ctx context.Context, desired []nat.Object) error {
	if desired == nil {
		desired = []nat.Object{}
	}
	_, err := c.Do(ctx, Request{Op: OpSync, Objects: desired})
	return err
}

// SetGatewayQoS makes the gateway's gateway-wide QoS exactly rules (none:
// no gateway-wide QoS), in one transaction; changed says the agent found
// something else in the kernel and wrote (an agent older than that
// answer says false). It is not part of Agent: an agent without it
// refuses the request with CodeBadRequest.
func (c *Client) SetGatewayQoS(ctx context.Context, rules []gwqos.Rule) (changed bool, err error) {
	resp, err := c.Do(ctx, Request{Op: OpGatewayQoS, QoS: rules})
	if err != nil {
		return false, err
	}
	return resp.Changed, nil
}

// Info returns the agent's version, data plane, boot id and counts.
func (c *Client) Info(ctx context.Context) (*Info, error) {
	resp, err := c.Do(ctx, Request{Op: OpInfo})
	if err != nil {
		return nil, err
	}
	if resp.Info == nil {
		return nil, &Error{Code: CodeInternal, Message: "info response without info"}
	}
	return resp.Info, nil
}
