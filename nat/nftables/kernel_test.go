package nftables

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/internal/golden"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/engine"
	"github.com/natgw/natgw/nat/nattest"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
)

var update = flag.Bool("update", false, "rewrite testdata/golden/*.nft")

var bootRE = regexp.MustCompile(`boot=[0-9a-f]+`)

// normalize makes a table dump comparable: the boot id is random.
func normalize(s string) string { return bootRE.ReplaceAllString(s, "boot=BOOT") }

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	golden.Check(t, filepath.Join("testdata", "golden", name), got, *update) // go test -update rewrites it
}

func nftExec(t *testing.T, ns, script string) {
	t.Helper()
	if _, err := netlab.Exec(context.Background(), ns, script, "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

func list(t *testing.T, dp nat.Dataplane) []nat.Object {
	t.Helper()
	objs, err := dp.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func sameObjects(a, b []nat.Object) bool {
	a, b = append([]nat.Object(nil), a...), append([]nat.Object(nil), b...)
	nat.SortObjects(a)
	nat.SortObjects(b)
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Equal(b[i]) {
			return false
		}
	}
	return true
}

func wantObjects(t *testing.T, what string, dp nat.Dataplane, want []nat.Object) {
	t.Helper()
	if got := list(t, dp); !sameObjects(got, want) {
		t.Errorf("%s: List = %v, want %v", what, got, want)
	}
}

// generation reads the ruleset generation of ns: the kernel bumps it once
// per committed transaction.
func generation(t testing.TB, ns string) uint32 {
	t.Helper()
	n, err := netns.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: n.Fd()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil || len(msgs) != 1 {
		t.Fatalf("get generation: %v (%d replies)", err, len(msgs))
	}
	ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
	if err != nil {
		t.Fatal(err)
	}
	ad.ByteOrder = binary.BigEndian
	for ad.Next() {
		if ad.Type() == unix.NFTA_GEN_ID {
			return ad.Uint32()
		}
	}
	t.Fatalf("no generation id in %x", msgs[0].Data)
	return 0
}

// TestGolden applies a fixed set of objects in a fresh namespace and compares
// the table with testdata/golden/table.nft, then again after a reopen (Load
// rewrites every rule: the result must be identical).
func TestGolden(t *testing.T) {
	cfg := gateway(t)
	dp := open(t, cfg)
	if err := dp.Apply(ctxT(t), goldenObjects()...); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "table.nft", normalize(table(t, cfg.NetNS)))
	dp.Close()
	dp = open(t, cfg)
	wantObjects(t, "after reopen", dp, goldenObjects())
	checkGolden(t, "table.nft", normalize(table(t, cfg.NetNS)))
	if err := dp.Delete(ctxT(t), nat.UIDs(goldenObjects())...); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "empty.nft", normalize(table(t, cfg.NetNS)))
}

// TestPolicersAndSNATMaps follows the per-EIP policers and the per-prefix
// SNAT maps through updates: structure appears and disappears with the
// objects that need it, and the snat_cidr chain stays longest prefix first.
func TestPolicersAndSNATMaps(t *testing.T) {
	cfg := gateway(t)
	dp := open(t, cfg)
	ctx := ctxT(t)
	u := nattest.UID
	eip := addr("192.0.2.10")
	steps := []struct {
		name       string
		apply      []nat.Object
		del        []string
		has, hasNo []string
	}{
		{
			name:  "ingress policer",
			apply: []nat.Object{nattest.EIPQoS(u(nat.KindEIP, 1), eip, nat.QoS{IngressRateMbps: 8})},
			has:   []string{"limit qos_in_192_0_2_10 {\n\t\trate over 1000000 bytes/second", "goto qos_in_192_0_2_10", "chain qos_in_192_0_2_10 {"},
			hasNo: []string{"qos_out_192_0_2_10"},
		},
		{
			name:  "rate change and egress added",
			apply: []nat.Object{nattest.EIPQoS(u(nat.KindEIP, 1), eip, nat.QoS{IngressRateMbps: 16, IngressBurstMbit: 8, EgressRateMbps: 4})},
			has:   []string{"rate over 2000000 bytes/second burst 1000000 bytes", "limit qos_out_192_0_2_10 {\n\t\trate over 500000 bytes/second", "goto qos_out_192_0_2_10"},
		},
		{
			name:  "QoS removed",
			apply: []nat.Object{nattest.EIP(u(nat.KindEIP, 1), eip)},
			hasNo: []string{"qos_in_192_0_2_10", "qos_out_192_0_2_10", "limit "},
		},
		{
			name: "SNAT maps per prefix length, longest first",
			apply: []nat.Object{
				nattest.SNAT(u(nat.KindSNAT, 1), eip, prefix("10.0.0.0/8"), false),
				nattest.SNAT(u(nat.KindSNAT, 2), eip, prefix("10.1.0.0/16"), true),
				nattest.SNAT(u(nat.KindSNAT, 3), eip, prefix("10.1.2.0/24"), false),
			},
			has: []string{"map snat_p8 {", "map snat_p16_rf {", "map snat_p24 {",
				"chain snat_cidr {\n\t\tct mark set ip saddr & 255.255.255.0 map @snat_p24"},
		},
		{
			name:  "last SNAT of a prefix length gone",
			del:   []string{u(nat.KindSNAT, 3)},
			has:   []string{"chain snat_cidr {\n\t\tct mark set ip saddr & 255.255.0.0 map @snat_p16_rf"},
			hasNo: []string{"snat_p24"},
		},
	}
	for _, s := range steps {
		if len(s.apply) > 0 {
			if err := dp.Apply(ctx, s.apply...); err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
		}
		if len(s.del) > 0 {
			if err := dp.Delete(ctx, s.del...); err != nil {
				t.Fatalf("%s: %v", s.name, err)
			}
		}
		got := table(t, cfg.NetNS)
		for _, h := range s.has {
			if !strings.Contains(got, h) {
				t.Errorf("%s: table lacks %q:\n%s", s.name, h, got)
			}
		}
		for _, h := range s.hasNo {
			if strings.Contains(got, h) {
				t.Errorf("%s: table still has %q:\n%s", s.name, h, got)
			}
		}
	}
}

