package nftconn

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// TestReadsMatchLibrary: the reads of Netlink and Lasting (natgw's own
// dumps and decoder) equal google/nftables' reads of the same tables, in
// a namespace the test makes (root needed): the tables of several
// families, a chain with tagged rules, an untagged one and one with an
// nft comment, maps with comments (one with a concatenated key), and the
// same missing objects refused, with ENOENT.
func TestReadsMatchLibrary(t *testing.T) {
	ns, name := labNS(t, "nftreads")
	ctx := context.Background()
	l, err := DialLasting(ns, name, time.Minute, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lib, err := nft.New(nft.WithNetNSFd(ns.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	v6 := Table{Family: nft.TableFamilyIPv6, Name: "t6"}
	inet := Table{Family: nft.TableFamilyINet, Name: "ti"}
	inet2 := Table{Family: nft.TableFamilyINet, Name: "ti2"}
	concat, err := nft.ConcatSetType(nft.TypeIPAddr, nft.TypeInetService)
	if err != nil {
		t.Fatal(err)
	}
	tx := baseTx()
	tx.AddTable(v6)
	tx.AddTable(inet)
	tx.AddTable(inet2)
	for i := range 5 {
		tx.AppendRule(testTable, testChain, Rule{Exprs: []expr.Any{&expr.Masq{}}, Text: "masquerade", Tag: fmt.Sprintf("natgw tag %d", i)})
	}
	tx.AppendRule(testTable, testChain, Rule{Exprs: []expr.Any{&expr.Masq{}}, Text: "masquerade"})
	tx.AppendRule(testTable, testChain, Rule{Exprs: []expr.Any{&expr.Masq{}}, Text: "masquerade", Comment: "an nft comment"})
	tx.AddChain(inet, Chain{Name: "c"})
	tx.AppendRule(inet, "c", Rule{Exprs: []expr.Any{&expr.Counter{}}, Text: "counter", Tag: "inet"})
	tx.AddMap(inet, classMap)
	var els []Element
	for i := range 300 {
		els = append(els, Element{Key: []byte{byte(i), byte(i >> 8), 0, 0}, Val: []byte{byte(i), 0, 0x47, 0x4e}, Comment: fmt.Sprintf("natgw element %d", i)})
	}
	els = append(els, Element{Key: []byte{1, 0, 0, 0x42}, Val: []byte{1, 0, 0x47, 0x4e}}) // no comment
	tx.AddElements(inet, classMap.Name, els...)
	tx.AddMap(v6, Map{Name: "cc", KeyType: concat, DataType: nft.TypeClassID})
	tx.AddElements(v6, "cc",
		Element{Key: []byte{192, 0, 2, 1, 0x1f, 0x90, 0, 0}, Val: []byte{1, 0, 0x47, 0x4e}, Comment: "192.0.2.1 . 8080"},
		Element{Key: []byte{192, 0, 2, 2, 0, 0x50, 0, 0}, Val: []byte{2, 0, 0x47, 0x4e}, Comment: "192.0.2.2 . 80"})
	if err := l.Apply(ctx, tx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []Conn{Open(ns), l} {
		for _, f := range []nft.TableFamily{nft.TableFamilyIPv4, nft.TableFamilyIPv6, nft.TableFamilyINet, nft.TableFamilyBridge} {
			got, err := c.Tables(ctx, f)
			want, werr := libTables(lib, f)
			if err != nil || werr != nil || !slices.Equal(sorted(got), sorted(want)) {
				t.Errorf("%T: %s tables %q (%v), library %q (%v)", c, FamilyName(f), got, err, want, werr)
			}
		}
		for _, ch := range []struct {
			t     Table
			chain ChainName
			n     int
		}{{testTable, testChain, 7}, {testTable, "plain", 0}, {inet, "c", 1}} {
			got, err := c.Rules(ctx, ch.t, ch.chain)
			want, werr := libRules(lib, ch.t, ch.chain)
			if err != nil || werr != nil || len(got) != ch.n || !slices.Equal(got, want) {
				t.Errorf("%T: rules of %s %s %+v (%v), library %+v (%v); want %d", c, ch.t, ch.chain, got, err, want, werr, ch.n)
			}
		}
		for _, m := range []struct {
			t    Table
			name MapName
			n    int
		}{{inet, classMap.Name, len(els)}, {v6, "cc", 2}} {
			got, err := c.MapElements(ctx, m.t, m.name)
			want, werr := libMapElements(lib, m.t, m.name)
			if err != nil || werr != nil || len(got) != m.n || elemLines(got) != elemLines(want) {
				t.Errorf("%T: elements of %s %s: %d (%v), library %d (%v), want %d:\n%s\nlibrary:\n%s", c, m.t, m.name, len(got), err, len(want), werr, m.n, elemLines(got), elemLines(want))
			}
		}
		if got, want := elemLines(mustElements(t, c, v6, "cc")), elemLines([]Element{
			{Key: []byte{192, 0, 2, 1, 0x1f, 0x90, 0, 0}, Val: []byte{1, 0, 0x47, 0x4e}, Comment: "192.0.2.1 . 8080"},
			{Key: []byte{192, 0, 2, 2, 0, 0x50, 0, 0}, Val: []byte{2, 0, 0x47, 0x4e}, Comment: "192.0.2.2 . 80"},
		}); got != want {
			t.Errorf("%T: concatenated keys %s, want %s", c, got, want)
		}
		for _, miss := range []struct {
			t    Table
			name string
		}{{inet, "nope"}, {inet2, string(classMap.Name)}, {Table{Family: nft.TableFamilyIPv4, Name: "ti"}, string(classMap.Name)}} {
			if _, err := c.MapElements(ctx, miss.t, MapName(miss.name)); !errors.Is(err, unix.ENOENT) {
				t.Errorf("%T: elements of the missing map %s %s: %v, want ENOENT", c, miss.t, miss.name, err)
			}
			if _, err := libMapElements(lib, miss.t, MapName(miss.name)); err == nil {
				t.Errorf("library: elements of the missing map %s %s: no error", miss.t, miss.name)
			}
			if _, err := c.Rules(ctx, miss.t, ChainName(miss.name)); !errors.Is(err, unix.ENOENT) {
				t.Errorf("%T: rules of the missing chain %s %s: %v, want ENOENT", c, miss.t, miss.name, err)
			}
		}
	}
	// After the missing objects, Lasting still reads over the same socket.
	sock := l.Socket()
	if _, err := l.Rules(ctx, testTable, testChain); err != nil || l.Socket() != sock {
		t.Errorf("Lasting after ENOENT answers: %v, socket kept %v", err, l.Socket() == sock)
	}
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

// mustElements returns the elements of map name in t read over c.
func mustElements(t *testing.T, c Conn, tb Table, name MapName) []Element {
	t.Helper()
	els, err := c.MapElements(context.Background(), tb, name)
	if err != nil {
		t.Fatal(err)
	}
	return els
}

// elemLines renders elements one per line, sorted (the kernel has its
// own order).
func elemLines(els []Element) string {
	var lines []string
	for _, e := range els {
		lines = append(lines, fmt.Sprintf("%x : %x %q", e.Key, e.Val, e.Comment))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// The reference reads: google/nftables' connection, as nftconn read before
// its own decoder (this test is the only place it is still used).

func libTables(c *nft.Conn, f nft.TableFamily) ([]string, error) {
	tables, err := c.ListTablesOfFamily(f)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, t := range tables {
		names = append(names, t.Name)
	}
	return names, nil
}

func libRules(c *nft.Conn, t Table, chain ChainName) ([]RuleRef, error) {
	tb := &nft.Table{Name: string(t.Name), Family: t.Family}
	rules, err := c.GetRules(tb, &nft.Chain{Name: string(chain), Table: tb})
	if err != nil {
		return nil, err
	}
	refs := []RuleRef{}
	for _, r := range rules {
		refs = append(refs, RuleRef{Handle: r.Handle, Tag: string(r.UserData)})
	}
	return refs, nil
}

func libMapElements(c *nft.Conn, t Table, name MapName) ([]Element, error) {
	s, err := c.GetSetByName(&nft.Table{Name: string(t.Name), Family: t.Family}, string(name))
	if err != nil {
		return nil, err
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		return nil, err
	}
	var out []Element
	for _, e := range els {
		out = append(out, Element{Key: e.Key, Val: e.Val, Comment: e.Comment})
	}
	return out, nil
}
