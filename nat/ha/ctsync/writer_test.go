package ctsync

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat/netns"
)

var ap = netip.MustParseAddrPort

// natFamily is one address family's fixture of the ctsync kernel tests:
// NATed entries as a gateway of that family makes them (an SNAT with a
// chosen port, a TCP DNAT with another port, a UDP DNAT), and the
// conntrack(8) arguments that make the TCP DNAT's entry beforehand, as
// the kernel makes entries for traffic (without liberal tracking).
type natFamily struct {
	name    string
	entries []Entry
	preset  []string
}

const established, assured = 3, 1<<2 | 1<<1

var natFamilies = []natFamily{
	{
		name: "IPv4",
		entries: []Entry{
			{ // SNAT with a chosen port
				Op: OpUpsert, Proto: 6, OrigSrc: ap("198.51.100.11:40000"), OrigDst: ap("192.0.2.1:80"),
				ReplySrc: ap("192.0.2.1:80"), ReplyDst: ap("192.0.2.12:61001"),
				Status: assured | 1<<4 | 1<<3, Timeout: 300, Mark: 0xc000020c, TCPState: established,
			},
			{ // DNAT with another port
				Op: OpUpsert, Proto: 6, OrigSrc: ap("192.0.2.1:50000"), OrigDst: ap("192.0.2.11:8080"),
				ReplySrc: ap("198.51.100.11:7001"), ReplyDst: ap("192.0.2.1:50000"),
				Status: assured | 1<<5, Timeout: 300, Mark: 0xc000020b, TCPState: established,
			},
			{ // UDP DNAT
				Op: OpUpsert, Proto: 17, OrigSrc: ap("192.0.2.1:50001"), OrigDst: ap("192.0.2.11:5353"),
				ReplySrc: ap("198.51.100.11:7002"), ReplyDst: ap("192.0.2.1:50001"),
				Status: assured | 1<<5, Timeout: 120, Mark: 0xc000020b,
			},
		},
		preset: []string{"-p", "tcp", "-s", "192.0.2.1", "-d", "192.0.2.11", "--sport", "50000", "--dport", "8080",
			"--state", "ESTABLISHED", "-u", "ASSURED,SEEN_REPLY", "-t", "100", "--dst-nat", "198.51.100.11:7001"},
	},
	{
		// IPv6 entries carry no ct mark (nat/README.md, Conntrack).
		name: "IPv6",
		entries: []Entry{
			{ // SNAT with a chosen port
				Op: OpUpsert, Proto: 6, OrigSrc: ap("[2001:db8:100::11]:40000"), OrigDst: ap("[2001:db8:2::1]:80"),
				ReplySrc: ap("[2001:db8:2::1]:80"), ReplyDst: ap("[2001:db8:2::12]:61001"),
				Status: assured | 1<<4 | 1<<3, Timeout: 300, TCPState: established,
			},
			{ // DNAT with another port
				Op: OpUpsert, Proto: 6, OrigSrc: ap("[2001:db8:2::1]:50000"), OrigDst: ap("[2001:db8:2::11]:8080"),
				ReplySrc: ap("[2001:db8:100::11]:7001"), ReplyDst: ap("[2001:db8:2::1]:50000"),
				Status: assured | 1<<5, Timeout: 300, TCPState: established,
			},
			{ // UDP DNAT
				Op: OpUpsert, Proto: 17, OrigSrc: ap("[2001:db8:2::1]:50001"), OrigDst: ap("[2001:db8:2::11]:5353"),
				ReplySrc: ap("[2001:db8:100::11]:7002"), ReplyDst: ap("[2001:db8:2::1]:50001"),
				Status: assured | 1<<5, Timeout: 120,
			},
		},
		preset: []string{"-p", "tcp", "-s", "2001:db8:2::1", "-d", "2001:db8:2::11", "--sport", "50000", "--dport", "8080",
			"--state", "ESTABLISHED", "-u", "ASSURED,SEEN_REPLY", "-t", "100", "--dst-nat", "[2001:db8:100::11]:7001"},
	},
}

// TestWriterNAT writes entries with source and destination NAT bindings
// into an empty namespace and reads them back from the kernel, in each
// family: the reply tuples (the bindings) are the replicated ones and the
// kernel sets the NAT status; a second write updates, a delete removes, a
// delete of a missing entry is no error.
func TestWriterNAT(t *testing.T) {
	for _, fam := range natFamilies {
		t.Run(fam.name, func(t *testing.T) { testWriterNAT(t, fam) })
	}
}

