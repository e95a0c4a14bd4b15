package iptables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/conntrack"
	"github.com/natgw/natgw/nat/engine"
	"github.com/natgw/natgw/nat/link"
	"github.com/natgw/natgw/nat/netns"
)

// ExecTimeout bounds one iptables-legacy-save or -restore run (a restore of
// a 100,000-object sync included); a shorter context deadline wins.
const ExecTimeout = 2 * time.Minute

// lockWait is how long iptables-legacy-restore waits for the xtables lock
// (shared by every namespace of the host) before giving up.
const lockWait = "30"

// Option configures New.
type Option func(*options)

type options struct {
	noPlumb bool
}

// WithoutPlumbing makes New skip addresses and routes (no link.Plumber):
// EIP and Route objects then live only in natgw's chains and state, as with
// nftables.WithoutPlumbing. For a hot-standby replica, whose EIP addresses
// float (nat/ha adds them where it is active), and for tests of the rules
// alone.
func WithoutPlumbing() Option { return func(o *options) { o.noPlumb = true } }

// New returns the iptables-legacy data plane for cfg: the Backend of this
// package under the shared engine, with cfg's link plumber for addresses and
// routes (none with WithoutPlumbing).
func New(ctx context.Context, cfg nat.Config, opts ...Option) (nat.Dataplane, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	cfg = cfg.WithDefaults()
	r, err := NewBackend(cfg)
	if err != nil {
		return nil, err
	}
	var plumb *link.Plumber
	if !o.noPlumb {
		if plumb, err = link.New(cfg); err != nil {
			r.Close()
			return nil, fmt.Errorf("iptables: %w", err)
		}
	}
	e, err := engine.New(ctx, r, plumb, cfg.Log)
	if err != nil {
		if plumb != nil {
			plumb.Close()
		}
		r.Close()
		return nil, err
	}
	return e, nil
}

// Backend is the iptables-legacy engine.Backend: it programs natgw's chains
// by running iptables-legacy-save and iptables-legacy-restore inside the
// gateway's namespace. See doc.go for the layout.
type Backend struct {
	rd  renderer
	ref string // the namespace as configured, for messages
	ns  *netns.NS
	// nsFile is a duplicate of the namespace fd that every child gets as
	// fd 3 and enters with `nsenter --net=/proc/self/fd/3`: the same
	// namespace whether it was named by a name, a path or "", and even if
	// the name is re-bound meanwhile.
	nsFile *os.File
	ct     *conntrack.Cleaner
	bin    struct{ nsenter, save, restore string }
	log    logr.Logger

	// Kernel mirror, valid after Load and each successful Commit; the
	// engine serializes calls.
	boot   string
	snats  map[string]nat.Object // SNAT objects by UID: SHARED_SNAT is rewritten whole
	shares map[string]nat.Object // share DNATs by UID: an identity's rules are rewritten whole
}

var (
	_ engine.Backend           = (*Backend)(nil)
	_ engine.DNATFlowForgetter = (*Backend)(nil)
)

// NewBackend opens cfg's namespace and finds the tools. Call Load before
// Commit.
func NewBackend(cfg nat.Config) (*Backend, error) {
	cfg = cfg.WithDefaults()
	r := &Backend{
		rd:     renderer{extIf: cfg.ExternalInterface, intIf: cfg.InternalInterface},
		ref:    cfg.NetNS,
		log:    cfg.Log.WithName("iptables"),
		snats:  map[string]nat.Object{},
		shares: map[string]nat.Object{},
	}
	var err error
	for _, b := range []struct {
		dst  *string
		name string
	}{{&r.bin.nsenter, "nsenter"}, {&r.bin.save, "iptables-legacy-save"}, {&r.bin.restore, "iptables-legacy-restore"}} {
		if *b.dst, err = LookPath(b.name); err != nil {
			return nil, fmt.Errorf("iptables: %w", err)
		}
	}
	if r.ns, err = netns.Open(cfg.NetNS); err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	fd, err := unix.FcntlInt(uintptr(r.ns.Fd()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		r.ns.Close()
		return nil, fmt.Errorf("iptables: dup netns fd of %q: %w", cfg.NetNS, err)
	}
	r.nsFile = os.NewFile(uintptr(fd), "netns:"+cfg.NetNS)
	if r.ct, err = conntrack.Open(r.ns); err != nil {
		r.nsFile.Close()
		r.ns.Close()
		return nil, fmt.Errorf("iptables: %w", err)
	}
	return r, nil
}

// LookPath finds a tool in PATH or in the sbin directories, which a
// non-login root PATH may lack.
func LookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found in PATH or sbin (install iptables / util-linux)", name)
}

