package nftconn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	nft "github.com/google/nftables"
	"golang.org/x/sys/unix"
)

var testTable = Table{Family: nft.TableFamilyIPv4, Name: "t"}

// testChain is testTable's NAT postrouting base chain.
const testChain ChainName = "post"

func baseTx() *Tx {
	tx := &Tx{}
	tx.AddTable(testTable)
	tx.AddChain(testTable, Chain{Name: testChain, Type: nft.ChainTypeNAT, Hook: nft.ChainHookPostrouting, Priority: nft.ChainPriorityNATSource})
	tx.AddChain(testTable, Chain{Name: "plain"})
	return tx
}

// TestFakeApply: the Fake applies a transaction all or nothing, refuses
// what the kernel refuses (ENOENT for a missing table, chain or rule),
// and its rules and tables read back in order.
func TestFakeApply(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	if err := f.Apply(ctx, baseTx()); err != nil {
		t.Fatal(err)
	}
	tx := &Tx{}
	tx.AppendRule(testTable, testChain, Rule{Text: "b", Tag: "tb"})
	tx.InsertRule(testTable, testChain, Rule{Text: "a", Tag: "ta"})
	if err := f.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	before := f.Dump()
	for name, bad := range map[string]struct {
		op   func(*Tx)
		want error
	}{
		"rule in a missing chain":   {func(tx *Tx) { tx.AppendRule(testTable, "nope", Rule{Text: "x"}) }, unix.ENOENT},
		"missing rule handle":       {func(tx *Tx) { tx.DeleteRule(testTable, testChain, 99, "") }, unix.ENOENT},
		"delete a missing table":    {func(tx *Tx) { tx.DeleteTable(Table{Family: nft.TableFamilyIPv6, Name: "t"}) }, unix.ENOENT},
		"chain in a missing table":  {func(tx *Tx) { tx.AddChain(Table{Family: nft.TableFamilyINet, Name: "t"}, Chain{Name: "c"}) }, unix.ENOENT},
		"delete a missing chain":    {func(tx *Tx) { tx.DeleteChain(testTable, "nope") }, unix.ENOENT},
		"create an existing table":  {func(tx *Tx) { tx.CreateTable(testTable) }, unix.EEXIST},
		"delete, then use, a chain": {func(tx *Tx) { tx.DeleteChain(testTable, "plain"); tx.FlushChain(testTable, "plain") }, unix.ENOENT},
	} {
		tx := &Tx{}
		tx.AppendRule(testTable, testChain, Rule{Text: "c"}) // valid, must not stay
		bad.op(tx)
		if err := f.Apply(ctx, tx); !errors.Is(err, bad.want) {
			t.Errorf("%s: %v, want %v", name, err, bad.want)
		}
		if got := f.Dump(); got != before {
			t.Errorf("%s: a refused transaction changed the table:\n%s", name, got)
		}
	}
	refs, err := f.Rules(ctx, testTable, testChain)
	if err != nil || len(refs) != 2 || refs[0].Tag != "ta" || refs[1].Tag != "tb" {
		t.Fatalf("rules: %+v, %v; want ta then tb", refs, err)
	}
	h, ok, err := FindRule(ctx, f, testTable, testChain, "tb")
	if err != nil || !ok || h != refs[1].Handle {
		t.Fatalf("FindRule tb: %d %v %v", h, ok, err)
	}
	del := &Tx{}
	del.DeleteRule(testTable, testChain, h, "tb")
	if err := f.Apply(ctx, del); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := FindRule(ctx, f, testTable, testChain, "tb"); ok {
		t.Fatal("tb still there after its delete")
	}
	for i, want := range []bool{true, false} {
		added, err := AddRuleOnce(ctx, f, testTable, testChain, Rule{Text: "once", Tag: "once"}, true)
		if err != nil || added != want {
			t.Fatalf("AddRuleOnce %d: added %v, %v; want %v", i+1, added, err, want)
		}
	}
	if refs, _ := f.Rules(ctx, testTable, testChain); len(refs) != 2 || refs[0].Tag != "once" {
		t.Fatalf("after AddRuleOnce (insert) twice: %+v, want once first, one copy", refs)
	}
	if _, err := AddRuleOnce(ctx, f, testTable, "nope", Rule{Tag: "x"}, false); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("AddRuleOnce on a missing chain: %v", err)
	}
	flush := &Tx{}
	flush.FlushChain(testTable, testChain)
	if err := f.Apply(ctx, flush); err != nil {
		t.Fatal(err)
	}
	if refs, err := f.Rules(ctx, testTable, testChain); err != nil || len(refs) != 0 {
		t.Fatalf("after a flush: %+v, %v", refs, err)
	}
	if names, _ := f.Tables(ctx, nft.TableFamilyIPv4); !slices.Equal(names, []string{"t"}) {
		t.Fatalf("tables: %v", names)
	}
	if ok, _ := HasTable(ctx, f, Table{Family: nft.TableFamilyIPv6, Name: "t"}); ok {
		t.Fatal("HasTable: ip6 t does not exist")
	}
}

