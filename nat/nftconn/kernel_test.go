package nftconn

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat/netns"
)

// TestNetlink runs the same transactions on the kernel (in a namespace the
// test makes; root needed) and on a Fake: rules read back in the same
// order with their tags, nft lists the Fake's texts, a flush, a delete by
// handle, a refused transaction changes nothing, and the table goes.
func TestNetlink(t *testing.T) {
	ns, name := labNS(t, "nftconn")
	ctx := context.Background()
	k, f := Open(ns), NewFake()
	masq := func(last byte) Rule {
		return Rule{
			Exprs: []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{10, 0, 0, last}},
				&expr.Masq{},
			},
			Text: "ip daddr 10.0.0." + string(rune('0'+last)) + " masquerade",
			Tag:  "m" + string(rune('0'+last)),
		}
	}
	tx := baseTx()
	tx.AppendRule(testTable, testChain, masq(2))
	tx.InsertRule(testTable, testChain, masq(1))
	tx.AppendRule(testTable, testChain, masq(3))
	both := func(what string, tx *Tx) {
		t.Helper()
		for _, c := range []Conn{k, f} {
			if err := c.Apply(ctx, tx); err != nil {
				t.Fatalf("%s on %T: %v", what, c, err)
			}
		}
	}
	both("build", tx)
	rk, err := k.Rules(ctx, testTable, testChain)
	if err != nil {
		t.Fatal(err)
	}
	if len(rk) != 3 || rk[0].Tag != "m1" || rk[1].Tag != "m2" || rk[2].Tag != "m3" {
		t.Fatalf("kernel rules: %+v, want m1 m2 m3", rk)
	}
	listing, err := netlab.NftTable(ctx, name, "ip", testTable.Name)
	if err != nil {
		t.Fatal(err)
	}
	if miss := f.NotListed(testTable, listing); miss != nil {
		t.Fatalf("nft does not list %q:\n%s", miss, listing)
	}
	bad := &Tx{}
	bad.AppendRule(testTable, testChain, masq(4))
	bad.DeleteRule(testTable, testChain, rk[2].Handle+1000, "")
	if err := k.Apply(ctx, bad); err == nil || !errors.Is(err, unix.ENOENT) {
		t.Fatalf("a delete of a missing rule: %v, want ENOENT", err)
	}
	del := &Tx{}
	del.DeleteRule(testTable, testChain, rk[1].Handle, "m2")
	if err := k.Apply(ctx, del); err != nil {
		t.Fatal(err)
	}
	if rk, err := k.Rules(ctx, testTable, testChain); err != nil || len(rk) != 2 || rk[0].Tag != "m1" || rk[1].Tag != "m3" {
		t.Fatalf("after the refused transaction and the delete of m2: %+v, %v", rk, err)
	}
	create := &Tx{}
	create.CreateTable(testTable)
	for _, c := range []Conn{k, f} {
		if err := c.Apply(ctx, create); !errors.Is(err, unix.EEXIST) {
			t.Fatalf("create of an existing table on %T: %v, want EEXIST", c, err)
		}
	}
	dropPlain := &Tx{}
	dropPlain.DeleteChain(testTable, "plain")
	both("delete chain plain", dropPlain)
	for _, c := range []Conn{k, f} {
		if err := c.Apply(ctx, dropPlain); !errors.Is(err, unix.ENOENT) {
			t.Fatalf("delete of a deleted chain on %T: %v, want ENOENT", c, err)
		}
	}
	flush := &Tx{}
	flush.FlushChain(testTable, testChain)
	flush.DeleteTable(testTable)
	if err := k.Apply(ctx, flush); err != nil {
		t.Fatal(err)
	}
	if ok, err := HasTable(ctx, k, testTable); err != nil || ok {
		t.Fatalf("table after its delete: %v, %v", ok, err)
	}
	if err := k.Apply(ctx, flush); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("a flush of a deleted table's chain: %v, want ENOENT", err)
	}
	recreate := &Tx{}
	recreate.CreateTable(testTable)
	recreate.DeleteTable(testTable)
	if err := k.Apply(ctx, recreate); err != nil {
		t.Fatalf("create of a table that does not exist: %v", err)
	}
}

