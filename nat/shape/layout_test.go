package shape

import (
	"cmp"
	"context"
	"net/netip"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	nft "github.com/google/nftables"

	"github.com/natgw/natgw/internal/golden"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

// layoutSteps are the EIP sets TestLayoutGolden and TestTableListed
// program in turn: two IPv4 EIPs and a dual-stack one on an empty gateway,
// then one changed, two gone and two new, one IPv6-only (the table exists:
// maps and chain flushed and refilled), then none.
func layoutSteps() [][]EIP {
	a := netip.MustParseAddr
	return [][]EIP{
		{
			{Address: a("192.0.2.11"), Ingress: Limit{RateMbps: 10, BurstMB: 1}, Egress: Limit{RateMbps: 1.5, BurstMB: 0.5}},
			{Address: a("192.0.2.10"), Ingress: Limit{RateMbps: 100}},
			{Address: a("192.0.2.14"), V6Address: a("2001:db8::14"), Mark6: 0x10002, Ingress: Limit{RateMbps: 30}, Egress: Limit{RateMbps: 30}},
		},
		{
			{Address: a("192.0.2.11"), Ingress: Limit{RateMbps: 20, BurstMB: 1}},
			{Address: a("192.0.2.12"), Egress: Limit{RateMbps: 1, BurstMB: 25}},
			{V6Address: a("2001:db8::15"), Mark6: 0x10003, Ingress: Limit{RateMbps: 40}, Egress: Limit{RateMbps: 50}},
		},
		nil,
	}
}

// fakeSet does on c what Set does to the table, without the classes: read
// the maps, assign classes, apply tableTx. It returns the classes wanted.
func fakeSet(t *testing.T, c nftconn.Conn, cfg nat.Config, eips []EIP) []class {
	t.Helper()
	ctx := context.Background()
	cur, there, err := readMaps(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	want, err := assign(cur, eips)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(ctx, tableTx(cfg, len(want) > 0, there, want)); err != nil {
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
		got, _, err := readMaps(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) || len(want) > 0 && !reflect.DeepEqual(sorted(got), sorted(want)) {
			t.Errorf("step %d: the maps read back as %+v, want %+v", i+1, got, want)
		}
	}
	golden.Check(t, filepath.Join("testdata", "golden", "shape.nft"), golden.Transcript(f.Applied, dumps, "step"), *update)
}

// listCounter is a Conn that counts the table listings it answers.
type listCounter struct {
	nftconn.Conn
	lists int
}

func (c *listCounter) Tables(ctx context.Context, f nft.TableFamily) ([]string, error) {
	c.lists++
	return c.Conn.Tables(ctx, f)
}

// TestReadMapsTables: the read before a change says which tables are there
// (what the change's transaction deletes or flushes) with one listing per
// family, for each of none, the inet table, the old family ip one, and
// both; the classes come from the inet table when it is there.
func TestReadMapsTables(t *testing.T) {
	ctx := context.Background()
	cfg := nat.Config{}.WithDefaults()
	eips := layoutSteps()[0]
	for _, there := range []tablesThere{{}, {inet: true}, {old: true}, {inet: true, old: true}} {
		f := nftconn.NewFake()
		var want []class
		if there.old {
			old, err := assign(nil, eips[:1])
			if err != nil {
				t.Fatal(err)
			}
			tx := &nftconn.Tx{}
			tx.AddTable(oldTable)
			for _, m := range []mapKind{mapIngress, mapEgress} {
				tx.AddMap(oldTable, m.spec())
				tx.AddElements(oldTable, m.spec().Name, elementsOf(m, old)...)
			}
			if err := f.Apply(ctx, tx); err != nil {
				t.Fatal(err)
			}
			want = old
		}
		if there.inet {
			inet, err := assign(nil, eips)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Apply(ctx, tableTx(cfg, true, tablesThere{}, inet)); err != nil {
				t.Fatal(err)
			}
			want = inet
		}
		c := &listCounter{Conn: f}
		got, gotThere, err := readMaps(ctx, c)
		if err != nil {
			t.Fatalf("%+v: %v", there, err)
		}
		if gotThere != there || c.lists != 2 {
			t.Errorf("%+v: readMaps says %+v after %d table listings, want 2", there, gotThere, c.lists)
		}
		if len(got) != len(want) || len(want) > 0 && !reflect.DeepEqual(sorted(got), sorted(want)) {
			t.Errorf("%+v: classes %+v, want %+v", there, got, want)
		}
	}
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
	ns := stubGateway(t)
	ctx := context.Background()
	cfg := nat.Config{NetNS: ns}
	f := nftconn.NewFake()
	for i, eips := range layoutSteps() {
		if err := Set(t.Context(), cfg, eips); err != nil {
			t.Fatalf("step %d: %v", i+1, err)
		}
		fakeSet(t, f, cfg.WithDefaults(), eips)
		listing, err := netlab.NftTable(ctx, ns, "inet", table.Name)
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

// stubGateway is a gateway namespace (root) with stub interfaces eth0
// and net1.
func stubGateway(t *testing.T) string {
	t.Helper()
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
	return ns
}

// TestUpgradeFromIPTable: a gateway whose shaping is in the family ip
// natgw_shape of layouts before IPv6 shaping (root; stub interfaces) reads
// back from it (Get), and the next Set leaves only the inet table, with
// the classes intact: same minors, same rates, nothing re-made.
func TestUpgradeFromIPTable(t *testing.T) {
	ns := stubGateway(t)
	ctx := t.Context()
	cfg := nat.Config{NetNS: ns}
	eips := layoutSteps()[1][:2] // IPv4 EIPs: what an old table held
	if err := Set(ctx, cfg, eips); err != nil {
		t.Fatal(err)
	}
	// Make the table the old one: the same maps' elements in table ip.
	var cur []class
	err := withKernel(ctx, cfg.WithDefaults(), func(k *kernel) error {
		var err error
		if cur, _, err = k.readMaps(); err != nil {
			return err
		}
		tx := &nftconn.Tx{}
		tx.DeleteTable(table)
		tx.AddTable(oldTable)
		for _, m := range []mapKind{mapIngress, mapEgress} {
			tx.AddMap(oldTable, m.spec())
			tx.AddElements(oldTable, m.spec().Name, elementsOf(m, cur)...)
		}
		tx.AddChain(oldTable, postChain)
		// The old egress rule had no meta nfproto (table ip): drop it.
		rs := rules(k.cfg)[:2]
		rs[1].Exprs = slices.Concat(rs[1].Exprs[:2], rs[1].Exprs[4:])
		for _, r := range rs {
			tx.AppendRule(oldTable, postChain.Name, r)
		}
		return k.conn.Apply(ctx, tx)
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := netlab.NftTable(ctx, ns, "ip", table.Name); err != nil {
		t.Fatalf("no old table made: %v", err)
	}
	if got, err := Get(ctx, cfg); err != nil || !reflect.DeepEqual(got, toEIPs(cur)) {
		t.Fatalf("Get from the old table = %+v, %v; want %+v", got, err, toEIPs(cur))
	}
	if err := Set(ctx, cfg, eips); err != nil {
		t.Fatal(err)
	}
	if listing, err := netlab.NftTable(ctx, ns, "ip", table.Name); err == nil {
		t.Errorf("the old table is left:\n%s", listing)
	}
	if _, err := netlab.NftTable(ctx, ns, "inet", table.Name); err != nil {
		t.Errorf("no inet table: %v", err)
	}
	err = withKernel(ctx, cfg.WithDefaults(), func(k *kernel) error {
		after, _, err := k.readMaps()
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(sorted(after), sorted(cur)) {
			t.Errorf("classes after the upgrade %+v, want %+v", after, cur)
		}
		held, err := k.heldClasses(after)
		if err != nil {
			return err
		}
		if len(held) != len(cur) {
			t.Errorf("the kernel holds %d of the %d classes with their rates", len(held), len(cur))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
