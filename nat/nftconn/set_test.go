package nftconn

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	nft "github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/internal/netlab"
)

// The Sets, elements and limit objects of the tests below: a table inet
// laid out as the main table's (a plain mark set whose one element
// carries user data of its own, a concatenated map, a verdict map, a
// mark map, a limit object and rules with nft comments).
var (
	setTable = Table{Family: nft.TableFamilyINet, Name: "s"}
	metaSet  = Set{Name: "meta", Key: nft.TypeMark}
	addrSet  = Set{Name: "addrs", Key: nft.TypeIPAddr}
	portKey  = nft.MustConcatSetType(nft.TypeIPAddr, nft.TypeInetProto, nft.TypeInetService)
	portVal  = nft.MustConcatSetType(nft.TypeIPAddr, nft.TypeInetService)
	portMap  = Set{Name: "ports", Key: portKey, Data: portVal, Concat: true}
	vmap     = Set{Name: "vm", Key: nft.TypeIPAddr, Data: nft.TypeVerdict}
	markMap  = Set{Name: "mm", Key: nft.TypeIP6Addr, Data: nft.TypeMark}
	tempSet  = Set{Name: "temp", Key: nft.TypeIPAddr, Data: nft.TypeIPAddr}
	policer  = expr.Limit{Type: expr.LimitTypePktBytes, Rate: 128 << 10, Unit: expr.LimitTimeSecond, Burst: 3 << 10, Over: true}
)

// portElem is ports' element a:proto:port -> 198.51.100.x:80.
func portElem(a byte, proto byte, port uint16, comment string) nft.SetElement {
	k := append([]byte{192, 0, 2, a, proto, 0, 0, 0}, binary.BigEndian.AppendUint16(nil, port)...)
	k = append(k, 0, 0)
	v := append([]byte{198, 51, 100, a}, binary.BigEndian.AppendUint16(nil, 80)...)
	return nft.SetElement{Key: k, Val: append(v, 0, 0), Comment: comment}
}

// setsTx builds setTable with every kind of Set operation that adds.
func setsTx() *Tx {
	tx := &Tx{}
	tx.CreateTable(setTable)
	for _, s := range []Set{metaSet, addrSet, portMap, vmap, markMap, tempSet} {
		tx.AddSet(setTable, s)
	}
	tx.AddLimit(setTable, "pol", policer)
	tx.AddChain(setTable, Chain{Name: "pol"})
	tx.AppendRule(setTable, "pol", Rule{Text: `limit name "pol" drop`, Comment: "policer",
		Exprs: []expr.Any{&expr.Objref{Type: int(nft.ObjTypeLimit), Name: "pol"}, &expr.Verdict{Kind: expr.VerdictDrop}}})
	tx.AddChain(setTable, Chain{Name: "pre", Type: nft.ChainTypeFilter, Hook: nft.ChainHookPrerouting, Priority: nft.ChainPriorityFilter})
	tx.AppendRule(setTable, "pre", Rule{Text: "ip daddr vmap @vm", Comment: `a "quoted" comment`, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: string(vmap.Name), IsDestRegSet: true, DestRegister: 0},
	}})
	tx.AddSetElements(setTable, addrSet, []nft.SetElement{{Key: []byte{192, 0, 2, 1}, Comment: "one"}, {Key: []byte{192, 0, 2, 2}}}, false)
	tx.AddSetElements(setTable, portMap, []nft.SetElement{portElem(1, 6, 8080, "p1"), portElem(2, 17, 53, "")}, true)
	tx.AddSetElements(setTable, vmap, []nft.SetElement{{Key: []byte{192, 0, 2, 1}, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: "pol"}}}, false)
	tx.AddSetElements(setTable, markMap, []nft.SetElement{{Key: []byte{0x20, 0x01, 0x0d, 0xb8, 15: 1}, Val: binaryutil.NativeEndian.PutUint32(2)}}, false)
	tx.AddSetElements(setTable, tempSet, []nft.SetElement{{Key: []byte{10, 0, 0, 1}, Val: []byte{10, 0, 0, 2}}}, false)
	tx.FlushSet(setTable, metaSet)
	tx.AddElementUserData(setTable, metaSet, binaryutil.NativeEndian.PutUint32(1), "stamp", []byte{0xf0, 4, 0, 0, 0, 7}, "generation 7 in userdata")
	return tx
}

