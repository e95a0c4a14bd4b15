package agentapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/syncbuf"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

func fip(uid, eip, in string) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netip.MustParseAddr(eip), InternalIP: netip.MustParseAddr(in)}}
}

func dnat(uid, eip string, port uint16, in string, inPort uint16) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: netip.MustParseAddr(eip), Protocol: nat.TCP,
		ExternalPort: port, InternalIP: netip.MustParseAddr(in), InternalPort: inPort}}
}

// pipeAgent runs Serve on dp behind a Client; the returned stop closes the
// client's side and waits for Serve to return, reporting its error.
func pipeAgent(t *testing.T, dp nat.Dataplane, opts ...Option) (*Client, func() error) {
	t.Helper()
	return pipeAgentMode(t, dp, false, opts...)
}

// pipeAgentMode is pipeAgent with the responses on an os.Pipe when direct is
// set: a reader with deadlines, which the Client reads from in its calls.
func pipeAgentMode(t testing.TB, dp nat.Dataplane, direct bool, opts ...Option) (*Client, func() error) {
	t.Helper()
	var reqR, respR io.Reader
	var reqW, respW io.WriteCloser
	if direct {
		// Both ways on kernel pipes, as for a local agent: a write
		// returns once its line is in the pipe's buffer.
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		rr, rw, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close(); rr.Close() })
		respR, respW, reqR, reqW = r, w, rr, rw
	} else {
		r, w := io.Pipe()
		rr, rw := io.Pipe()
		respR, respW, reqR, reqW = r, w, rr, rw
	}
	done := make(chan error, 1)
	go func() {
		err := Serve(context.Background(), dp, reqR, respW, Info{Version: "test"}, opts...)
		respW.Close()
		done <- err
	}()
	c := NewClient(respR, reqW)
	if got := c.dr != nil; got != direct {
		t.Fatalf("client reads directly: %v, want %v", got, direct)
	}
	stop := sync.OnceValue(func() error {
		c.Close()
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			return errors.New("Serve did not return after EOF")
		}
	})
	t.Cleanup(func() { _ = stop() })
	return c, stop
}

