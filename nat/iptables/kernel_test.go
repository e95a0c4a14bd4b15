package iptables

import (
	"context"
	"errors"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/engine"
	"github.com/natgw/natgw/nat/netns"
)

// These tests run the backend against the real kernel in a gateway topology
// they create (internal/netlab); they skip when not root. The shared
// conformance suite (nattest) covers packets; these check the iptables
// specifics: chain contents, rule order, repair, and that a refused call
// leaves iptables-save byte-identical.

type kenv struct {
	t   *testing.T
	ctx context.Context
	gw  *netlab.Gateway
	cfg nat.Config
	dp  nat.Dataplane
}

func newKEnv(t *testing.T) *kenv {
	t.Helper()
	lab := netlab.ForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatalf("gateway topology: %v", err)
	}
	e := &kenv{t: t, ctx: ctx, gw: gw, cfg: gw.Config()}
	e.open()
	return e
}

func (e *kenv) open() {
	e.t.Helper()
	dp, err := New(e.ctx, e.cfg)
	if err != nil {
		e.t.Fatalf("open: %v", err)
	}
	e.dp = dp
	e.t.Cleanup(func() { dp.Close() })
}

func (e *kenv) reopen() {
	e.t.Helper()
	if err := e.dp.Close(); err != nil {
		e.t.Fatalf("close: %v", err)
	}
	e.open()
}

func (e *kenv) save() string {
	e.t.Helper()
	out, err := netlab.IptablesSave(e.ctx, e.gw.GW, true)
	if err != nil {
		e.t.Fatalf("iptables-legacy-save: %v", err)
	}
	return out
}

// chain returns the "-A CHAIN ..." lines of one chain, in order.
func (e *kenv) chain(name string) []string {
	var out []string
	for _, l := range strings.Split(e.save(), "\n") {
		if strings.HasPrefix(l, "-A "+name+" ") {
			out = append(out, l)
		}
	}
	return out
}

func (e *kenv) sh(argv ...string) {
	e.t.Helper()
	if _, err := netlab.Exec(e.ctx, e.gw.GW, "", argv...); err != nil {
		e.t.Fatal(err)
	}
}

func (e *kenv) apply(objs ...nat.Object) {
	e.t.Helper()
	if err := e.dp.Apply(e.ctx, objs...); err != nil {
		e.t.Fatalf("apply: %v", err)
	}
}

func (e *kenv) wantList(want ...nat.Object) {
	e.t.Helper()
	got, err := e.dp.List(e.ctx)
	if err != nil {
		e.t.Fatalf("list: %v", err)
	}
	want = slices.Clone(want)
	nat.SortObjects(want)
	if !slices.EqualFunc(got, want, nat.Object.Equal) {
		e.t.Fatalf("list:\n got %v\nwant %v", got, want)
	}
}

var (
	eip0, eip1, eip2 = netlab.EIP(0), netlab.EIP(1), netlab.EIP(2)
	vm0              = netlab.VMAddr(0)
)

func testObjects() []nat.Object {
	return []nat.Object{
		{UID: "eip-0", Kind: nat.KindEIP, EIP: &nat.EIP{Address: eip0, PrefixLen: 24, QoS: &nat.QoS{IngressRateMbps: 10, EgressRateMbps: 20, EgressBurstMbit: 40}}},
		{UID: "eip-1", Kind: nat.KindEIP, EIP: &nat.EIP{Address: eip1, PrefixLen: 24}},
		{UID: "fip-0", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip0, InternalIP: vm0}},
		{UID: "dnat-0", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: eip1, Protocol: nat.TCP, ExternalPort: 80, InternalIP: vm0, InternalPort: 8080}},
		{UID: "snat-0", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: eip1, InternalCIDR: netip.MustParsePrefix("198.51.100.0/24"), RandomFully: true}},
		{UID: "route-0", Kind: nat.KindRoute, Route: &nat.Route{Destination: netip.MustParsePrefix("10.9.0.0/16"), NextHop: netip.MustParseAddr("198.51.100.254"), Device: nat.DeviceInternal}},
	}
}