// TestNetlinkMaps runs the same map transactions on the kernel (root
// needed) and on a Fake: a map added with its elements and a rule that
// looks it up in one transaction, elements read back with their values
// and comments, nft lists the Fake's element and rule texts, a key added
// again with another value is refused by both, a flush empties the map.
func TestNetlinkMaps(t *testing.T) {
	ns, name := labNS(t, "nftmaps")
	ctx := context.Background()
	k, f := Open(ns), NewFake()
	tx := baseTx()
	tx.AddMap(testTable, classMap)
	tx.AddElements(testTable, "m", el(1, 1, "a"), el(2, 2, "b"))
	prio := nft.ChainPriorityRef(200)
	tx.AddChain(testTable, Chain{Name: "prio", Type: nft.ChainTypeFilter, Hook: nft.ChainHookPostrouting, Priority: prio})
	tx.AppendRule(testTable, "prio", Rule{Text: "meta priority set ct mark map @m", Tag: "lookup", Exprs: []expr.Any{
		&expr.Ct{Key: expr.CtKeyMARK, Register: 1},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: "m"},
		&expr.Meta{Key: expr.MetaKeyPRIORITY, SourceRegister: true, Register: 1},
	}})
	for _, c := range []Conn{k, f} {
		if err := c.Apply(ctx, tx); err != nil {
			t.Fatalf("build on %T: %v", c, err)
		}
	}
	ek, err := k.MapElements(ctx, testTable, "m")
	if err != nil {
		t.Fatal(err)
	}
	ef, _ := f.MapElements(ctx, testTable, "m")
	if len(ek) != 2 || elemLines(ek) != elemLines(ef) {
		t.Fatalf("kernel elements %s, fake's %s", elemLines(ek), elemLines(ef))
	}
	listing, err := netlab.NftTable(ctx, name, "ip", testTable.Name)
	if err != nil {
		t.Fatal(err)
	}
	if miss := f.NotListed(testTable, listing); miss != nil {
		t.Fatalf("nft does not list %q:\n%s", miss, listing)
	}
	clash := &Tx{}
	clash.AddElements(testTable, "m", el(2, 3, "b"))
	for _, c := range []Conn{k, f} {
		if err := c.Apply(ctx, clash); err == nil {
			t.Errorf("%T: a key added again with another value: no error", c)
		}
	}
	flush := &Tx{}
	flush.FlushMap(testTable, "m")
	if err := k.Apply(ctx, flush); err != nil {
		t.Fatal(err)
	}
	if els, err := k.MapElements(ctx, testTable, "m"); err != nil || len(els) != 0 {
		t.Fatalf("kernel elements after a flush: %+v, %v", els, err)
	}
	if _, err := k.MapElements(ctx, testTable, "nope"); err == nil {
		t.Fatal("elements of a missing map: no error")
	}
}

