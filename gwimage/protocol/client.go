package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/natgw/natgw/nat"
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
type Client struct {
	w       io.Writer
	wsem    chan struct{} // one writer at a time, acquirable with a context
	maxLine int           // largest request line sent (MaxLineBytes)

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan Response
	err     error // set once the stream is broken
	done    chan struct{}
	skipped int // response lines that matched no call
}

// NewClient starts a Client that writes requests to w and reads responses
// from r. Its reading goroutine runs until r ends (for an agent: after
// Close, when the agent has exited).
func NewClient(r io.Reader, w io.Writer) *Client {
	c := &Client{
		w:       w,
		wsem:    make(chan struct{}, 1),
		maxLine: MaxLineBytes,
		pending: map[uint64]chan Response{},
		done:    make(chan struct{}),
	}
	go c.readLoop(r)
	return c
}

func (c *Client) readLoop(r io.Reader) {
	lr := newLineReader(r, MaxResponseBytes)
	for {
		l, err := lr.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			c.fail(fmt.Errorf("%w: read response: %w", ErrClosed, err))
			return
		}
		if l.overflow > 0 {
			id, ok := idFromPrefix(l.prefix, false)
			c.deliver(id, ok, Response{ID: id, Error: &Error{Code: CodeInternal,
				Message: fmt.Sprintf("response of %d bytes exceeds the client's limit of %d", l.overflow, MaxResponseBytes)}})
			continue
		}
		if len(trimSpace(l.data)) == 0 {
			continue
		}
		resp, ok := fastResponse(l.data)
		if !ok {
			resp = Response{}
			err = json.Unmarshal(l.data, &resp)
		}
		if err != nil {
			id, ok := idFromPrefix(l.data, true)
			c.deliver(id, ok, Response{ID: id, Error: &Error{Code: CodeInternal,
				Message: "malformed response: " + err.Error()}})
			continue
		}
		c.deliver(resp.ID, true, resp)
	}
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