// writerLab makes a namespace "sb" and a Writer into it, both closed at the
// test's end: the namespace's name (for conntrack(8)), the open namespace
// and the Writer.
func writerLab(t *testing.T) (string, *netns.NS, *Writer) {
	t.Helper()
	ns, err := netlab.ForTest(t).NS("sb")
	if err != nil {
		t.Fatal(err)
	}
	n, err := netns.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	w, err := NewWriter(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return ns, n, w
}

func testWriterNAT(t *testing.T, fam natFamily) {
	ctx := context.Background()
	ns, n, w := writerLab(t)
	entries := fam.entries
	// The DNAT entry exists already, made by someone else without
	// liberal tracking (as the kernel makes entries for traffic): the
	// upsert updates it.
	if _, err := netlab.Exec(ctx, ns, "", append([]string{"conntrack", "-I"}, fam.preset...)...); err != nil {
		t.Fatal(err)
	}
	if failed, err := w.Apply(ctx, entries); err != nil || failed != 0 {
		t.Fatalf("Apply: %d failed: %v", failed, err)
	}
	// Upserts of existing entries are updates.
	if failed, err := w.Apply(ctx, entries); err != nil || failed != 0 {
		t.Fatalf("Apply again: %d failed: %v", failed, err)
	}
	wantNATed(t, n, entries, nil)
	del := []Entry{entries[0], entries[0]}
	del[0].Op, del[1].Op = OpDelete, OpDelete
	if failed, err := w.Apply(ctx, del); err != nil || failed != 0 {
		t.Fatalf("delete: %d failed: %v", failed, err)
	}
	flows, err := netlab.ConntrackEntries(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) != 2 {
		t.Fatalf("after delete: %d flows, want 2: %v", len(flows), flows)
	}
}

// wantNATed checks that the conntrack table of ns holds every entry of
// entries (tuples and mark) and none of gone; that each entry of entries
// holds the NAT status its reply tuple implies (without it packets would
// pass untranslated) and, for TCP, liberal tracking both ways.
func wantNATed(t *testing.T, ns *netns.NS, entries, gone []Entry) {
	t.Helper()
	for _, p := range natProblems(t, ns, entries, gone) {
		t.Error(p)
	}
}

// natProblems returns what wantNATed finds wrong.
func natProblems(t *testing.T, ns *netns.NS, entries, gone []Entry) []string {
	t.Helper()
	dumped := dumpFlows(t, ns)
	var bad []string
	have := map[Key]Entry{}
	wanted := map[Key]bool{}
	for _, e := range entries {
		wanted[e.Key()] = true
	}
	for _, f := range dumped {
		e := FromFlow(OpUpsert, &f)
		have[e.Key()] = e
		if !wanted[e.Key()] {
			continue // not written by the test (the replication stream's own)
		}
		var want ct.Status
		if e.ReplySrc != e.OrigDst {
			want |= ct.StatusDstNAT
		}
		if e.ReplyDst != e.OrigSrc {
			want |= ct.StatusSrcNAT
		}
		if f.Status&ct.StatusNATMask != want {
			bad = append(bad, fmt.Sprintf("%s: NAT status %#x, want %#x", e, f.Status&ct.StatusNATMask, want))
		}
		// Replicated TCP is tracked liberally in both directions (the
		// dump shows the flags in the high byte).
		if e.Proto == 6 && (e.FlagsOrig>>8&0x08 == 0 || e.FlagsReply>>8&0x08 == 0) {
			bad = append(bad, fmt.Sprintf("%s: TCP flags %#04x/%#04x lack BE_LIBERAL", e, e.FlagsOrig, e.FlagsReply))
		}
	}
	for _, e := range entries {
		h, ok := have[e.Key()]
		if !ok || h.ReplySrc != e.ReplySrc || h.ReplyDst != e.ReplyDst || h.Mark != e.Mark {
			bad = append(bad, fmt.Sprintf("kernel lacks %s (has %v: %s)", e, ok, h))
		}
	}
	for _, e := range gone {
		if h, ok := have[e.Key()]; ok {
			bad = append(bad, fmt.Sprintf("kernel still has %s", h))
		}
	}
	return bad
}

// dumpFlows returns the conntrack entries of ns, both families.
func dumpFlows(t *testing.T, ns *netns.NS) []ct.Flow {
	t.Helper()
	c, err := ct.Dial(&netlink.Config{NetNS: ns.Fd()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadBuffer(64 << 20)
	flows, err := c.Dump(nil)
	if err != nil {
		t.Fatal(err)
	}
	return flows
}

// TestReplicateBothFamilies: the NATed entries of both families (SNAT,
// TCP and UDP DNAT) that the active's kernel holds are recreated in the
// standby's table with their NAT bindings and status: those there before
// the Sender starts through its full dump, those made afterwards through
// the kernel's events; deleting them on the active deletes them on the
// standby (through the delete events, and for the entries made before
// the Sender listened, which the kernel sends no destroy event for, at the
// next refresh dump: 300 ms here).
func TestReplicateBothFamilies(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := newRepLab(t, ctx)
	r.refresh = 300 * time.Millisecond
	var before, after []Entry
	for _, fam := range natFamilies {
		before = append(before, fam.entries[:1]...)
		after = append(after, fam.entries[1:]...)
	}
	all := append(slices.Clone(before), after...)
	if failed, err := r.w.Apply(ctx, before); err != nil || failed != 0 {
		t.Fatalf("entries on the active: %d failed: %v", failed, err)
	}
	r.startSender(ctx)
	defer r.stopSender()
	waitFor(t, "first sync", 5*time.Second, r.recv.Synced)
	if failed, err := r.w.Apply(ctx, after); err != nil || failed != 0 {
		t.Fatalf("entries on the active after the sync: %d failed: %v", failed, err)
	}
	waitNATed(t, r.sb, "standby after the dump and the events", all, nil)
	if st := r.sender.Stats(); st.DumpSent < int64(len(before)) || st.Sent-st.DumpSent < int64(len(after)) {
		t.Errorf("sender sent %d entries in dumps and %d from events, want at least the %d made before it started and the %d made after", st.DumpSent, st.Sent-st.DumpSent, len(before), len(after))
	}
	del := slices.Clone(all)
	for i := range del {
		del[i].Op = OpDelete
	}
	if failed, err := r.w.Apply(ctx, del); err != nil || failed != 0 {
		t.Fatalf("delete on the active: %d failed: %v", failed, err)
	}
	waitNATed(t, r.sb, "standby after the deletes", nil, all)
}

// waitNATed waits up to 5 s for wantNATed's checks to pass on ns.
func waitNATed(t *testing.T, ns *netns.NS, what string, entries, gone []Entry) {
	t.Helper()
	var bad []string
	deadline := time.Now().Add(5 * time.Second)
	for {
		if bad = natProblems(t, ns, entries, gone); len(bad) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s after 5 s: %v", what, bad)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEntryCodec round-trips entries of both families through the wire
// encoding (alone and in one frame) and refuses a bad op and short input.
func TestEntryCodec(t *testing.T) {
	var all []Entry
	for _, e := range []Entry{
		{Op: OpUpsert, Proto: 6, OrigSrc: ap("1.2.3.4:5"), OrigDst: ap("6.7.8.9:10"), ReplySrc: ap("6.7.8.9:10"), ReplyDst: ap("11.12.13.14:15"), Status: 0x1be, Timeout: 432000, Mark: 7, TCPState: 3, WScaleOrig: 7, WScaleReply: 9, FlagsOrig: 0x2323, FlagsReply: 0x0a0a},
		{Op: OpDelete, Proto: 1, OrigSrc: ap("1.2.3.4:99"), OrigDst: ap("6.7.8.9:2048"), ReplySrc: ap("6.7.8.9:99"), ReplyDst: ap("1.2.3.4:0")},
		{Op: OpUpsert, Proto: 6, OrigSrc: ap("[2001:db8::4]:5"), OrigDst: ap("[2001:db8::9]:10"), ReplySrc: ap("[fd00::9]:10"), ReplyDst: ap("[2001:db8::4]:5"), Status: 0x1be, Timeout: 432000, TCPState: 3, WScaleOrig: 7, WScaleReply: 9, FlagsOrig: 0x2323, FlagsReply: 0x0a0a},
		{Op: OpDelete, Proto: 58, OrigSrc: ap("[fd00::4]:99"), OrigDst: ap("[2001:db8::9]:32768"), ReplySrc: ap("[2001:db8::9]:99"), ReplyDst: ap("[2001:db8::13]:0")},
	} {
		b := e.append(nil)
		size := entrySize
		if e.v6() {
			size = entrySize6
		}
		if len(b) != size {
			t.Fatalf("%s: %d bytes, want %d", e, len(b), size)
		}
		got, n, err := decodeEntry(b)
		if err != nil || got != e || n != size {
			t.Fatalf("round trip of %s: %s (%d bytes), %v", e, got, n, err)
		}
		if _, _, err := decodeEntry(b[:size-1]); err == nil {
			t.Fatalf("%s: short by one byte, decoded without error", e)
		}
		all = append(all, e)
	}
	// One frame holds entries of both families.
	var w bytes.Buffer
	if _, err := writeFrame(&w, nil, frameEvents, 7, all); err != nil {
		t.Fatal(err)
	}
	typ, seq, got, err := readFrame(&w, make([]byte, maxFrame), nil)
	if err != nil || typ != frameEvents || seq != 7 || !slices.Equal(got, all) {
		t.Fatalf("frame round trip: type %d seq %d %v, %v; want %v", typ, seq, got, err, all)
	}
	b := Entry{Op: 9}.append(nil)
	if _, _, err := decodeEntry(b); err == nil {
		t.Fatal("op 9 decoded without error")
	}
	if _, _, err := decodeEntry(b[:10]); err == nil {
		t.Fatal("short entry decoded without error")
	}
}

// TestWriterReplacesStale: the standby's kernel holds an entry under the
// replicated entry's original tuple with another NAT binding and status bits
// (ASSURED, SEEN_REPLY) the replicated version lacks — a leftover of this
// replica's own time as the active, or a tuple reused since. The kernel
// refuses the update (EBUSY: those bits cannot be cleared, and NAT is set
// only at creation); the writer deletes the entry and creates the active's
// version, binding included. Before, the write failed and the standby kept
// the stale binding (the HA lab's "standby lacks N of M NATed entries").
func TestWriterReplacesStale(t *testing.T) {
	for _, tc := range []struct {
		name   string
		entry  Entry
		preset []string
	}{
		{"IPv4", Entry{
			Op: OpUpsert, Proto: 6, OrigSrc: ap("192.0.2.1:50000"), OrigDst: ap("192.0.2.11:8080"),
			ReplySrc: ap("198.51.100.11:7001"), ReplyDst: ap("192.0.2.1:50000"),
			Status: 1<<3 | 1<<5, Timeout: 120, Mark: 0xc000020b, TCPState: 1,
		}, []string{"-p", "tcp", "-s", "192.0.2.1", "-d", "192.0.2.11", "--sport", "50000", "--dport", "8080",
			"--state", "ESTABLISHED", "-u", "ASSURED,SEEN_REPLY", "-t", "100", "--dst-nat", "198.51.100.99:7001"}},
		{"IPv6", Entry{
			Op: OpUpsert, Proto: 6, OrigSrc: ap("[2001:db8:2::1]:50000"), OrigDst: ap("[2001:db8:2::11]:8080"),
			ReplySrc: ap("[2001:db8:100::11]:7001"), ReplyDst: ap("[2001:db8:2::1]:50000"),
			Status: 1<<3 | 1<<5, Timeout: 120, TCPState: 1,
		}, []string{"-p", "tcp", "-s", "2001:db8:2::1", "-d", "2001:db8:2::11", "--sport", "50000", "--dport", "8080",
			"--state", "ESTABLISHED", "-u", "ASSURED,SEEN_REPLY", "-t", "100", "--dst-nat", "[2001:db8:100::99]:7001"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			ns, n, w := writerLab(t)
			if _, err := netlab.Exec(ctx, ns, "", append([]string{"conntrack", "-I"}, tc.preset...)...); err != nil {
				t.Fatal(err)
			}
			if failed, err := w.Apply(ctx, []Entry{tc.entry}); err != nil || failed != 0 {
				t.Fatalf("Apply over a stale entry: %d failed: %v", failed, err)
			}
			wantNATed(t, n, []Entry{tc.entry}, nil)
		})
	}
}