// TestKernelRejectChangesNothing makes the kernel refuse a transaction (an
// element put there behind the backend's back holds the key) and checks
// that the error is not "unknown", that neither kernel nor List changed, and
// that the backend keeps working.
func TestKernelRejectChangesNothing(t *testing.T) {
	cfg := gateway(t)
	dp := open(t, cfg, WithoutPlumbing())
	ctx := ctxT(t)
	u := nattest.UID
	a := nattest.FIP(u(nat.KindFIP, 1), addr("192.0.2.10"), addr("198.51.100.10"))
	if err := dp.Apply(ctx, a); err != nil {
		t.Fatal(err)
	}
	nftExec(t, cfg.NetNS, "add element inet natgw fip_dnat { 192.0.2.20 : 198.51.100.99 }\n")
	before := table(t, cfg.NetNS)
	gen := generation(t, cfg.NetNS)
	b := nattest.FIP(u(nat.KindFIP, 2), addr("192.0.2.20"), addr("198.51.100.20"))
	c := nattest.FIP(u(nat.KindFIP, 3), addr("192.0.2.30"), addr("198.51.100.30"))
	err := dp.Apply(ctx, c, b)
	if err == nil {
		t.Fatal("Apply over a foreign element succeeded")
	}
	if errors.Is(err, nat.ErrUnknownState) {
		t.Errorf("a rejected batch reported unknown state: %v", err)
	}
	// The failing message is not the last one, which alone asks for an
	// ack: its error still comes back, named.
	if !errors.Is(err, unix.EEXIST) || !strings.Contains(err.Error(), "add elements to fip_dnat (message 1 of ") {
		t.Errorf("error %q does not name the refused message (add elements to fip_dnat, message 1) with EEXIST", err)
	}
	if got := table(t, cfg.NetNS); got != before {
		t.Errorf("kernel changed by a rejected batch:\n%s\nwant\n%s", got, before)
	}
	if g := generation(t, cfg.NetNS); g != gen {
		t.Errorf("generation %d -> %d: something was committed", gen, g)
	}
	wantObjects(t, "after the rejected batch", dp, []nat.Object{a})
	if err := dp.Apply(ctx, c); err != nil {
		t.Fatalf("Apply after a rejected batch: %v", err)
	}
	// A reload finds the foreign element (no owner comment) and rewrites
	// the elements without it; then b goes in.
	if err := dp.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	wantObjects(t, "after reload", dp, []nat.Object{a, c})
	if strings.Contains(table(t, cfg.NetNS), "198.51.100.99") {
		t.Error("reload kept the element without owner")
	}
	if err := dp.Apply(ctx, b); err != nil {
		t.Fatal(err)
	}
	wantObjects(t, "end", dp, []nat.Object{a, b, c})
}

