// Package nattest is the conformance suite every nat.Dataplane backend runs,
// and the FIP benchmark both backends report (BenchFIP).
//
// Subtests of Run (top-level ones run in parallel, each in namespaces of
// its own):
//
//	RoundTrip     apply/list/delete of every kind (EIP with and without QoS,
//	              FIP, TCP/UDP DNAT, SNAT, routes), one by one and batched
//	Idempotent    apply twice, delete twice, delete unknown UIDs
//	Update        same UID, new spec: List shows it, the kernel holds exactly it
//	Conflicts     refused (nat.ErrConflict) by Apply and Sync, kernel unchanged
//	InvalidBatch  one invalid object (nat.ErrInvalid) refuses the whole batch
//	Reopen        Close, open again: same objects, same BootID, delete by UID
//	LostState     recreated namespace: empty, new BootID, resync
//	Sync          replaces the whole state
//	Concurrent    applies and deletes from several goroutines
//	ConcurrentOpen several backends opened at once on an empty kernel: all
//	              succeed with one BootID (agent start racing `natgw list`)
//	Canceled      a done context changes nothing
//	LargeSync     4,000 objects in one Sync, reopen, bulk delete
//	Link          EIP addresses on the external interface, routes
//	Packets       real TCP/UDP through the standard netlab topology: FIP (both
//	              ways, moved to another VM), DNAT, SNAT longest prefix (and
//	              FIP-SNAT first), hairpin, QoS policing; after a delete no
//	              connectivity and no conntrack entry of the EIP; IPv6: a
//	              round trip of IPv6 objects beside IPv4 ones, then every
//	              one of those packet cases (one body per case, with a
//	              family parameter) in IPv6 through a dual-stack topology,
//	              the FIP's EIP dual-stack beside an IPv4 FIP
//	              (Options.NoIPv6: every IPv6 kind refused, nothing changed)
//	ShareDNAT     share DNAT backends: spread, pinning, per-backend cleanup
//
// Every case runs in both families: RoundTrip to LargeSync (the state
// cases, one body with a family parameter) again under <case>/IPv6 with
// IPv6 objects (IPv6-only EIPs, IPv6 internal addresses, CIDRs and routes;
// Update and Conflicts add dual-stack EIP rows) in a stand-alone namespace
// whose net1 and eth0 have IPv6 addresses too; Link, Packets and ShareDNAT
// under Link/IPv6, Packets/IPv6 and ShareDNAT/IPv6. A backend of
// Options.NoIPv6 gets no <case>/IPv6 state runs: Packets/IPv6 checks its
// refusal of every IPv6 kind instead.
//
// Before the backend is opened, foreign nft tables and iptables-legacy rules
// (filter, nat and mangle, built-in and own chains) are put in the gateway
// namespace; after every operation they must be unchanged, and the backend
// may only have added what it owns (see Options).
//
// A backend's test calls it with a function that opens the backend:
//
//	func TestConformance(t *testing.T) {
//		nattest.Run(t, func(ctx context.Context, cfg nat.Config) (nat.Dataplane, error) {
//			return nftables.New(ctx, cfg)
//		})
//	}
//
// Every test builds its own namespaces (internal/netlab) and removes them;
// it skips when not root. Canceled, for a package's own tests, checks that
// its netlink calls refuse an ended context (no root needed).
package nattest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// Opener opens a backend on the gateway cfg describes.
type Opener func(ctx context.Context, cfg nat.Config) (nat.Dataplane, error)

// Options adjust the suite to a backend.
type Options struct {
	// OwnIptablesLine reports whether a line of iptables-legacy-save output
	// (a rule or a chain declaration, without the table header) belongs to
	// the backend. The default, for the "iptables" data plane, owns the
	// lines that declare, append to, or jump/goto a chain that did not exist
	// before the backend was opened; for any other data plane, none.
	OwnIptablesLine func(line string) bool
	// OwnNftTable reports whether the nft table ("family name", e.g.
	// "inet natgw") belongs to the backend. The default, for the "nftables"
	// data plane, owns every table that did not exist before the backend
	// was opened; for any other data plane, none.
	OwnNftTable func(table string) bool
	// NoIPv6 says the backend refuses IPv6 objects (the iptables-legacy
	// data plane): the IPv6 packet cases then check that every IPv6 kind
	// is refused with a *nat.FieldError and nothing changes, instead of
	// sending IPv6 packets.
	NoIPv6 bool
	// CtMark says the backend gives every connection NATed through an
	// EIP a ct mark of that EIP's own, in both families (the nftables
	// data plane: nat/README.md, "Conntrack"): the FIP packet case then
	// checks that the connections of two EIPs carry distinct non-zero
	// marks.
	CtMark bool
}

