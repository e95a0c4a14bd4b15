package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/agentapi"
)

// Local runs `natgw serve --netns NS --dataplane DP` as a child process per
// session and speaks the protocol over its stdin/stdout. It serves `make
// demo`, the e2e tests and the benchmarks, where gateways are network
// namespaces on this machine.
type Local struct {
	// Binary is the path of the natgw binary.
	Binary string
	// Log receives the agent's stderr, one entry per line.
	Log logr.Logger
	// StopGrace is how long Close waits for the agent to exit after its
	// input ended before killing it (default 5s).
	StopGrace time.Duration
}

// Open starts the agent for gw and checks it with an info request.
func (l *Local) Open(ctx context.Context, gw Endpoint) (Session, error) {
	if l.Binary == "" {
		return nil, errors.New("local transport: natgw binary path not set")
	}
	if gw.NetNS == "" {
		return nil, fmt.Errorf("local transport: gateway %s has no network namespace configured", gw.Name)
	}
	if err := gw.Dataplane.Valid(); err != nil {
		return nil, fmt.Errorf("local transport: gateway %s: %w", gw.Name, err)
	}
	cmd := exec.Command(l.Binary, serveArgs(gw, true, false)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("gateway %s: stdin pipe: %w", gw.Name, err)
	}
	// Our own pipes for stdout and stderr: exec.Cmd.Wait would close the
	// read ends it creates, possibly before the client read the agent's
	// last response.
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("gateway %s: stdout pipe: %w", gw.Name, err)
	}
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		stdoutR.Close()
		stdoutW.Close()
		return nil, fmt.Errorf("gateway %s: stderr pipe: %w", gw.Name, err)
	}
	cmd.Stdout, cmd.Stderr = stdoutW, stderrW
	err = cmd.Start()
	stdoutW.Close() // the child holds its copies
	stderrW.Close()
	if err != nil {
		stdoutR.Close()
		stderrR.Close()
		return nil, fmt.Errorf("gateway %s: start %s: %w", gw.Name, l.Binary, err)
	}
	log := l.Log.WithValues("gateway", gw.Name, "dataplane", gw.Dataplane, "pid", cmd.Process.Pid)
	client := agentapi.NewClient(stdoutR, stdin)
	// One goroutine per session, and no thread: it forwards the agent's
	// log until its stderr ends, which is when the agent exits (natgw
	// serve hands its own fd 2 to no other process), and only then reaps
	// it. Waiting for the exit itself (cmd.Wait, a blocking waitid) would
	// hold an OS thread per idle session.
	forwarded := make(chan struct{}) // the agent's log is read to its end
	exited := make(chan error, 1)
	go func() {
		forwardLines(stderrR, log)
		close(forwarded)
		stderrR.Close()
		err := cmd.Wait()
		// The client reads only while a call waits: tell it now.
		client.Broken(fmt.Errorf("gateway %s: agent exited: %v", gw.Name, exitStatus(err)))
		exited <- err
		close(exited)
	}()
	grace := l.StopGrace
	if grace <= 0 {
		grace = 5 * time.Second
	}
	var once sync.Once
	var waitErr error
	s := &session{
		Client: client,
		closeFn: func() error {
			once.Do(func() {
				select {
				case err := <-exited:
					waitErr = exitError(err)
				case <-time.After(grace):
					_ = cmd.Process.Kill()
					waitErr = fmt.Errorf("gateway %s: agent did not exit within %v after end of input; killed", gw.Name, grace)
					// Its stderr ends with it, unless another process
					// holds it: then stop reading the log.
					select {
					case <-exited:
					case <-time.After(grace):
						stderrR.Close()
						<-exited
					}
				}
				// Nothing of the session logs after Close returns (its
				// last lines are the agent's stop messages): the log
				// was read to its end before the agent was reaped.
				stdoutR.Close()
			})
			return waitErr
		},
	}
	if err := handshake(ctx, s, gw); err != nil {
		_ = cmd.Process.Kill()
		_ = s.Close()
		return nil, err
	}
	log.V(1).Info("agent started")
	return s, nil
}

// exitError ignores the exit of an agent that stopped because its input
// ended (status 0).
func exitError(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("agent exited: %w", err)
}

// exitStatus describes how the agent process ended.
func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// forwardLines logs each line read from r until it ends.
func forwardLines(r io.Reader, log logr.Logger) {
	sc := bufio.NewScanner(r)
	// Held while the agent is quiet (every idle session): log lines are
	// short, a longer one grows it.
	sc.Buffer(make([]byte, 0, 256), 1<<20)
	for sc.Scan() {
		log.Info("agent: " + sc.Text())
	}
}