func TestKernelRoundTripReopenDelete(t *testing.T) {
	e := newKEnv(t)
	boot := e.dp.BootID()
	if !engine.ValidBootID(boot) {
		t.Fatalf("boot id %q", boot)
	}
	objs := testObjects()
	e.apply(objs...)
	e.wantList(objs...)
	e.apply(objs...) // idempotent
	e.wantList(objs...)
	before := e.save()
	t.Logf("iptables-legacy-save:\n%s", before)
	for _, uid := range []string{"eip-0", "fip-0", "dnat-0", "snat-0", "route-0"} {
		if !strings.Contains(before, "--comment \""+uid+" ") {
			t.Errorf("no rule tagged %s in\n%s", uid, before)
		}
	}

	e.reopen()
	if got := e.dp.BootID(); got != boot {
		t.Fatalf("boot id after reopen = %q, want %q", got, boot)
	}
	e.wantList(objs...)
	if after := e.save(); after != before {
		t.Fatalf("reopen changed the kernel:\n%s\n---\n%s", before, after)
	}
	if err := e.dp.Delete(e.ctx, "fip-0", "eip-0", "snat-0", "unknown-uid"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	e.wantList(objs[1], objs[3], objs[5])
	after := e.save()
	for _, uid := range []string{"eip-0", "fip-0", "snat-0"} {
		if strings.Contains(after, "\""+uid+" ") {
			t.Errorf("rules of %s left after delete:\n%s", uid, after)
		}
	}
	if err := e.dp.Delete(e.ctx, "fip-0"); err != nil { // idempotent
		t.Fatalf("delete again: %v", err)
	}
	if err := e.dp.Sync(e.ctx, nil); err != nil {
		t.Fatalf("sync to empty: %v", err)
	}
	e.wantList()
	for _, ch := range []string{chainExclusiveDNAT, chainSharedDNAT, chainExclusiveSNAT, chainSharedSNAT, chainHairpinSNAT, chainQoSIngress, chainQoSEgress} {
		if got := e.chain(ch); len(got) != 0 {
			t.Errorf("%s not empty after sync to nothing: %q", ch, got)
		}
	}
	if got := e.chain(chainObjects); len(got) != 1 || !strings.Contains(got[0], bootTag+" "+boot) {
		t.Errorf("%s after sync to nothing = %q, want only the boot rule", chainObjects, got)
	}
}

func TestKernelUpdate(t *testing.T) {
	e := newKEnv(t)
	fip := nat.Object{UID: "fip-0", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip0, InternalIP: vm0}}
	e.apply(fip)
	moved := fip
	moved.FIP = &nat.FIP{EIP: eip2, InternalIP: netip.MustParseAddr("198.51.100.99")}
	e.apply(moved)
	e.wantList(moved)
	for _, ch := range []string{chainExclusiveDNAT, chainExclusiveSNAT, chainHairpinSNAT} {
		got := e.chain(ch)
		if len(got) != 1 || !strings.Contains(got[0], eip2.String()) || strings.Contains(got[0], eip0.String()+" ") {
			t.Errorf("%s after update = %q", ch, got)
		}
	}
	e.reopen()
	e.wantList(moved)
}

func TestKernelRefusedCallsChangeNothing(t *testing.T) {
	e := newKEnv(t)
	objs := testObjects()
	e.apply(objs...)
	before := e.save()
	cases := []struct {
		name   string
		objs   []nat.Object
		target error
	}{
		{"second fip on an eip", []nat.Object{{UID: "fip-x", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip0, InternalIP: netip.MustParseAddr("198.51.100.77")}}}, nat.ErrConflict},
		{"fip on a dnat eip", []nat.Object{{UID: "fip-y", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip1, InternalIP: netip.MustParseAddr("198.51.100.78")}}}, nat.ErrConflict},
		{"same dnat port", []nat.Object{{UID: "dnat-x", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: eip1, Protocol: nat.TCP, ExternalPort: 80, InternalIP: vm0, InternalPort: 81}}}, nat.ErrConflict},
		{"batch with one invalid", []nat.Object{
			{UID: "snat-ok", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: eip2, InternalCIDR: netip.MustParsePrefix("198.51.100.128/25")}},
			{UID: "dnat-bad", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: eip2, Protocol: "icmp", ExternalPort: 1, InternalIP: vm0, InternalPort: 1}},
		}, nat.ErrInvalid},
	}
	for _, tc := range cases {
		err := e.dp.Apply(e.ctx, tc.objs...)
		if !errors.Is(err, tc.target) {
			t.Errorf("%s: err = %v, want %v", tc.name, err, tc.target)
		}
		if after := e.save(); after != before {
			t.Errorf("%s changed iptables-save:\n%s\n---\n%s", tc.name, before, after)
		}
	}
	e.wantList(objs...)
}