// opTimeout bounds every Dataplane call the suite makes.
const opTimeout = 30 * time.Second

// Run runs the conformance suite against the backend open returns.
func Run(t *testing.T, open Opener) { RunWith(t, open, Options{}) }

// RunWith is Run with options.
func RunWith(t *testing.T, open Opener, opts Options) {
	if reason := netlab.Unavailable(); reason != "" {
		t.Skipf("nattest: %s", reason)
	}
	s := &suite{open: open, opts: opts}
	for _, tc := range s.tests() {
		t.Run(tc.name, func(t *testing.T) {
			// Every subtest has namespaces of its own; go test runs
			// at most -parallel (GOMAXPROCS) of them at once.
			t.Parallel()
			tc.run(t)
		})
	}
}

type suite struct {
	open Opener
	opts Options
}

type test struct {
	name string
	run  func(t *testing.T)
}

// env is one subtest's gateway: a namespace (with the standard topology
// when packets are sent) holding foreign rules, and an open backend whose
// every state-changing call is followed by an isolation check.
type env struct {
	t    *testing.T
	s    *suite
	ctx  context.Context
	lab  *netlab.Lab
	gw   *netlab.Gateway // nil without topology
	ns   string
	cfg  nat.Config
	dp   nat.Dataplane
	name nat.DataplaneName // dp.Name()
	base foreignState
	// empty is the kernel state right after the backend was opened.
	empty string
	// last caches the kernel state until the next operation (see touch).
	last *snapshot
	// v6: the stand-alone namespace gets IPv6 addresses too (gatewayNS).
	v6 bool
}

// newEnv makes a gateway namespace (the standard topology when topo is
// true, else a namespace with stand-alone net1/eth0, see GatewayNS), installs foreign nft tables
// and iptables-legacy rules, opens the backend and checks isolation.
func (s *suite) newEnv(t *testing.T, topo bool) *env {
	t.Helper()
	return s.newEnvWith(t, topo, netlab.GatewayOptions{})
}

// newEnvWith is newEnv with the topology's options (a dual-stack one:
// netlab.GatewayOptions.IPv6; without topology, IPv6 puts IPv6 addresses
// on the stand-alone net1 and eth0 too).
func (s *suite) newEnvWith(t *testing.T, topo bool, opts netlab.GatewayOptions) *env {
	t.Helper()
	e := &env{t: t, s: s, ctx: context.Background(), lab: netlab.ForTest(t), v6: opts.IPv6}
	if topo {
		gw, err := e.lab.Gateway(opts)
		if err != nil {
			t.Fatal(err)
		}
		e.gw, e.ns, e.cfg = gw, gw.GW, gw.Config()
		if err := installForeign(e.ctx, e.ns); err != nil {
			t.Fatal(err)
		}
	} else {
		e.recreateNS()
		e.cfg = nat.Config{NetNS: e.ns, ExternalInterface: nat.DefaultExternalInterface, InternalInterface: nat.DefaultInternalInterface}
	}
	base := e.snapshot()
	e.base = parseForeign(base.nft, base.ipt)
	t.Cleanup(e.closeDP)
	e.openDP()
	e.check("open")
	e.empty = e.kernel()
	return e
}

// recreateNS (re)makes the stand-alone gateway namespace "gw" with the
// foreign state: an empty kernel, as after a pod restart.
func (e *env) recreateNS() {
	e.t.Helper()
	e.touch()
	if e.ns != "" {
		if err := e.lab.RemoveNS(e.ns); err != nil {
			e.t.Fatal(err)
		}
	}
	ns, err := gatewayNS(e.lab, "gw", e.v6)
	if err != nil {
		e.t.Fatal(err)
	}
	e.ns = ns
	if err := installForeign(e.ctx, e.ns); err != nil {
		e.t.Fatal(err)
	}
}

// GatewayNS creates namespace role in lab with interfaces named like
// Kube-OVN's gateway (net1 192.0.2.254/24, eth0 198.51.100.1/24) and IPv4
// forwarding on: enough for a backend that sends no packets.
func GatewayNS(lab *netlab.Lab, role string) (string, error) { return gatewayNS(lab, role, false) }

