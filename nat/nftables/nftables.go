// Package nftables is natgw's nftables data plane: one table of its own
// (`inet natgw`, IPv4 and IPv6) whose named maps hold every NAT object as
// an element tagged with the owner's UID, programmed over one lasting
// netlink connection, one kernel transaction per operation. The table
// layout is specified in nat/README.md.
package nftables

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	nft "github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/conntrack"
	"github.com/natgw/natgw/nat/engine"
	"github.com/natgw/natgw/nat/link"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
)

// Socket sizing (see nat/README.md, "Transaction sizing").
const (
	// sendBuffer bounds one transaction: the whole batch goes out in one
	// sendmsg. 100,000 FIPs (200,000 elements) encode to ~16 MiB.
	sendBuffer = 256 << 20
	// recvBuffer holds the error answers of a large rejected batch (one
	// per failing message) and dump replies.
	recvBuffer = 32 << 20
	// dumpChunk is the receive size that makes the kernel fill dump
	// replies of 32 KiB instead of 4 KiB (see generation).
	dumpChunk = 32 << 10
)

// DefaultTimeout bounds one kernel operation when the context has no
// deadline.
const DefaultTimeout = time.Minute

// Option tunes the backend.
type Option func(*options)

type options struct {
	timeout time.Duration
	noPlumb bool
}

// WithTimeout bounds each kernel operation whose context has no deadline
// (default DefaultTimeout).
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithoutPlumbing makes New skip addresses and routes (no link.Plumber):
// EIP and Route objects then live only in the table. For benchmarks and
// tests of the table alone.
func WithoutPlumbing() Option { return func(o *options) { o.noPlumb = true } }

// New opens the nftables data plane of the gateway cfg names: it loads (or
// creates) the table and returns the engine over it.
func New(ctx context.Context, cfg nat.Config, opts ...Option) (nat.Dataplane, error) {
	r, err := NewBackend(cfg, opts...)
	if err != nil {
		return nil, err
	}
	var plumb *link.Plumber
	if !r.opts.noPlumb {
		if plumb, err = link.New(cfg); err != nil {
			r.Close()
			return nil, fmt.Errorf("nftables: %w", err)
		}
	}
	e, err := engine.New(ctx, r, plumb, cfg.Log)
	if err != nil {
		r.Close()
		if plumb != nil {
			plumb.Close()
		}
		return nil, err
	}
	return e, nil
}

// checkInterfaces refuses interface names the rules cannot match.
func checkInterfaces(cfg nat.Config) error {
	for _, n := range []string{cfg.ExternalInterface, cfg.InternalInterface} {
		if len(n) >= unix.IFNAMSIZ || strings.ContainsRune(n, 0) {
			return fmt.Errorf("interface name %q: longer than %d bytes or holds NUL", n, unix.IFNAMSIZ-1)
		}
	}
	return nil
}

