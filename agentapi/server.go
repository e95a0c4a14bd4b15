package agentapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

// Option tunes Serve.
type Option func(*serveOptions)

type serveOptions struct {
	maxLine   int
	releaseAt int
	// releaseIdle and free: WithReleaseMemory's wait and release
	// (releaseIdle, debug.FreeOSMemory; tests change them).
	releaseIdle time.Duration
	free        func()
	qos         func(context.Context, []gwqos.Rule) (bool, error)
	onSync      func(ctx context.Context) error
}

// WithGatewayQoS makes Serve answer gwqos requests with set: it must make
// the gateway hold exactly the rules given (none: no gateway-wide QoS), in
// one transaction, writing only when the kernel holds something else, and
// say whether it wrote (natgw serve: gwqos.Ensure in the gateway's
// namespace, a rule without interface on the external one). Without it a
// gwqos request is refused (CodeBadRequest).
func WithGatewayQoS(set func(ctx context.Context, rules []gwqos.Rule) (changed bool, err error)) Option {
	return func(o *serveOptions) { o.qos = set }
}

// WithOnSync makes Serve call after every successful sync request (the
// data plane now holds exactly the desired set): natgw serve --synced-file
// leaves its mark there, the sign `natgw ha` waits for before its replica
// may lead (RulesSyncedFile). An error from it fails the request (the
// controller retries the sync), so a mark is never missing after a sync
// reported done.
func WithOnSync(f func(ctx context.Context) error) Option {
	return func(o *serveOptions) { o.onSync = f }
}

// reloadBytesPerObject is what a re-read of the kernel counts per object
// toward WithReleaseMemory's bound (a 100k-FIP nftables reload allocates
// ~190 MB).
const reloadBytesPerObject = 1024

// WithReleaseMemory makes Serve return the memory of a large request to the
// operating system once it is answered and no more input came for a moment
// (releaseIdle, 200 ms): when the request line and the response line
// together reach n bytes (a sync or list of many objects), a forced garbage
// collection runs in the background (debug.FreeOSMemory), so the agent's
// resident memory falls back to what its index needs instead of staying at
// the request's peak until the runtime's scavenger gets to it. Requests
// that follow each other closely (a sync right after a sync) reuse the
// memory instead of faulting it in again; the release waits until they
// stop.
// A request that re-reads the kernel (list or info with fresh) counts
// reloadBytesPerObject per object the agent then holds, since reading a big
// table back leaves garbage far beyond its small request and response.
// It affects the whole process; natgw serve enables it.
func WithReleaseMemory(n int) Option {
	return func(o *serveOptions) { o.releaseAt = n }
}

// WithMaxLineBytes overrides MaxLineBytes (tests use a small bound).
func WithMaxLineBytes(n int) Option {
	return func(o *serveOptions) {
		if n > 0 {
			o.maxLine = n
		}
	}
}

// counter is implemented by data planes that count their objects without
// copying them (engine.Engine).
type counter interface {
	Counts() map[nat.Kind]int
}