// gatewayNS is GatewayNS; with v6 net1 also has 2001:db8:2::fe/64 and
// eth0 2001:db8:100::1/64 (the dual-stack topology's, without duplicate
// address detection) and IPv6 forwarding is on.
func gatewayNS(lab *netlab.Lab, role string, v6 bool) (string, error) {
	ns, err := lab.NS(role)
	if err != nil {
		return "", err
	}
	ext := []netip.Prefix{netip.PrefixFrom(netlab.GWExtAddr, netlab.ExtNet.Bits())}
	vpc := []netip.Prefix{netip.PrefixFrom(netlab.GWVPCAddr, netlab.VPCNet.Bits())}
	if v6 {
		if err := netlab.IPv6Sysctls(ns, true); err != nil {
			return "", err
		}
		ext = append(ext, netip.PrefixFrom(netlab.GWExtAddr6, netlab.ExtNet6.Bits()))
		vpc = append(vpc, netip.PrefixFrom(netlab.GWVPCAddr6, netlab.VPCNet6.Bits()))
	}
	if err := netlab.Stub(ns, nat.DefaultExternalInterface, ext...); err != nil {
		return "", err
	}
	if err := netlab.Stub(ns, nat.DefaultInternalInterface, vpc...); err != nil {
		return "", err
	}
	if err := netlab.Sysctl(ns, "net.ipv4.ip_forward", "1"); err != nil {
		return "", err
	}
	return ns, nil
}

// openDP opens a backend on the env's gateway as e.dp. The env's cleanup
// closes the one open at the end.
func (e *env) openDP() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, opTimeout)
	defer cancel()
	e.touch()
	dp, err := e.s.open(ctx, e.cfg)
	if err != nil {
		e.t.Fatalf("open backend on %s: %v", e.ns, err)
	}
	e.dp, e.name = dp, dp.Name()
}

// closeDP closes e.dp (once).
func (e *env) closeDP() {
	e.t.Helper()
	if e.dp == nil {
		return
	}
	e.touch()
	err := e.dp.Close()
	e.dp = nil
	if err != nil {
		e.t.Errorf("close: %v", err)
	}
}

// run runs fn as a subtest on the same env (e.t is the subtest meanwhile).
func (e *env) run(name string, fn func(t *testing.T)) {
	parent := e.t
	parent.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
		e.t = t
		defer func() { e.t = parent }()
		fn(t)
	})
}

// reopen closes the backend and opens a new one on the same namespace.
func (e *env) reopen() {
	e.t.Helper()
	e.closeDP()
	e.check("close")
	e.openDP()
	e.check("reopen")
}

func (e *env) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.ctx, opTimeout)
}

// tryApply applies objs and checks isolation; it returns Apply's error.
func (e *env) tryApply(objs ...nat.Object) error {
	e.t.Helper()
	ctx, cancel := e.opCtx()
	defer cancel()
	e.touch()
	err := e.dp.Apply(ctx, objs...)
	e.check("apply " + describe(objs))
	return err
}

// apply applies objs and fails the test on error.
func (e *env) apply(objs ...nat.Object) {
	e.t.Helper()
	if err := e.tryApply(objs...); err != nil {
		e.t.Fatalf("apply %s: %v", describe(objs), err)
	}
}

// del deletes uids and fails the test on error.
func (e *env) del(uids ...string) {
	e.t.Helper()
	ctx, cancel := e.opCtx()
	defer cancel()
	e.touch()
	err := e.dp.Delete(ctx, uids...)
	e.check(fmt.Sprintf("delete %v", uids))
	if err != nil {
		e.t.Fatalf("delete %v: %v", uids, err)
	}
}

// trySync syncs to desired and checks isolation; it returns Sync's error.
func (e *env) trySync(desired ...nat.Object) error {
	e.t.Helper()
	ctx, cancel := e.opCtx()
	defer cancel()
	e.touch()
	err := e.dp.Sync(ctx, desired)
	e.check("sync " + describe(desired))
	return err
}

func (e *env) sync(desired ...nat.Object) {
	e.t.Helper()
	if err := e.trySync(desired...); err != nil {
		e.t.Fatalf("sync %s: %v", describe(desired), err)
	}
}