// bothModes runs f with the Client reading through its goroutine and
// reading directly in its calls.
func bothModes(t *testing.T, f func(t *testing.T, direct bool)) {
	for _, direct := range []bool{false, true} {
		name := "goroutine"
		if direct {
			name = "direct"
		}
		t.Run(name, func(t *testing.T) { f(t, direct) })
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRoundTripEveryOp(t *testing.T) { bothModes(t, testRoundTripEveryOp) }

func testRoundTripEveryOp(t *testing.T, direct bool) {
	dp := newFakeDP()
	c, stop := pipeAgentMode(t, dp, direct)
	ctx := ctxT(t)

	a, b := fip("a", "192.0.2.10", "198.51.100.10"), dnat("b", "192.0.2.11", 80, "198.51.100.11", 8080)
	if err := c.Apply(ctx, a, b); err != nil {
		t.Fatalf("apply: %v", err)
	}
	got, err := c.List(ctx, false)
	if err != nil || len(got) != 2 || !got[0].Equal(a) || !got[1].Equal(b) {
		t.Fatalf("list after apply = %v, %v; want [a b]", got, err)
	}
	in, err := c.Info(ctx)
	if err != nil {
		t.Fatalf("info: %v", err)
	}
	if in.Version != "test" || in.Dataplane != "fake" || in.BootID != "boot-1" || in.Counts[nat.KindFIP] != 1 || in.Counts[nat.KindDNAT] != 1 {
		t.Fatalf("info = %+v", in)
	}
	if err := c.Delete(ctx, "a", "never-there"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if got, _ := c.List(ctx, true); len(got) != 1 || got[0].UID != "b" {
		t.Fatalf("list after delete = %v", got)
	}
	if dp.reloads != 1 {
		t.Fatalf("fresh list reloaded %d times, want 1", dp.reloads)
	}
	s := fip("s", "192.0.2.12", "198.51.100.12")
	if err := c.Sync(ctx, []nat.Object{s}); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if got, _ := c.List(ctx, false); len(got) != 1 || !got[0].Equal(s) {
		t.Fatalf("list after sync = %v", got)
	}
	if err := c.Sync(ctx, nil); err != nil {
		t.Fatalf("empty sync: %v", err)
	}
	if got, _ := c.List(ctx, false); len(got) != 0 {
		t.Fatalf("list after empty sync = %v", got)
	}
	if err := stop(); err != nil {
		t.Fatalf("Serve after EOF: %v, want nil", err)
	}
	if want := []string{"apply", "delete", "sync", "sync"}; fmt.Sprint(dp.calls) != fmt.Sprint(want) {
		t.Fatalf("data plane calls %v, want %v", dp.calls, want)
	}
}

func TestErrorCodes(t *testing.T) {
	dp := newFakeDP()
	c, _ := pipeAgent(t, dp)
	ctx := ctxT(t)
	if err := c.Apply(ctx, fip("a", "192.0.2.10", "198.51.100.10")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		setup func()
		call  func() error
		want  Error
	}{
		{"invalid", nil, func() error { return c.Apply(ctx, fip("x", "192.0.2.20", "224.0.0.1")) },
			Error{Code: CodeInvalid, UID: "x", Field: "fip.internalIP", Value: "224.0.0.1"}},
		{"conflict", nil, func() error { return c.Apply(ctx, fip("y", "192.0.2.10", "198.51.100.99")) },
			Error{Code: CodeConflict, UID: "y", Field: "fip.eip", Value: "192.0.2.10"}},
		{"conflict in sync", nil, func() error {
			return c.Sync(ctx, []nat.Object{fip("p", "192.0.2.30", "198.51.100.1"), fip("q", "192.0.2.30", "198.51.100.2")})
		}, Error{Code: CodeConflict, UID: "q", Field: "fip.eip", Value: "192.0.2.30"}},
		{"unknown state", func() { dp.fail = fmt.Errorf("commit: %w", nat.ErrUnknownState) },
			func() error { return c.Delete(ctx, "a") }, Error{Code: CodeUnknownState}},
		{"internal", func() { dp.fail = errors.New("netlink: boom") },
			func() error { return c.Delete(ctx, "a") }, Error{Code: CodeInternal}},
		{"bad uid", nil, func() error { return c.Delete(ctx, "has space") },
			Error{Code: CodeBadRequest, Field: "uids[0]", Value: "has space"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.setup != nil {
				tt.setup()
			}
			err := tt.call()
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %v (%T), want *Error", err, err)
			}
			if pe.Code != tt.want.Code || pe.UID != tt.want.UID || pe.Field != tt.want.Field || pe.Value != tt.want.Value || pe.Message == "" {
				t.Fatalf("error = %+v, want %+v and a message", *pe, tt.want)
			}
		})
	}
	// Nothing of the failed calls stuck.
	if got, _ := c.List(ctx, false); len(got) != 1 || got[0].UID != "a" {
		t.Fatalf("state after failures = %v", got)
	}
}

// rawAgent runs Serve on raw pipes so tests can write any bytes.
func rawAgent(t *testing.T, dp nat.Dataplane, opts ...Option) (w *io.PipeWriter, responses func() Response, done chan error) {
	t.Helper()
	reqR, reqW := io.Pipe()
	respR, respW := io.Pipe()
	done = make(chan error, 1)
	go func() {
		err := Serve(context.Background(), dp, reqR, respW, Info{Version: "test"}, opts...)
		respW.Close()
		done <- err
	}()
	lr := newLineReader(respR, 1<<20)
	t.Cleanup(func() { reqW.Close(); respR.Close() })
	return reqW, func() Response {
		t.Helper()
		ch := make(chan Response, 1)
		go func() {
			l, err := lr.next()
			if err != nil {
				close(ch)
				return
			}
			var r Response
			if err := json.Unmarshal(l.data, &r); err != nil {
				close(ch)
				return
			}
			ch <- r
		}()
		select {
		case r, ok := <-ch:
			if !ok {
				t.Fatal("no valid response line")
			}
			return r
		case <-time.After(5 * time.Second):
			t.Fatal("timed out waiting for a response")
		}
		return Response{}
	}, done
}

func TestBadAndOversizedLinesKeepServing(t *testing.T) {
	dp := newFakeDP()
	const max = 1024
	w, next, done := rawAgent(t, dp, WithMaxLineBytes(max))
	write := func(s string) {
		t.Helper()
		go func() { _, _ = io.WriteString(w, s) }()
	}
	huge := `{"id":7,"op":"delete","uids":["` + strings.Repeat("x", 5*max) + `"]}` + "\n"
	cases := []struct {
		line      string
		wantID    uint64
		wantOK    bool
		wantCode  string
		wantField string
		wantMsg   string
	}{
		{"this is not json\n", 0, false, CodeBadRequest, "", "malformed"},
		{`{"id":3,"op":"apply","objects":[{"uid":"a","kind":"fip","fip":{"eip":"300.1.1.1","internalIP":"10.0.0.1"}}]}` + "\n", 3, false, CodeBadRequest, "objects[0].fip.eip", "300.1.1.1"},
		{`{"id":4,"op":"list","bogus":1}` + "\n", 4, false, CodeBadRequest, "bogus", "unknown field"},
		{`{"id":5,"op":"explode"}` + "\n", 5, false, CodeBadRequest, "op", "explode"},
		{`{"id":6,"op":"delete","uids":["a"]} trailing` + "\n", 6, false, CodeBadRequest, "", "after the JSON"},
		{huge, 7, false, CodeBadRequest, "", "exceeds the limit of 1024"},
		{"\n   \n" + `{"id":8,"op":"info"}` + "\r\n", 8, true, "", "", ""},
	}
	for _, tc := range cases {
		write(tc.line)
		r := next()
		if r.ID != tc.wantID || r.OK != tc.wantOK {
			t.Fatalf("line %.60q: response id=%d ok=%v, want id=%d ok=%v (%+v)", tc.line, r.ID, r.OK, tc.wantID, tc.wantOK, r.Error)
		}
		if tc.wantOK {
			continue
		}
		if r.Error == nil || r.Error.Code != tc.wantCode || r.Error.Field != tc.wantField || !strings.Contains(r.Error.Message+" "+r.Error.Value, tc.wantMsg) {
			t.Fatalf("line %.60q: error %+v, want code %s field %q mentioning %q", tc.line, r.Error, tc.wantCode, tc.wantField, tc.wantMsg)
		}
	}
	// A last line without a newline is still served before EOF.
	go func() { _, _ = io.WriteString(w, `{"id":9,"op":"list"}`); w.Close() }()
	if r := next(); r.ID != 9 || !r.OK {
		t.Fatalf("unterminated last line: %+v", r)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve = %v, want nil at EOF", err)
	}
}

func TestConcurrentCallsCorrelate(t *testing.T) { bothModes(t, testConcurrentCallsCorrelate) }

func testConcurrentCallsCorrelate(t *testing.T, direct bool) {
	dp := newFakeDP()
	c, _ := pipeAgentMode(t, dp, direct)
	ctx := ctxT(t)
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			uid := fmt.Sprintf("u%d", i)
			o := fip(uid, fmt.Sprintf("192.0.2.%d", 10+i), fmt.Sprintf("198.51.100.%d", 10+i))
			if err := c.Apply(ctx, o); err != nil {
				errs <- err
				return
			}
			// A failing call answered between others must reach its caller.
			err := c.Apply(ctx, fip(uid+"-dup", fmt.Sprintf("192.0.2.%d", 10+i), "198.51.100.250"))
			var pe *Error
			if !errors.As(err, &pe) || pe.Code != CodeConflict || pe.UID != uid+"-dup" {
				errs <- fmt.Errorf("%s: dup apply = %v, want its own conflict", uid, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got, _ := c.List(ctx, false); len(got) != n {
		t.Fatalf("%d objects, want %d", len(got), n)
	}
}

func TestClientFailsPendingWhenStreamBreaks(t *testing.T) {
	reqR, reqW := io.Pipe()
	respR, respW := io.Pipe()
	c := NewClient(respR, reqW)
	// A fake agent that reads two requests, answers neither, then dies.
	go func() {
		lr := newLineReader(reqR, MaxLineBytes)
		for range 2 {
			if _, err := lr.next(); err != nil {
				return
			}
		}
		respW.CloseWithError(errors.New("exec stream reset"))
	}()
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = c.Delete(ctx, "x") }()
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "exec stream reset") {
			t.Errorf("call %d: %v, want ErrClosed with the cause", i, err)
		}
	}
	select {
	case <-c.Done():
	default:
		t.Fatal("Done not closed")
	}
	if err := c.Delete(ctx, "later"); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after break = %v, want ErrClosed", err)
	}
}

