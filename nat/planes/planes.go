// Package planes keeps one natgw data plane per gateway namespace. natgw has
// two (nftables and iptables-legacy) and both program the same namespace's
// EIP addresses and routes; which one holds a gateway's state is read from
// the namespace itself, not from any API field. An agent about to serve one
// data plane calls EmptyOthers first: every other data plane found holding
// natgw state there is emptied through its own backend (its NAT rules,
// their conntrack entries, its EIP addresses and routes), so no NAT of the
// old data plane survives a switch, whoever asked for it and whatever was
// interrupted.
//
// The order makes an interrupted cleanup safe to repeat: the old data
// plane's addresses and routes go first (the old table still lists them),
// then its objects (rules, conntrack), in the old backend's own
// transaction. A kill in between leaves the old table still listing its
// objects, so the next start finds and empties it again. Addresses and
// routes the kept data plane also holds are put back by Restore after the
// kept data plane is opened.
//
// Once emptied, the other data plane's kernel structure goes too (table
// inet natgw, and table ip natgw of layouts 1-3; natgw's NATGW_ chains and
// the jumps to them), so the next start finds nothing to do. Detection
// never creates anything: nftables "holds state" when table inet natgw
// (or the older ip natgw) exists; iptables-legacy when the namespace's nat
// or mangle table (iptables-legacy-save) has natgw's chains.
//
// Two agents of different data planes must not program one namespace at
// the same time (each would empty the other at its start): during a switch
// natgw-controller sends nothing to the old agent while the new one starts,
// and closes the old one before it programs the new one.
package planes

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	nft "github.com/google/nftables"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/iptables"
	"github.com/natgw/natgw/nat/link"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftables"
	"github.com/natgw/natgw/nat/nftconn"
)

// Names of the data planes, as in --dataplane (nat.DataplaneNames).
var Names = nat.DataplaneNames

// Opener opens a data plane backend.
type Opener func(ctx context.Context, cfg nat.Config) (nat.Dataplane, error)

// plane is one data plane as this package sees it.
type plane struct {
	open Opener
	// bare opens it without address/route plumbing (WithoutPlumbing).
	bare Opener
	// present tells whether the data plane holds natgw state in the
	// namespace, without creating anything.
	present func(ctx context.Context, ns *netns.NS) (bool, error)
	// remove deletes the data plane's emptied kernel structure (table or
	// chains), so that the next start finds nothing.
	remove func(ctx context.Context, ns *netns.NS) error
}

var planesByName = map[nat.DataplaneName]plane{
	nat.DataplaneNftables: {
		open: func(ctx context.Context, cfg nat.Config) (nat.Dataplane, error) {
			return nftables.New(ctx, cfg)
		},
		bare: func(ctx context.Context, cfg nat.Config) (nat.Dataplane, error) {
			return nftables.New(ctx, cfg, nftables.WithoutPlumbing())
		},
		present: nftPresent,
		remove:  nftRemove,
	},
	nat.DataplaneIptables: {open: func(ctx context.Context, cfg nat.Config) (nat.Dataplane, error) {
		return iptables.New(ctx, cfg)
	}, bare: func(ctx context.Context, cfg nat.Config) (nat.Dataplane, error) {
		return iptables.New(ctx, cfg, iptables.WithoutPlumbing())
	}, present: iptablesPresent, remove: iptablesRemove},
}

// lookup returns the data plane called name, or its validity error.
func lookup(name nat.DataplaneName) (plane, error) {
	if err := name.Valid(); err != nil {
		return plane{}, fmt.Errorf("planes: %w", err)
	}
	pl, ok := planesByName[name]
	if !ok {
		return plane{}, fmt.Errorf("planes: data plane %q has no backend", name)
	}
	return pl, nil
}

// Open opens the backend of data plane name (one of Names) on cfg's
// gateway.
func Open(ctx context.Context, name nat.DataplaneName, cfg nat.Config) (nat.Dataplane, error) {
	pl, err := lookup(name)
	if err != nil {
		return nil, err
	}
	return pl.open(ctx, cfg)
}