// list returns the backend's objects.
func (e *env) list() []nat.Object {
	e.t.Helper()
	ctx, cancel := e.opCtx()
	defer cancel()
	objs, err := e.dp.List(ctx)
	if err != nil {
		e.t.Fatalf("list: %v", err)
	}
	return objs
}

// wantList checks that List returns exactly want (in canonical order).
func (e *env) wantList(what string, want ...nat.Object) {
	e.t.Helper()
	got := e.list()
	want = slices.Clone(want)
	nat.SortObjects(want)
	if objectsEqual(got, want) {
		return
	}
	if len(got) <= 4 && len(want) <= 4 {
		e.t.Errorf("%s: List =\n  %s\nwant\n  %s", what, describe(got), describe(want))
		return
	}
	e.t.Errorf("%s: List has %d objects, want %d:\n%s", what, len(got), len(want), objectsDiff(want, got))
}

// objectsDiff lists (at most 10 of each) the objects only in want ("-")
// and only in got ("+"), compared by UID and spec.
func objectsDiff(want, got []nat.Object) string {
	key := func(o nat.Object) string { return o.String() }
	in := func(objs []nat.Object) map[string]bool {
		m := make(map[string]bool, len(objs))
		for _, o := range objs {
			m[key(o)] = true
		}
		return m
	}
	inWant, inGot := in(want), in(got)
	var out []string
	list := func(objs []nat.Object, other map[string]bool, mark string) {
		n := 0
		for _, o := range objs {
			if other[key(o)] {
				continue
			}
			if n++; n > 10 {
				out = append(out, mark+" ...")
				return
			}
			out = append(out, mark+" "+key(o))
		}
	}
	list(want, inGot, "-")
	list(got, inWant, "+")
	if len(out) == 0 {
		return "(same objects, different order)"
	}
	return strings.Join(out, "\n")
}

func objectsEqual(a, b []nat.Object) bool {
	return slices.EqualFunc(a, b, func(x, y nat.Object) bool { return x.Equal(y) })
}