var toSourceRE = regexp.MustCompile(`-s (\S+) `)

func TestKernelSNATLongestPrefixOrder(t *testing.T) {
	e := newKEnv(t)
	snat := func(uid, cidr string) nat.Object {
		return nat.Object{UID: uid, Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: eip0, InternalCIDR: netip.MustParsePrefix(cidr)}}
	}
	order := func() []string {
		var out []string
		for _, l := range e.chain(chainSharedSNAT) {
			m := toSourceRE.FindStringSubmatch(l)
			if m == nil {
				out = append(out, "any")
				continue
			}
			out = append(out, m[1])
		}
		return out
	}
	steps := []struct {
		apply  []nat.Object
		delete []string
		want   []string
	}{
		{apply: []nat.Object{snat("a", "198.51.100.0/24")}, want: []string{"198.51.100.0/24"}},
		{apply: []nat.Object{snat("b", "198.51.0.0/16")}, want: []string{"198.51.100.0/24", "198.51.0.0/16"}},
		{apply: []nat.Object{snat("c", "198.51.100.16/28"), snat("d", "0.0.0.0/0")}, want: []string{"198.51.100.16/28", "198.51.100.0/24", "198.51.0.0/16", "any"}},
		{delete: []string{"a"}, want: []string{"198.51.100.16/28", "198.51.0.0/16", "any"}},
		{apply: []nat.Object{snat("b", "198.51.100.0/25")}, want: []string{"198.51.100.16/28", "198.51.100.0/25", "any"}},
	}
	for i, s := range steps {
		if len(s.apply) > 0 {
			e.apply(s.apply...)
		}
		if len(s.delete) > 0 {
			if err := e.dp.Delete(e.ctx, s.delete...); err != nil {
				t.Fatalf("step %d: delete: %v", i, err)
			}
		}
		if got := order(); !slices.Equal(got, s.want) {
			t.Fatalf("step %d: SHARED_SNAT order %q, want %q", i, got, s.want)
		}
	}
	e.reopen()
	if got := order(); !slices.Equal(got, steps[len(steps)-1].want) {
		t.Fatalf("after reopen: SHARED_SNAT order %q", got)
	}
}