// Serve runs the agent side of the protocol: it reads one JSON request per
// line from r, carries it out on dp as one transaction, and writes one
// response line to w, strictly in order. A line that is not a valid request
// gets an error response with CodeBadRequest (naming the field and value) and
// Serve goes on; a line longer than MaxLineBytes gets an error response too
// and is skipped up to its newline without being buffered.
//
// info is the template of info responses: its Version is reported as is;
// Dataplane, BootID and Counts are filled in from dp at each request.
//
// Serve returns nil at EOF on r (a clean shutdown: the kernel state stays, dp
// is not closed), ctx's error when ctx is done, or the error that broke r or
// w. Logs go to the logr.Logger in ctx. When Serve returns because ctx is
// done, a goroutine may stay blocked reading r until r is closed.
func Serve(ctx context.Context, dp nat.Dataplane, r io.Reader, w io.Writer, info Info, opts ...Option) error {
	o := serveOptions{maxLine: MaxLineBytes, releaseIdle: releaseIdle, free: debug.FreeOSMemory}
	for _, opt := range opts {
		opt(&o)
	}
	log := logr.FromContextOrDiscard(ctx)
	s := &server{dp: dp, w: w, info: info, log: log, qos: o.qos, onSync: o.onSync}
	var rel *idleRelease
	if o.releaseAt > 0 {
		rel = newIdleRelease(o.releaseIdle, o.free)
		defer rel.stop()
	}

	// The reading goroutine also carries each request out and answers it,
	// so a request costs no hand-off between goroutines (on an idle
	// gateway every hand-off can mean waking another CPU). Serve itself
	// only waits for it or for ctx. busy is held from a line's arrival to
	// its answer: Serve returns on ctx only once no request is between
	// the two, so nothing is written after Serve returned.
	var busy sync.Mutex
	stop := make(chan struct{})
	done := make(chan error, 1)
	// step answers one line (or ends on a read error) under busy; end
	// says the goroutine stops, with err for Serve.
	step := func(l line, rerr error) (end bool, err error) {
		busy.Lock()
		defer busy.Unlock()
		select {
		case <-stop:
			return true, nil // Serve returned: answer nothing
		default:
		}
		switch {
		case errors.Is(rerr, io.EOF):
			log.V(1).Info("end of input, shutting down")
			return true, nil
		case rerr != nil:
			return true, fmt.Errorf("read request: %w", rerr)
		}
		if rel != nil {
			rel.busy()
		}
		resp, skip := s.handleLine(ctx, l, o.maxLine)
		if skip {
			return false, nil
		}
		out, err := s.write(resp)
		if err != nil {
			return true, err
		}
		work := len(l.data) + out + s.reloaded*reloadBytesPerObject
		s.reloaded = 0
		switch {
		case rel == nil:
		case work >= o.releaseAt:
			rel.owe()
		default:
			rel.idle()
		}
		return false, nil
	}
	go func() {
		lr := newLineReader(r, o.maxLine)
		if rel != nil {
			lr.onData = rel.busy
		}
		for {
			if end, err := step(lr.next()); end {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		busy.Lock()
		close(stop)
		busy.Unlock()
		return ctx.Err()
	}
}

type server struct {
	dp   nat.Dataplane
	w    io.Writer
	info Info
	log  logr.Logger
	// reloaded is the number of objects the last request read back from
	// the kernel (a fresh list or info), 0 when it read nothing.
	reloaded int
	qos      func(context.Context, []gwqos.Rule) (bool, error) // WithGatewayQoS
	onSync   func(context.Context) error                       // WithOnSync
}

// handleLine turns one input line into its response; skip is true for blank
// lines, which get no response.
func (s *server) handleLine(ctx context.Context, l line, maxLine int) (resp Response, skip bool) {
	if l.overflow > 0 {
		id, _ := idFromPrefix(l.prefix, false)
		s.log.Info("request line too long, skipped", "id", id, "bytes", l.overflow, "max", maxLine)
		return Response{ID: id, Error: &Error{
			Code:    CodeBadRequest,
			Message: fmt.Sprintf("request line of %d bytes exceeds the limit of %d bytes", l.overflow, maxLine),
		}}, false
	}
	if len(trimSpace(l.data)) == 0 {
		return Response{}, true
	}
	req, err := DecodeRequest(l.data)
	if err != nil {
		var pe *Error
		if !errors.As(err, &pe) {
			pe = &Error{Code: CodeBadRequest, Message: err.Error()}
		}
		s.log.Info("bad request", "id", req.ID, "error", pe.Message, "field", pe.Field)
		return Response{ID: req.ID, Error: pe}, false
	}
	return s.handle(ctx, req), false
}

// handle carries out one decoded request.
func (s *server) handle(ctx context.Context, req Request) (resp Response) {
	start := time.Now()
	resp.ID = req.ID
	defer func() {
		if p := recover(); p != nil {
			s.log.Error(fmt.Errorf("panic: %v", p), "request handler panicked", "id", req.ID, "op", req.Op, "stack", string(debug.Stack()))
			resp = Response{ID: req.ID, Error: &Error{Code: CodeInternal, Message: fmt.Sprintf("internal error: %v", p)}}
		}
		if resp.Error == nil && !s.log.V(1).Enabled() {
			return // no garbage for a log line nobody reads
		}
		kv := []any{"id", req.ID, "op", req.Op, "objects", len(req.Objects), "uids", len(req.UIDs), "qos", len(req.QoS), "took", time.Since(start)}
		if resp.Error != nil {
			s.log.Info("request failed", append(kv, "code", resp.Error.Code, "error", resp.Error.Message)...)
		} else {
			s.log.V(1).Info("request done", kv...)
		}
	}()
	var err error
	switch req.Op {
	case OpApply:
		err = s.dp.Apply(ctx, req.Objects...)
	case OpDelete:
		err = s.dp.Delete(ctx, req.UIDs...)
	case OpSync:
		objs := req.Objects
		if objs == nil {
			objs = []nat.Object{}
		}
		err = s.dp.Sync(ctx, objs)
		if err == nil && s.onSync != nil {
			if err = s.onSync(ctx); err != nil {
				err = fmt.Errorf("after sync: %w", err)
			}
		}
	case OpList:
		if req.Fresh {
			if err = s.reload(ctx); err != nil {
				break
			}
		}
		resp.Objects, err = s.dp.List(ctx)
		if resp.Objects == nil && err == nil {
			resp.Objects = []nat.Object{}
		}
	case OpInfo:
		if req.Fresh {
			if err = s.reload(ctx); err != nil {
				break
			}
		}
		resp.Info, err = s.infoNow(ctx)
	case OpGatewayQoS:
		if s.qos == nil {
			err = &Error{Code: CodeBadRequest, Field: "op", Value: req.Op, Message: "this agent does not program gateway-wide QoS"}
			break
		}
		resp.Changed, err = s.qos(ctx, req.QoS)
	default:
		err = &Error{Code: CodeBadRequest, Field: "op", Value: req.Op, Message: "unknown op " + req.Op}
	}
	if err != nil {
		return Response{ID: req.ID, Error: ErrorFor(err)}
	}
	resp.OK = true
	return resp
}

// reload re-reads the kernel and records how many objects it read.
func (s *server) reload(ctx context.Context) error {
	if err := s.dp.Reload(ctx); err != nil {
		return err
	}
	if c, ok := s.dp.(counter); ok {
		for _, n := range c.Counts() {
			s.reloaded += n
		}
	}
	return nil
}

func (s *server) infoNow(ctx context.Context) (*Info, error) {
	in := s.info
	in.Dataplane = s.dp.Name()
	in.BootID = s.dp.BootID()
	if c, ok := s.dp.(counter); ok {
		in.Counts = c.Counts()
	} else {
		objs, err := s.dp.List(ctx)
		if err != nil {
			return nil, fmt.Errorf("count objects: %w", err)
		}
		in.Counts = map[nat.Kind]int{}
		for _, o := range objs {
			in.Counts[o.Kind]++
		}
	}
	if in.Counts == nil {
		in.Counts = map[nat.Kind]int{}
	}
	return &in, nil
}

// write sends resp as one line and returns its length.
func (s *server) write(resp Response) (int, error) {
	b, err := marshalResponse(resp)
	if err != nil {
		b, _ = json.Marshal(Response{ID: resp.ID, Error: &Error{Code: CodeInternal, Message: "encode response: " + err.Error()}})
	}
	b = append(b, '\n')
	if _, err := s.w.Write(b); err != nil {
		return 0, fmt.Errorf("write response %d: %w", resp.ID, err)
	}
	return len(b), nil
}

// ErrorFor maps a data plane error to its wire form: *nat.FieldError →
// CodeInvalid, *nat.ConflictError → CodeConflict (both with UID, Field and
// Value), nat.ErrUnknownState → CodeUnknownState, an *Error as is, anything
// else → CodeInternal.
func ErrorFor(err error) *Error {
	var (
		pe *Error
		fe *nat.FieldError
		ce *nat.ConflictError
	)
	switch {
	case errors.As(err, &pe):
		return pe
	case errors.Is(err, nat.ErrUnknownState):
		return &Error{Code: CodeUnknownState, Message: err.Error()}
	case errors.As(err, &fe):
		return &Error{Code: CodeInvalid, Message: err.Error(), UID: fe.UID, Field: fe.Field, Value: clip(fe.Value)}
	case errors.As(err, &ce):
		return &Error{Code: CodeConflict, Message: err.Error(), UID: ce.UID, Field: ce.Field, Value: clip(ce.Value)}
	}
	return &Error{Code: CodeInternal, Message: err.Error()}
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