// TestSetText: every Set operation renders as nft writes it, elements one
// command each from their set's types.
func TestSetText(t *testing.T) {
	tx := setsTx()
	tx.DeleteSetElements(setTable, portMap, []nft.SetElement{portElem(2, 17, 53, "")})
	tx.DeleteSet(setTable, tempSet)
	tx.DeleteLimit(setTable, "pol")
	want := `create table inet s
add set inet s meta { type mark; }
add set inet s addrs { type ipv4_addr; }
add map inet s ports { type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service; }
add map inet s vm { type ipv4_addr : verdict; }
add map inet s mm { type ipv6_addr : mark; }
add map inet s temp { type ipv4_addr : ipv4_addr; }
add limit inet s pol { rate over 128 kbytes/second burst 3 kbytes; }
add chain inet s pol
add rule inet s pol limit name "pol" drop comment "policer"
add chain inet s pre { type filter hook prerouting priority filter; policy accept; }
add rule inet s pre ip daddr vmap @vm comment "a \"quoted\" comment"
add element inet s addrs { 192.0.2.1 comment "one" }
add element inet s addrs { 192.0.2.2 }
create element inet s ports { 192.0.2.1 . tcp . 8080 comment "p1" : 198.51.100.1 . 80 }
create element inet s ports { 192.0.2.2 . udp . 53 : 198.51.100.2 . 80 }
add element inet s vm { 192.0.2.1 : jump pol }
add element inet s mm { 2001:db8::1 : 0x02000000 }
add element inet s temp { 10.0.0.1 : 10.0.0.2 }
flush set inet s meta
add element inet s meta { 0x00000001 comment "stamp" } # generation 7 in userdata
delete element inet s ports { 192.0.2.2 . udp . 53 }
delete map inet s temp
delete limit inet s pol
`
	if got := tx.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	for _, tc := range []struct {
		l    expr.Limit
		want string
	}{
		{expr.Limit{Type: expr.LimitTypePktBytes, Rate: 15625 << 10, Unit: expr.LimitTimeSecond, Over: true}, "rate over 15625 kbytes/second"},
		{expr.Limit{Type: expr.LimitTypePktBytes, Rate: 1 << 20, Unit: expr.LimitTimeSecond, Burst: 1000}, "rate 1 mbytes/second burst 1000 bytes"},
		{expr.Limit{Type: expr.LimitTypePkts, Rate: 10, Unit: expr.LimitTimeMinute, Burst: 5}, "rate 10/minute burst 5 packets"},
	} {
		if got := LimitText(tc.l); got != tc.want {
			t.Errorf("LimitText(%+v) = %q, want %q", tc.l, got, tc.want)
		}
	}
}

// TestEncodeSetsMatchLibrary: the Set, limit and commented-rule operations
// encode to the messages google/nftables' Conn sends for them (set IDs
// zeroed on both sides). Elements are checked in the kernel
// (TestNetlinkSets): the library adds attributes natgw does not send.
func TestEncodeSetsMatchLibrary(t *testing.T) {
	tx := &Tx{}
	sets := []Set{metaSet, addrSet, portMap, vmap, markMap}
	for _, s := range sets {
		tx.AddSet(setTable, s)
	}
	tx.FlushSet(setTable, portMap)
	tx.DeleteSet(setTable, vmap)
	tx.AddLimit(setTable, "pol", policer)
	tx.DeleteLimit(setTable, "pol")
	rule := Rule{Comment: "policer", Exprs: []expr.Any{&expr.Objref{Type: int(nft.ObjTypeLimit), Name: "pol"}, &expr.Verdict{Kind: expr.VerdictDrop}}}
	tx.AppendRule(setTable, "pol", rule)
	ours := NewBatch(1, tx.SizeHint(), nil)
	if err := tx.Encode(ours); err != nil {
		t.Fatal(err)
	}
	theirs, err := LibraryMessages(func(lib *nft.Conn) error {
		tb := &nft.Table{Name: string(setTable.Name), Family: setTable.Family}
		for _, s := range sets {
			ls := &nft.Set{Table: tb, Name: string(s.Name), KeyType: s.Key, DataType: s.Data, IsMap: s.IsMap(),
				Concatenation: s.Concat, KeyByteOrder: binaryutil.BigEndian, ID: 1}
			if s.Key == nft.TypeMark {
				ls.KeyByteOrder = binaryutil.NativeEndian
			}
			if err := lib.AddSet(ls, nil); err != nil {
				return err
			}
		}
		lib.FlushSet(&nft.Set{Table: tb, Name: string(portMap.Name)})
		lib.DelSet(&nft.Set{Table: tb, Name: string(vmap.Name)})
		l := policer
		lib.AddObj(&nft.NamedObj{Table: tb, Name: "pol", Type: nft.ObjTypeLimit, Obj: &l})
		lib.DeleteObject(&nft.NamedObj{Table: tb, Name: "pol", Type: nft.ObjTypeLimit})
		lib.AddRule(&nft.Rule{Table: tb, Chain: &nft.Chain{Name: "pol", Table: tb}, Exprs: rule.Exprs,
			UserData: userdata.AppendString(nil, userdata.TypeComment, rule.Comment)})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	diffs, err := ours.DiffLibrary(theirs, func(m netlink.Message, _ bool) string { return WithoutSetID(m) })
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Error(d)
	}
	bad := &Tx{}
	bad.AppendRule(setTable, "pol", Rule{Tag: "t", Comment: "c"})
	if err := bad.Encode(NewBatch(1, 0, nil)); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("a rule with a tag and a comment: %v, want refused", err)
	}
}

