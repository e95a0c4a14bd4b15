package agentapi

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/natgw/natgw/nat"
)

// agentsEnv makes the test binary a process of in-process agents (see
// TestMain): its value is how many, each serving one pair of the pipes
// passed as its extra files (requests on fd 3+2i, responses on 4+2i).
const agentsEnv = "NATGW_AGENTAPI_TEST_AGENTS"

func TestMain(m *testing.M) {
	if n := os.Getenv(agentsEnv); n != "" {
		os.Exit(serveAgents(n))
	}
	os.Exit(m.Run())
}

// serveAgents runs n agents on the fake data plane, each holding a small
// gateway's set (scenario 6's many small gateways hold 113 objects each:
// here 10 FIPs and 103 DNATs), until every one's input ends.
func serveAgents(n string) int {
	count, err := strconv.Atoi(n)
	if err != nil || count <= 0 {
		fmt.Fprintf(os.Stderr, "%s=%q: not a count\n", agentsEnv, n)
		return 2
	}
	var wg sync.WaitGroup
	failed := make(chan error, count)
	for i := range count {
		req := os.NewFile(uintptr(3+2*i), fmt.Sprintf("requests %d", i))
		resp := os.NewFile(uintptr(4+2*i), fmt.Sprintf("responses %d", i))
		dp := newFakeDP()
		if err := dp.Dataplane.Apply(context.Background(), smallGateway(10, 103)...); err != nil {
			fmt.Fprintf(os.Stderr, "agent %d: load: %v\n", i, err)
			return 2
		}
		wg.Go(func() {
			defer resp.Close()
			if err := Serve(context.Background(), dp, req, resp, Info{Version: "test"}); err != nil {
				failed <- fmt.Errorf("agent %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	close(failed)
	for err := range failed {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// smallGateway is a gateway of fips FIPs and dnats DNATs (on one EIP).
func smallGateway(fips, dnats int) []nat.Object {
	var objs []nat.Object
	for i := range fips {
		objs = append(objs, fip(fmt.Sprintf("fip-%04d", i), fmt.Sprintf("192.0.%d.%d", 2+i/250, 1+i%250), fmt.Sprintf("10.0.0.%d", 1+i%250)))
	}
	for i := range dnats {
		objs = append(objs, dnat(fmt.Sprintf("dnat-%04d", i), "198.51.100.1", uint16(1000+i), fmt.Sprintf("10.0.%d.%d", 1+i/200, 1+i%200), 8080))
	}
	return objs
}

// heap is what the process holds after two forced collections.
type heap struct {
	inuse, alloc, stack uint64
	goroutines          int
}

func heapNow() heap {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return heap{inuse: ms.HeapInuse, alloc: ms.HeapAlloc, stack: ms.StackInuse, goroutines: runtime.NumGoroutine()}
}

// idleSessionBytes bounds the heap an idle session's client side holds
// (its Client, line reader and the two ends of its pipes), after an Info
// and a List of a 113-object gateway. It was ~80 KiB while every reader
// kept a 64 KiB bufio.Reader and the last List's line buffer.
const idleSessionBytes = 8 << 10

// TestIdleSessionMemory opens sessions as the controller holds them, one
// per gateway, to agents in another process (so that only the client's
// side is in this process's heap), makes one Info and one List on each,
// and measures what the sessions hold once idle: HeapInuse after two
// forced collections, before the pipes were made and after the calls,
// divided by the number of sessions. Both ways a Client reads: directly
// from an *os.File (the local transport) and through its reading
// goroutine (an io.Reader without deadlines, as the exec transport's
// stream).
func TestIdleSessionMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process of 200 agents")
	}
	const n = 200
	for _, direct := range []bool{true, false} {
		name := "exec-shaped reader goroutine"
		if direct {
			name = "direct (local transport)"
		}
		t.Run(name, func(t *testing.T) {
			per := idleSessions(t, n, direct)
			t.Logf("%d idle sessions (%s): heap in use %d B (live objects %d B) per session, goroutine stacks %d B per session, %.1f goroutines per session",
				n, name, per.inuse, per.alloc, per.stack, float64(per.goroutines)/n)
			if per.inuse > idleSessionBytes {
				t.Errorf("an idle session holds %d B of heap, want at most %d", per.inuse, idleSessionBytes)
			}
		})
	}
}

// idleSessions returns the growth of heap and stacks per session (the
// goroutine count is the total growth) once n sessions made their calls.
func idleSessions(t *testing.T, n int, direct bool) heap {
	before := heapNow()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), agentsEnv+"="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	clients := make([]*Client, n)
	var theirs []*os.File
	for i := range n {
		reqR, reqW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		respR, respW, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		theirs = append(theirs, reqR, respW)
		var r io.Reader = respR
		if !direct {
			r = struct{ io.Reader }{respR} // no deadlines: a reading goroutine
		}
		clients[i] = NewClient(r, reqW)
	}
	cmd.ExtraFiles = theirs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the agents: %v", err)
	}
	for _, f := range theirs {
		f.Close()
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		for _, c := range clients {
			c.Close()
		}
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("agents: %v", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Error("agents did not exit after their input ended")
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, c := range clients {
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatalf("session %d: info: %v", i, err)
		}
		if info.Counts[nat.KindDNAT] != 103 {
			t.Fatalf("session %d: info counts %v, want 103 DNATs", i, info.Counts)
		}
		objs, err := c.List(ctx, false)
		if err != nil || len(objs) != 113 {
			t.Fatalf("session %d: list = %d objects, %v; want 113", i, len(objs), err)
		}
	}
	after := heapNow()
	return heap{
		inuse:      (after.inuse - min(after.inuse, before.inuse)) / uint64(n),
		alloc:      (after.alloc - min(after.alloc, before.alloc)) / uint64(n),
		stack:      (after.stack - min(after.stack, before.stack)) / uint64(n),
		goroutines: after.goroutines - before.goroutines - 1, // the Wait above
	}
}

// BenchmarkReadList100k reads the response to a List of 100,000 FIPs
// (a 9 MB line) and decodes it, as a Client does (lineReader, dispatch's
// decoding, release): the cost of a large response on the reading side,
// which an idle session's savings must not raise. The line comes from
// memory at most 64 KiB a read, as from a kernel pipe (its default
// capacity), one line per iteration as an agent answers; no other
// goroutine, so that cachegrind can count it (GOMAXPROCS=1).
func BenchmarkReadList100k(b *testing.B) {
	objs := make([]nat.Object, 100_000)
	for i := range objs {
		objs[i] = fip(fmt.Sprintf("fip-%06d", i), fmt.Sprintf("10.%d.%d.%d", 64+i>>16, i>>8&255, i&255), fmt.Sprintf("172.16.%d.%d", i>>8&255, i&255))
	}
	line, err := marshalResponse(Response{ID: 1, OK: true, Objects: objs})
	if err != nil {
		b.Fatal(err)
	}
	line = append(line, '\n')
	r := &pipeLike{}
	lr := newLineReader(r, MaxResponseBytes)
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		r.rest = line
		l, err := lr.next()
		if err != nil {
			b.Fatal(err)
		}
		resp, ok := fastResponse(l.data)
		if !ok || len(resp.Objects) != len(objs) {
			b.Fatalf("decoded %d objects (fast path %v), want %d", len(resp.Objects), ok, len(objs))
		}
		lr.release()
	}
}

// pipeLike reads rest at most 64 KiB at a time, as a kernel pipe would
// hand out a response its writer keeps it full of.
type pipeLike struct{ rest []byte }

func (p *pipeLike) Read(b []byte) (int, error) {
	if len(p.rest) == 0 {
		return 0, io.EOF
	}
	n := copy(b[:min(len(b), 64<<10)], p.rest)
	p.rest = p.rest[n:]
	return n, nil
}
