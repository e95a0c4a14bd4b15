package shape

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftables"
)

// TestShapeTCP shapes the lab's EIP at 10 Mbit/s both ways and checks with
// real TCP through the FIP (vm's connections to ext, SNATed to the EIP) and
// with pings from ext to the EIP (DNATed to vm) that each direction is
// held at the rate, that the kernel holds natgw's qdiscs, classes and table,
// that Get reads the limits back, and that Set(nil) removes all of it and
// the transfers are fast again.
func TestShapeTCP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tp := newTopo(t, ctx, 0)
	want := []EIP{{Address: labEIP, Ingress: Limit{RateMbps: 10, BurstMB: 0.1}, Egress: Limit{RateMbps: 10, BurstMB: 0.1}}}
	if err := Set(t.Context(), tp.cfg, want); err != nil {
		t.Fatal(err)
	}
	got, err := Get(t.Context(), tp.cfg)
	if err != nil || len(got) != 1 || got[0] != want[0] {
		t.Fatalf("Get = %+v, %v; want %+v", got, err, want)
	}
	for _, dev := range []string{"eth0", "net1"} {
		out, err := netlab.Exec(ctx, tp.gw, "", "tc", "class", "show", "dev", dev)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "class htb 4e47:1 root") || !strings.Contains(out, "rate 10Mbit ceil 10Mbit") {
			t.Errorf("tc class show dev %s: no 10 Mbit class 4e47:1:\n%s", dev, out)
		}
		q, err := netlab.Exec(ctx, tp.gw, "", "tc", "qdisc", "show", "dev", dev)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(q, "qdisc htb 4e47: root") || strings.Contains(q, "bfifo") {
			t.Errorf("tc qdisc show dev %s: want htb root 4e47: with HTB's default leaves:\n%s", dev, q)
		}
	}
	for _, dir := range []flowDir{download, upload} {
		r, err := tp.runTCP(ctx, dir, 1, 1500*time.Millisecond, 4*time.Second, true)
		if err != nil {
			t.Fatal(err)
		}
		g := r.Goodput()
		t.Logf("%s shaped at 10 Mbit/s: %.2f Mbit/s, retransmits %.2f%%, %d pings answered", dir, g, r.Retrans, len(r.Pings))
		if g < 8.5 || g > 10.5 {
			t.Errorf("%s shaped at 10 Mbit/s: goodput %.2f Mbit/s, want 8.5–10.5", dir, g)
		}
		if len(r.Pings) == 0 {
			t.Errorf("%s: no ping through the EIP answered under load", dir)
		}
	}
	if err := Set(t.Context(), tp.cfg, nil); err != nil {
		t.Fatal(err)
	}
	rs, err := netlab.NftRuleset(ctx, tp.gw)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(rs, string(table.Name)) {
		t.Errorf("table %s still there after Set(nil)", table.Name)
	}
	for _, dev := range []string{"eth0", "net1"} {
		out, err := netlab.Exec(ctx, tp.gw, "", "tc", "qdisc", "show", "dev", dev)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "4e47") {
			t.Errorf("natgw's qdisc still on %s after Set(nil):\n%s", dev, out)
		}
	}
	r, err := tp.runTCP(ctx, download, 1, 500*time.Millisecond, 2*time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	if g := r.Goodput(); g < 50 {
		t.Errorf("download after Set(nil): %.1f Mbit/s, still shaped?", g)
	}
}