// TestFakeSets: the Fake applies Set and limit operations all or nothing
// and refuses what the kernel refuses: a created key that is there
// (EEXIST), an added key with another value (EBUSY), a missing element,
// set or limit (ENOENT), a limit that exists.
func TestFakeSets(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	if err := f.Apply(ctx, setsTx()); err != nil {
		t.Fatal(err)
	}
	before := f.Dump()
	for _, tc := range []struct {
		name string
		tx   func(*Tx)
		want error
	}{
		{"create an existing key", func(tx *Tx) {
			tx.AddSetElements(setTable, portMap, []nft.SetElement{portElem(1, 6, 8080, "p1")}, true)
		}, unix.EEXIST},
		{"add a key with another value", func(tx *Tx) {
			tx.AddSetElements(setTable, vmap, []nft.SetElement{{Key: []byte{192, 0, 2, 1}, VerdictData: &expr.Verdict{Kind: expr.VerdictDrop}}}, false)
		}, unix.EBUSY},
		{"delete a missing key", func(tx *Tx) {
			tx.DeleteSetElements(setTable, addrSet, []nft.SetElement{{Key: []byte{192, 0, 2, 9}}})
		}, unix.ENOENT},
		{"flush a missing set", func(tx *Tx) { tx.FlushSet(setTable, Set{Name: "nope", Key: nft.TypeMark}) }, unix.ENOENT},
		{"delete a missing limit", func(tx *Tx) { tx.DeleteLimit(setTable, "nope") }, unix.ENOENT},
		{"add an existing limit", func(tx *Tx) { tx.AddLimit(setTable, "pol", policer) }, unix.EEXIST},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx := &Tx{}
			tx.DeleteSetElements(setTable, addrSet, []nft.SetElement{{Key: []byte{192, 0, 2, 2}}}) // undone
			tc.tx(tx)
			if err := f.Apply(ctx, tx); !errors.Is(err, tc.want) {
				t.Errorf("Apply: %v, want %v", err, tc.want)
			}
			if got := f.Dump(); got != before {
				t.Errorf("a refused transaction changed the fake:\n%s", got)
			}
		})
	}
	again := &Tx{}
	again.AddSetElements(setTable, addrSet, []nft.SetElement{{Key: []byte{192, 0, 2, 1}, Comment: "one"}}, false)
	again.DeleteSetElements(setTable, portMap, []nft.SetElement{portElem(2, 17, 53, "")})
	again.DeleteSet(setTable, tempSet)
	if err := f.Apply(ctx, again); err != nil {
		t.Fatalf("an existing key added again with its value, deletes: %v", err)
	}
	want := `table inet s {
	limit pol {
		rate over 128 kbytes/second burst 3 kbytes
	}

	set meta {
		type mark
		elements = { 0x00000001 comment "stamp" }
	}

	set addrs {
		type ipv4_addr
		elements = { 192.0.2.1 comment "one", 192.0.2.2 }
	}

	map ports {
		type ipv4_addr . inet_proto . inet_service : ipv4_addr . inet_service
		elements = { 192.0.2.1 . tcp . 8080 comment "p1" : 198.51.100.1 . 80 }
	}

	map vm {
		type ipv4_addr : verdict
		elements = { 192.0.2.1 : jump pol }
	}

	map mm {
		type ipv6_addr : mark
		elements = { 2001:db8::1 : 0x02000000 }
	}

	chain pol {
		limit name "pol" drop comment "policer"
	}

	chain pre {
		type filter hook prerouting priority filter; policy accept;
		ip daddr vmap @vm comment "a \"quoted\" comment"
	}
}
`
	if got := f.Dump(); got != want {
		t.Errorf("dump:\n%s\nwant:\n%s", got, want)
	}
}

