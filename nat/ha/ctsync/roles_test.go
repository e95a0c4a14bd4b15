package ctsync

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat/netns"
)

// roleEnv makes the test binary one side of a replication stream instead
// of running tests (TestMain): "sender ADDR" streams the conntrack table
// of the process's namespace to ADDR, "receiver ADDR" listens on ADDR and
// writes what it receives. The figure tests start both sides this way, in
// their namespaces, so that the CPU of the active side and of the standby
// side are measured apart (/proc/PID/stat), as conntrackd's two processes
// are.
const roleEnv = "NATGW_CTSYNC_ROLE"

func TestMain(m *testing.M) {
	if spec := os.Getenv(roleEnv); spec != "" {
		os.Exit(runRole(spec))
	}
	os.Exit(m.Run())
}

// runRole is the role process: it runs until its standard input closes,
// prints "SYNCED" (receiver) once a full dump was written and, at the
// end, "STATS <json>" with its counters (SenderStats or ReceiverStats).
func runRole(spec string) int {
	kind, addr, _ := strings.Cut(spec, " ")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	say := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", a...)
	}
	done := make(chan error, 1)
	var stats func() any
	switch kind {
	case "receiver":
		recv, err := NewReceiver(nil, logr.Discard())
		if err != nil {
			fmt.Fprintln(os.Stderr, "receiver:", err)
			return 1
		}
		ln, err := net.Listen("tcp4", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "receiver:", err)
			return 1
		}
		go func() { done <- recv.Serve(ctx, ln) }()
		go func() {
			for !recv.Synced() {
				if ctx.Err() != nil {
					return
				}
				time.Sleep(time.Millisecond)
			}
			say("SYNCED")
		}()
		stats = func() any { return recv.Stats() }
	case "sender":
		s := &Sender{Peer: addr, Log: logr.Discard()}
		go func() { done <- s.Run(ctx) }()
		stats = func() any { return s.Stats() }
	default:
		fmt.Fprintf(os.Stderr, "%s=%q: want \"sender ADDR\" or \"receiver ADDR\"\n", roleEnv, spec)
		return 2
	}
	_, _ = io.Copy(io.Discard, os.Stdin) // the parent closes it to stop us
	cancel()
	if err := <-done; err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, kind+":", err)
		return 1
	}
	b, err := json.Marshal(stats())
	if err != nil {
		fmt.Fprintln(os.Stderr, kind+": stats:", err)
		return 1
	}
	say("STATS %s", b)
	return 0
}

// roleProc is a role process started by startRole.
type roleProc struct {
	name   string
	pid    int
	stdin  io.WriteCloser
	synced chan struct{} // closed at "SYNCED"
	stats  chan []byte   // the STATS line's JSON
	done   chan error    // the process's exit
}

// startRole starts the test binary as role kind ("sender" or "receiver")
// with address addr in ns; the test's end stops it.
func startRole(t *testing.T, ctx context.Context, ns *netns.NS, kind, addr string) *roleProc {
	t.Helper()
	cmd := netlab.Command(ctx, ns.Ref(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"="+kind+" "+addr)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the %s process: %v", kind, err)
	}
	p := &roleProc{name: kind, pid: cmd.Process.Pid, stdin: stdin, synced: make(chan struct{}), stats: make(chan []byte, 1), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 256<<20)
		for sc.Scan() {
			switch line := sc.Text(); {
			case line == "SYNCED":
				close(p.synced)
			case strings.HasPrefix(line, "STATS "):
				p.stats <- []byte(strings.TrimPrefix(line, "STATS "))
			}
		}
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.stdin.Close()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	return p
}

// waitSynced waits until the receiver process wrote its first full dump.
func (p *roleProc) waitSynced(t *testing.T, within time.Duration) {
	t.Helper()
	select {
	case <-p.synced:
	case err := <-p.done:
		t.Fatalf("the %s process ended before its first sync: %v", p.name, err)
	case <-time.After(within):
		t.Fatalf("the %s process not synced after %s", p.name, within)
	}
}

// stop ends the process and decodes its counters into stats.
func (p *roleProc) stop(t *testing.T, stats any) {
	t.Helper()
	_ = p.stdin.Close()
	select {
	case b := <-p.stats:
		if err := json.Unmarshal(b, stats); err != nil {
			t.Fatalf("the %s process's counters %s: %v", p.name, b, err)
		}
	case err := <-p.done:
		// The reader sends the counters before the exit: when both
		// are ready by the time this select runs (a loaded machine),
		// it may pick the exit; the counters are then in p.stats.
		select {
		case b := <-p.stats:
			if err := json.Unmarshal(b, stats); err != nil {
				t.Fatalf("the %s process's counters %s: %v", p.name, b, err)
			}
			return
		default:
		}
		t.Fatalf("the %s process ended without its counters: %v", p.name, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("the %s process did not stop within 10 s", p.name)
	}
}