// TestTextAndNotListed: a transaction's text and a dump name the table as
// nft does; NotListed finds a rule a listing lacks or holds in another
// order.
func TestTextAndNotListed(t *testing.T) {
	tx := baseTx()
	tx.AppendRule(testTable, testChain, Rule{Text: "ip daddr 10.0.0.1 masquerade", Tag: "m1"})
	tx.AppendRule(testTable, testChain, Rule{Text: "ip daddr 10.0.0.2 masquerade"})
	want := "add table ip t\n" +
		"add chain ip t post { type nat hook postrouting priority srcnat; policy accept; }\n" +
		"add chain ip t plain\n" +
		"add rule ip t post ip daddr 10.0.0.1 masquerade # \"m1\"\n" +
		"add rule ip t post ip daddr 10.0.0.2 masquerade\n"
	if got := tx.String(); got != want {
		t.Fatalf("text:\n%s\nwant:\n%s", got, want)
	}
	drop := &Tx{}
	drop.DeleteChain(testTable, "plain")
	drop.CreateTable(testTable)
	if got, want := drop.String(), "delete chain ip t plain\ncreate table ip t\n"; got != want {
		t.Fatalf("text:\n%s\nwant:\n%s", got, want)
	}
	f := NewFake()
	if err := f.Apply(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	listing := "table ip t {\n\tchain post {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n" +
		"\t\tip daddr 10.0.0.1 masquerade\n\t\tip daddr 10.0.0.2 masquerade\n\t}\n\n\tchain plain {\n\t}\n}\n"
	for _, tc := range []struct {
		name, listing string
		miss          int
	}{
		{"same", listing, 0},
		{"swapped", "table ip t {\n\tchain post {\n\t\tip daddr 10.0.0.2 masquerade\n\t\tip daddr 10.0.0.1 masquerade\n\t}\n\tchain plain {\n\t}\n}\n", 1},
		{"rule missing", "table ip t {\n\tchain post {\n\t\tip daddr 10.0.0.1 masquerade\n\t}\n\tchain plain {\n\t}\n}\n", 1},
		{"chain missing", "table ip t {\n\tchain post {\n\t\tip daddr 10.0.0.1 masquerade\n\t\tip daddr 10.0.0.2 masquerade\n\t}\n}\n", 1},
	} {
		if got := f.NotListed(testTable, tc.listing); len(got) != tc.miss {
			t.Errorf("%s: not listed %q, want %d", tc.name, got, tc.miss)
		}
	}
	if got := f.NotListed(Table{Family: nft.TableFamilyIPv6, Name: "t"}, listing); len(got) != 1 {
		t.Errorf("a table the fake lacks: %q", got)
	}
}

// classMap is a map of marks to classids, as nat/shape's.
var classMap = Map{Name: "m", KeyType: nft.TypeMark, DataType: nft.TypeClassID}

func el(key, val byte, comment string) Element {
	return Element{Key: []byte{key, 0, 0, 0}, Val: []byte{val, 0, 0x47, 0x4e}, Comment: comment,
		Text: fmt.Sprintf("0x%02x000000 comment %q : %x00:474e", key, comment, val)} // nft's byte order
}

// TestFakeMaps: a map's elements are added, read back and flushed; a key
// added again with its value is kept, with another value refused (EBUSY),
// a missing map refused (ENOENT), each changing nothing; the text and the
// dump show the map and its elements.
func TestFakeMaps(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	tx := baseTx()
	tx.AddMap(testTable, classMap)
	tx.AddElements(testTable, "m", el(1, 1, "a"), el(2, 2, "b"))
	tx.AddElements(testTable, "m") // nothing: no operation
	if err := f.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	wantText := "add map ip t m { type mark : classid; }\nadd element ip t m { 0x01000000 comment \"a\" : 100:474e, 0x02000000 comment \"b\" : 200:474e }\n"
	if got := tx.String(); !strings.HasSuffix(got, wantText) || tx.Len() != 5 {
		t.Fatalf("text (%d operations):\n%s\nwant it to end with:\n%s", tx.Len(), got, wantText)
	}
	if !strings.Contains(f.Dump(), "\tmap m {\n\t\ttype mark : classid\n\t\telements = { 0x01000000 comment \"a\" : 100:474e, 0x02000000 comment \"b\" : 200:474e }\n\t}\n\n\tchain post {") {
		t.Fatalf("dump:\n%s", f.Dump())
	}
	again := &Tx{}
	again.AddMap(testTable, classMap)
	again.AddElements(testTable, "m", el(2, 2, "b"))
	if err := f.Apply(ctx, again); err != nil {
		t.Fatalf("an element added again with its value: %v", err)
	}
	before := f.Dump()
	for name, tc := range map[string]struct {
		bad  func(*Tx)
		want error
	}{
		"key with another value":    {func(tx *Tx) { tx.AddElements(testTable, "m", el(2, 3, "b")) }, unix.EBUSY},
		"elements of a missing map": {func(tx *Tx) { tx.AddElements(testTable, "nope", el(3, 3, "c")) }, unix.ENOENT},
		"flush of a missing map":    {func(tx *Tx) { tx.FlushMap(testTable, "nope") }, unix.ENOENT},
		"map in a missing table":    {func(tx *Tx) { tx.AddMap(Table{Family: nft.TableFamilyINet, Name: "t"}, classMap) }, unix.ENOENT},
	} {
		tx := &Tx{}
		tx.AddElements(testTable, "m", el(9, 9, "z")) // valid, must not stay
		tc.bad(tx)
		if err := f.Apply(ctx, tx); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
		if got := f.Dump(); got != before {
			t.Errorf("%s: a refused transaction changed the table:\n%s", name, got)
		}
	}
	els, err := f.MapElements(ctx, testTable, "m")
	if err != nil || len(els) != 2 || els[1].Comment != "b" || !slices.Equal(els[0].Val, []byte{1, 0, 0x47, 0x4e}) {
		t.Fatalf("elements: %+v, %v", els, err)
	}
	flush := &Tx{}
	flush.FlushMap(testTable, "m")
	if err := f.Apply(ctx, flush); err != nil {
		t.Fatal(err)
	}
	if els, err := f.MapElements(ctx, testTable, "m"); err != nil || len(els) != 0 {
		t.Fatalf("after a flush: %+v, %v", els, err)
	}
	if _, err := f.MapElements(ctx, testTable, "nope"); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("elements of a missing map: %v, want ENOENT", err)
	}
}
