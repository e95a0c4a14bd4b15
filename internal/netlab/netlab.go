// Package netlab builds throw-away network labs for tests: uniquely named
// network namespaces (prefix "ngw-", compatible with `ip netns`), veth links,
// bridges, the standard NAT gateway topology, in-process TCP/UDP probes and
// readers of a namespace's kernel state. Everything a Lab makes is removed by
// Lab.Close; namespaces left behind by killed runs are removed by SweepStale
// (ForTest runs it once per process).
//
// Typical use in a test (root only; ForTest skips otherwise):
//
//	lab := netlab.ForTest(t)                              // closed by t.Cleanup
//	gw, err := lab.Gateway(netlab.GatewayOptions{})       // ext, gw, sw, vm1..vm3
//	dp, err := nftables.New(ctx, gw.Config())             // NetNS: gw.GW, net1, eth0
//	srv, err := lab.ServeTCP(ctx, gw.VMs[0].NS, "0.0.0.0:8080")
//	r, err := netlab.Dial(ctx, gw.Ext.NS, "192.0.2.10:8080", netlab.DialTimeout)
//	// r.Client is the address vm1 saw; r.Server names the namespace that answered.
//	_, err = netlab.Dial(ctx, gw.Ext.NS, "192.0.2.10:8080", netlab.FailTimeout) // must fail
//	flows, err := netlab.ConntrackEntries(ctx, gw.GW)
//	ruleset, err := netlab.NftRuleset(ctx, gw.GW)
//
// Several gateways live in one Lab through GatewayOptions.Name; each has its
// own ext, gw, sw and VM namespaces. Gateway.RecreateGW empties a gateway
// like a pod restart.
//
// Namespaces are made in-process (unshare + bind mount under /run/netns,
// as `ip netns add` does), links and addresses over netlink; only the
// kernel state readers exec nft, iptables-save or nsenter.
//
// Like `ip netns add`, netlab makes /run/netns a shared mount. Whoever
// bind-mounts it elsewhere recursively (e.g. into a chroot) must make the
// copy a slave (MS_SLAVE|MS_REC) before unmounting it: unmounting a shared
// copy propagates back and unmounts every named namespace on the host,
// other runs' included ("not a namespace file" errors).
//
// Everything runs against the real kernel; the caller must be root.
package netlab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/internal/procfs"
	"github.com/natgw/natgw/nat/netns"
)

// Prefix starts the name of every namespace a Lab creates.
const Prefix = "ngw-"

// Lab owns a set of network namespaces and the probes running in them.
// Namespace names are Prefix + ID + "-" + role. A Lab is safe for concurrent
// use.
type Lab struct {
	id string

	mu      sync.Mutex
	nss     []string // in creation order
	closers []io.Closer
	closed  bool
}

// New returns an empty Lab with a fresh ID. The ID encodes the creating
// process and time so that SweepStale can tell leftovers of dead runs from
// labs in use.
func New(ctx context.Context) (*Lab, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("netlab: %w", err)
	}
	var b [2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("netlab: random id: %w", err)
	}
	return &Lab{id: fmt.Sprintf("%d.%08x.%s", os.Getpid(), time.Now().Unix(), hex.EncodeToString(b[:]))}, nil
}

// StaleAge is how old a dead run's namespaces must be before ForTest
// sweeps them.
const StaleAge = time.Minute

var sweepOnce sync.Once

// ForTest returns a new Lab closed by t.Cleanup. It skips the test (with the
// reason) when not running as root, since namespaces need CAP_SYS_ADMIN.
// The first call in a process also sweeps namespaces of killed runs (see
// SweepStale).
func ForTest(t testing.TB) *Lab {
	t.Helper()
	if reason := Unavailable(); reason != "" {
		t.Skipf("netlab: %s", reason)
	}
	sweepOnce.Do(func() {
		removed, err := SweepStale(StaleAge)
		if err != nil {
			t.Logf("netlab: sweeping stale namespaces: %v", err)
		}
		if len(removed) > 0 {
			t.Logf("netlab: removed %d stale namespaces of killed runs: %v", len(removed), removed)
		}
	})
	l, err := New(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("netlab: close lab %s: %v", l.id, err)
		}
	})
	return l
}

// Unavailable returns why labs cannot be built here ("" when they can).
func Unavailable() string {
	if os.Geteuid() != 0 {
		return "network namespace tests need root (run as root, e.g. `sudo make test`)"
	}
	return ""
}

// ID returns the Lab's unique id.
func (l *Lab) ID() string { return l.id }

// Name returns the namespace name the Lab uses for role (whether or not
// the namespace exists yet).
func (l *Lab) Name(role string) string { return Prefix + l.id + "-" + role }

// NS creates the namespace for role, brings its loopback up and returns its
// name (usable with `ip netns exec`, nat/netns.Open and nat.Config.NetNS).
func (l *Lab) NS(role string) (string, error) {
	if role == "" || strings.ContainsAny(role, "/ \t\n") {
		return "", fmt.Errorf("netlab: bad role %q", role)
	}
	name := l.Name(role)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return "", fmt.Errorf("netlab: create %s: lab closed", name)
	}
	l.mu.Unlock()
	if err := createNamed(name); err != nil {
		return "", fmt.Errorf("netlab: create %s: %w", name, err)
	}
	l.mu.Lock()
	l.nss = append(l.nss, name)
	l.mu.Unlock()
	if err := withHandle(name, func(h *handle) error { return h.linkUp("lo") }); err != nil {
		return "", fmt.Errorf("netlab: %s: %w", name, err)
	}
	return name, nil
}