// Name implements engine.Backend.
func (r *Backend) Name() nat.DataplaneName { return nat.DataplaneIptables }

// Close implements engine.Backend. Kernel state stays.
func (r *Backend) Close() error {
	return errors.Join(r.ct.Close(), r.nsFile.Close(), r.ns.Close())
}

// ForgetFlows implements engine.Backend like upstream's `conntrack -D -d
// EIP`, and also drops SNATed flows whose reply goes to the EIP.
func (r *Backend) ForgetFlows(ctx context.Context, eips []netip.Addr) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := r.ct.DeleteByAddr(eips); err != nil {
		return fmt.Errorf("iptables: forget flows of %v: %w", eips, err)
	}
	return nil
}

// ForgetDNATFlows implements engine.DNATFlowForgetter: it deletes, by
// tuple (conntrack.DeleteDNAT), the conntrack entries DNATed through each
// removed share DNAT backend, so the identity's other backends keep theirs.
func (r *Backend) ForgetDNATFlows(ctx context.Context, dnats []nat.DNAT) error {
	if err := r.ct.ForgetDNAT(ctx, dnats); err != nil {
		return fmt.Errorf("iptables: %w", err)
	}
	return nil
}

// Load implements engine.Backend. It reads our chains with one
// iptables-legacy-save, rebuilds every object from the rule comments and,
// when the chains do not hold exactly what those objects render to (first
// start, a hand edit, a lost hook), rewrites our chains in one restore. A
// missing boot rule means the chains were created anew (or wiped): the boot
// id is then new and the state empty. It holds the gateway lock (see
// lock) from the save to the restore.
func (r *Backend) Load(ctx context.Context) ([]nat.Object, string, error) {
	unlock, err := r.lock(ctx)
	if err != nil {
		return nil, "", err
	}
	defer unlock()
	saved, err := r.save(ctx)
	if err != nil {
		return nil, "", err
	}
	boot, objs := r.decode(saved)
	if boot == "" {
		if boot, err = engine.NewBootID(); err != nil {
			return nil, "", err
		}
		if len(objs) > 0 {
			r.log.Info("boot rule missing: dropping the objects left in our chains", "objects", len(objs))
		}
		objs = nil
	}
	if err := r.reconcile(ctx, saved, objs, boot); err != nil {
		return nil, "", err
	}
	r.boot = boot
	r.setMirror(objs)
	return objs, boot, nil
}

// lock takes the gateway namespace's lock (netns.NS.Lock) for one save and
// restore: iptables-legacy has no transaction across a read and a write, so
// two openers (an agent starting while `natgw list` runs) would otherwise
// both find no boot rule and write different boot ids, or rewrite chains
// from a save the other has just changed.
func (r *Backend) lock(ctx context.Context) (func(), error) {
	unlock, err := r.ns.Lock(ctx)
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	return unlock, nil
}

