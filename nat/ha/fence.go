package ha

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// ErrHeld is returned by Fence.Acquire when another replica's lease has
// not expired.
var ErrHeld = errors.New("ha: lease held by the other replica")

// HeldError is the ErrHeld of a fence that knows until when the other
// holder's lease runs (errors.Is(err, ErrHeld) holds for it): a standby
// asks again at Until instead of at its next turn. Until is read on the
// clock that decides the lease for the caller (the arbiter's on one host;
// for a Kubernetes Lease renewTime + duration, which the reader compares
// with its own clock).
type HeldError struct {
	Holder string
	Until  time.Time
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("%v: %s until %s", ErrHeld, e.Holder, e.Until.UTC().Format(time.RFC3339Nano))
}

// Is makes a HeldError an ErrHeld.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// heldUntil returns until when err says the lease is held (zero when err
// is not a HeldError).
func heldUntil(err error) time.Time {
	var h *HeldError
	if errors.As(err, &h) {
		return h.Until
	}
	return time.Time{}
}

// Fence is the tie-breaker that decides which replica may lead: a lease
// that one holder at a time has for a bounded time. The active renews it
// every heartbeat; a standby becomes active only when its peer is silent
// AND it acquired the lease; an active that cannot renew before its lease
// runs out steps down. A Kubernetes Lease implements it in a cluster; it
// is the fence, not the detector: failures are detected by heartbeats.
type Fence interface {
	// Acquire takes the lease for holder, or renews it when holder has
	// it, for ttl from now. It returns ErrHeld (wrapped; a *HeldError
	// when the fence knows the lease's end, so that the caller can ask
	// again exactly then) when another holder's lease has not expired,
	// and other errors when the arbiter cannot be reached or read.
	Acquire(ctx context.Context, holder string, ttl time.Duration) error
	// Release ends holder's lease now; nothing when holder does not
	// hold it.
	Release(ctx context.Context, holder string) error
}

// FileFence is a Fence kept in one file under an exclusive flock: the line
// "<holder> <expiry unix nanoseconds>". Replicas that share a file system
// (a lab, one node) use it; it trusts one clock (the host's). A replica
// frozen while it holds the flock (SIGSTOP) blocks the other until it
// resumes, as an unreachable arbiter would; ServeFence/SocketFence have
// no such window.
type FileFence struct {
	Path string
}

func (f FileFence) locked(ctx context.Context, fn func(holder string, expiry time.Time, write func(string, time.Time) error) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fd, err := os.OpenFile(f.Path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("ha: fence %s: %w", f.Path, err)
	}
	defer fd.Close()
	// Never wait for the lock beyond ctx: a holder that hangs inside it
	// makes the arbiter unreachable, not the caller.
	for {
		err := unix.Flock(int(fd.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("ha: fence %s: lock: %w", f.Path, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("ha: fence %s: lock: %w", f.Path, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
	buf := make([]byte, 256)
	n, err := fd.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("ha: fence %s: read: %w", f.Path, err)
	}
	var holder string
	var expiry time.Time
	if fields := strings.Fields(string(buf[:n])); len(fields) == 2 {
		ns, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			return fmt.Errorf("ha: fence %s: expiry %q: %w", f.Path, fields[1], err)
		}
		holder, expiry = fields[0], time.Unix(0, ns)
	} else if n > 0 {
		return fmt.Errorf("ha: fence %s: content %q: want \"<holder> <expiry ns>\"", f.Path, buf[:n])
	}
	write := func(h string, exp time.Time) error {
		line := fmt.Sprintf("%s %d\n", h, exp.UnixNano())
		if err := fd.Truncate(0); err != nil {
			return fmt.Errorf("ha: fence %s: %w", f.Path, err)
		}
		if _, err := fd.WriteAt([]byte(line), 0); err != nil {
			return fmt.Errorf("ha: fence %s: %w", f.Path, err)
		}
		return nil
	}
	return fn(holder, expiry, write)
}

// Acquire implements Fence.
func (f FileFence) Acquire(ctx context.Context, holder string, ttl time.Duration) error {
	if holder == "" || strings.ContainsAny(holder, " \n\t") {
		return fmt.Errorf("ha: fence holder %q: want a non-empty name without blanks", holder)
	}
	return f.locked(ctx, func(cur string, expiry time.Time, write func(string, time.Time) error) error {
		now := time.Now()
		if cur != "" && cur != holder && now.Before(expiry) {
			return fmt.Errorf("ha: fence %s: %w", f.Path, &HeldError{Holder: cur, Until: expiry})
		}
		return write(holder, now.Add(ttl))
	})
}

// Release implements Fence.
func (f FileFence) Release(ctx context.Context, holder string) error {
	return f.locked(ctx, func(cur string, _ time.Time, write func(string, time.Time) error) error {
		if cur != holder {
			return nil
		}
		return write(holder, time.Unix(0, 0))
	})
}

// Arbiter holds one lease in memory and serves it to SocketFence clients
// over a unix socket: a stand-in for a Kubernetes Lease in the API server
// (the state lives in another process; a client that hangs holds nothing).
type Arbiter struct {
	mu     sync.Mutex
	holder string
	expiry time.Time
}

// Serve answers requests on ln until ctx ends. One request per
// connection: "acquire <holder> <ttl ns>" or "release <holder>"; the
// answer is "ok", "held <holder> <expiry ns>" or "error <text>".
func (a *Arbiter) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("ha: arbiter: %w", err)
		}
		go a.answer(c)
	}
}