// TestLoadRepairs damages the table behind the backend's back; opening it
// again restores rules and elements from what the elements say.
func TestLoadRepairs(t *testing.T) {
	cfg := gateway(t)
	dp := open(t, cfg)
	if err := dp.Apply(ctxT(t), goldenObjects()...); err != nil {
		t.Fatal(err)
	}
	want := table(t, cfg.NetNS)
	boot := dp.BootID()
	dp.Close()
	nftExec(t, cfg.NetNS, strings.Join([]string{
		"flush chain inet natgw dstnat",
		"flush chain inet natgw snat_cidr",
		"flush chain inet natgw qos_in_192_0_2_10",
		"delete element inet natgw fip_snat { 198.51.100.10 }",
		"delete element inet natgw qos_out { 192.0.2.11 }",
		"delete chain inet natgw qos_out_192_0_2_11",
		"delete limit inet natgw qos_out_192_0_2_11",
		"add chain inet natgw qos_in_192_0_2_99",
		"flush chain inet natgw share",
		"delete element inet natgw share_mod { 192.0.2.11 . tcp . 443 }",
		"",
	}, "\n"))
	dp = open(t, cfg)
	if dp.BootID() != boot {
		t.Errorf("boot id changed by a repair: %s -> %s", boot, dp.BootID())
	}
	wantObjects(t, "after repair", dp, goldenObjects())
	// A chain the repair made again is listed after those kept: compare
	// the table's blocks in any order.
	if got := table(t, cfg.NetNS); sortedBlocks(got) != sortedBlocks(want) {
		t.Errorf("repaired table:\n%s\nwant\n%s", got, want)
	}
}

// sortedBlocks returns an nft listing with its blank-line separated
// blocks (sets, maps, chains) sorted.
func sortedBlocks(s string) string {
	bs := strings.Split(strings.TrimSuffix(strings.TrimSpace(s), "}"), "\n\n")
	for i, b := range bs {
		bs[i] = strings.TrimSpace(b)
	}
	slices.Sort(bs)
	return strings.Join(bs, "\n\n")
}

// TestRecreate: a table of another layout version, or no table, gives a
// fresh table and a new boot id.
func TestRecreate(t *testing.T) {
	cfg := gateway(t)
	dp := open(t, cfg, WithoutPlumbing())
	ctx := ctxT(t)
	if err := dp.Apply(ctx, goldenObjects()...); err != nil {
		t.Fatal(err)
	}
	empty := func() string {
		lab := netlab.ForTest(t)
		ns, err := lab.NS("fresh")
		if err != nil {
			t.Fatal(err)
		}
		d := open(t, nat.Config{NetNS: ns}, WithoutPlumbing())
		d.Close()
		return normalize(table(t, ns))
	}()
	for _, tc := range []struct{ name, script string }{
		{"old layout", "delete element inet natgw natgw_meta { 0x1 }\nadd element inet natgw natgw_meta { 0x1 comment \"natgw layout=0 boot=0\" }\n"},
		{"table deleted", "delete table inet natgw\n"},
	} {
		boot := dp.BootID()
		nftExec(t, cfg.NetNS, tc.script)
		if err := dp.Reload(ctx); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if dp.BootID() == boot || dp.BootID() == "" {
			t.Errorf("%s: boot id %q after reload, was %q", tc.name, dp.BootID(), boot)
		}
		wantObjects(t, tc.name, dp, nil)
		if got := normalize(table(t, cfg.NetNS)); got != empty {
			t.Errorf("%s: table\n%s\nwant a fresh one:\n%s", tc.name, got, empty)
		}
		if err := dp.Apply(ctx, goldenObjects()...); err != nil {
			t.Fatal(err)
		}
	}
}

// manyFIPs returns n FIPs with UIDs of uidLen characters.
func manyFIPs(n, uidLen int) []nat.Object {
	out := make([]nat.Object, n)
	for i := range out {
		v := uint32(i + 1)
		uid := nattest.UID(nat.KindFIP, i)
		if uidLen > len(uid) {
			uid += "-" + strings.Repeat("x", uidLen-len(uid)-1)
		}
		out[i] = nattest.FIP(uid, netip.AddrFrom4([4]byte{100, byte(64 + v>>16), byte(v >> 8), byte(v)}),
			netip.AddrFrom4([4]byte{10, byte(v >> 16), byte(v >> 8), byte(v)}))
	}
	return out
}

