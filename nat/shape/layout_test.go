package shape

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/natgw/natgw/internal/golden"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

// layoutSteps are the EIP sets TestLayoutGolden and TestTableListed
// program in turn: two EIPs on an empty gateway, then one changed, one
// gone and one new (the table exists: maps and chain flushed and
// refilled), then none.
func layoutSteps() [][]EIP {
	a := netip.MustParseAddr
	return [][]EIP{
		{
			{Address: a("192.0.2.11"), Ingress: Limit{RateMbps: 10, BurstMB: 1}, Egress: Limit{RateMbps: 1.5, BurstMB: 0.5}},
			{Address: a("192.0.2.10"), Ingress: Limit{RateMbps: 100}},
		},
		{
			{Address: a("192.0.2.11"), Ingress: Limit{RateMbps: 20, BurstMB: 1}},
			{Address: a("192.0.2.12"), Egress: Limit{RateMbps: 1, BurstMB: 25}},
		},
		nil,
	}
}

// fakeSet does on c what Set does to the table, without the classes: read
// the maps, assign classes, apply tableTx. It returns the classes wanted.
func fakeSet(t *testing.T, c nftconn.Conn, cfg nat.Config, eips []EIP) []class {
	t.Helper()
	ctx := context.Background()
	cur, err := readMaps(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	want, err := assign(cur, eips)
	if err != nil {
		t.Fatal(err)
	}
	exists, err := nftconn.HasTable(ctx, c, table)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(ctx, tableTx(cfg, len(want) > 0, len(cur) > 0 || exists, want)); err != nil {
		t.Fatal(err)
	}
	return want
}

// TestLayoutGolden: the shaping table without a kernel, over
// nftconn.Fake: the transactions of layoutSteps and the table after each,
// compared with testdata/golden/shape.nft (go test -update rewrites it).
// After each step the maps read back as the classes written (minors kept
// by an EIP that keeps its direction).
func TestLayoutGolden(t *testing.T) {
	ctx := context.Background()
	cfg := nat.Config{}.WithDefaults()
	f := nftconn.NewFake()
	var dumps []string
	for i, eips := range layoutSteps() {
		want := fakeSet(t, f, cfg, eips)
		dumps = append(dumps, f.Dump())
		got, err := readMaps(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) || len(want) > 0 && !reflect.DeepEqual(sorted(got), sorted(want)) {
			t.Errorf("step %d: the maps read back as %+v, want %+v", i+1, got, want)
		}
	}
	var b strings.Builder
	for i, tx := range f.Applied {
		fmt.Fprintf(&b, "# transaction %d\n%s", i+1, tx)
	}
	for i, d := range dumps {
		fmt.Fprintf(&b, "\n# after step %d\n%s", i+1, d)
	}
	golden.Check(t, filepath.Join("testdata", "golden", "shape.nft"), b.String(), *update)
}

// sorted returns cs by direction, then address.
func sorted(cs []class) []class {
	out := slices.Clone(cs)
	slices.SortFunc(out, func(a, b class) int { return cmp.Or(cmp.Compare(a.dir, b.dir), a.eip.Compare(b.eip)) })
	return out
}

// TestTableListed: in a namespace (root; stub interfaces eth0 and net1),
// Set of each of layoutSteps: nft lists the maps' elements and the
// chain's rules as the rootless golden (TestLayoutGolden) has them, and
// Get reads the EIPs back; the last step leaves no table.
func TestTableListed(t *testing.T) {
	lab := netlab.ForTest(t)
	ns, err := lab.NS("gw")
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range []string{"eth0", "net1"} {
		if err := netlab.Stub(ns, dev); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	cfg := nat.Config{NetNS: ns}
	f := nftconn.NewFake()
	for i, eips := range layoutSteps() {
		if err := Set(t.Context(), cfg, eips); err != nil {
			t.Fatalf("step %d: %v", i+1, err)
		}
		fakeSet(t, f, cfg.WithDefaults(), eips)
		listing, err := netlab.NftTable(ctx, ns, "ip", table.Name)
		if len(eips) == 0 {
			if err == nil {
				t.Fatalf("step %d: table left:\n%s", i+1, listing)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if miss := f.NotListed(table, listing); miss != nil {
			t.Errorf("step %d: the kernel does not list %q as the golden layout has it:\n%s", i+1, miss, listing)
		}
		got, err := Get(t.Context(), cfg)
		if err != nil || len(got) != len(eips) {
			t.Fatalf("step %d: Get = %+v, %v; want %+v", i+1, got, err, eips)
		}
	}
}