func (a *Arbiter) answer(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return
	}
	f := strings.Fields(line)
	reply := "error bad request " + strconv.Quote(strings.TrimSpace(line))
	a.mu.Lock()
	now := time.Now()
	switch {
	case len(f) == 3 && f[0] == "acquire":
		ttl, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil || ttl <= 0 {
			reply = "error ttl " + strconv.Quote(f[2])
			break
		}
		if a.holder != "" && a.holder != f[1] && now.Before(a.expiry) {
			reply = fmt.Sprintf("held %s %d", a.holder, a.expiry.UnixNano())
			break
		}
		a.holder, a.expiry, reply = f[1], now.Add(time.Duration(ttl)), "ok"
	case len(f) == 2 && f[0] == "release":
		if a.holder == f[1] {
			a.expiry = time.Time{}
		}
		reply = "ok"
	}
	a.mu.Unlock()
	_, _ = io.WriteString(c, reply+"\n")
}

// SocketFence is a Fence kept by an Arbiter listening on the unix socket
// Path.
type SocketFence struct {
	Path string
}

func (f SocketFence) ask(ctx context.Context, req string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", f.Path)
	if err != nil {
		return fmt.Errorf("ha: fence %s: %w", f.Path, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, req+"\n"); err != nil {
		return fmt.Errorf("ha: fence %s: %w", f.Path, err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("ha: fence %s: %w", f.Path, err)
	}
	line = strings.TrimSpace(line)
	switch {
	case line == "ok":
		return nil
	case strings.HasPrefix(line, "held "):
		// "held <holder> <expiry ns>": the arbiter's clock, this host's.
		if fl := strings.Fields(line); len(fl) == 3 {
			if ns, err := strconv.ParseInt(fl[2], 10, 64); err == nil {
				return fmt.Errorf("ha: fence %s: %w", f.Path, &HeldError{Holder: fl[1], Until: time.Unix(0, ns)})
			}
		}
		return fmt.Errorf("%w: %s", ErrHeld, strings.TrimPrefix(line, "held "))
	}
	return fmt.Errorf("ha: fence %s: %s", f.Path, line)
}

// Acquire implements Fence.
func (f SocketFence) Acquire(ctx context.Context, holder string, ttl time.Duration) error {
	if holder == "" || strings.ContainsAny(holder, " \n\t") {
		return fmt.Errorf("ha: fence holder %q: want a non-empty name without blanks", holder)
	}
	return f.ask(ctx, fmt.Sprintf("acquire %s %d", holder, ttl.Nanoseconds()))
}

// Release implements Fence.
func (f SocketFence) Release(ctx context.Context, holder string) error {
	return f.ask(ctx, "release "+holder)
}

// Lease returns the current holder and expiry.
func (a *Arbiter) Lease() (holder string, expiry time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.holder, a.expiry
}