// Backend is the nftables engine.Backend of one gateway namespace. Its
// methods are called one at a time (the engine serializes them).
type Backend struct {
	cfg   nat.Config
	opts  options
	table *nft.Table
	transport

	// gen is the ruleset generation after natgw's last transaction as far
	// as natgw knows (read at Load, +1 per commit); a transaction that
	// stores it in natgw_meta stores gen+1, its own (see Load, Settle).
	gen     uint32
	stamped bool // natgw_meta holds gen (see Settle)
	// rules is rulesPrint(cfg), which every stamp stores (0 in Plan's
	// Backend: none stored).
	rules uint64

	// snapID is the index snapshot the kernel's FIP maps are known to
	// equal (0: none known): the one Load found valid, or Settle wrote;
	// a transaction that touches the FIP maps clears it, and every
	// stamping transaction stores it in natgw_meta. snapDir is where the
	// snapshot file lives (nat.Config.StateDir; "": none is read or
	// written). state is the engine's nat.State (LoadState's), which
	// Settle writes the snapshot from. See nat/README.md, "The index
	// snapshot".
	snapID       uint64
	snapDir      string
	state        *nat.State
	traceForTest func(*nftconn.Tx) // set by tests only: sees every transaction before it is sent
	spare        *txPlan           // the last transaction, emptied, for the next (see exec)

	// The kernel's structure, read at Load and kept by Commit. Elements
	// need no index: the kernel holds exactly the rendering of the
	// engine's objects (Load repairs it to that), so a removed object is
	// deleted by the keys it renders to.
	snat map[snatClass]int // SNAT objects per CIDR SNAT map
	qos  map[qosKey]qosVal // policers (limit object + chain)
	// share holds the backends of every share DNAT identity, ordered by
	// UID (the order of their map's indexes).
	share map[shareKey][]nat.Object
	boot  string
	// marks6 holds the mark id of every IPv6 EIP object's address (its
	// eip_marks6 element, see marks.go), marksUsed the same by id;
	// forgotten6 the ids the last commit freed, for the ForgetFlows that
	// follows it.
	marks6     map[netip.Addr]markID
	marksUsed  map[uint32]netip.Addr
	forgotten6 map[netip.Addr]uint32
	// unmarked6: the IPv6 conntrack table may hold connections of an
	// address that holds a mark id whose ct mark is not that id (they
	// predate it: made before the id was given, by an older layout or
	// by a FIP used before its EIP object came). Set when an id is given
	// (and at Load); while set, ForgetFlows deletes IPv6 flows by
	// address, and its dump clears it once no such connection is left.
	unmarked6 bool

	cleaner *conntrack.Cleaner // opened on first use
}

var _ engine.Backend = (*Backend)(nil)

// NewBackend opens cfg's namespace and dials the lasting connection. Most
// callers want New.
func NewBackend(cfg nat.Config, opts ...Option) (*Backend, error) {
	cfg = cfg.WithDefaults()
	r := &Backend{
		cfg:   cfg,
		table: &nft.Table{Name: tableName, Family: tableFamily},
		opts:  options{timeout: DefaultTimeout},
	}
	for _, o := range opts {
		o(&r.opts)
	}
	r.snapDir = cfg.StateDir
	r.transport = transport{nsName: cfg.NetNS, timeout: r.opts.timeout, log: cfg.Log.WithName("nftables")}
	if err := checkInterfaces(cfg); err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	var err error
	if r.rules, err = rulesPrintOf(cfg); err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	r.ns = ns
	if err := r.dial(); err != nil {
		ns.Close()
		return nil, err
	}
	return r, nil
}

// Name implements engine.Backend.
func (r *Backend) Name() nat.DataplaneName { return nat.DataplaneNftables }

// flushMarkMax is the number of EIPs up to which ForgetFlows flushes by ct
// mark (one kernel walk of the conntrack table per EIP); beyond it, it dumps
// the table once and deletes by address.
const flushMarkMax = 16

// openCleaner dials the conntrack sockets once.
func (r *Backend) openCleaner() error {
	if r.cleaner != nil {
		return nil
	}
	c, err := conntrack.Open(r.ns)
	if err != nil {
		return fmt.Errorf("nftables: forget flows: %w", err)
	}
	r.cleaner = c
	return nil
}

// ForgetDNATFlows implements engine.DNATFlowForgetter: the conntrack
// entries of removed share DNAT backends carry their EIP's mark like the
// other backends' of the identity, so they are found by one dump and
// deleted by tuple (conntrack.DeleteDNAT), and the others stay.
func (r *Backend) ForgetDNATFlows(ctx context.Context, dnats []nat.DNAT) error {
	if len(dnats) == 0 {
		return nil // no cleaner opened for nothing
	}
	if err := r.openCleaner(); err != nil {
		return err
	}
	if err := r.cleaner.ForgetDNAT(ctx, dnats); err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	return nil
}