// opCtx bounds one operation of the large tests: generous, since under the
// race detector on a loaded 2-core machine a 100k Sync takes tens of seconds.
func opCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestSyncLarge syncs 100,000 FIPs (200,000 elements) through the Backend
// and checks that it was one kernel transaction, that a new Backend reads
// all of it back as consistent, and that replacing half of it (100,000
// deletes by flush, 200,000 adds) is one transaction again. (The Backend alone: the engine's planning of 100k
// objects is slow under the race detector and is not what is tested here.)
func TestSyncLarge(t *testing.T) {
	const n = 100_000
	cfg := gateway(t)
	load := func() (*Backend, []nat.Object) {
		t.Helper()
		r, err := NewBackend(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		start := time.Now()
		objs, _, err := r.Load(opCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Load of %d objects: %v", len(objs), time.Since(start))
		return r, objs
	}
	r, _ := load()
	objs := manyFIPs(n, 36)
	sync := func(r *Backend, removed, added, want []nat.Object) {
		t.Helper()
		gen := generation(t, cfg.NetNS)
		start := time.Now()
		if err := r.Commit(opCtx(t), engine.Commit{Full: true, Removed: removed, Added: added, Want: want}); err != nil {
			t.Fatal(err)
		}
		t.Logf("full commit of %d FIPs: %v", len(want), time.Since(start))
		if g := generation(t, cfg.NetNS); g != gen+1 {
			t.Errorf("full commit took %d transactions, want 1", g-gen)
		}
	}
	sync(r, nil, objs, objs)
	r, got := load()
	if !sameObjects(got, objs) {
		t.Fatalf("read back %d objects, want %d", len(got), len(objs))
	}
	next := append([]nat.Object(nil), objs[:n/2]...)
	for _, o := range manyFIPs(n, 36)[n/2:] {
		o.UID = "b" + o.UID[1:]
		o.FIP.InternalIP = o.FIP.InternalIP.Next()
		next = append(next, o)
	}
	// (TestSyncLongUIDs reads a second Sync back; at this size that read
	// is what makes the test slow.)
	sync(r, objs[n/2:], next[n/2:], next)
}

// TestSyncLongUIDs syncs 20,000 FIPs with 64-character UIDs (elements of
// ~100 bytes: the per-message chunking must split by size), reopens, syncs
// half of them away in one transaction, and deletes by UID after a reopen.
func TestSyncLongUIDs(t *testing.T) {
	const n = 20_000
	cfg := gateway(t)
	dp := open(t, cfg, WithoutPlumbing())
	objs := manyFIPs(n, nat.MaxUIDLen)
	gen := generation(t, cfg.NetNS)
	if err := dp.Sync(opCtx(t), objs); err != nil {
		t.Fatal(err)
	}
	if g := generation(t, cfg.NetNS); g != gen+1 {
		t.Errorf("Sync took %d transactions, want 1", g-gen)
	}
	dp.Close()
	dp = open(t, cfg, WithoutPlumbing())
	if got := list(t, dp); !sameObjects(got, objs) {
		t.Fatalf("after reopen: %d objects, want %d", len(got), len(objs))
	}
	next := objs[:n/2]
	gen = generation(t, cfg.NetNS)
	if err := dp.Sync(opCtx(t), next); err != nil {
		t.Fatal(err)
	}
	if g := generation(t, cfg.NetNS); g != gen+1 {
		t.Errorf("second Sync took %d transactions, want 1", g-gen)
	}
	dp.Close()
	dp = open(t, cfg, WithoutPlumbing())
	if err := dp.Delete(opCtx(t), next[0].UID, next[len(next)-1].UID); err != nil {
		t.Fatal(err)
	}
	dp.Close()
	dp = open(t, cfg, WithoutPlumbing())
	if got := list(t, dp); !sameObjects(got, next[1:len(next)-1]) {
		t.Errorf("after delete and reopen: %d objects, want %d", len(got), len(next)-2)
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		unknown bool
	}{
		{"refused element", &netlink.OpError{Op: "receive", Err: unix.EBUSY}, false},
		{"refused, joined", fmt.Errorf("conn.Receive: %w", errors.Join(&netlink.OpError{Op: "receive", Err: unix.ENOENT})), false},
		{"too big to send", fmt.Errorf("SendMessages: %w", &netlink.OpError{Op: "send", Err: unix.EMSGSIZE}), false},
		{"acks dropped", &netlink.OpError{Op: "receive", Err: unix.ENOBUFS}, true},
		{"timeout", fmt.Errorf("conn.Receive: %w", os.ErrDeadlineExceeded), true},
		{"no errno", errors.New("expected header 2, got 16"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := classify(tc.err)
			if got := errors.Is(err, nat.ErrUnknownState); got != tc.unknown {
				t.Errorf("classify(%v) unknown = %v, want %v", tc.err, got, tc.unknown)
			}
			if !errors.Is(err, tc.err) {
				t.Errorf("classify(%v) = %v does not wrap the cause", tc.err, err)
			}
		})
	}
}

// TestForgetFlows puts conntrack entries in the gateway namespace and
// checks that ForgetFlows removes those of the given EIPs and keeps the
// others, both by ct mark (few EIPs) and by one dump (many EIPs).
func TestForgetFlows(t *testing.T) {
	for _, n := range []int{2, flushMarkMax + 4} {
		t.Run(fmt.Sprintf("%d_EIPs", n), func(t *testing.T) {
			cfg := gateway(t)
			r, err := NewBackend(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			ctx := ctxT(t)
			var eips []netip.Addr
			insert := func(eip netip.Addr, port int) {
				t.Helper()
				// What the dstnat rule leaves: a connection to the EIP,
				// marked with it.
				if _, err := netlab.Exec(ctx, cfg.NetNS, "", "conntrack", "-I", "-p", "udp", "-s", "192.0.2.1", "-d", eip.String(),
					"--sport", fmt.Sprint(port), "--dport", "53", "--timeout", "120", "--mark", fmt.Sprint(markOf(eip))); err != nil {
					t.Fatal(err)
				}
			}
			for i := range n + 1 {
				eip := netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)})
				insert(eip, 1000+i)
				if i < n {
					eips = append(eips, eip)
				}
			}
			keep := netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + n)})
			if err := r.ForgetFlows(ctx, eips); err != nil {
				t.Fatal(err)
			}
			flows, err := netlab.ConntrackEntries(ctx, cfg.NetNS)
			if err != nil {
				t.Fatal(err)
			}
			for _, a := range eips {
				for _, f := range netlab.FlowsWith(flows, a) {
					t.Errorf("entry of forgotten %s left: %s", a, f)
				}
			}
			if len(netlab.FlowsWith(flows, keep)) != 1 {
				t.Errorf("entry of %s (not forgotten) gone; entries: %v", keep, flows)
			}
		})
	}
}