// OpenWithoutPlumbing opens data plane name like Open, but the backend adds
// and removes no address or route: EIP and Route objects live only in its
// rules and state (nftables.WithoutPlumbing, iptables.WithoutPlumbing). For
// a replica of a highly available gateway, whose EIP addresses nat/ha
// moves between the replicas.
func OpenWithoutPlumbing(ctx context.Context, name nat.DataplaneName, cfg nat.Config) (nat.Dataplane, error) {
	pl, err := lookup(name)
	if err != nil {
		return nil, err
	}
	return pl.bare(ctx, cfg)
}

// Emptied is what EmptyOthers removed.
type Emptied struct {
	// Planes are the data planes that held natgw state and were emptied.
	Planes []nat.DataplaneName
	// Objects are the objects they held (EIPs and routes among them, whose
	// addresses and routes were removed from the namespace).
	Objects []nat.Object
}

// Empty reports whether nothing was found.
func (e Emptied) Empty() bool { return len(e.Planes) == 0 }

// EmptyOthers empties every data plane other than keep that holds natgw
// state in cfg's namespace. It returns what it removed; on error the
// namespace may still hold some of the other data plane's state (never
// less consistent than before: call it again).
func EmptyOthers(ctx context.Context, keep nat.DataplaneName, cfg nat.Config) (Emptied, error) {
	return emptyOthers(ctx, keep, cfg, true)
}

// EmptyOthersWithoutPlumbing is EmptyOthers for an agent that opens keep
// with OpenWithoutPlumbing: the other data planes' rules and state go, but
// no address or route is removed (nat/ha owns them; they were never the
// other data plane's to remove).
func EmptyOthersWithoutPlumbing(ctx context.Context, keep nat.DataplaneName, cfg nat.Config) (Emptied, error) {
	return emptyOthers(ctx, keep, cfg, false)
}

func emptyOthers(ctx context.Context, keep nat.DataplaneName, cfg nat.Config, unplumb bool) (Emptied, error) {
	if _, err := lookup(keep); err != nil {
		return Emptied{}, err
	}
	cfg = cfg.WithDefaults()
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return Emptied{}, fmt.Errorf("planes: %w", err)
	}
	defer ns.Close()
	var out Emptied
	for _, name := range Names {
		if name == keep {
			continue
		}
		pl := planesByName[name]
		present, err := pl.present(ctx, ns)
		if err != nil {
			return out, fmt.Errorf("planes: look for %s state in netns %q: %w", name, cfg.NetNS, err)
		}
		if !present {
			continue
		}
		open := pl.open
		if !unplumb {
			open = pl.bare
		}
		objs, err := empty(ctx, open, cfg, unplumb)
		if err != nil {
			return out, fmt.Errorf("planes: empty the %s data plane in netns %q: %w", name, cfg.NetNS, err)
		}
		if err := pl.remove(ctx, ns); err != nil {
			return out, fmt.Errorf("planes: remove the emptied %s data plane in netns %q: %w", name, cfg.NetNS, err)
		}
		out.Planes = append(out.Planes, name)
		out.Objects = append(out.Objects, objs...)
	}
	return out, nil
}

// Holds reports whether data plane name holds natgw state (its table or
// chains) in cfg's namespace. It creates nothing.
func Holds(ctx context.Context, name nat.DataplaneName, cfg nat.Config) (bool, error) {
	pl, err := lookup(name)
	if err != nil {
		return false, err
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		return false, fmt.Errorf("planes: %w", err)
	}
	defer ns.Close()
	return pl.present(ctx, ns)
}