func TestKernelRepairAndBootID(t *testing.T) {
	e := newKEnv(t)
	objs := testObjects()
	e.apply(objs...)
	good := e.save()
	boot := e.dp.BootID()

	// Hand edits: a rule of the FIP and a hook go missing, a stray rule
	// and a duplicate hook appear.
	fipSNAT := e.chain(chainExclusiveSNAT)
	if len(fipSNAT) != 1 {
		t.Fatalf("EXCLUSIVE_SNAT = %q", fipSNAT)
	}
	args, err := splitArgs(strings.TrimPrefix(fipSNAT[0], "-A "))
	if err != nil {
		t.Fatal(err)
	}
	e.sh(append([]string{"iptables-legacy", "-t", "nat", "-D"}, args...)...)
	e.sh("iptables-legacy", "-t", "nat", "-D", "POSTROUTING", "-j", chainSNATFilter)
	e.sh("iptables-legacy", "-t", "mangle", "-A", "PREROUTING", "-j", chainQoSIngress)
	e.sh("iptables-legacy", "-t", "nat", "-A", chainSharedDNAT, "-d", "192.0.2.99/32", "-j", "DNAT", "--to-destination", "10.0.0.1")
	if err := e.dp.Reload(e.ctx); err != nil {
		t.Fatalf("reload: %v", err)
	}
	e.wantList(objs...)
	if got := e.dp.BootID(); got != boot {
		t.Fatalf("boot id changed by a repair: %q -> %q", boot, got)
	}
	if got := e.save(); !sameRules(got, good) {
		t.Fatalf("repair did not restore the rules:\n%s\n--- want (any order) ---\n%s", got, good)
	}

	// Losing the chains (here: all of nat) is a new boot: empty state.
	e.sh("iptables-legacy", "-t", "nat", "-F")
	e.sh("iptables-legacy", "-t", "nat", "-X")
	if err := e.dp.Reload(e.ctx); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if got := e.dp.BootID(); got == boot || !engine.ValidBootID(got) {
		t.Fatalf("boot id after the chains were lost = %q (was %q)", got, boot)
	}
	e.wantList()
	for _, ch := range []string{chainQoSIngress, chainQoSEgress} {
		if got := e.chain(ch); len(got) != 0 {
			t.Errorf("%s kept rules of the lost state: %q", ch, got)
		}
	}
}

// sameRules compares two dumps as multisets of lines (a repair rewrites
// chains, so order inside unordered chains may differ).
func sameRules(a, b string) bool {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(x, y)
}

// TestKernelNamespaceByPath opens the backend on the gateway namespace given
// as a path instead of a name: the rules land in that namespace.
func TestKernelNamespaceByPath(t *testing.T) {
	e := newKEnv(t)
	e.dp.Close()
	e.cfg.NetNS = netns.Path(e.gw.GW) // /run/netns/<name>
	if !strings.HasPrefix(e.cfg.NetNS, "/") {
		t.Fatalf("netns.Path(%q) = %q, want a path", e.gw.GW, e.cfg.NetNS)
	}
	e.open()
	fip := nat.Object{UID: "fip-p", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip0, InternalIP: vm0}}
	e.apply(fip)
	if got := e.chain(chainExclusiveDNAT); len(got) != 1 || !strings.Contains(got[0], "fip-p") {
		t.Fatalf("EXCLUSIVE_DNAT of %s = %q", e.gw.GW, got)
	}
}

// TestKernelPartialCommitIsUnknownState: a call that writes nat and mangle
// fails in the mangle section after nat was committed (here because the QoS
// chain was removed by hand). The error wraps nat.ErrUnknownState, and the
// engine's re-read takes the committed nat record as the truth: the EIP has
// its new QoS, and the mangle chain is rebuilt to police it.
func TestKernelPartialCommitIsUnknownState(t *testing.T) {
	e := newKEnv(t)
	plain := nat.Object{UID: "eip-u", Kind: nat.KindEIP, EIP: &nat.EIP{Address: eip0, PrefixLen: 24}}
	e.apply(plain)
	e.sh("iptables-legacy", "-t", "mangle", "-D", "PREROUTING", "-j", chainQoSIngress)
	e.sh("iptables-legacy", "-t", "mangle", "-X", chainQoSIngress)
	policed := plain
	policed.EIP = &nat.EIP{Address: eip0, PrefixLen: 24, QoS: &nat.QoS{IngressRateMbps: 5}}
	err := e.dp.Apply(e.ctx, policed)
	if !errors.Is(err, nat.ErrUnknownState) {
		t.Fatalf("apply with the mangle chain gone: err = %v, want ErrUnknownState", err)
	}
	e.wantList(policed)
	if got := e.chain(chainQoSIngress); len(got) != 1 || !strings.Contains(got[0], eip0.String()) {
		t.Fatalf("%s after the re-read = %q", chainQoSIngress, got)
	}
	if got := e.chain("PREROUTING"); !slices.Contains(got, "-A PREROUTING -j "+chainQoSIngress) {
		t.Fatalf("mangle hook not restored: %q", got)
	}
}