func markOf(a netip.Addr) uint32 { return binary.BigEndian.Uint32(a4(a)) }

// TestTinyReceiveBuffer shrinks the socket's receive buffer to a few
// answers. A batch asks for one answer (the last message's ack; see
// txn.close), so a large transaction that applies is reported as applied
// however small the buffer. A batch whose many messages fail gets one error
// answer each: when they overrun the buffer (ENOBUFS), the Backend must not
// report success or failure blindly: the error wraps nat.ErrUnknownState
// (the engine reads the kernel back on such errors; nat/engine tests it).
func TestTinyReceiveBuffer(t *testing.T) {
	objs := manyFIPs(5000, 36)
	for _, tc := range []struct {
		name     string
		conflict bool // every key of the batch's adds is in the kernel already
	}{
		{"applied batch", false},
		{"rejected batch with more errors than the buffer holds", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := gateway(t)
			r, err := NewBackend(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if _, _, err := r.Load(opCtx(t)); err != nil {
				t.Fatal(err)
			}
			if tc.conflict {
				var b strings.Builder
				for _, o := range objs {
					fmt.Fprintf(&b, "add element inet natgw fip_dnat { %s : 192.0.2.1 }\n", o.FIP.EIP)
					fmt.Fprintf(&b, "add element inet natgw fip_snat { %s : 192.0.2.1 }\n", o.FIP.InternalIP)
				}
				nftExec(t, cfg.NetNS, b.String())
			}
			if err := r.nl.SetBuffers(0, 1024); err != nil {
				t.Fatal(err)
			}
			gen := generation(t, cfg.NetNS)
			err = r.commitDiff(opCtx(t), nil, objs, tc.conflict)
			if !tc.conflict {
				if err != nil {
					t.Fatalf("commit of %d FIPs with a tiny receive buffer: %v", len(objs), err)
				}
				if g := generation(t, cfg.NetNS); g != gen+1 {
					t.Errorf("generation %d -> %d, want one transaction", gen, g)
				}
			} else {
				if !errors.Is(err, nat.ErrUnknownState) || !errors.Is(err, unix.ENOBUFS) {
					t.Fatalf("commit whose errors overrun the buffer: %v, want an error wrapping nat.ErrUnknownState and ENOBUFS", err)
				}
				if g := generation(t, cfg.NetNS); g != gen {
					t.Errorf("generation %d -> %d, want the rejected batch to commit nothing", gen, g)
				}
			}
			// The connection was replaced (full buffers again) after the
			// unknown outcome; either way reading back works and shows
			// what the kernel holds.
			k, err := r.readKernel(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			st, _, _ := k.objects(logr.Discard())
			want := objs
			if tc.conflict {
				want = nil
			}
			if got := st.Objects(); !sameObjects(got, want) {
				t.Errorf("read back: %d objects, want %d", len(got), len(want))
			}
		})
	}
}

// TestSyncDiff: a Sync that changes a few of many objects sends only the
// difference, in one transaction; when the kernel's elements are not what
// the index says (hand edits), the kernel refuses the difference and the
// Sync rewrites every element instead, still as one committed transaction.
func TestSyncDiff(t *testing.T) {
	const n = 200
	base := manyFIPs(n, 36)
	next := append([]nat.Object(nil), base...)
	for i := 0; i < n; i += 20 { // 10 of 200 replaced
		o := next[i]
		f := *o.FIP
		f.InternalIP = netip.AddrFrom4([4]byte{11, 0, byte(i >> 8), byte(i)})
		o.UID, o.FIP = "d"+o.UID[1:], &f
		next[i] = o
	}
	gone, kept := base[0].FIP, base[1].FIP
	for _, tc := range []struct {
		name string
		edit string // nft script run before the Sync ("" none)
	}{
		{"clean", ""},
		{"element of a removed object deleted by hand", fmt.Sprintf("delete element inet natgw fip_snat { %s }", gone.InternalIP)},
		{"stray element on a key the sync adds", fmt.Sprintf("add element inet natgw fip_snat { %s : 192.0.2.1 }", next[0].FIP.InternalIP)},
		{"element of a kept object deleted by hand", fmt.Sprintf("delete element inet natgw fip_dnat { %s }", kept.EIP)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := gateway(t)
			dp := open(t, cfg, WithoutPlumbing())
			if err := dp.Sync(ctxT(t), base); err != nil {
				t.Fatal(err)
			}
			if tc.edit != "" {
				nftExec(t, cfg.NetNS, tc.edit+"\n")
			}
			gen := generation(t, cfg.NetNS)
			if err := dp.Sync(ctxT(t), next); err != nil {
				t.Fatal(err)
			}
			if g := generation(t, cfg.NetNS); g != gen+1 {
				t.Errorf("sync took %d committed transactions, want 1", g-gen)
			}
			k := kernelOf(t, cfg)
			st, _, consistent := k.objects(logr.Discard())
			if objs := st.Objects(); !sameObjects(objs, next) {
				t.Errorf("kernel holds %d objects, want the %d synced", len(objs), len(next))
			}
			// A hand edit the difference does not touch is left to Load.
			if want := tc.name != "element of a kept object deleted by hand"; consistent != want {
				t.Errorf("kernel consistent with its objects: %v, want %v", consistent, want)
			}
		})
	}
}