func TestClientContextAndStrays(t *testing.T) { bothModes(t, testClientContextAndStrays) }

func testClientContextAndStrays(t *testing.T, direct bool) {
	dp := newFakeDP()
	dp.block = make(chan struct{})
	c, _ := pipeAgentMode(t, dp, direct)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := c.Delete(ctx, "a")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked call = %v, want deadline exceeded", err)
	}
	close(dp.block) // the agent now answers the abandoned call: dropped
	if _, err := c.Info(ctxT(t)); err != nil {
		t.Fatalf("call after an abandoned one: %v", err)
	}
	c.mu.Lock()
	skipped := c.skipped
	c.mu.Unlock()
	if skipped != 1 {
		t.Fatalf("skipped %d stray responses, want 1", skipped)
	}
}

func TestServeStopsOnContext(t *testing.T) {
	r, w := io.Pipe()
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, newFakeDP(), r, io.Discard, Info{}) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Serve = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not stop on cancel")
	}
}

func TestServeAnswersNothingAfterReturning(t *testing.T) {
	r, w := io.Pipe()
	defer w.Close()
	out := &syncbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, newFakeDP(), r, out, Info{}) }()
	if _, err := io.WriteString(w, `{"id":1,"op":"info"}`+"\n"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(out.String(), `"id":1`) {
		if time.Now().After(deadline) {
			t.Fatalf("no answer to the first request: %q", out.String())
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve = %v, want context.Canceled", err)
	}
	// The reading goroutine still takes this line, but must not answer.
	if _, err := io.WriteString(w, `{"id":2,"op":"info"}`+"\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if strings.Contains(out.String(), `"id":2`) {
		t.Fatalf("Serve answered after it returned: %q", out.String())
	}
}

func TestLineReader(t *testing.T) {
	in := "a\r\nbb\n" + strings.Repeat("x", 20) + "\nccc\n" + strings.Repeat("y", 11) + "\nlast"
	lr := newLineReader(strings.NewReader(in), 10)
	type res struct {
		data     string
		overflow int64
		prefix   string
	}
	var got []res
	for {
		l, err := lr.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, res{string(l.data), l.overflow, string(l.prefix)})
	}
	want := []res{{"a", 0, ""}, {"bb", 0, ""}, {"", 21, strings.Repeat("x", 20) + "\n"}, {"ccc", 0, ""}, {"", 12, strings.Repeat("y", 11) + "\n"}, {"last", 0, ""}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("lines\n got %v\nwant %v", got, want)
	}
}

