package agentapi

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/natgw/natgw/nat"
)

// Agent is what a caller can ask a gateway's agent: one method per request
// op. *Client implements it over the wire; controller/transport's Session is
// an Agent plus the life of its stream.
type Agent interface {
	// Apply adds or updates objects in one transaction.
	Apply(ctx context.Context, objs ...nat.Object) error
	// Delete removes the objects with these UIDs in one transaction.
	Delete(ctx context.Context, uids ...string) error
	// List returns the gateway's objects; fresh re-reads the kernel first.
	List(ctx context.Context, fresh bool) ([]nat.Object, error)
	// Sync makes the gateway hold exactly desired, in one transaction.
	Sync(ctx context.Context, desired []nat.Object) error
	// Info returns the agent's version, data plane, boot id and counts.
	Info(ctx context.Context) (*Info, error)
}

var _ Agent = (*Client)(nil)

// Dataplane is a Client seen as a nat.Dataplane: code written against the
// backends' interface programs a gateway through its agent. What differs
// from a local backend, and is kept visible:
//
//   - ctx bounds the wait for the agent's answer, not the agent's work: a
//     call whose ctx ends returns ctx's error and may still be carried out
//     (the Client's contract; every request is idempotent, so retry), and a
//     broken stream fails every call with an error matching ErrClosed.
//   - Name and BootID take no context, so they do not ask the agent: they
//     are the answer of the info request of NewDataplane or of the last
//     Reload. A new boot id shows only after a Reload.
//   - The agent's refusals are *Error (errors.As) that also match the nat
//     error their code stands for (errors.Is): nat.ErrInvalid,
//     nat.ErrConflict, nat.ErrUnknownState.
//   - Close closes the Client: the agent sees end of input and exits; its
//     kernel state stays, as with a backend's Close.
type Dataplane struct {
	c *Client

	mu   sync.Mutex
	info Info
}

var _ nat.Dataplane = (*Dataplane)(nil)

// NewDataplane asks the agent behind c for its info (ctx bounds that call)
// and returns c as a nat.Dataplane.
func NewDataplane(ctx context.Context, c *Client) (*Dataplane, error) {
	info, err := c.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("agent info: %w", dataplaneError(err))
	}
	return &Dataplane{c: c, info: *info}, nil
}

// Client returns the Client beneath.
func (d *Dataplane) Client() *Client { return d.c }

// Name returns the agent's data plane, as of the last info.
func (d *Dataplane) Name() nat.DataplaneName {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.info.Dataplane
}

// BootID returns the agent's boot id, as of the last info (NewDataplane or
// Reload).
func (d *Dataplane) BootID() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.info.BootID
}

// Apply adds or updates objects in one transaction on the gateway.
func (d *Dataplane) Apply(ctx context.Context, objs ...nat.Object) error {
	return dataplaneError(d.c.Apply(ctx, objs...))
}

// Delete removes the objects with these UIDs in one transaction.
func (d *Dataplane) Delete(ctx context.Context, uids ...string) error {
	return dataplaneError(d.c.Delete(ctx, uids...))
}

// List returns the agent's index of the gateway's objects.
func (d *Dataplane) List(ctx context.Context) ([]nat.Object, error) {
	objs, err := d.c.List(ctx, false)
	return objs, dataplaneError(err)
}

// Sync makes the gateway hold exactly desired, in one transaction.
func (d *Dataplane) Sync(ctx context.Context, desired []nat.Object) error {
	return dataplaneError(d.c.Sync(ctx, desired))
}

// Reload has the agent rebuild its index from the kernel (an info request
// with fresh set) and takes its answer as the new Name and BootID.
func (d *Dataplane) Reload(ctx context.Context) error {
	resp, err := d.c.Do(ctx, Request{Op: OpInfo, Fresh: true})
	if err != nil {
		return dataplaneError(err)
	}
	if resp.Info == nil {
		return &Error{Code: CodeInternal, Message: "info response without info"}
	}
	d.mu.Lock()
	d.info = *resp.Info
	d.mu.Unlock()
	return nil
}

// Close closes the Client; the gateway's kernel state stays.
func (d *Dataplane) Close() error { return d.c.Close() }

// codeError is an error holding an agent's *Error that also matches the nat
// error the code stands for; its text is the error's own.
type codeError struct {
	err error
	is  error
}

func (e *codeError) Error() string   { return e.err.Error() }
func (e *codeError) Unwrap() []error { return []error{e.err, e.is} }

// dataplaneError gives an agent's refusal the nat error of its code (the
// inverse of ErrorFor); other errors pass unchanged.
func dataplaneError(err error) error {
	var pe *Error
	if !errors.As(err, &pe) {
		return err
	}
	var is error
	switch pe.Code {
	case CodeInvalid:
		is = nat.ErrInvalid
	case CodeConflict:
		is = nat.ErrConflict
	case CodeUnknownState:
		is = nat.ErrUnknownState
	default:
		return err
	}
	return &codeError{err: err, is: is}
}