// ForgetFlows implements engine.Backend: every IPv4 connection to an EIP
// or NATed through one carries the EIP as its ct mark, and every IPv6 one
// its IPv6 EIP's mark id (eip_marks6), so the kernel flushes them by mark,
// one request per EIP. If that fails, or for many EIPs of a family at
// once, it dumps that family's entries once and deletes by address; an
// IPv6 address without a mark id (used by FIPs, DNATs or SNATs without an
// IPv6 EIP object, whose connections carry no mark) is deleted by
// address too.
func (r *Backend) ForgetFlows(ctx context.Context, eips []netip.Addr) error {
	if len(eips) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := r.openCleaner(); err != nil {
		return err
	}
	var v4, v6 []flushTarget
	var byAddr []netip.Addr // no mark known
	for _, a := range eips {
		if a.Is4() {
			v4 = append(v4, flushTarget{a, conntrack.MarkOf(a)})
			continue
		}
		id, ok := r.markOf6(a)
		if !ok {
			byAddr = append(byAddr, a)
			continue
		}
		v6 = append(v6, flushTarget{a, id})
	}
	for _, fam := range []struct {
		family  uint8
		targets []flushTarget
	}{{unix.AF_INET, v4}, {unix.AF_INET6, v6}} {
		if len(fam.targets) > flushMarkMax || fam.family == unix.AF_INET6 && r.unmarked6 {
			// Every flush by mark walks the whole conntrack hash
			// table in the kernel; past a few dozen EIPs one dump
			// is cheaper. IPv6 connections that predate their
			// EIP's mark id carry another mark: only the address
			// finds them.
			for _, t := range fam.targets {
				byAddr = append(byAddr, t.eip)
			}
			continue
		}
		var failed []netip.Addr
		var errs []error
		for _, t := range fam.targets {
			if err := r.cleaner.FlushMark(ctx, fam.family, t.mark, 0xffffffff); err != nil {
				errs = append(errs, err)
				failed = append(failed, t.eip)
			}
		}
		if len(failed) > 0 {
			r.log.Error(errors.Join(errs...), "flush by ct mark failed, deleting by address", "eips", failed)
			byAddr = append(byAddr, failed...)
		}
	}
	if len(byAddr) == 0 {
		return nil
	}
	dumped6 := slices.ContainsFunc(byAddr, netip.Addr.Is6)
	stale := 0
	if _, err := r.cleaner.DeleteByAddrVisit(byAddr, func(origDst, replyDst netip.Addr, mark uint32) {
		if r.predatesMark(origDst, mark) || r.predatesMark(replyDst, mark) {
			stale++
		}
	}); err != nil {
		return fmt.Errorf("nftables: forget flows of %d EIPs by address: %w", len(byAddr), err)
	}
	if dumped6 {
		// The dump saw every IPv6 connection left.
		r.unmarked6 = stale > 0
	}
	return nil
}

// predatesMark reports whether a connection with destination a (original
// or reply) and ct mark predates a's mark id: a holds an id, the mark is
// not it.
func (r *Backend) predatesMark(a netip.Addr, mark uint32) bool {
	m, ok := r.marks6[a]
	return ok && a.Is6() && m.id != mark
}

// flushTarget is an EIP and the ct mark of its connections.
type flushTarget struct {
	eip  netip.Addr
	mark uint32
}

// Close implements engine.Backend: it settles (see Settle), sockets
// close, kernel state stays.
func (r *Backend) Close() error {
	var errs []error
	if r.nl != nil {
		// The stored generation is only a hint for the next Load.
		ctx, cancel := context.WithTimeout(context.Background(), r.opts.timeout)
		if err := r.Settle(ctx); err != nil {
			r.log.Error(err, "closing: the next start reads the whole table")
		}
		cancel()
	}
	errs = append(errs, r.closeSockets())
	if r.cleaner != nil {
		errs = append(errs, r.cleaner.Close())
		r.cleaner = nil
	}
	if r.ns != nil {
		errs = append(errs, r.ns.Close())
		r.ns = nil
	}
	return errors.Join(errs...)
}