// TestLoadMirror: Load skips reading fip_snat (the mirror of fip_dnat)
// only while the ruleset generation is the one natgw's last transaction
// stored; any other commit in the namespace (another table, a hand edit of
// natgw's) makes it read and check everything.
func TestLoadMirror(t *testing.T) {
	cfg := gateway(t)
	dp := open(t, cfg)
	if err := dp.Apply(ctxT(t), goldenObjects()...); err != nil {
		t.Fatal(err)
	}
	r, err := NewBackend(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	check := func(what string, mirror, consistent bool) {
		t.Helper()
		k, err := r.readKernel(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if k.mirror != mirror {
			t.Errorf("%s: fip_snat taken as the mirror: %v, want %v", what, k.mirror, mirror)
		}
		st, _, ok := k.objects(logr.Discard())
		if ok != consistent {
			t.Errorf("%s: consistent %v, want %v", what, ok, consistent)
		}
		if objs := st.Objects(); consistent && !sameObjects(objs, goldenObjects()) {
			t.Errorf("%s: read %v, want the golden objects", what, objs)
		}
	}
	// Apply leaves the generation to Settle (Close settles).
	check("after an Apply, before Close", false, true)
	dp.Close()
	check("after natgw's last transaction and Close", true, true)
	nftExec(t, cfg.NetNS, "add table ip foreign\n")
	check("after another table was added", false, true)
	if _, _, err := r.Load(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	check("after Load's own transaction", true, true)
	nftExec(t, cfg.NetNS, "delete element inet natgw fip_snat { 198.51.100.10 }\n")
	check("after fip_snat was edited by hand", false, false)
}

// TestListing: after every transaction natgw sends (open, adds, QoS
// changes that need kbytes and mbytes units, a /32 and a /0 SNAT map,
// deletes, a full Sync), the kernel's `nft list table` equals the listing
// of the text rendering of every transaction sent so far.
func TestListing(t *testing.T) {
	cfg := gateway(t)
	r, err := NewBackend(cfg)
	if err != nil {
		t.Fatal(err)
	}
	model := nftconn.NewFake()
	var sent []string
	r.traceForTest = func(tx *nftconn.Tx) {
		sent = append(sent, tx.String())
		if err := model.Apply(context.Background(), tx); err != nil {
			t.Errorf("the model refuses transaction %d:\n%s\n%v", len(sent), tx, err)
		}
	}
	ctx := ctxT(t)
	e, err := engine.New(ctx, r, nil, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	check := func(step string) {
		t.Helper()
		got, want := canonical(normalize(table(t, cfg.NetNS))), canonical(normalize(model.Dump()))
		if got != want {
			t.Fatalf("%s: the kernel lists\n%s\nthe rendering of the %d transactions sent says\n%s\nlast transaction:\n%s", step, got, len(sent), want, sent[len(sent)-1])
		}
	}
	check("open")
	if err := e.Apply(ctx, goldenObjects()...); err != nil {
		t.Fatal(err)
	}
	check("golden objects")
	u := nattest.UID
	more := []nat.Object{
		nattest.EIPQoS(u(nat.KindEIP, 1), addr("192.0.2.10"), nat.QoS{IngressRateMbps: 128, EgressRateMbps: 8192, EgressBurstMbit: 1024}),
		nattest.EIP(u(nat.KindEIP, 9), addr("192.0.2.40")),
		nattest.SNAT(u(nat.KindSNAT, 7), addr("192.0.2.40"), prefix("203.0.113.7/32"), false),
		nattest.SNAT(u(nat.KindSNAT, 8), addr("192.0.2.40"), prefix("0.0.0.0/0"), true),
	}
	if err := e.Apply(ctx, more...); err != nil {
		t.Fatal(err)
	}
	check("QoS change and /32, /0 SNATs")
	if err := e.Delete(ctx, u(nat.KindEIP, 2), u(nat.KindSNAT, 2), u(nat.KindDNAT, 1)); err != nil {
		t.Fatal(err)
	}
	check("deletes")
	if err := e.Sync(ctx, goldenObjects()[3:6]); err != nil {
		t.Fatal(err)
	}
	check("sync")
	if err := r.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	check("settle")
}

// legacyTable is a table ip natgw as layout 3 left it (IPv4 only; a part
// of its sets and chains, with a FIP): what an agent upgraded to the inet
// layout finds.
const legacyTable = `add table ip natgw
add set ip natgw natgw_meta { type mark; }
add element ip natgw natgw_meta { 0x1 comment "natgw layout=3 boot=0123456789abcdef0123456789abcdef" }
add set ip natgw eips { type ipv4_addr; }
add map ip natgw fip_dnat { type ipv4_addr : ipv4_addr; }
add map ip natgw fip_snat { type ipv4_addr : ipv4_addr; }
add element ip natgw fip_dnat { 192.0.2.10 comment "u1" : 198.51.100.10 }
add element ip natgw fip_snat { 198.51.100.10 comment "u1" : 192.0.2.10 }
add chain ip natgw dstnat { type nat hook prerouting priority dstnat; }
add rule ip natgw dstnat dnat to ip daddr map @fip_dnat
add chain ip natgw srcnat { type nat hook postrouting priority srcnat; }
add rule ip natgw srcnat snat to ip saddr map @fip_snat
`

// TestUpgradeFromIPTable: an agent that finds table ip natgw (layouts 1-3)
// replaces it with a fresh table inet natgw in one transaction (ruleset
// generation +1; a new boot id, so the controller resyncs); a leftover ip
// table beside a usable inet one goes in the repair transaction of the next
// Load, which keeps the inet table's objects and boot id.
func TestUpgradeFromIPTable(t *testing.T) {
	lab := netlab.ForTest(t)
	ns, err := lab.NS("old")
	if err != nil {
		t.Fatal(err)
	}
	fresh := func() string {
		ns, err := lab.NS("fresh")
		if err != nil {
			t.Fatal(err)
		}
		d := open(t, nat.Config{NetNS: ns}, WithoutPlumbing())
		d.Close()
		return normalize(table(t, ns))
	}()
	hasIP := func() bool {
		out, err := netlab.Exec(context.Background(), ns, "", "nft", "list", "tables")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(out, "table ip natgw")
	}
	nftExec(t, ns, legacyTable)
	before := generation(t, ns)
	dp := open(t, nat.Config{NetNS: ns}, WithoutPlumbing())
	if g := generation(t, ns); g != before+1 {
		t.Errorf("the upgrade took %d transactions, want 1", g-before)
	}
	if hasIP() {
		t.Fatal("table ip natgw left after the upgrade")
	}
	if got := normalize(table(t, ns)); got != fresh {
		t.Errorf("table after the upgrade:\n%s\nwant a fresh one:\n%s", got, fresh)
	}
	if dp.BootID() == "" || dp.BootID() == "0123456789abcdef0123456789abcdef" {
		t.Errorf("boot id %q after the upgrade, want a new one", dp.BootID())
	}
	wantObjects(t, "after the upgrade", dp, nil)
	ctx := ctxT(t)
	objs := goldenObjects()
	if err := dp.Apply(ctx, objs...); err != nil {
		t.Fatal(err)
	}
	// An older agent recreated its table meanwhile: the next Load drops
	// it and keeps the inet table as it is.
	nftExec(t, ns, legacyTable)
	boot := dp.BootID()
	if err := dp.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if hasIP() {
		t.Fatal("table ip natgw left after a reload")
	}
	if dp.BootID() != boot {
		t.Errorf("boot id %q after the reload, want %q kept", dp.BootID(), boot)
	}
	wantObjects(t, "after the reload", dp, objs)
	dp.Close()
}

// TestDualStackOneTransaction: an operation that holds objects of both
// families (a dual-stack EIP with QoS, FIPs, a DNAT and SNATs of each
// family), its update, a delete of both families' FIPs and a Sync to a
// subset of both families are one kernel transaction each (table inet
// natgw holds both families' maps), and List gives back what was applied.
func TestDualStackOneTransaction(t *testing.T) {
	cfg := gateway(t)
	dp := open(t, cfg, WithoutPlumbing())
	a, p := netip.MustParseAddr, netip.MustParsePrefix
	dual := nat.Object{UID: "eip-dual", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.10"), PrefixLen: 24, V6Address: a("2001:db8:2::100"), V6PrefixLen: 64,
		QoS: &nat.QoS{IngressRateMbps: 10, EgressRateMbps: 20}}}
	fip := func(uid, eip, in string) nat.Object {
		return nat.Object{UID: uid, Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a(eip), InternalIP: a(in)}}
	}
	snat := func(uid, eip, cidr string, rf bool) nat.Object {
		return nat.Object{UID: uid, Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a(eip), InternalCIDR: p(cidr), RandomFully: rf}}
	}
	objs := []nat.Object{
		dual,
		fip("fip4", "192.0.2.10", "198.51.100.10"),
		fip("fip6", "2001:db8:2::100", "2001:db8:100::a"),
		{UID: "dnat6", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a("2001:db8:2::101"), Protocol: nat.TCP, ExternalPort: 2222, InternalIP: a("2001:db8:100::b"), InternalPort: 22}},
		snat("snat4", "192.0.2.11", "198.51.100.0/24", false),
		snat("snat6", "2001:db8:2::101", "2001:db8:100::/64", false),
		snat("snat6-long", "2001:db8:2::102", "2001:db8:100::8/126", true),
	}
	step := func(what string, op func() error, want []nat.Object) {
		t.Helper()
		gen := generation(t, cfg.NetNS)
		if err := op(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if g := generation(t, cfg.NetNS); g != gen+1 {
			t.Errorf("%s took %d transactions, want 1", what, g-gen)
		}
		if got := list(t, dp); !sameObjects(got, want) {
			t.Errorf("%s: List = %v, want %v", what, got, want)
		}
	}
	step("apply of both families", func() error { return dp.Apply(opCtx(t), objs...) }, objs)
	moved := fip("fip6", "2001:db8:2::100", "2001:db8:100::c")
	rf := snat("snat4", "192.0.2.11", "198.51.100.0/24", true)
	updated := slices.Clone(objs)
	updated[2], updated[4] = moved, rf
	step("update of both families", func() error { return dp.Apply(opCtx(t), moved, rf) }, updated)
	rest := slices.Concat(updated[:1], updated[3:])
	step("delete of both families' FIPs", func() error { return dp.Delete(opCtx(t), "fip4", "fip6") }, rest)
	subset := []nat.Object{rest[0], rest[2], rest[3]}
	step("sync to a subset of both families", func() error { return dp.Sync(opCtx(t), subset) }, subset)
}