// chunkReader returns its chunks one per Read (a chunk larger than the
// read's buffer over several); a nil chunk is a passed read deadline.
type chunkReader struct{ chunks [][]byte }

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	c := r.chunks[0]
	r.chunks = r.chunks[1:]
	if c == nil {
		return 0, os.ErrDeadlineExceeded
	}
	n := copy(p, c)
	if n < len(c) { // the rest comes with the next read
		r.chunks = append([][]byte{c[n:]}, r.chunks...)
	}
	return n, nil
}

func TestLineReaderResumesAfterDeadline(t *testing.T) {
	lr := newLineReader(&chunkReader{chunks: [][]byte{[]byte(`{"id":1,`), nil, []byte(`"ok":true}` + "\n" + `{"id":2}` + "\n")}}, 64)
	if _, err := lr.next(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("first read = %v, want the deadline", err)
	}
	for _, want := range []string{`{"id":1,"ok":true}`, `{"id":2}`} {
		l, err := lr.next()
		if err != nil || string(l.data) != want {
			t.Fatalf("line = %q, %v; want %q", l.data, err, want)
		}
	}
}

func TestDirectClientReaderHandsOver(t *testing.T) {
	// Call A times out while the agent is stuck on it; B, queued behind
	// it, must still get its own answer, whichever of the two was reading
	// when A gave up.
	for range 10 {
		dp := newFakeDP()
		dp.block = make(chan struct{})
		c, _ := pipeAgentMode(t, dp, true)
		short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		errA := make(chan error, 1)
		go func() { errA <- c.Delete(short, "a") }()
		errB := make(chan error, 1)
		go func() { errB <- c.Delete(ctxT(t), "b") }()
		if err := <-errA; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call A = %v, want its deadline", err)
		}
		cancel()
		close(dp.block)
		if err := <-errB; err != nil {
			t.Fatalf("call B = %v, want its answer", err)
		}
		if _, err := c.Info(ctxT(t)); err != nil {
			t.Fatalf("a later call: %v", err)
		}
	}
}

