package gwqos

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/natgw/natgw/internal/golden"
	"github.com/natgw/natgw/nat/nftconn"
)

// goldenRules are TestSetKernel's first rules: both directions, u32 and
// matchall, a priority tie, a policed rule with and without a burst.
func goldenRules() []Rule {
	return []Rule{
		{Direction: Egress, Iface: "net1", Priority: 3, Classifier: MatchAll, RateMbps: 16, BurstMB: 1},
		{Direction: Egress, Iface: "net1", Priority: 1, Classifier: U32, MatchDir: "dst", CIDR: pfx("192.0.2.1/32"), RateMbps: 1000, BurstMB: 10},
		{Direction: Ingress, Iface: "net1", Priority: 2, Classifier: U32, MatchDir: "dst", CIDR: pfx("192.0.2.0/24"), RateMbps: 12.5, BurstMB: 0.5},
		{Direction: Ingress, Iface: "net2", Priority: 2, Classifier: U32, MatchDir: "src", CIDR: pfx("10.0.0.0/8"), RateMbps: 8, BurstMB: 0},
		{Direction: Egress, Iface: "net1", Priority: 2, Classifier: U32, MatchDir: "src", CIDR: pfx("192.0.2.10/32"), RateMbps: 10, BurstMB: 1, Police: true},
		{Direction: Ingress, Iface: "net1", Priority: 4, Classifier: U32, MatchDir: "dst", CIDR: pfx("192.0.2.11/32"), RateMbps: 8.192, BurstMB: 0, Police: true},
	}
}

// fakeWrite does on f what Set (whole) or Apply does to the table, without
// the classes: read the table, merge changes, apply writeTx. It returns
// the entries written.
func fakeWrite(t *testing.T, f *nftconn.Fake, changes []Change, whole bool) []entry {
	t.Helper()
	ctx := context.Background()
	exists, err := nftconn.HasTable(ctx, f, table)
	if err != nil {
		t.Fatal(err)
	}
	var cur []entry
	if exists {
		if cur, _, err = readAll(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	next := merge(cur, changes, whole)
	tx, err := writeTx(exists, next)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	return next
}

func adds(rules []Rule) []Change {
	out := make([]Change, len(rules))
	for i, r := range rules {
		out[i] = Change{Add: true, Rule: r}
	}
	return out
}

// TestLayoutGolden: the gateway-wide QoS table without a kernel. Set of
// goldenRules, the compat path's Apply of an add and a delete on top, then
// Set of nothing: the transactions sent and the table after each, compared
// with testdata/golden/gwqos.nft (go test -update rewrites it). After each
// write the table reads back as the entries written (holds), and not as
// entries with one class changed.
func TestLayoutGolden(t *testing.T) {
	ctx := context.Background()
	f := nftconn.NewFake()
	rules := goldenRules()
	extra := Rule{Direction: Ingress, Iface: "net1", Priority: 9, Classifier: MatchAll, RateMbps: 1, BurstMB: 1}
	var dumps []string
	for i, step := range []struct {
		changes []Change
		whole   bool
	}{
		{adds(rules), true},
		{[]Change{{Add: true, Rule: extra}, {Rule: rules[1]}}, false},
		{nil, true},
	} {
		want := fakeWrite(t, f, step.changes, step.whole)
		dumps = append(dumps, f.Dump())
		if len(want) == 0 {
			if ok, err := nftconn.HasTable(ctx, f, table); err != nil || ok {
				t.Fatalf("write %d of nothing: table there %v (%v), want deleted", i+1, ok, err)
			}
			continue
		}
		sortEntries(want)
		if !holds(ctx, f, want) {
			t.Errorf("write %d: the table does not read back as the entries written:\n%s", i+1, f.Dump())
		}
		other := append([]entry(nil), want...)
		other[0].Minor++
		if holds(ctx, f, other) {
			t.Errorf("write %d: holds is true of entries with another class", i+1)
		}
	}
	golden.Check(t, filepath.Join("testdata", "golden", "gwqos.nft"), golden.Transcript(f.Applied, dumps, "write"), *update)
}

// TestWriteTxLimit: more rules than the mark numbers is refused before
// anything is sent.
func TestWriteTxLimit(t *testing.T) {
	entries := make([]entry, maxMarked+1)
	for i := range entries {
		entries[i] = entry{Rule: Rule{Direction: Egress, Iface: "net1", Classifier: MatchAll, RateMbps: 1}, Seq: uint64(i + 1)}
	}
	if tx, err := writeTx(false, entries); err == nil || !strings.Contains(err.Error(), fmt.Sprint(maxMarked)) {
		t.Fatalf("writeTx of %d entries = %v, %v; want an error naming the limit %d", len(entries), tx, err, maxMarked)
	}
	if tx, err := writeTx(false, nil); err != nil || tx.Len() != 0 {
		t.Fatalf("writeTx of nothing without a table = %v, %v; want an empty transaction", tx, err)
	}
}
