package nftables

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	nft "github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/mdlayher/netlink"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
	"github.com/natgw/natgw/nat/nftconn"
)

// goldenBoot is the boot id of the planned golden table.
const goldenBoot = "0123456789abcdef0123456789abcdef"

// TestPlanGolden: the transaction that creates the golden table, in nft
// syntax, is testdata/golden/plan.nft (no kernel needed; -update rewrites).
func TestPlanGolden(t *testing.T) {
	tx, err := Plan(nat.Config{}, goldenObjects(), goldenBoot)
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "plan.nft", normalize(tx.String()))
}

// TestPlanListing: the table the planned transaction makes, as nft would
// list it, is the kernel's listing in testdata/golden/table.nft (which
// TestGolden checks against the kernel, as root). Without root this ties
// the text rendering to what the kernel holds.
func TestPlanListing(t *testing.T) {
	tx, err := Plan(nat.Config{}, goldenObjects(), goldenBoot)
	if err != nil {
		t.Fatal(err)
	}
	m := nftconn.NewFake()
	if err := m.Apply(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	want := readGolden(t, "table.nft")
	if got := canonical(normalize(m.Dump())); got != canonical(want) {
		t.Errorf("the planned table, listed:\n%s\nthe kernel's (testdata/golden/table.nft):\n%s", got, canonical(want))
	}
}

// TestPlanRefuses: bad objects and configs are refused by field, before
// anything is planned.
func TestPlanRefuses(t *testing.T) {
	u := nattest.UID
	for _, tc := range []struct {
		name string
		cfg  nat.Config
		objs []nat.Object
		want string
	}{
		{"invalid object", nat.Config{}, []nat.Object{{UID: "x", Kind: nat.KindFIP}}, "fip"},
		{"conflict", nat.Config{}, []nat.Object{
			nattest.FIP(u(nat.KindFIP, 1), addr("192.0.2.10"), addr("198.51.100.10")),
			nattest.FIP(u(nat.KindFIP, 2), addr("192.0.2.10"), addr("198.51.100.11")),
		}, "192.0.2.10"},
		{"interface name", nat.Config{ExternalInterface: strings.Repeat("x", 16)}, nil, "interface name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Plan(tc.cfg, tc.objs, goldenBoot)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Plan: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// TestTxText renders every kind of operation (table-driven).
func TestTxText(t *testing.T) {
	k := qosKey{qosIn, addr("192.0.2.10")}
	for _, tc := range []struct {
		name string
		tx   func(*txPlan)
		want string
	}{
		{"delete table", (*txPlan).deleteTable, "delete table inet natgw\n"},
		{"delete legacy table", (*txPlan).deleteLegacyTable, "delete table ip natgw\n"},
		{"flush map", func(tx *txPlan) { tx.flushSet(setFIPDNAT) }, "flush map inet natgw fip_dnat\n"},
		{"flush set", func(tx *txPlan) { tx.flushSet(setEIPs) }, "flush set inet natgw eips\n"},
		{"delete snat map", func(tx *txPlan) { tx.deleteSet("snat_p24") }, "delete map inet natgw snat_p24\n"},
		{"flush chain", func(tx *txPlan) { tx.flushChain(k.name()) }, "flush chain inet natgw qos_in_192_0_2_10\n"},
		{"delete chain", func(tx *txPlan) { tx.deleteChain(k.name()) }, "delete chain inet natgw qos_in_192_0_2_10\n"},
		{"delete limit", func(tx *txPlan) { tx.deleteLimit(k.name()) }, "delete limit inet natgw qos_in_192_0_2_10\n"},
		{"limit in kbytes", func(tx *txPlan) { tx.addLimit(k, qosVal{rate: 128 * mbit, burst: 0}) },
			"add limit inet natgw qos_in_192_0_2_10 { rate over 15625 kbytes/second; }\n"},
		{"limit in mbytes", func(tx *txPlan) { tx.addLimit(k, qosVal{rate: 1 << 20, burst: 3 << 10}) },
			"add limit inet natgw qos_in_192_0_2_10 { rate over 1 mbytes/second burst 3 kbytes; }\n"},
		{"delete elements", func(tx *txPlan) {
			tx.deleteElements(setPortDNAT, []nft.SetElement{{Key: append(append(a4(addr("192.0.2.11")), 6, 0, 0, 0), port4(8080)...)}})
		}, "delete element inet natgw port_dnat { 192.0.2.11 . tcp . 8080 }\n"},
		{"exclusive add", func(tx *txPlan) {
			tx.addElements(setFIPDNAT, []nft.SetElement{{Key: a4(addr("192.0.2.10")), Val: a4(addr("198.51.100.10")), Comment: "u"}}, true)
		}, "create element inet natgw fip_dnat { 192.0.2.10 comment \"u\" : 198.51.100.10 }\n"},
		{"no elements", func(tx *txPlan) { tx.addElements(setEIPs, nil, false) }, ""},
		{"stamp", func(tx *txPlan) { tx.stamp("natgw layout=1 boot=b", 7, 0, 0) },
			"flush set inet natgw natgw_meta\nadd element inet natgw natgw_meta { 0x00000001 comment \"natgw layout=1 boot=b\" } # generation 7 in userdata\n"},
		{"stamp with snapshot", func(tx *txPlan) { tx.stamp("natgw layout=1 boot=b", 7, 0xab, 0xcd) },
			"flush set inet natgw natgw_meta\nadd element inet natgw natgw_meta { 0x00000001 comment \"natgw layout=1 boot=b\" } # generation 7, index snapshot 00000000000000ab in userdata\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tx txPlan
			tc.tx(&tx)
			if got := tx.tx.String(); got != tc.want {
				t.Errorf("got  %q\nwant %q", got, tc.want)
			}
		})
	}
}

// TestEncodeMatchesLibrary: the structural messages natgw encodes with
// public encoders are byte for byte the ones google/nftables' Conn sends
// for the same calls (recorded through the library's test dial, in this
// test only).
func TestEncodeMatchesLibrary(t *testing.T) {
	k := qosKey{qosOut, addr("192.0.2.11")}
	v := qosVal{rate: 20 * mbit, burst: 5 * mbit}
	snat := snatClass{bits: 28, randomFully: true}
	chains := fixedChains(nat.Config{}.WithDefaults())

	var tx txPlan
	tx.deleteTable()
	tx.createTable()
	for _, s := range append(slices.Clone(fixedSets), snat.spec()) {
		tx.addSet(s)
	}
	tx.flushSet(setEIPs)
	tx.deleteSet(snat.setName())
	for _, c := range chains {
		tx.addChain(c)
	}
	tx.addChain(chainSpec{name: k.name()})
	tx.flushChain(chainDNAT)
	tx.deleteChain(k.name())
	tx.addLimit(k, v)
	tx.deleteLimit(k.name())
	for _, c := range chains {
		for _, r := range c.rules {
			tx.addRule(c.name, r)
		}
	}
	tx.addRule(chainSNATCIDR, snatRule(snat))
	tx.addRule(chainSNATCIDR, snatRule(snatClass{bits: 32}))
	tx.addRule(k.name(), qosRule(k))
	ours := nftconn.NewBatch(1, tx.tx.SizeHint(), nil)
	if err := tx.tx.Encode(ours); err != nil {
		t.Fatal(err)
	}

	theirs, err := nftconn.LibraryMessages(func(lib *nft.Conn) error {
		table := &nft.Table{Name: tableName, Family: tableFamily}
		libSet := func(s setSpec) *nft.Set {
			ls := &nft.Set{Table: table, Name: s.name, KeyType: s.key, DataType: s.val, IsMap: s.isMap(),
				Concatenation: s.concat, KeyByteOrder: binaryutil.BigEndian, ID: 1}
			if s.key == nft.TypeMark {
				ls.KeyByteOrder = binaryutil.NativeEndian
			}
			return ls
		}
		lib.DelTable(table)
		lib.CreateTable(table)
		for _, s := range append(slices.Clone(fixedSets), snat.spec()) {
			if err := lib.AddSet(libSet(s), nil); err != nil {
				return err
			}
		}
		lib.FlushSet(&nft.Set{Table: table, Name: setEIPs})
		lib.DelSet(&nft.Set{Table: table, Name: snat.setName()})
		for _, c := range chains {
			lib.AddChain(&nft.Chain{Name: c.name, Table: table, Hooknum: c.hook, Priority: c.prio, Type: c.typ})
		}
		lib.AddChain(&nft.Chain{Name: k.name(), Table: table})
		lib.FlushChain(&nft.Chain{Name: chainDNAT, Table: table})
		lib.DelChain(&nft.Chain{Name: k.name(), Table: table})
		lib.AddObj(&nft.NamedObj{Table: table, Name: k.name(), Type: nft.ObjTypeLimit, Obj: limitExpr(v)})
		lib.DeleteObject(&nft.NamedObj{Table: table, Name: k.name(), Type: nft.ObjTypeLimit})
		addRule := func(chain string, r ruleSpec) {
			lib.AddRule(&nft.Rule{Table: table, Chain: &nft.Chain{Name: chain, Table: table}, Exprs: r.exprs,
				UserData: commentUserdata(r.comment)})
		}
		for _, c := range chains {
			for _, r := range c.rules {
				addRule(c.name, r)
			}
		}
		addRule(chainSNATCIDR, snatRule(snat))
		addRule(chainSNATCIDR, snatRule(snatClass{bits: 32}))
		addRule(k.name(), qosRule(k))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := ours.DiffLibrary(theirs, func(m netlink.Message, _ bool) string { return nftconn.WithoutSetID(m) })
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Error(d)
	}
}

func commentUserdata(s string) []byte {
	return append([]byte{0, byte(len(s) + 1)}, append([]byte(s), 0)...)
}

var elementsRE = regexp.MustCompile(`(?s)elements = \{ (.*?) \}\n`)

// canonical rewrites a table listing so that nft's line wrapping and
// element order do not matter: every element on its own line, sorted.
func canonical(s string) string {
	return elementsRE.ReplaceAllStringFunc(s, func(m string) string {
		body := elementsRE.FindStringSubmatch(m)[1]
		body = regexp.MustCompile(`,\n\s*`).ReplaceAllString(body, ", ")
		es := splitElements(body)
		slices.Sort(es)
		return "elements = {\n\t\t\t" + strings.Join(es, ",\n\t\t\t") + " }\n"
	})
}

// splitElements splits an element list at the commas outside quotes.
func splitElements(s string) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '"' && (i == 0 || s[i-1] != '\\'):
			quoted = !quoted
		case s[i] == ',' && !quoted:
			out = append(out, strings.TrimSpace(s[start:i]))
			start = i + 1
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

// TestCanonical: nft's wrapped element lists and ours compare equal.
func TestCanonical(t *testing.T) {
	nftOut := "\t\telements = { 1.1.1.2 comment \"a, b\", 1.1.1.1,\n\t\t\t     1.1.1.3 }\n"
	ours := "\t\telements = { 1.1.1.1, 1.1.1.2 comment \"a, b\", 1.1.1.3 }\n"
	if canonical(nftOut) != canonical(ours) {
		t.Errorf("%q != %q", canonical(nftOut), canonical(ours))
	}
	if canonical(ours) == canonical(strings.Replace(ours, "1.1.1.3", "1.1.1.4", 1)) {
		t.Error("canonical hides a changed element")
	}
}

func readGolden(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "golden", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