func TestDirectClientNoticesBrokenStream(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, reqW := io.Pipe()
	c := NewClient(r, reqW)
	if c.dr == nil {
		t.Fatal("client on an os.Pipe does not read directly")
	}
	c.Broken(errors.New("agent exited: signal: killed"))
	select {
	case <-c.Done():
	default:
		t.Fatal("Done not closed after Broken")
	}
	if err := c.Delete(ctxT(t), "x"); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "signal: killed") {
		t.Fatalf("call after Broken = %v, want ErrClosed with the cause", err)
	}
	// A stream that ends under a waiting call fails it.
	r2, w2, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	reqR2, reqW2 := io.Pipe()
	c2 := NewClient(r2, reqW2)
	go func() {
		lr := newLineReader(reqR2, MaxLineBytes)
		if _, err := lr.next(); err == nil {
			w2.Close() // read the request, died without answering
		}
	}()
	if err := c2.Delete(ctxT(t), "x"); !errors.Is(err, ErrClosed) {
		t.Fatalf("call when the stream ends = %v, want ErrClosed", err)
	}
	w.Close()
}

func TestLineReaderDoesNotBufferLongLines(t *testing.T) {
	// A line ten times the limit: the reader must skip it holding at most
	// the limit in memory, and find the next line.
	const max = 1 << 20
	big := io.MultiReader(strings.NewReader(`{"id":42,`), &repeatReader{n: 10 * max}, strings.NewReader("\n{\"id\":43}\n"))
	lr := newLineReader(big, max)
	l, err := lr.next()
	if err != nil || l.overflow != 10*max+10 || cap(lr.buf) > max+1 {
		t.Fatalf("first line: overflow %d err %v buf cap %d", l.overflow, err, cap(lr.buf))
	}
	if id, ok := idFromPrefix(l.prefix, false); !ok || id != 42 {
		t.Fatalf("id from prefix = %d, %v", id, ok)
	}
	l, err = lr.next()
	if err != nil || string(l.data) != `{"id":43}` {
		t.Fatalf("second line %q, %v", l.data, err)
	}
}

type repeatReader struct{ n int }

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	k := min(len(p), r.n)
	for i := range p[:k] {
		p[i] = 'z'
	}
	r.n -= k
	return k, nil
}

func TestIDFromPrefix(t *testing.T) {
	tests := []struct {
		in       string
		complete bool
		id       uint64
		ok       bool
	}{
		{`{"id":12,"op":"list"}`, true, 12, true},
		{` { "id" : 7 }`, true, 7, true},
		{`{"id":5`, true, 5, true},
		{`{"id":5`, false, 0, false}, // might be 5xxx
		{`{"op":"list","id":3}`, true, 0, false},
		{`{"id":-1}`, true, 0, false},
		{`{"id":99999999999999999999}`, true, 0, false},
		{`{"id":1x}`, true, 0, false},
		{`[]`, true, 0, false},
		{``, true, 0, false},
	}
	for _, tt := range tests {
		id, ok := idFromPrefix([]byte(tt.in), tt.complete)
		if id != tt.id || ok != tt.ok {
			t.Errorf("idFromPrefix(%q, %v) = %d, %v; want %d, %v", tt.in, tt.complete, id, ok, tt.id, tt.ok)
		}
	}
}