// TestNetlinkSets runs the Set, element and limit operations on the kernel
// (in a namespace the test makes; root needed) and on a Fake: nft lists
// every limit, element and rule text of the Fake (the mark set's element
// with its comment, its own user data not shown), a created key that is
// there and a deleted key that is not are refused by both and change
// nothing, deletes of elements, a set and a limit take.
func TestNetlinkSets(t *testing.T) {
	ns, name := labNS(t, "nftsets")
	ctx := context.Background()
	k, f := Open(ns), NewFake()
	both := func(what string, tx *Tx, fail error) {
		t.Helper()
		for _, c := range []Conn{k, f} {
			if err := c.Apply(ctx, tx); !errors.Is(err, fail) {
				t.Fatalf("%s on %T: %v, want %v", what, c, err, fail)
			}
		}
	}
	listed := func(step string) string {
		t.Helper()
		listing, err := netlab.NftTable(ctx, name, "inet", setTable.Name)
		if err != nil {
			t.Fatal(err)
		}
		if miss := f.NotListed(setTable, listing); miss != nil {
			t.Fatalf("%s: nft does not list %q:\n%s", step, miss, listing)
		}
		return listing
	}
	both("build", setsTx(), nil)
	first := listed("build")
	if !strings.Contains(first, "map temp") || !strings.Contains(first, "limit pol") {
		t.Fatalf("the listing lacks the map temp or the limit:\n%s", first)
	}
	dup := &Tx{}
	dup.AddSetElements(setTable, addrSet, []nft.SetElement{{Key: []byte{192, 0, 2, 3}}}, false)
	dup.AddSetElements(setTable, portMap, []nft.SetElement{portElem(1, 6, 8080, "again")}, true)
	both("create of a key that is there", dup, unix.EEXIST)
	gone := &Tx{}
	gone.DeleteSetElements(setTable, addrSet, []nft.SetElement{{Key: []byte{192, 0, 2, 9}}})
	both("delete of a key that is not there", gone, unix.ENOENT)
	if again := listed("refused"); again != first {
		t.Fatalf("refused transactions changed the table:\n%s\nbefore:\n%s", again, first)
	}
	del := &Tx{}
	del.DeleteSetElements(setTable, portMap, []nft.SetElement{portElem(2, 17, 53, "")})
	del.DeleteSetElements(setTable, addrSet, []nft.SetElement{{Key: []byte{192, 0, 2, 2}}})
	del.DeleteSet(setTable, tempSet)
	del.FlushChain(setTable, "pol")
	del.DeleteLimit(setTable, "pol")
	del.FlushSet(setTable, metaSet)
	del.AddElementUserData(setTable, metaSet, binaryutil.NativeEndian.PutUint32(1), "stamp 2", []byte{0xf0, 4, 0, 0, 0, 8}, "generation 8")
	both("deletes", del, nil)
	last := listed("deletes")
	for _, gone := range []string{"192.0.2.2 ", "udp . 53", "map temp", "limit pol", `"stamp"`} {
		if strings.Contains(last, gone) {
			t.Errorf("after the deletes the listing still holds %q:\n%s", gone, last)
		}
	}
	if !strings.Contains(last, `0x00000001 comment "stamp 2"`) {
		t.Errorf("the replaced mark element is not listed:\n%s", last)
	}
	// The element's own user data is in the kernel after the comment
	// (MapElements reads a Set's elements too).
	els, err := k.MapElements(ctx, setTable, MapName(metaSet.Name))
	if err != nil || len(els) != 1 {
		t.Fatalf("meta elements: %+v (%v), want 1", els, err)
	}
	if got := fmt.Sprintf("%x", els[0].Comment); got != fmt.Sprintf("%x", "stamp 2") {
		t.Errorf("meta comment %q, want %q", els[0].Comment, "stamp 2")
	}
}