// TestWrapShapesEIPQoS: through Wrap, an EIP's nat.QoS is shaped, not
// policed (the NAT table gets no limit, natgw_shape the classes), List
// gives the QoS back, a change the wrapped data plane refuses leaves the
// shaping as it was, a QoS the shaper cannot hold is refused naming the
// object's field with nothing changed, a foreign root qdisc is refused
// before anything is changed, and deleting the EIP removes its shaping.
func TestWrapShapesEIPQoS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tp := newTopo(t, ctx, 0)
	dp := Wrap(tp.dp, tp.cfg)
	q := &nat.QoS{IngressRateMbps: 10, IngressBurstMbit: 1, EgressRateMbps: 20}
	eip := nat.Object{UID: "eip-0", Kind: nat.KindEIP, EIP: &nat.EIP{Address: labEIP, PrefixLen: 24, QoS: q}}
	if err := dp.Apply(ctx, eip); err != nil {
		t.Fatal(err)
	}
	rs, err := netlab.NftRuleset(ctx, tp.gw)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(rs, "qos_in_") || strings.Contains(rs, "qos_out_") {
		t.Errorf("the NAT table polices the EIP although Wrap shapes it:\n%s", rs)
	}
	wantShape := []EIP{{Address: labEIP, Ingress: Limit{RateMbps: 10, BurstMB: 125_000.0 / BytesPerMB}, Egress: Limit{RateMbps: 20}}}
	checkShape := func(when string, want []EIP) {
		t.Helper()
		got, err := Get(t.Context(), tp.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: shaping %+v, want %+v", when, got, want)
		}
	}
	checkShape("after apply", wantShape)
	// Objects other than EIPs pass through and keep the shaping.
	dnat := nat.Object{UID: "dnat-1", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: netlab.EIP(1), Protocol: nat.TCP, ExternalPort: 80, InternalIP: labVM, InternalPort: 80}}
	if err := dp.Apply(ctx, dnat); err != nil {
		t.Fatal(err)
	}
	if err := dp.Delete(ctx, "dnat-1"); err != nil {
		t.Fatal(err)
	}
	checkShape("after a DNAT came and went", wantShape)
	// Change (one transaction of the engine) passes through too.
	if err := dp.Change(ctx, []nat.Object{dnat}, nil); err != nil {
		t.Fatal(err)
	}
	if err := dp.Change(ctx, nil, []string{"dnat-1"}); err != nil {
		t.Fatal(err)
	}
	if c := dp.Counts(); c[nat.KindEIP] != 1 || c[nat.KindDNAT] != 0 {
		t.Errorf("Counts = %v, want 1 EIP", c)
	}
	checkShape("after Change", wantShape)
	objs, err := dp.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, o := range objs {
		if o.UID == "eip-0" {
			found = true
			if o.EIP.QoS == nil || *o.EIP.QoS != *q {
				t.Errorf("List: EIP QoS %+v, want %+v", o.EIP.QoS, q)
			}
		}
	}
	if !found {
		t.Fatalf("List: no eip-0 in %+v", objs)
	}
	r, err := tp.runTCP(ctx, upload, 1, time.Second, 3*time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	if g := r.Goodput(); g < 17 || g > 21 {
		t.Errorf("upload through Wrap's 20 Mbit/s: %.1f Mbit/s", g)
	}

	// Refused by the wrapped data plane (a second FIP on the EIP): the
	// QoS change in the same call must not stay.
	changed := eip
	changed.EIP = &nat.EIP{Address: labEIP, PrefixLen: 24, QoS: &nat.QoS{IngressRateMbps: 50}}
	bad := nat.Object{UID: "fip-1", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: labEIP, InternalIP: netlab.VMAddr(1)}}
	if err := dp.Apply(ctx, changed, bad); err == nil {
		t.Fatal("a second FIP on the EIP was accepted")
	}
	checkShape("after a refused apply", wantShape)

	// A burst the shaper cannot hold: 40,000 Mbit at 1 Mbit/s.
	tooLong := eip
	tooLong.EIP = &nat.EIP{Address: labEIP, PrefixLen: 24, QoS: &nat.QoS{IngressRateMbps: 1, IngressBurstMbit: 40_000}}
	err = dp.Apply(ctx, tooLong)
	var fe *nat.FieldError
	if !errors.As(err, &fe) || fe.UID != "eip-0" || fe.Field != "eip.qos.ingressBurstMbit" || fe.Value != "40000" {
		t.Fatalf("apply of a too long burst: %v, want a field error on eip-0 eip.qos.ingressBurstMbit 40000", err)
	}
	checkShape("after a refused burst", wantShape)

	// Someone else's root qdisc on net1: refused, eth0 untouched.
	if err := Set(t.Context(), tp.cfg, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := netlab.Exec(ctx, tp.gw, "", "tc", "qdisc", "add", "dev", "net1", "root", "handle", "1:", "tbf", "rate", "1mbit", "burst", "10k", "latency", "50ms"); err != nil {
		t.Fatal(err)
	}
	err = Set(t.Context(), tp.cfg, wantShape)
	if err == nil || !strings.Contains(err.Error(), "net1") || !strings.Contains(err.Error(), "did not make") {
		t.Fatalf("Set with a foreign root qdisc on net1: %v, want a refusal naming net1", err)
	}
	for _, dev := range []string{"eth0", "net1"} {
		out, err := netlab.Exec(ctx, tp.gw, "", "tc", "qdisc", "show", "dev", dev)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "4e47") {
			t.Errorf("refused Set left natgw's qdisc on %s:\n%s", dev, out)
		}
		if dev == "net1" && !strings.Contains(out, "qdisc tbf 1: root") {
			t.Errorf("the foreign qdisc on net1 changed:\n%s", out)
		}
	}
	if _, err := netlab.Exec(ctx, tp.gw, "", "tc", "qdisc", "del", "dev", "net1", "root"); err != nil {
		t.Fatal(err)
	}

	// The shaping was removed behind the wrapper's back (Set(nil) above):
	// a sync reads it again and repairs it.
	if err := dp.Sync(ctx, []nat.Object{eip}); err != nil {
		t.Fatal(err)
	}
	checkShape("after sync", wantShape)
	if err := dp.Delete(ctx, "eip-0"); err != nil {
		t.Fatal(err)
	}
	checkShape("after delete", nil)
	rs, err = netlab.NftRuleset(ctx, tp.gw)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(rs, string(table.Name)) {
		t.Errorf("table %s left after the last shaped EIP went", table.Name)
	}
}