func TestDecodeRequest(t *testing.T) {
	tests := []struct {
		in        string
		wantErr   bool
		field     string
		value     string
		wantID    uint64
		wantObjs  int
		msgSubstr string
	}{
		{in: `{"id":1,"op":"apply","objects":[{"uid":"a","kind":"fip","fip":{"eip":"192.0.2.1","internalIP":"10.0.0.1"}}]}`, wantID: 1, wantObjs: 1},
		{in: `{"id":2,"op":"sync"}`, wantID: 2},
		{in: `{"id":3,"op":"list","fresh":true}`, wantID: 3},
		{in: `{"id":4,"op":"delete","uids":["a","b"]}`, wantID: 4},
		{in: `{"id":5,"op":"info"}`, wantID: 5},
		{in: `{"id":6}`, wantErr: true, field: "op", wantID: 6, msgSubstr: "missing op"},
		{in: `{"id":7,"op":"list","uids":["a"]}`, wantErr: true, field: "uids", wantID: 7},
		{in: `{"id":8,"op":"delete","objects":[{}]}`, wantErr: true, field: "objects", wantID: 8},
		{in: `{"id":9,"op":"apply","fresh":true}`, wantErr: true, field: "fresh", value: "true", wantID: 9},
		{in: `{"id":10,"op":"apply","objects":[{"uid":"a","kind":"dnat","dnat":{"externalPort":70000}}]}`, wantErr: true, field: "objects[0].dnat.externalPort", value: "70000", wantID: 10},
		{in: `{"id":11,"op":"apply","objects":[{"uid":"a","kind":"snat","snat":{"internalCIDR":"10.0.0.0/33"}}]}`, wantErr: true, field: "objects[0].snat.internalCIDR", value: "10.0.0.0/33", wantID: 11},
		{in: `{"id":12,"op":"apply","objects":[{"uid":"a","kind":"fip","fip":{"eip":"1.2.3.4","internalIp":"10.0.0.1","extra":1}}]}`, wantErr: true, field: "objects[0].fip.extra", wantID: 12},
		{in: `{"id":"13","op":"list"}`, wantErr: true, field: "id", value: "13"},
		{in: `{"id":14,"op":"delete","uids":[""]}`, wantErr: true, field: "uids[0]", wantID: 14},
		{in: `{"id":15,`, wantErr: true, wantID: 15, msgSubstr: "malformed"},
		{in: `null`, wantErr: true, field: "op"},
		{in: `{"id":16,"op":"gwqos","qos":[{"direction":"egress","interface":"","priority":1,"classifier":"matchall","rateMbps":1,"burstMB":0}]}`, wantID: 16},
		{in: `{"id":17,"op":"gwqos"}`, wantID: 17},
		{in: `{"id":18,"op":"sync","qos":[{"direction":"egress"}]}`, wantErr: true, field: "qos", wantID: 18},
		{in: `{"id":19,"op":"gwqos","qos":[{"direction":"egress","priority":-1}]}`, wantErr: true, field: "qos[0].priority", value: "-1", wantID: 19},
		{in: `{"id":20,"op":"gwqos","qos":[{"direction":"egress","cidr":"10.0.0.0/40"}]}`, wantErr: true, field: "qos[0].cidr", value: "10.0.0.0/40", wantID: 20},
	}
	for _, tt := range tests {
		req, err := DecodeRequest([]byte(tt.in))
		if req.ID != tt.wantID {
			t.Errorf("%s: id %d, want %d", tt.in, req.ID, tt.wantID)
		}
		if !tt.wantErr {
			if err != nil || len(req.Objects) != tt.wantObjs {
				t.Errorf("%s: %v, %d objects", tt.in, err, len(req.Objects))
			}
			continue
		}
		var pe *Error
		if !errors.As(err, &pe) || pe.Code != CodeBadRequest {
			t.Errorf("%s: error %v, want BadRequest", tt.in, err)
			continue
		}
		if pe.Field != tt.field || pe.Value != tt.value || !strings.Contains(pe.Message, tt.msgSubstr) {
			t.Errorf("%s: error %+v, want field %q value %q message with %q", tt.in, *pe, tt.field, tt.value, tt.msgSubstr)
		}
	}
}

func TestClientRefusesOversizedRequest(t *testing.T) {
	var sink bytes.Buffer
	r, _ := io.Pipe()
	c := NewClient(r, &sink)
	c.maxLine = 4096
	uids := make([]string, c.maxLine/60+1)
	for i := range uids {
		uids[i] = strings.Repeat("u", 60)
	}
	err := c.Delete(context.Background(), uids...)
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeBadRequest || sink.Len() != 0 {
		t.Fatalf("oversized request: %v, %d bytes written", err, sink.Len())
	}
}

func TestClientGivesUpOnStuckWrite(t *testing.T) {
	// Nobody reads the request pipe: the write blocks.
	_, reqW := io.Pipe()
	respR, _ := io.Pipe()
	c := NewClient(respR, reqW)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := c.Delete(ctx, "a")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("stuck write: %v after %v, want the deadline", err, time.Since(start))
	}
	if err := c.Delete(context.Background(), "b"); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after an abandoned write = %v, want ErrClosed", err)
	}
}

// TestGatewayQoSOp: a gwqos request reaches WithGatewayQoS's function with
// its rules (nil for none), the function's "changed" comes back as the
// response's, its *nat.FieldError as Invalid naming the field, and an agent
// without the option refuses the request as BadRequest without touching
// the data plane.
func TestGatewayQoSOp(t *testing.T) { bothModes(t, testGatewayQoSOp) }