// TestKernelShareDNAT: a share identity's rules in the real kernel are
// contiguous, in rank order, with the probabilities iptables-legacy-save
// prints; the saved chains match the rendering (so Load leaves them be); a
// hand-reordered identity is put back in rank order by Reload; removing a
// backend rewrites the identity for the ones left; reopen rebuilds them.
func TestKernelShareDNAT(t *testing.T) {
	e := newKEnv(t)
	share := func(uid string, port uint16) nat.Object {
		return nat.Object{UID: uid, Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: eip0, Protocol: nat.TCP, ExternalPort: 80,
			InternalIP: vm0, InternalPort: port, Type: nat.DNATShare}}
	}
	eip := nat.Object{UID: "eip-0", Kind: nat.KindEIP, EIP: &nat.EIP{Address: eip0, PrefixLen: 24}}
	excl := nat.Object{UID: "dnat-x", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: eip0, Protocol: nat.TCP, ExternalPort: 22, InternalIP: vm0, InternalPort: 22}}
	a, b, c := share("share-a", 8001), share("share-b", 8002), share("share-c", 8003)
	e.apply(eip, excl, c, a, b)
	e.wantList(eip, excl, a, b, c)

	ranks := func() []string { // the identity's rules: "uid probability"
		var out []string
		for _, l := range e.chain(chainSharedDNAT) {
			if !strings.Contains(l, "type=share") {
				continue
			}
			f := strings.Fields(l)
			p := "-"
			if i := slices.Index(f, "--probability"); i >= 0 {
				p = f[i+1]
			}
			out = append(out, strings.Trim(f[slices.Index(f, "--comment")+1], `"`)+" "+p)
		}
		return out
	}
	wantRanks := func(what string, want ...string) {
		t.Helper()
		if got := ranks(); !slices.Equal(got, want) {
			t.Fatalf("%s: identity rules %q, want %q\n%s", what, got, want, e.save())
		}
	}
	wantRanks("three backends", "share-a 0.33333333349", "share-b 0.50000000000", "share-c -")

	// The real listing matches the rendering (probabilities as printed).
	d, err := parseSave(e.save())
	if err != nil {
		t.Fatal(err)
	}
	r := &Backend{rd: renderer{extIf: e.cfg.ExternalInterface, intIf: e.cfg.InternalInterface}}
	if !chainsMatch(d.table(tableNAT), tableNAT, r.desired([]nat.Object{eip, excl, a, b, c}, e.dp.BootID())[tableNAT]) {
		t.Fatalf("the saved nat chains do not match their rendering:\n%s", e.save())
	}

	// Hand edit: rank 0 moved to the end. Reload restores rank order.
	first := e.chain(chainSharedDNAT)
	var moved []string
	for _, l := range first {
		if strings.Contains(l, "share-a ") {
			if moved, err = splitArgs(strings.TrimPrefix(l, "-A ")); err != nil {
				t.Fatal(err)
			}
		}
	}
	e.sh(append([]string{"iptables-legacy", "-t", "nat", "-D"}, moved...)...)
	e.sh(append([]string{"iptables-legacy", "-t", "nat", "-A"}, moved...)...)
	wantRanks("hand-reordered", "share-b 0.50000000000", "share-c -", "share-a 0.33333333349")
	if err := e.dp.Reload(e.ctx); err != nil {
		t.Fatalf("reload: %v", err)
	}
	wantRanks("after reload", "share-a 0.33333333349", "share-b 0.50000000000", "share-c -")

	if err := e.dp.Delete(e.ctx, "share-b"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	wantRanks("backend b removed", "share-a 0.50000000000", "share-c -")
	e.reopen()
	e.wantList(eip, excl, a, c)
	wantRanks("after reopen", "share-a 0.50000000000", "share-c -")
	if err := e.dp.Delete(e.ctx, "share-a", "share-c"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	wantRanks("identity gone")
	if got := e.chain(chainSharedDNAT); len(got) != 1 || !strings.Contains(got[0], "dnat-x ") {
		t.Errorf("SHARED_DNAT after the identity went: %q, want the exclusive DNAT only", got)
	}
}