// TestLeafQueue: with LeafDelay set, each class gets a bfifo of that long
// at its rate (100 ms at 10 Mbit/s: 125,000 bytes; at 1 Mbit/s the floor
// of 16 frames), and a class's change replaces it.
func TestLeafQueue(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tp := newTopo(t, ctx, 0)
	LeafDelay = 100 * time.Millisecond
	defer func() { LeafDelay = 0 }()
	for _, tc := range []struct {
		rate float64
		want string
	}{{10, "limit 125000b"}, {1, "limit 24224b"}} {
		if err := Set(t.Context(), tp.cfg, []EIP{{Address: labEIP, Egress: Limit{RateMbps: tc.rate}}}); err != nil {
			t.Fatal(err)
		}
		q, err := netlab.Exec(ctx, tp.gw, "", "tc", "qdisc", "show", "dev", "net1")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(q, "qdisc bfifo") || !strings.Contains(q, "parent 4e47:1 "+tc.want) {
			t.Errorf("%g Mbit/s: want a bfifo %s under 4e47:1:\n%s", tc.rate, tc.want, q)
		}
	}
	if err := Set(t.Context(), tp.cfg, nil); err != nil {
		t.Fatal(err)
	}
}

// TestLeafProbe: the first class natgw makes probes the kernel for
// fq_codel, once per process; each class then has fq_codel where the
// kernel has it (as `tc qdisc add ... fq_codel` by hand says) and HTB's
// default leaf where it does not (this CI kernel: the fallback).
func TestLeafProbe(t *testing.T) {
	lab := netlab.ForTest(t)
	ns, err := lab.NS("gw")
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range []string{"eth0", "net1", "probe"} {
		if err := netlab.Stub(ns, dev); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	_, ferr := netlab.Exec(ctx, ns, "", "tc", "qdisc", "add", "dev", "probe", "root", "fq_codel")
	kernelHas := ferr == nil
	t.Logf("tc qdisc add fq_codel by hand: %v (kernel has fq_codel: %v)", ferr, kernelHas)
	fqCodel.Store(0)
	fqCodelProbes.Store(0)
	t.Cleanup(func() { fqCodel.Store(0) })
	cfg := nat.Config{NetNS: ns}
	eips := []EIP{
		{Address: netip.MustParseAddr("192.0.2.10"), Ingress: Limit{RateMbps: 10}, Egress: Limit{RateMbps: 10}},
		{Address: netip.MustParseAddr("192.0.2.11"), Egress: Limit{RateMbps: 5}},
	}
	if err := Set(t.Context(), cfg, eips); err != nil {
		t.Fatal(err)
	}
	have, known := FqCodel()
	if !known || have != kernelHas {
		t.Fatalf("FqCodel() = %v, %v after the first classes; the kernel has it: %v", have, known, kernelHas)
	}
	eips[1].Egress.RateMbps = 6
	if err := Set(t.Context(), cfg, eips); err != nil {
		t.Fatal(err)
	}
	if n := fqCodelProbes.Load(); n != 1 {
		t.Errorf("%d fq_codel probes for 4 classes made in two calls, want 1", n)
	}
	for dev, classes := range map[string]int{"eth0": 1, "net1": 2} {
		out, err := netlab.Exec(ctx, ns, "", "tc", "qdisc", "show", "dev", dev)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(out, "qdisc fq_codel"); kernelHas && got != classes || !kernelHas && got != 0 {
			t.Errorf("dev %s: %d fq_codel leaves for %d classes (kernel has fq_codel: %v):\n%s", dev, got, classes, kernelHas, out)
		}
		if !strings.Contains(out, "qdisc htb 4e47: root") {
			t.Errorf("dev %s: no natgw root qdisc:\n%s", dev, out)
		}
	}
	if err := Set(t.Context(), cfg, nil); err != nil {
		t.Fatal(err)
	}
}

// TestDriftRestoresClass: an EIP's class deleted by hand (tc class del)
// shows in a fresh read (Reload, then List: the EIP lacks that direction's
// QoS, so the controller's drift check sees a difference and syncs), and
// the Sync that follows puts the class back; a class whose rate was changed
// by hand the same.
func TestDriftRestoresClass(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tp := newTopo(t, ctx, 0)
	dp := Wrap(tp.dp, tp.cfg)
	q := &nat.QoS{IngressRateMbps: 10, EgressRateMbps: 20}
	eip := nat.Object{UID: "eip-0", Kind: nat.KindEIP, EIP: &nat.EIP{Address: labEIP, PrefixLen: 24, QoS: q}}
	if err := dp.Apply(ctx, eip); err != nil {
		t.Fatal(err)
	}
	classes := func() string {
		out, err := netlab.Exec(ctx, tp.gw, "", "tc", "class", "show", "dev", "net1")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	desired, err := dp.List(ctx) // the topology's FIP and the EIP
	if err != nil {
		t.Fatal(err)
	}
	before := classes()
	if !strings.Contains(before, "class htb 4e47:1 root") {
		t.Fatalf("no egress class 4e47:1 on net1:\n%s", before)
	}
	for _, drift := range []struct {
		name string
		tc   []string
	}{
		{"class deleted by hand", []string{"tc", "class", "del", "dev", "net1", "classid", "4e47:1"}},
		{"rate changed by hand", []string{"tc", "class", "change", "dev", "net1", "parent", "4e47:", "classid", "4e47:1", "htb", "rate", "1mbit", "ceil", "1mbit"}},
	} {
		if _, err := netlab.Exec(ctx, tp.gw, "", drift.tc...); err != nil {
			t.Fatalf("%s: %v", drift.name, err)
		}
		if err := dp.Reload(ctx); err != nil {
			t.Fatal(err)
		}
		objs, err := dp.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got *nat.QoS
		for _, o := range objs {
			if o.UID == eip.UID {
				got = o.EIP.QoS
			}
		}
		if got == nil || got.EgressRateMbps != 0 || got.IngressRateMbps != 10 {
			t.Fatalf("%s: a fresh List shows QoS %+v; want the ingress limit only (the egress class is not what was applied)", drift.name, got)
		}
		if err := dp.Sync(ctx, desired); err != nil {
			t.Fatal(err)
		}
		if after := classes(); after != before {
			t.Fatalf("%s: after Sync net1's classes are\n%s\nwant\n%s", drift.name, after, before)
		}
		if err := dp.Reload(ctx); err != nil {
			t.Fatal(err)
		}
		if objs, err := dp.List(ctx); err != nil || fmt.Sprint(objs) != fmt.Sprint(desired) {
			t.Fatalf("%s: after Sync a fresh List = %v, %v; want %v", drift.name, objs, err, desired)
		}
	}
}

// TestWrapKeepsItsKernel: a Dataplane dials its sockets once and keeps
// them across Syncs and Applies (closing an nftables socket after a
// transaction that freed objects waits for an RCU grace period: see
// Dataplane.withKernel), drops them after a failed kernel call so the
// next one dials again, and Close closes every one it opened.
func TestWrapKeepsItsKernel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := gw.Config()
	inner, err := nftables.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// What each open fd is ("socket:[inode]", a path): fd numbers are
	// reused, and other tests' goroutines may open and close files.
	targets := func() map[string]bool {
		t.Helper()
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, e := range ents {
			if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
				m[l] = true
			}
		}
		return m
	}
	before := targets()
	dp := Wrap(inner, cfg)
	q := &nat.QoS{IngressRateMbps: 10, EgressRateMbps: 20}
	objs := []nat.Object{{UID: "eip-0", Kind: nat.KindEIP, EIP: &nat.EIP{Address: netlab.EIP(0), PrefixLen: 24, QoS: q}}}
	round := func(i int) {
		t.Helper()
		if err := dp.Sync(ctx, objs); err != nil {
			t.Fatal(err)
		}
		fip := nat.Object{UID: fmt.Sprintf("fip-%d", i), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netlab.EIP(0), InternalIP: gw.VMs[0].Addr}}
		if err := dp.Apply(ctx, fip); err != nil {
			t.Fatal(err)
		}
		if err := dp.Delete(ctx, fip.UID); err != nil {
			t.Fatal(err)
		}
	}
	round(0) // the inner data plane opens what it opens on first use too
	k := dp.k
	if k == nil {
		t.Fatal("no kernel kept after a Sync")
	}
	var opened []string // the sockets and files the first round left open
	for l := range targets() {
		if !before[l] {
			opened = append(opened, l)
		}
	}
	if len(opened) == 0 {
		t.Fatal("the first round left nothing open: no kernel kept?")
	}
	// The namespaces of the sockets the first round left open, the host's
	// left out (other tests' sockets live there): a socket opened in them
	// and left open by a later call beside the kept ones is a leak, which
	// the fd targets above cannot tell from other tests' files.
	host, err := hostNetnsCookie()
	if err != nil {
		t.Fatal(err)
	}
	nsOf := map[uint64]bool{}
	mine := 0 // of opened, the sockets in those namespaces
	for _, l := range opened {
		if c, ok := netnsCookie(l); ok && c != host {
			nsOf[c] = true
			mine++
		}
	}
	if mine == 0 {
		t.Fatalf("none of %v is a socket in the gateway's namespace", opened)
	}
	kept := socketsIn(nsOf)
	for i := range 5 {
		round(i + 1)
	}
	if dp.k != k {
		t.Error("the kernel was dialed again between calls that succeeded")
	}
	if n := socketsIn(nsOf); n != kept {
		t.Errorf("%d sockets in the gateway's namespace after five more rounds, %d after the first: a socket left open per call", n, kept)
	}
	now := targets()
	for _, l := range opened {
		if !now[l] {
			t.Errorf("%s, open after the first round, was closed by later rounds: dialed per call", l)
		}
	}
	// A failed kernel call drops the kernel; the next call dials again.
	dp.mu.Lock()
	err = dp.withKernel(ctx, func(*kernel) error { return errors.New("injected") })
	dropped := dp.k == nil
	dp.mu.Unlock()
	if err == nil || !dropped {
		t.Errorf("after a failed kernel call: error %v, kernel dropped %v", err, dropped)
	}
	if err := dp.Sync(ctx, objs); err != nil {
		t.Fatal(err)
	}
	if dp.k == nil || dp.k == k {
		t.Error("the Sync after the failure did not dial a new kernel")
	}
	if err := dp.Close(); err != nil {
		t.Fatal(err)
	}
	if dp.k != nil {
		t.Error("Close kept the kernel")
	}
	after := targets()
	for _, l := range opened {
		if after[l] {
			t.Errorf("%s, opened by the Dataplane, is still open after Close", l)
		}
	}
	// Close closes the inner data plane too: nothing of this process is
	// left in the gateway's namespace.
	if n := socketsIn(nsOf); n != 0 {
		t.Errorf("%d sockets in the gateway's namespace after Close, want 0", n)
	}
}

// soNetnsCookie is SO_NETNS_COOKIE (Linux 5.14), which golang.org/x/sys
// does not name: the cookie of the network namespace a socket is in.
const soNetnsCookie = 71

// netnsCookie returns the namespace cookie of the socket the fd link
// target l names ("socket:[inode]"), looked up among this process's fds.
func netnsCookie(l string) (uint64, bool) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, false
	}
	for _, e := range ents {
		if t, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && t == l {
			if fd, err := strconv.Atoi(e.Name()); err == nil {
				c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, soNetnsCookie)
				return c, err == nil
			}
		}
	}
	return 0, false
}

// hostNetnsCookie is the namespace cookie of a socket opened by this
// goroutine's thread (the test process's namespace).
func hostNetnsCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return unix.GetsockoptUint64(fd, unix.SOL_SOCKET, soNetnsCookie)
}

// socketsIn counts this process's open sockets in the namespaces whose
// cookies are in ns.
func socketsIn(ns map[uint64]bool) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	n := 0
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || !strings.HasPrefix(l, "socket:") {
			continue
		}
		if c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, soNetnsCookie); err == nil && ns[c] {
			n++
		}
	}
	return n
}