func testGatewayQoSOp(t *testing.T, direct bool) {
	ctx := ctxT(t)
	var got [][]gwqos.Rule
	set := func(_ context.Context, rules []gwqos.Rule) (bool, error) {
		got = append(got, rules)
		return len(got) == 1, gwqos.ValidateAll(rules)
	}
	c, stop := pipeAgentMode(t, newFakeDP(), direct, WithGatewayQoS(set))
	rules := codecQoS()
	rules[0].Iface = "net1"
	if changed, err := c.SetGatewayQoS(ctx, rules); err != nil || !changed {
		t.Fatalf("first gwqos = %v, %v; want changed", changed, err)
	}
	if changed, err := c.SetGatewayQoS(ctx, nil); err != nil || changed {
		t.Fatalf("second gwqos = %v, %v; want not changed", changed, err)
	}
	bad := rules[0]
	bad.Classifier = "fw"
	_, err := c.SetGatewayQoS(ctx, []gwqos.Rule{bad})
	var pe *Error
	if !errors.As(err, &pe) || pe.Code != CodeInvalid || pe.Field != "qos[0].classifier" || pe.Value != "fw" {
		t.Fatalf("gwqos with classifier fw = %v, want Invalid naming qos[0].classifier", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || !reflect.DeepEqual(got[0], rules) || got[1] != nil {
		t.Fatalf("the agent's function got %+v, want %+v then nil", got, rules)
	}

	dp := newFakeDP()
	c, _ = pipeAgentMode(t, dp, direct)
	_, err = c.SetGatewayQoS(ctx, rules)
	if !errors.As(err, &pe) || pe.Code != CodeBadRequest || pe.Field != "op" {
		t.Fatalf("gwqos to an agent without gateway QoS = %v, want BadRequest naming op", err)
	}
	if len(dp.calls) != 0 {
		t.Fatalf("data plane calls %v, want none", dp.calls)
	}
}

// A direct-mode Client keeps no large line buffer after a big List: with one
// session per gateway it would hold every gateway's last response.
func TestDirectClientReleasesLargeBuffer(t *testing.T) {
	dp := newFakeDP()
	c, _ := pipeAgentMode(t, dp, true)
	ctx := ctxT(t)
	var objs []nat.Object
	for i := range 2000 { // ~100 bytes each: a line well over poolBuf
		objs = append(objs, fip(fmt.Sprintf("uid-%04d", i), fmt.Sprintf("192.0.%d.%d", 2+i/250, 1+i%250), fmt.Sprintf("198.51.%d.%d", i/250, 1+i%250)))
	}
	if err := c.Apply(ctx, objs...); err != nil {
		t.Fatalf("apply: %v", err)
	}
	got, err := c.List(ctx, false)
	if err != nil || len(got) != len(objs) {
		t.Fatalf("list = %d objects, %v; want %d", len(got), err, len(objs))
	}
	if n := cap(c.lr.buf); n > idleBuf || c.lr.pooled != nil {
		t.Fatalf("client keeps a line buffer of %d bytes after the List (pooled: %v), want at most %d", n, c.lr.pooled != nil, idleBuf)
	}
	if _, err := c.Info(ctx); err != nil { // the reader still works after the release
		t.Fatalf("info after the release: %v", err)
	}
}

// release keeps a line that a read deadline cut short.
func TestLineReaderReleaseKeepsPartialLine(t *testing.T) {
	long := strings.Repeat("z", 2*poolBuf)
	var chunks [][]byte
	for i := 0; i < len(long); i += 16 << 10 {
		chunks = append(chunks, []byte(long[i:min(len(long), i+16<<10)]))
	}
	lr := newLineReader(&chunkReader{chunks: append(chunks, nil, []byte("\n"))}, 4*poolBuf)
	if _, err := lr.next(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("first read = %v, want the deadline", err)
	}
	lr.release()
	l, err := lr.next()
	if err != nil || string(l.data) != long {
		t.Fatalf("line after release = %d bytes, %v; want the %d bytes read before the deadline", len(l.data), err, len(long))
	}
	lr.release()
	if cap(lr.buf) > idleBuf {
		t.Fatalf("buffer of %d bytes kept after release, want at most %d", cap(lr.buf), idleBuf)
	}
}
