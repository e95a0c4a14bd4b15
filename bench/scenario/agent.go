package scenario

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"time"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/syncbuf"
	"github.com/natgw/natgw/nat/netns"
)

// agent is a `natgw serve` process running inside a gateway namespace (as
// in a gateway pod) and a agentapi.Client on its stdin/stdout.
type agent struct {
	*agentapi.Client
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr *syncbuf.Buffer
	done   chan error
}

// startAgent starts `natgw --dataplane DP serve` forked from a thread inside
// the namespace nsName, so the agent programs the namespace it runs in.
func startAgent(bin, nsName, dataplane string, env ...string) (*agent, error) {
	ns, err := netns.Open(nsName)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	cmd := exec.Command(bin, "--dataplane", dataplane, "serve")
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	a := &agent{cmd: cmd, stderr: &syncbuf.Buffer{Max: 64 << 10}, done: make(chan error, 1)}
	if a.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = a.stderr
	if err := ns.Do(cmd.Start); err != nil {
		return nil, fmt.Errorf("start %s serve in %s: %w", bin, nsName, err)
	}
	a.Client = agentapi.NewClient(stdout, a.stdin)
	go func() {
		err := cmd.Wait()
		a.Client.Broken(fmt.Errorf("natgw serve exited: %v", err))
		a.done <- err
	}()
	return a, nil
}

// PID is the agent's process id.
func (a *agent) PID() int { return a.cmd.Process.Pid }

// Close ends the agent's input (a clean shutdown) and waits for it to exit,
// killing it after 30 s.
func (a *agent) Close() error {
	a.Client.Close()
	select {
	case err := <-a.done:
		a.done <- err
		if err != nil {
			return fmt.Errorf("natgw serve: %w: %s", err, lastLines(a.stderr.String(), 5))
		}
		return nil
	case <-time.After(30 * time.Second):
		a.cmd.Process.Kill()
		<-a.done
		return errors.New("natgw serve did not exit within 30 s of closing its input; killed")
	}
}

// cpu is the user plus system CPU time the agent process used, once it
// exited (Close); 0 before.
func (a *agent) cpu() time.Duration {
	if ps := a.cmd.ProcessState; ps != nil {
		return ps.UserTime() + ps.SystemTime()
	}
	return 0
}

// wrap adds the agent's last stderr lines to a failed call's error.
func (a *agent) wrap(err error) error {
	if err == nil {
		return nil
	}
	if s := a.stderr.String(); s != "" {
		return fmt.Errorf("%w (agent stderr: %s)", err, lastLines(s, 3))
	}
	return err
}

func lastLines(s string, n int) string {
	lines := bytes.Split(bytes.TrimSpace([]byte(s)), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte(" | ")))
}

// agentProgrammer drives natgw through `natgw serve`.
type agentProgrammer struct{ a *agent }

func openAgent(ctx context.Context, e *Env, gw *netlab.Gateway) (Programmer, error) {
	a, err := startAgent(e.Natgw, gw.GW, "nftables")
	if err != nil {
		return nil, err
	}
	// The first answer proves the agent has loaded its table.
	if _, err := a.Info(ctx); err != nil {
		a.Close()
		return nil, a.wrap(fmt.Errorf("agent info: %w", err))
	}
	return &agentProgrammer{a: a}, nil
}

// HoldEIP implements EIPHolder.
func (p *agentProgrammer) HoldEIP(ctx context.Context, uid string, eip netip.Prefix) error {
	return p.a.wrap(p.a.Apply(ctx, eipObject(uid, eip)))
}

func (p *agentProgrammer) Preload(ctx context.Context, fips []FIP) error {
	if err := p.a.Sync(ctx, Objects(fips)); err != nil {
		return p.a.wrap(fmt.Errorf("preload %d fips: %w", len(fips), err))
	}
	return nil
}

func (p *agentProgrammer) Add(ctx context.Context, f FIP) error {
	return p.a.wrap(p.a.Apply(ctx, f.Object()))
}

func (p *agentProgrammer) Delete(ctx context.Context, f FIP) error {
	return p.a.wrap(p.a.Delete(ctx, f.UID))
}

func (p *agentProgrammer) Close() error { return p.a.Close() }

// RoundTrip sends a request that changes nothing and costs the agent no
// work that grows with its table (a delete of a UID it does not hold; info
// would count every object): its latency is the floor of every request
// through the pipe protocol.
func (p *agentProgrammer) RoundTrip(ctx context.Context) error {
	return p.a.wrap(p.a.Delete(ctx, "bench-round-trip-unknown-uid"))
}

// pipeEcho is an idle `cat` on a pair of pipes: the round trip of one line
// through it is what any call to another process costs on this machine
// before that process does any work (waking it, and then its caller).
type pipeEcho struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startPipeEcho() (*pipeEcho, error) {
	cmd := exec.Command("cat")
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start cat: %w", err)
	}
	p := &pipeEcho{cmd: cmd, in: in, out: bufio.NewReader(out)}
	if _, err := p.RoundTrip(); err != nil { // the first one starts it
		p.Close()
		return nil, err
	}
	return p, nil
}

// RoundTrip writes one line and reads it back, returning how long it took.
func (p *pipeEcho) RoundTrip() (time.Duration, error) {
	t0 := time.Now()
	if _, err := p.in.Write([]byte("x\n")); err != nil {
		return 0, fmt.Errorf("echo: %w", err)
	}
	if _, err := p.out.ReadBytes('\n'); err != nil {
		return 0, fmt.Errorf("echo: %w", err)
	}
	return time.Since(t0), nil
}

func (p *pipeEcho) Close() error {
	p.in.Close()
	return p.cmd.Wait()
}