// RemoveNS deletes one namespace the Lab created (before Close).
func (l *Lab) RemoveNS(name string) error {
	l.mu.Lock()
	i := slices.Index(l.nss, name)
	if i >= 0 {
		l.nss = slices.Delete(l.nss, i, i+1)
	}
	l.mu.Unlock()
	if i < 0 {
		return fmt.Errorf("netlab: remove %s: not a namespace of lab %s", name, l.id)
	}
	if err := deleteNamed(name); err != nil {
		return fmt.Errorf("netlab: delete %s: %w", name, err)
	}
	return nil
}

// Namespaces returns the names of the namespaces the Lab created.
func (l *Lab) Namespaces() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.nss...)
}

// addCloser registers c to be closed by Close, before namespaces go.
func (l *Lab) addCloser(c io.Closer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closers = append(l.closers, c)
}

// Close stops the Lab's probes and deletes its namespaces (their links go
// with them). It is idempotent.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	closers, nss := l.closers, l.nss
	l.closers, l.nss = nil, nil
	l.mu.Unlock()

	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		if err := closers[i].Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			errs = append(errs, err)
		}
	}
	for i := len(nss) - 1; i >= 0; i-- {
		if err := deleteNamed(nss[i]); err != nil {
			errs = append(errs, fmt.Errorf("netlab: delete %s: %w", nss[i], err))
		}
	}
	return errors.Join(errs...)
}

var sharedRunDir sync.Once

// prepareRunDir makes RunDir a shared mount point like `ip netns add` does,
// so namespaces mounted there are visible in other mount namespaces.
func prepareRunDir() error {
	if err := os.MkdirAll(netns.RunDir, 0o755); err != nil {
		return err
	}
	var err error
	sharedRunDir.Do(func() {
		err = unix.Mount("", netns.RunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		if errors.Is(err, unix.EINVAL) {
			if err = unix.Mount(netns.RunDir, netns.RunDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
				err = unix.Mount("", netns.RunDir, "none", unix.MS_SHARED|unix.MS_REC, "")
			}
		}
		if err != nil {
			err = fmt.Errorf("make %s a shared mount: %w", netns.RunDir, err)
		}
	})
	return err
}

// createNamed creates a network namespace and bind-mounts it at
// RunDir/name, as `ip netns add name` does.
func createNamed(name string) error {
	if err := prepareRunDir(); err != nil {
		return err
	}
	path := filepath.Join(netns.RunDir, name)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread ends up in the new namespace: keep it locked so
		// the runtime discards it when this goroutine exits.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind mount %s: %w", path, err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// deleteNamed unmounts and removes RunDir/name, as `ip netns delete` does.
func deleteNamed(name string) error {
	path := filepath.Join(netns.RunDir, name)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// labInfo is what a namespace name says about the Lab that made it.
type labInfo struct {
	pid     int
	created time.Time
}

// parseName decodes Prefix + "<pid>.<hex unix time>.<rand>-<role>".
func parseName(name string) (labInfo, bool) {
	rest, ok := strings.CutPrefix(name, Prefix)
	if !ok {
		return labInfo{}, false
	}
	id, _, ok := strings.Cut(rest, "-")
	if !ok {
		return labInfo{}, false
	}
	parts := strings.Split(id, ".")
	if len(parts) != 3 {
		return labInfo{}, false
	}
	pid, err := strconv.Atoi(parts[0])
	if err != nil || pid <= 0 {
		return labInfo{}, false
	}
	sec, err := strconv.ParseInt(parts[1], 16, 64)
	if err != nil {
		return labInfo{}, false
	}
	return labInfo{pid: pid, created: time.Unix(sec, 0)}, true
}

// ownerAlive reports whether the process that made a Lab still runs (a pid
// reused by a process started after the Lab does not count).
func ownerAlive(li labInfo) bool {
	if err := unix.Kill(li.pid, 0); errors.Is(err, unix.ESRCH) {
		return false
	}
	start, err := procfs.StartTime(li.pid)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	return !start.After(li.created.Add(2 * time.Second))
}

// SweepStale deletes namespaces left by Labs of processes that are gone and
// that are older than maxAge, and returns their names. Namespaces of live
// processes and names not made by a Lab are left alone.
func SweepStale(maxAge time.Duration) ([]string, error) {
	ents, err := os.ReadDir(netns.RunDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("netlab: sweep: %w", err)
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		li, ok := parseName(e.Name())
		if !ok || time.Since(li.created) < maxAge || ownerAlive(li) {
			continue
		}
		if err := deleteNamed(e.Name()); err != nil {
			errs = append(errs, fmt.Errorf("netlab: sweep %s: %w", e.Name(), err))
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}

// DeleteLinkOnClose makes Close delete interface name in ns before the
// Lab's namespaces go: a link the Lab made outside its own namespaces
// (e.g. a veth end on the host's bridge) is gone when Close returns,
// instead of whenever the kernel finishes destroying the namespace that
// held its peer.
func (l *Lab) DeleteLinkOnClose(ns, name string) {
	l.addCloser(closerFunc(func() error { return DeleteLink(ns, name) }))
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }
