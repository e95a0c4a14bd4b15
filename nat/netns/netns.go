// Package netns opens network namespaces by name or path and runs code in
// them, so one process can program any gateway namespace.
package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// RunDir is where iproute2 keeps named namespaces.
const RunDir = "/run/netns"

// Path resolves a namespace reference: "" is the caller's namespace
// (/proc/self/ns/net of the calling thread), a reference with a "/" is a
// path, anything else a name under RunDir.
func Path(ref string) string {
	switch {
	case ref == "":
		return fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
	case strings.Contains(ref, "/"):
		return ref
	default:
		return filepath.Join(RunDir, ref)
	}
}

// NS is an open network namespace. Keep it open as long as sockets bound
// through its Fd are in use: closing it (or letting it be collected) makes
// later dials land in the wrong namespace.
type NS struct {
	f   *os.File
	ref string
}

// Open opens the namespace named by ref (see Path). An empty ref opens the
// caller's current namespace.
func Open(ref string) (*NS, error) {
	f, err := os.Open(Path(ref))
	if err != nil {
		return nil, fmt.Errorf("open netns %q: %w", ref, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("open netns %q: %w", ref, err)
	}
	if st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC {
		f.Close()
		return nil, fmt.Errorf("open netns %q: not a namespace file", ref)
	}
	return &NS{f: f, ref: ref}, nil
}

// Fd returns the namespace's file descriptor, e.g. for nftables.WithNetNSFd.
func (n *NS) Fd() int {
	fd := int(n.f.Fd())
	runtime.KeepAlive(n)
	return fd
}

// Ref returns the reference the namespace was opened with.
func (n *NS) Ref() string { return n.ref }

// lockPoll is how often Lock tries again while another holder has the lock.
const lockPoll = 5 * time.Millisecond

// Lock takes an exclusive advisory lock (flock) on the namespace itself, so
// that processes (or NS values within one process) that read and then
// rewrite state of the same namespace do so one at a time. Every reference
// to one namespace (a name under RunDir, /proc/PID/ns/net) is the same
// inode, hence the same lock. It waits until the lock is free or ctx is
// done, and returns the function that releases it.
func (n *NS) Lock(ctx context.Context) (unlock func(), err error) {
	fd := n.Fd()
	for {
		err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() {
				unix.Flock(fd, unix.LOCK_UN)
				runtime.KeepAlive(n)
			}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			return nil, fmt.Errorf("lock netns %q: %w", n.ref, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("lock netns %q: %w", n.ref, ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}

// Close closes the namespace file.
func (n *NS) Close() error { return n.f.Close() }

// Do runs fn on an OS thread switched into the namespace, then switches the
// thread back. If the thread cannot be switched back it is left locked, so
// the Go runtime discards it instead of reusing it in the wrong namespace.
// Sockets created inside fn stay in the namespace after Do returns.
func (n *NS) Do(fn func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns %q: save current: %w", n.ref, err)
	}
	defer orig.Close()
	if err := unix.Setns(n.Fd(), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns %q: enter: %w", n.ref, err)
	}
	ferr := fn()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: it dies with this goroutine.
		return fmt.Errorf("netns %q: return to original namespace: %w", n.ref, err)
	}
	runtime.UnlockOSThread()
	return ferr
}

// Do opens ref, runs fn inside it (see NS.Do) and closes it.
func Do(ref string, fn func() error) error {
	ns, err := Open(ref)
	if err != nil {
		return err
	}
	defer ns.Close()
	return ns.Do(fn)
}