// Commit implements engine.Backend with one iptables-legacy-restore
// --noflush run. See doc.go for the transaction shape.
func (r *Backend) Commit(ctx context.Context, c engine.Commit) error {
	if err := refuseIPv6(c.Added); err != nil {
		return err
	}
	unlock, err := r.lock(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	if c.Full {
		saved, err := r.save(ctx)
		if err != nil {
			return err
		}
		if err := r.reconcile(ctx, saved, c.Want, r.boot); err != nil {
			return err
		}
		r.setMirror(c.Want)
		return nil
	}
	sc, snats, shares := r.commitScript(c)
	if err := r.restore(ctx, sc); err != nil {
		return err
	}
	r.snats, r.shares = snats, shares
	return nil
}

// commitScript renders an incremental Commit: the restore script and the SNAT
// and share DNAT mirrors after it.
func (r *Backend) commitScript(c engine.Commit) (*script, map[string]nat.Object, map[string]nat.Object) {
	sc := newScript()
	snats, shares := maps.Clone(r.snats), maps.Clone(r.shares)
	snatChanged := false
	touched := map[shareKey]bool{} // share identities this change rewrites
	each := func(objs []nat.Object, cmd string) {
		for _, o := range objs {
			mirror := map[string]nat.Object(nil)
			switch {
			case o.Kind == nat.KindSNAT:
				snatChanged = true
				mirror = snats
			case o.Kind == nat.KindDNAT && o.DNAT.Shared():
				touched[shareKeyOf(o.DNAT)] = true
				mirror = shares
			}
			if mirror != nil {
				if cmd == "-D" {
					delete(mirror, o.UID)
				} else {
					mirror[o.UID] = o
				}
			}
			if o.Kind == nat.KindSNAT {
				continue
			}
			for _, rule := range r.rd.rules(o) {
				sc.add(rule.Table, rule.Line(cmd))
			}
		}
	}
	// Deletes first, then adds (an update is old out, new in). SNAT
	// objects are only collected: SHARED_SNAT is rewritten whole, in
	// longest-prefix order, at the end of the nat section. A touched
	// share identity has its old rules deleted and its new ones appended
	// in rank order (shareRules).
	each(c.Removed, "-D")
	each(c.Added, "-A")
	if len(touched) > 0 {
		before, after := groupShares(r.shares), groupShares(shares)
		keys := make([]shareKey, 0, len(touched))
		for k := range touched {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { return shareKeyLess(keys[i], keys[j]) })
		for _, k := range keys {
			for _, rule := range shareRules(before[k]) {
				sc.add(tableNAT, rule.Line("-D"))
			}
		}
		for _, k := range keys {
			for _, rule := range shareRules(after[k]) {
				sc.add(tableNAT, rule.Line("-A"))
			}
		}
	}
	if snatChanged {
		sc.add(tableNAT, "-F "+chainSharedSNAT)
		for _, rule := range r.snatRules(snats) {
			sc.add(tableNAT, rule.Line("-A"))
		}
	}
	return sc, snats, shares
}

// setMirror sets the SNAT and share DNAT mirrors to those of objs.
func (r *Backend) setMirror(objs []nat.Object) {
	r.snats, r.shares = map[string]nat.Object{}, map[string]nat.Object{}
	for _, o := range objs {
		switch {
		case o.Kind == nat.KindSNAT:
			r.snats[o.UID] = o
		case o.Kind == nat.KindDNAT && o.DNAT.Shared():
			r.shares[o.UID] = o
		}
	}
}

// groupShares groups share DNATs by identity.
func groupShares(shares map[string]nat.Object) map[shareKey][]nat.Object {
	out := map[shareKey][]nat.Object{}
	for _, o := range shares {
		k := shareKeyOf(o.DNAT)
		out[k] = append(out[k], o)
	}
	return out
}

// shareKeyLess orders share identities (for a canonical script).
func shareKeyLess(a, b shareKey) bool {
	if a.eip != b.eip {
		return a.eip.Less(b.eip)
	}
	if a.proto != b.proto {
		return a.proto < b.proto
	}
	return a.port < b.port
}

// snatRules renders the SHARED_SNAT chain: longest prefix first.
func (r *Backend) snatRules(snats map[string]nat.Object) []Rule {
	objs := make([]nat.Object, 0, len(snats))
	for _, o := range snats {
		objs = append(objs, o)
	}
	sortSNATs(objs)
	var out []Rule
	for _, o := range objs {
		out = append(out, r.rd.rules(o)...)
	}
	return out
}

// desired renders the whole content of our chains for objs: table → chain →
// rules, SHARED_SNAT in longest-prefix order.
func (r *Backend) desired(objs []nat.Object, boot string) map[string]map[string][]Rule {
	want := map[string]map[string][]Rule{}
	for _, t := range tables {
		want[t] = map[string][]Rule{}
	}
	put := func(rules []Rule) {
		for _, rule := range rules {
			want[rule.Table][rule.Chain] = append(want[rule.Table][rule.Chain], rule)
		}
	}
	put(r.rd.skeleton(boot))
	snats, shares := map[string]nat.Object{}, map[string]nat.Object{}
	for _, o := range objs {
		if o.Kind == nat.KindSNAT {
			snats[o.UID] = o
			continue
		}
		if o.Kind == nat.KindDNAT && o.DNAT.Shared() {
			shares[o.UID] = o
		}
		put(r.rd.rules(o))
	}
	put(r.snatRules(snats))
	groups := groupShares(shares)
	keys := make([]shareKey, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return shareKeyLess(keys[i], keys[j]) })
	for _, k := range keys {
		put(shareRules(groups[k]))
	}
	return want
}