// TestRulesOfMissingChain: listing the rules of a chain that is not there
// (or of a table that is not) is an error wrapping ENOENT on the kernel,
// over both connections, as on Fake; an empty chain that is there lists
// no rules and no error.
func TestRulesOfMissingChain(t *testing.T) {
	ns, name := labNS(t, "nftnochain")
	ctx := context.Background()
	l, err := DialLasting(ns, name, time.Minute, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f := NewFake()
	other := Table{Family: nft.TableFamilyIPv4, Name: "other"}
	tx := baseTx()
	tx.AddTable(other)
	tx.AddChain(other, Chain{Name: "elsewhere"})
	for _, c := range []Conn{Open(ns), l, f} {
		if err := c.Apply(ctx, tx); err != nil {
			t.Fatalf("build on %T: %v", c, err)
		}
		if refs, err := c.Rules(ctx, testTable, "plain"); err != nil || len(refs) != 0 {
			t.Errorf("rules of an empty chain on %T: %+v, %v; want none, no error", c, refs, err)
		}
		for _, miss := range []struct {
			t     Table
			chain ChainName
		}{
			{testTable, "nope"},
			{testTable, "elsewhere"}, // a chain of that name in another table
			{Table{Family: nft.TableFamilyIPv4, Name: "nope"}, "plain"},
			{Table{Family: nft.TableFamilyINet, Name: testTable.Name}, "plain"}, // another family
		} {
			if refs, err := c.Rules(ctx, miss.t, miss.chain); !errors.Is(err, unix.ENOENT) {
				t.Errorf("rules of %s %s on %T: %+v, %v; want ENOENT", miss.t, miss.chain, c, refs, err)
			}
		}
	}
}

// TestNetlinkLargeBatch: a transaction larger than a socket's default send
// buffer (Netlink.Apply raises it for the batch; the kernel refuses a
// message beyond it with EMSGSIZE) commits, all its elements read back.
func TestNetlinkLargeBatch(t *testing.T) {
	ns, _ := labNS(t, "nftlarge")
	ctx := context.Background()
	const n = 20_000
	els := make([]Element, n)
	for i := range els {
		els[i] = Element{Key: binary.NativeEndian.AppendUint32(nil, uint32(i+1)), Val: []byte{1, 0, 0x47, 0x4e}, Comment: fmt.Sprintf("element %05d", i)}
	}
	tx := baseTx()
	tx.AddMap(testTable, classMap)
	tx.AddElements(testTable, classMap.Name, els...)
	b := NewBatch(0, 0, nil)
	if err := tx.Encode(b); err != nil {
		t.Fatal(err)
	}
	if l := len(b.Bytes()); l <= 256<<10 {
		t.Fatalf("batch of %d bytes: not beyond a default send buffer; make the test larger", l)
	}
	k := Open(ns)
	if err := k.Apply(ctx, tx); err != nil {
		t.Fatalf("apply a %d-byte batch: %v", len(b.Bytes()), err)
	}
	got, err := k.MapElements(ctx, testTable, classMap.Name)
	if err != nil || len(got) != n {
		t.Fatalf("%d elements read back (%v), want %d", len(got), err, n)
	}
}

// TestNetlinkManyRules: a transaction of many rule adds commits through
// Netlink.Apply, whose socket has the system's receive buffer: the kernel
// answers each message with an ack only (natgw does not ask for the rule
// to be echoed back, which at thousands of rules overran that buffer,
// ENOBUFS, an outcome unknown), and every rule reads back.
func TestNetlinkManyRules(t *testing.T) {
	ns, _ := labNS(t, "nftrules")
	ctx := context.Background()
	const n = 5_000
	tx := baseTx()
	for i := range n {
		tx.AppendRule(testTable, testChain, Rule{Tag: fmt.Sprintf("rule-%05d", i), Exprs: []expr.Any{&expr.Masq{}}})
	}
	k := Open(ns)
	if err := k.Apply(ctx, tx); err != nil {
		t.Fatalf("apply %d rule adds: %v", n, err)
	}
	refs, err := k.Rules(ctx, testTable, testChain)
	if err != nil || len(refs) != n {
		t.Fatalf("%d rules read back (%v), want %d", len(refs), err, n)
	}
	if refs[0].Tag != "rule-00000" || refs[n-1].Tag != fmt.Sprintf("rule-%05d", n-1) {
		t.Fatalf("rules read back out of order: first %q, last %q", refs[0].Tag, refs[n-1].Tag)
	}
}

// TestLasting: a Lasting applies transactions and reads back over the
// sockets it keeps; a refused transaction changes nothing and the next
// one works (the sockets were redialed); after Close the next call dials
// again.
func TestLasting(t *testing.T) {
	ns, name := labNS(t, "nftlasting")
	ctx := context.Background()
	l, err := DialLasting(ns, name, time.Minute, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	masq := Rule{Exprs: []expr.Any{&expr.Masq{}}, Text: "masquerade", Tag: "m"}
	tx := baseTx()
	tx.AddMap(testTable, classMap)
	tx.AddElements(testTable, classMap.Name, el(1, 1, "a"))
	tx.AppendRule(testTable, testChain, masq)
	if err := l.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	sock := l.Socket()
	bad := &Tx{}
	bad.AppendRule(testTable, testChain, masq)
	bad.DeleteRule(testTable, testChain, 1<<40, "")
	if err := l.Apply(ctx, bad); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("a delete of a missing rule: %v, want ENOENT", err)
	}
	if l.Socket() == sock {
		t.Error("the socket was kept after a refused transaction, want a new one")
	}
	more := &Tx{}
	more.AddElements(testTable, classMap.Name, el(2, 2, "b"))
	if err := l.Apply(ctx, more); err != nil {
		t.Fatalf("after a refused transaction: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	rules, err := l.Rules(ctx, testTable, testChain)
	if err != nil || len(rules) != 1 || rules[0].Tag != "m" {
		t.Fatalf("rules after Close and a new dial: %+v (%v), want one tagged m", rules, err)
	}
	els, err := l.MapElements(ctx, testTable, classMap.Name)
	if err != nil || len(els) != 2 {
		t.Fatalf("elements: %+v (%v), want 2", els, err)
	}
	if ok, err := HasTable(ctx, l, testTable); err != nil || !ok {
		t.Fatalf("HasTable: %v (%v), want true", ok, err)
	}
}

// labNS makes a namespace for the test (root needed; netlab skips without)
// and opens it until the test ends; it returns the handle and the name.
func labNS(t testing.TB, prefix string) (*netns.NS, string) {
	t.Helper()
	name, err := netlab.ForTest(t).NS(prefix)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := netns.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns, name
}
