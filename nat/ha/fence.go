package ha

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrHeld is returned by Fence.Acquire when another replica's lease has
// not expired.
var ErrHeld = errors.New("ha: lease held by the other replica")

// Fence is the tie-breaker that decides which replica may lead: a lease
// that one holder at a time has for a bounded time. The active renews it
// every heartbeat; a standby becomes active only when its peer is silent
// AND it acquired the lease; an active that cannot renew before its lease
// runs out steps down. A Kubernetes Lease implements it in a cluster; it
// is the fence, not the detector: failures are detected by heartbeats.
type Fence interface {
	// Acquire takes the lease for holder, or renews it when holder has
	// it, for ttl from now. It returns ErrHeld (wrapped) when another
	// holder's lease has not expired, and other errors when the arbiter
	// cannot be reached or read.
	Acquire(ctx context.Context, holder string, ttl time.Duration) error
	// Release ends holder's lease now; nothing when holder does not
	// hold it.
	Release(ctx context.Context, holder string) error
}

// FileFence is a Fence kept in one file under an exclusive flock: the line
// "<holder> <expiry unix nanoseconds>". Replicas that share a file system
// (a lab, one node) use it; it trusts one clock (the host's).
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
	if err := unix.Flock(int(fd.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("ha: fence %s: lock: %w", f.Path, err)
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
			return fmt.Errorf("%w: %s until %s", ErrHeld, cur, expiry.Format(time.RFC3339Nano))
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
