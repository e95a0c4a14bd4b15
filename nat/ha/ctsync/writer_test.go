package ctsync

import (
	"context"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat/netns"
)

var ap = netip.MustParseAddrPort

// TestWriterNAT writes entries with source and destination NAT bindings
// into an empty namespace and reads them back from the kernel: the reply
// tuples (the bindings) are the replicated ones; a second write updates,
// a delete removes, a delete of a missing entry is no error.
func TestWriterNAT(t *testing.T) {
	lab := netlab.ForTest(t)
	ctx := context.Background()
	ns, err := lab.NS("sb")
	if err != nil {
		t.Fatal(err)
	}
	n, err := netns.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	w, err := NewWriter(n)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const established, assured = 3, 1<<2 | 1<<1
	entries := []Entry{
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
	}
	// The DNAT entry exists already, made by someone else without
	// liberal tracking (as the kernel makes entries for traffic): the
	// upsert updates it.
	if _, err := netlab.Exec(ctx, ns, "", "conntrack", "-I", "-p", "tcp", "-s", "192.0.2.1", "-d", "192.0.2.11", "--sport", "50000", "--dport", "8080",
		"--state", "ESTABLISHED", "-u", "ASSURED,SEEN_REPLY", "-t", "100", "--dst-nat", "198.51.100.11:7001"); err != nil {
		t.Fatal(err)
	}
	if failed, err := w.Apply(ctx, entries); err != nil || failed != 0 {
		t.Fatalf("Apply: %d failed: %v", failed, err)
	}
	// Upserts of existing entries are updates.
	if failed, err := w.Apply(ctx, entries); err != nil || failed != 0 {
		t.Fatalf("Apply again: %d failed: %v", failed, err)
	}
	flows, err := netlab.ConntrackEntries(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, e := range entries {
		want[netlab.Flow{Proto: e.Proto, OrigSrc: e.OrigSrc, OrigDst: e.OrigDst, ReplySrc: e.ReplySrc, ReplyDst: e.ReplyDst, Mark: e.Mark}.String()] = true
	}
	for _, f := range flows {
		delete(want, f.String())
	}
	if len(want) != 0 {
		t.Fatalf("kernel lacks %v; has %v", want, flows)
	}
	// The kernel translates them: the NAT status bits are set (without
	// them packets would pass untranslated).
	c, err := ct.Dial(&netlink.Config{NetNS: n.Fd()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dumped, err := c.Dump(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range dumped {
		e := FromFlow(OpUpsert, &f)
		var want ct.Status
		if e.ReplySrc != e.OrigDst {
			want |= ct.StatusDstNAT
		}
		if e.ReplyDst != e.OrigSrc {
			want |= ct.StatusSrcNAT
		}
		if f.Status&ct.StatusNATMask != want {
			t.Errorf("%s: NAT status %#x, want %#x", e, f.Status&ct.StatusNATMask, want)
		}
		// Replicated TCP is tracked liberally in both directions (the
		// dump shows the flags in the high byte).
		if e.Proto == 6 && (e.FlagsOrig>>8&0x08 == 0 || e.FlagsReply>>8&0x08 == 0) {
			t.Errorf("%s: TCP flags %#04x/%#04x lack BE_LIBERAL", e, e.FlagsOrig, e.FlagsReply)
		}
	}
	del := []Entry{entries[0], entries[0]}
	del[0].Op, del[1].Op = OpDelete, OpDelete
	if failed, err := w.Apply(ctx, del); err != nil || failed != 0 {
		t.Fatalf("delete: %d failed: %v", failed, err)
	}
	flows, err = netlab.ConntrackEntries(ctx, ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(flows) != 2 {
		t.Fatalf("after delete: %d flows, want 2: %v", len(flows), flows)
	}
}

// TestEntryCodec round-trips entries through the wire encoding and refuses
// a bad op.
func TestEntryCodec(t *testing.T) {
	for _, e := range []Entry{
		{Op: OpUpsert, Proto: 6, OrigSrc: ap("1.2.3.4:5"), OrigDst: ap("6.7.8.9:10"), ReplySrc: ap("6.7.8.9:10"), ReplyDst: ap("11.12.13.14:15"), Status: 0x1be, Timeout: 432000, Mark: 7, TCPState: 3, WScaleOrig: 7, WScaleReply: 9, FlagsOrig: 0x2323, FlagsReply: 0x0a0a},
		{Op: OpDelete, Proto: 1, OrigSrc: ap("1.2.3.4:99"), OrigDst: ap("6.7.8.9:2048"), ReplySrc: ap("6.7.8.9:99"), ReplyDst: ap("1.2.3.4:0")},
	} {
		b := e.append(nil)
		if len(b) != entrySize {
			t.Fatalf("%s: %d bytes, want %d", e, len(b), entrySize)
		}
		got, err := decodeEntry(b)
		if err != nil || got != e {
			t.Fatalf("round trip of %s: %s, %v", e, got, err)
		}
	}
	b := Entry{Op: 9}.append(nil)
	if _, err := decodeEntry(b); err == nil {
		t.Fatal("op 9 decoded without error")
	}
	if _, err := decodeEntry(b[:10]); err == nil {
		t.Fatal("short entry decoded without error")
	}
}