// reconcile makes our chains and hooks hold exactly what objs and boot
// render to, given the kernel's current content saved. Tables that already
// match are not written; the others have all our chains flushed and
// rewritten, in one restore (nat, then mangle).
func (r *Backend) reconcile(ctx context.Context, saved dump, objs []nat.Object, boot string) error {
	want := r.desired(objs, boot)
	sc := newScript()
	for _, t := range tables {
		td := saved.table(t)
		if !chainsMatch(td, t, want[t]) {
			for _, ch := range ownChains[t] {
				sc.add(t, ":"+ch+" - [0:0]") // creates, or flushes (--noflush)
			}
			for _, ch := range ownChains[t] {
				for _, rule := range want[t][ch] {
					sc.add(t, rule.Line("-A"))
				}
			}
		}
		for _, h := range hooks {
			if h.table != t {
				continue
			}
			n := 0
			for _, rule := range td.rules[h.builtin] {
				if len(rule.Args) == 2 && rule.Args[0] == "-j" && rule.Args[1] == h.target {
					n++
				}
			}
			if n == 0 {
				sc.add(t, fmt.Sprintf("-I %s 1 -j %s", h.builtin, h.target))
			}
			for ; n > 1; n-- {
				sc.add(t, fmt.Sprintf("-D %s -j %s", h.builtin, h.target))
			}
		}
	}
	if !sc.empty() {
		r.log.V(1).Info("rewriting chains", "tables", sc.tableNames())
	}
	return r.restore(ctx, sc)
}

// chainsMatch reports whether our chains of one table exist and hold exactly
// want (see Rule.key; ordered chains in order; in the other chains the
// rules of one share DNAT identity in order, see Rule.group).
func chainsMatch(td *tableDump, table string, want map[string][]Rule) bool {
	for _, ch := range ownChains[table] {
		if !td.chains[ch] {
			return false
		}
		have, wantRules := td.rules[ch], want[ch]
		if len(have) != len(wantRules) {
			return false
		}
		hk, wk := make([]string, len(have)), make([]string, len(wantRules))
		if orderedChains[ch] {
			for i := range have {
				hk[i], wk[i] = have[i].key(), wantRules[i].key()
			}
		} else {
			hk, wk = groupedKeys(have), groupedKeys(wantRules)
		}
		for i := range hk {
			if hk[i] != wk[i] {
				return false
			}
		}
	}
	return true
}

// groupedKeys returns the keys of an unordered chain's rules in a canonical
// order that keeps the relative order of the rules of one group (one share
// DNAT identity; every other rule is a group of its own).
func groupedKeys(rules []Rule) []string {
	type gk struct{ group, key string }
	ks := make([]gk, len(rules))
	for i, r := range rules {
		k := r.key()
		g := r.group()
		if g == "" {
			g = k
		}
		ks[i] = gk{g, k}
	}
	sort.SliceStable(ks, func(i, j int) bool { return ks[i].group < ks[j].group })
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = k.key
	}
	return out
}

// decode rebuilds the boot id and the objects from the comments of the rules
// in our chains. The nat table is authoritative: an object's comment there
// wins over its mangle (QoS) rules, which reconcile then rewrites; this
// settles a restore that committed nat but failed in mangle. Rules whose
// comment does not decode, UIDs whose rules within one table disagree, and
// objects that conflict with others are logged and left out; reconcile then
// removes their rules.
func (r *Backend) decode(saved dump) (string, []nat.Object) {
	boot := ""
	found := map[string]string{} // uid → comment, from the first table that has it
	bad := map[string]bool{}
	for _, t := range tables {
		seen := map[string]string{} // this table's comments
		disagree := map[string]bool{}
		td := saved.table(t)
		for _, ch := range ownChains[t] {
			for _, rule := range td.rules[ch] {
				c := rule.comment()
				if c == "" {
					continue
				}
				if strings.HasPrefix(c, bootTag+" ") {
					if id := strings.TrimPrefix(c, bootTag+" "); boot == "" && ch == chainObjects && engine.ValidBootID(id) {
						boot = id
					}
					continue
				}
				uid, _, _ := strings.Cut(c, " ")
				if prev, ok := seen[uid]; ok && prev != c {
					disagree[uid] = true
				}
				seen[uid] = c
			}
		}
		for uid, c := range seen {
			if _, ok := found[uid]; !ok { // else an earlier table decided
				found[uid] = c
				bad[uid] = disagree[uid]
			}
		}
	}
	uids := make([]string, 0, len(found))
	for uid := range found {
		uids = append(uids, uid)
	}
	sort.Strings(uids)
	st := nat.NewState()
	for _, uid := range uids {
		if bad[uid] {
			r.log.Info("rules of one UID disagree; dropped", "uid", uid)
			continue
		}
		o, err := decodeComment(found[uid])
		if err == nil {
			err = st.Insert(o)
		}
		if err != nil {
			r.log.Error(err, "rule comment in our chains not loadable; dropped", "uid", uid)
		}
	}
	return boot, st.Objects()
}