// empty opens a data plane, removes the addresses and routes of its EIPs and
// routes, then syncs it empty (rules and their conntrack entries).
// Without unplumb, addresses and routes stay.
func empty(ctx context.Context, open Opener, cfg nat.Config, unplumb bool) ([]nat.Object, error) {
	dp, err := open(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	defer dp.Close()
	objs, err := dp.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	if unplumb {
		if err := plumb(ctx, cfg, plumbed(objs), nil); err != nil {
			return nil, fmt.Errorf("remove addresses and routes: %w", err)
		}
	}
	if err := dp.Sync(ctx, nil); err != nil {
		return nil, fmt.Errorf("sync empty: %w", err)
	}
	return objs, nil
}

// Restore puts back the addresses and routes of kept's objects that
// EmptyOthers took away (both data planes held the same EIP or route, e.g.
// after a switch interrupted half-way).
func Restore(ctx context.Context, kept nat.Dataplane, cfg nat.Config, e Emptied) error {
	if e.Empty() {
		return nil
	}
	removed := map[string]bool{}
	for _, o := range plumbed(e.Objects) {
		removed[link.Key(o)] = true
	}
	objs, err := kept.List(ctx)
	if err != nil {
		return fmt.Errorf("planes: list the %s data plane: %w", kept.Name(), err)
	}
	var back []nat.Object
	for _, o := range plumbed(objs) {
		if removed[link.Key(o)] {
			back = append(back, o)
		}
	}
	if len(back) == 0 {
		return nil
	}
	if err := plumb(ctx, cfg, nil, back); err != nil {
		return fmt.Errorf("planes: restore %d addresses and routes of the %s data plane: %w", len(back), kept.Name(), err)
	}
	return nil
}

// plumbed returns the EIP and Route objects of objs.
func plumbed(objs []nat.Object) []nat.Object {
	var out []nat.Object
	for _, o := range objs {
		if o.Kind == nat.KindEIP || o.Kind == nat.KindRoute {
			out = append(out, o)
		}
	}
	return out
}

func plumb(ctx context.Context, cfg nat.Config, removed, added []nat.Object) error {
	if len(removed) == 0 && len(added) == 0 {
		return nil
	}
	p, err := link.New(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	return p.Apply(ctx, removed, added)
}

// nftTables are the tables the nftables data plane leaves: table inet
// natgw, and table ip natgw of layouts 1-3.
var nftTables = []nftconn.Table{
	{Family: nft.TableFamilyINet, Name: nftconn.MainTable},
	{Family: nft.TableFamilyIPv4, Name: nftconn.MainTable},
}

// nftPresent reports whether table inet natgw (or table ip natgw, the
// table of layouts 1-3) exists.
func nftPresent(ctx context.Context, ns *netns.NS) (bool, error) {
	held, err := nftHeld(ctx, nftconn.Open(ns))
	return len(held) > 0, err
}

// nftHeld returns those of nftTables that exist.
func nftHeld(ctx context.Context, c nftconn.Conn) ([]nftconn.Table, error) {
	var held []nftconn.Table
	for _, t := range nftTables {
		ok, err := nftconn.HasTable(ctx, c, t)
		if err != nil {
			return nil, err
		}
		if ok {
			held = append(held, t)
		}
	}
	return held, nil
}

// nftRemove deletes table inet natgw (empty by now) and a table ip natgw
// of layouts 1-3 if one is left, those that exist, in one transaction.
func nftRemove(ctx context.Context, ns *netns.NS) error {
	return nftRemoveOn(ctx, nftconn.Open(ns))
}

func nftRemoveOn(ctx context.Context, c nftconn.Conn) error {
	tx, err := nftRemoveTx(ctx, c)
	if err != nil {
		return err
	}
	if err := c.Apply(ctx, tx); err != nil {
		return fmt.Errorf("delete the nftables data plane's tables: %w", err)
	}
	return nil
}

// nftRemoveTx is nftRemove's transaction on c: a delete of each of
// nftTables that exists (none: an empty transaction).
func nftRemoveTx(ctx context.Context, c nftconn.Conn) (*nftconn.Tx, error) {
	held, err := nftHeld(ctx, c)
	if err != nil {
		return nil, err
	}
	tx := &nftconn.Tx{}
	for _, t := range held {
		tx.DeleteTable(t)
	}
	return tx, nil
}

// chainPrefix starts the name of every chain natgw's iptables data plane
// creates (package iptables' layout).
const chainPrefix = "NATGW_"

// iptablesPresent reports whether natgw's iptables-legacy chains exist. The
// kernel lists the namespace's loaded x_tables first, so a namespace that
// never had iptables-legacy tables costs no exec.
func iptablesPresent(ctx context.Context, ns *netns.NS) (bool, error) {
	saved, err := iptablesSave(ctx, ns)
	if err != nil {
		return false, err
	}
	for _, out := range saved {
		if len(ownChains(out)) > 0 {
			return true, nil
		}
	}
	return false, nil
}

// iptablesRemove deletes natgw's jumps from the built-in chains and
// natgw's chains (flushed by then), one iptables-legacy-restore per table.
func iptablesRemove(ctx context.Context, ns *netns.NS) error {
	saved, err := iptablesSave(ctx, ns)
	if err != nil {
		return err
	}
	for _, t := range slices.Sorted(maps.Keys(saved)) {
		script := teardown(t, saved[t])
		if script == "" {
			continue
		}
		if _, err := inNS(ctx, ns, "iptables-legacy-restore", strings.NewReader(script), "-w", "30", "--noflush"); err != nil {
			return fmt.Errorf("table %s: %w", t, err)
		}
	}
	return nil
}

// ownChains returns natgw's chains in one table's iptables-legacy-save
// output.
func ownChains(saved string) []string {
	var chains []string
	for _, line := range strings.Split(saved, "\n") {
		if rest, ok := strings.CutPrefix(line, ":"+chainPrefix); ok {
			name, _, _ := strings.Cut(rest, " ")
			chains = append(chains, chainPrefix+name)
		}
	}
	return chains
}

// teardown returns the iptables-legacy-restore --noflush script that
// removes natgw from one table ("" when natgw has nothing there): the rules
// of other chains that jump to natgw's chains, then natgw's chains.
func teardown(table, saved string) string {
	chains := ownChains(saved)
	if len(chains) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "*%s\n", table)
	for _, line := range strings.Split(saved, "\n") {
		rest, ok := strings.CutPrefix(line, "-A ")
		if !ok || strings.HasPrefix(rest, chainPrefix) || !strings.Contains(rest, "-j "+chainPrefix) {
			continue
		}
		fmt.Fprintf(&b, "-D %s\n", rest)
	}
	for _, c := range chains {
		fmt.Fprintf(&b, "-F %s\n", c)
	}
	for _, c := range chains {
		fmt.Fprintf(&b, "-X %s\n", c)
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// iptablesSave returns iptables-legacy-save's output of the namespace's nat
// and mangle tables (the ones natgw uses), by table; none when those tables
// are not loaded or iptables-legacy-save is not installed (then natgw
// cannot have programmed them from here).
func iptablesSave(ctx context.Context, ns *netns.NS) (map[string]string, error) {
	var names []byte
	err := ns.Do(func() error {
		b, err := os.ReadFile("/proc/thread-self/net/ip_tables_names")
		if errors.Is(err, os.ErrNotExist) {
			return nil // ip_tables not loaded: no table anywhere
		}
		names = b
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read ip_tables_names: %w", err)
	}
	out := map[string]string{}
	for _, t := range strings.Fields(string(names)) {
		if t != "nat" && t != "mangle" {
			continue
		}
		if _, err := iptables.LookPath("iptables-legacy-save"); err != nil {
			return nil, nil
		}
		saved, err := inNS(ctx, ns, "iptables-legacy-save", nil, "-t", t)
		if err != nil {
			return nil, err
		}
		out[t] = saved
	}
	return out, nil
}

// execTimeout bounds one iptables-legacy-save or -restore run.
const execTimeout = 30 * time.Second

// inNS runs tool with args inside ns (nsenter onto a duplicate of its fd)
// and returns its standard output.
func inNS(ctx context.Context, ns *netns.NS, tool string, stdin io.Reader, args ...string) (string, error) {
	nsenter, err := iptables.LookPath("nsenter")
	if err != nil {
		return "", err
	}
	bin, err := iptables.LookPath(tool)
	if err != nil {
		return "", err
	}
	fd, err := os.Open(fmt.Sprintf("/proc/self/fd/%d", ns.Fd()))
	if err != nil {
		return "", fmt.Errorf("reopen netns %q: %w", ns.Ref(), err)
	}
	defer fd.Close()
	ctx, cancel := context.WithTimeout(ctx, execTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, nsenter, append([]string{"--net=/proc/self/fd/3", bin}, args...)...)
	cmd.ExtraFiles = []*os.File{fd}
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", tool, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