// describe names objects for messages: all of them when few, else the
// first three and the count.
func describe(objs []nat.Object) string {
	const most = 4
	n := min(len(objs), most)
	if len(objs) > most {
		n = 3
	}
	parts := make([]string, n, n+1)
	for i := range n {
		parts[i] = objs[i].String()
	}
	if n < len(objs) {
		parts = append(parts, fmt.Sprintf("... %d objects in all", len(objs)))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// snapshot is everything a backend may change in the gateway namespace:
// the nft ruleset (stateless), the iptables-legacy rules, the addresses of
// the external interface and the routes.
type snapshot struct {
	nft, ipt string
	addrs    []netip.Prefix
	routes   []netlab.Route
}

// touch forgets the cached snapshot: call it before anything that may
// change the kernel.
func (e *env) touch() { e.last = nil }

// snapshot returns the kernel state, read once per change (see touch).
func (e *env) snapshot() *snapshot {
	e.t.Helper()
	if e.last != nil {
		return e.last
	}
	var snap snapshot
	var iptErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		snap.ipt, iptErr = netlab.IptablesSave(e.ctx, e.ns, true)
	}()
	nft, err := netlab.Exec(e.ctx, e.ns, "", "nft", "-s", "list", "ruleset")
	<-done
	if err != nil {
		e.t.Fatal(err)
	}
	if iptErr != nil {
		e.t.Fatal(iptErr)
	}
	snap.nft = nft
	if snap.addrs, err = netlab.Addrs(e.ns, e.cfg.ExternalInterface); err != nil {
		e.t.Fatal(err)
	}
	if snap.routes, err = netlab.Routes(e.ns); err != nil {
		e.t.Fatal(err)
	}
	e.last = &snap
	return e.last
}

// kernel returns the snapshot as text. Two calls with nothing changed in
// between return identical text.
func (e *env) kernel() string {
	e.t.Helper()
	snap := e.snapshot()
	var b strings.Builder
	fmt.Fprintf(&b, "# nft -s list ruleset\n%s# iptables-legacy-save\n%s# addresses of %s\n", snap.nft, snap.ipt, e.cfg.ExternalInterface)
	for _, a := range snap.addrs {
		fmt.Fprintf(&b, "%s\n", a)
	}
	b.WriteString("# routes\n")
	for _, r := range snap.routes {
		fmt.Fprintf(&b, "%s\n", r)
	}
	return b.String()
}

// wantKernel checks that the kernel state is byte-identical to want: for
// operations that must change nothing.
func (e *env) wantKernel(what, want string) {
	e.t.Helper()
	if got := e.kernel(); got != want {
		e.t.Errorf("%s: kernel state changed:\n%s", what, lineDiff(want, got))
	}
}

// wantEquiv checks that the kernel state holds the same as want, up to the
// order of nft sets, maps and chains in their table, of set elements and
// of addresses: for the same objects reached by another sequence of
// operations (listing order follows creation order, not semantics; rule
// order inside a chain still counts).
func (e *env) wantEquiv(what, want string) {
	e.t.Helper()
	if got := canonical(e.kernel()); got != canonical(want) {
		e.t.Errorf("%s: kernel state differs:\n%s", what, lineDiff(canonical(want), got))
	}
}

// canonical rewrites kernel() text into a canonical order (see wantEquiv).
func canonical(text string) string {
	sections := strings.SplitAfter(text, "\n# ")
	for i, sec := range sections {
		switch {
		case strings.HasPrefix(sec, "# nft"):
			head, body, _ := strings.Cut(sec, "\n")
			body, tail := cutTail(body)
			sections[i] = head + "\n" + canonicalNft(body) + tail
		case strings.HasPrefix(sec, "addresses"):
			head, body, _ := strings.Cut(sec, "\n")
			body, tail := cutTail(body)
			lines := strings.Split(body, "\n")
			slices.Sort(lines)
			sections[i] = head + "\n" + strings.Join(lines, "\n") + tail
		}
	}
	return strings.Join(sections, "")
}

// cutTail splits the "\n# " that starts the next section off a section.
func cutTail(body string) (string, string) {
	if b, ok := strings.CutSuffix(body, "\n# "); ok {
		return b, "\n# "
	}
	return body, ""
}

// canonicalNft sorts the blocks (sets, maps, chains, ...) of every table of
// an nft listing, and the elements of every set and map.
func canonicalNft(s string) string {
	var out strings.Builder
	var blocks []string
	var cur strings.Builder
	depth := 0
	flush := func() {
		if b := strings.TrimSpace(cur.String()); b != "" {
			blocks = append(blocks, sortElements(b))
		}
		cur.Reset()
	}
	for _, line := range strings.Split(s, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case depth == 0:
			if strings.HasSuffix(trimmed, "{") {
				depth++
			}
			out.WriteString(line + "\n")
			continue
		case depth == 1 && trimmed == "}":
			flush()
			slices.Sort(blocks)
			out.WriteString(strings.Join(blocks, "\n") + "\n}\n")
			blocks = nil
			depth = 0
			continue
		case depth == 1 && trimmed == "":
			flush()
			continue
		}
		depth += strings.Count(trimmed, "{") - strings.Count(trimmed, "}")
		cur.WriteString(trimmed + "\n")
	}
	flush()
	if len(blocks) > 0 {
		out.WriteString(strings.Join(blocks, "\n"))
	}
	return out.String()
}

// sortElements sorts the comma-separated items of an "elements = { ... }"
// list in a block of an nft listing (which may span several lines).
func sortElements(block string) string {
	i := strings.Index(block, "elements = {")
	if i < 0 {
		return block
	}
	start := i + len("elements = {")
	end := strings.Index(block[start:], "}")
	if end < 0 {
		return block
	}
	end += start
	items := strings.Split(block[start:end], ",")
	for j := range items {
		items[j] = strings.Join(strings.Fields(items[j]), " ")
	}
	slices.Sort(items)
	return block[:start] + " " + strings.Join(items, ", ") + " " + block[end:]
}

// lineDiff is a small unified-ish diff of two texts: lines only in a ("-")
// and only in b ("+").
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	count := map[string]int{}
	for _, l := range bl {
		count[l]++
	}
	var out []string
	for _, l := range al {
		if count[l] > 0 {
			count[l]--
			continue
		}
		out = append(out, "- "+l)
	}
	count = map[string]int{}
	for _, l := range al {
		count[l]++
	}
	for _, l := range bl {
		if count[l] > 0 {
			count[l]--
			continue
		}
		out = append(out, "+ "+l)
	}
	if len(out) == 0 {
		return "(same lines, different order)\n--- want\n" + a + "\n--- got\n" + b
	}
	return strings.Join(out, "\n")
}

// wantErr checks that err matches target.
func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: error = %v, want one matching %q", what, err, target)
	}
}