// save runs iptables-legacy-save in the namespace and parses it.
func (r *Backend) save(ctx context.Context) (dump, error) {
	out, err := r.run(ctx, "", r.bin.save)
	if err != nil {
		return nil, fmt.Errorf("iptables: save in netns %q: %w", r.ref, err)
	}
	d, err := parseSave(out)
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	return d, nil
}

// lineRE finds the failing line in iptables-restore's error output
// ("line 7 failed", "Error occurred at line: 7").
var lineRE = regexp.MustCompile(`line:? (\d+)`)

// restore runs one iptables-legacy-restore --noflush with sc. Each table of
// the script is replaced atomically when its COMMIT line is reached; a
// script with several tables is therefore atomic per table. If the run fails
// in a later table (or is killed) after an earlier one was committed, the
// error wraps nat.ErrUnknownState so the engine re-reads the kernel.
func (r *Backend) restore(ctx context.Context, sc *script) error {
	if sc.empty() {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("iptables: restore: %w", err)
	}
	text, commits := sc.render()
	_, err := r.run(ctx, text, r.bin.restore, "-w", lockWait, "--noflush")
	if err == nil {
		return nil
	}
	err = fmt.Errorf("iptables: restore of %s in netns %q: %w", strings.Join(sc.tableNames(), "+"), r.ref, err)
	if ctx.Err() != nil || !nothingCommitted(err.Error(), commits) {
		return fmt.Errorf("%w: %w", err, nat.ErrUnknownState)
	}
	return err
}

// nothingCommitted tells from a failed restore's error text whether no table
// of the script can have been replaced: true for a one-table script (the
// table is replaced at its COMMIT, as the last step), and for a failure at
// or before the first table's COMMIT line (commits holds the COMMIT line
// numbers).
func nothingCommitted(msg string, commits []int) bool {
	if len(commits) <= 1 {
		return true
	}
	m := lineRE.FindStringSubmatch(msg)
	if m == nil {
		return false
	}
	n, _ := strconv.Atoi(m[1])
	return n > 0 && n <= commits[0]
}

// run runs bin with args inside the namespace (nsenter on the inherited
// namespace fd), feeding stdin, under ExecTimeout. The error carries stderr.
func (r *Backend) run(ctx context.Context, stdin string, bin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, ExecTimeout)
	defer cancel()
	argv := append([]string{"--net=/proc/self/fd/3", "--", bin}, args...)
	cmd := exec.CommandContext(ctx, r.bin.nsenter, argv...)
	cmd.ExtraFiles = []*os.File{r.nsFile}
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if ctx.Err() != nil {
			return "", fmt.Errorf("%s: %w (%v): %s", filepath.Base(bin), ctx.Err(), err, msg)
		}
		return "", fmt.Errorf("%s: %w: %s", filepath.Base(bin), err, msg)
	}
	return stdout.String(), nil
}

// script is an iptables-restore input under construction: lines per table,
// written out in the fixed table order (nat, then mangle).
type script struct {
	lines map[string][]string
}

func newScript() *script { return &script{lines: map[string][]string{}} }

func (s *script) add(table, line string) { s.lines[table] = append(s.lines[table], line) }

func (s *script) empty() bool { return len(s.lines) == 0 }

func (s *script) tableNames() []string {
	var out []string
	for _, t := range tables {
		if len(s.lines[t]) > 0 {
			out = append(out, t)
		}
	}
	return out
}

// render returns the script text and the line number of each table's
// COMMIT, in order.
func (s *script) render() (string, []int) {
	var b strings.Builder
	var commits []int
	n := 0
	for _, t := range s.tableNames() {
		b.WriteString("*" + t + "\n")
		n++
		for _, l := range s.lines[t] {
			b.WriteString(l)
			b.WriteByte('\n')
			n++
		}
		b.WriteString("COMMIT\n")
		n++
		commits = append(commits, n)
	}
	return b.String(), commits
}

// refuseIPv6 refuses IPv6 objects before anything is sent: this data plane
// drives iptables-legacy only (see doc.go, "IPv6").
func refuseIPv6(objs []nat.Object) error {
	for _, o := range objs {
		if f, v, ok := o.IPv6Field(); ok {
			return fmt.Errorf("iptables: %w", &nat.FieldError{UID: o.UID, Field: f, Value: v, Reason: ipv6Refusal})
		}
	}
	return nil
}

// ipv6Refusal is the reason given for an IPv6 object.
const ipv6Refusal = "IPv6 is not supported by the iptables-legacy data plane (natgw does not drive ip6tables-legacy); use the nftables data plane"
