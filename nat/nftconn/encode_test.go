package nftconn

import (
	"fmt"
	"strings"
	"testing"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestEncodeMatchesLibrary: every operation of a Tx encodes to the
// message google/nftables' Conn sends for it (type, flags, attributes),
// set IDs aside (each side numbers its own; the lookup of a map added in
// the same transaction carries the map's ID on both). No kernel needed.
func TestEncodeMatchesLibrary(t *testing.T) {
	m := Map{Name: "m", KeyType: nft.TypeIPAddr, DataType: nft.TypeVerdict}
	lookup := Rule{
		Exprs: []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: string(m.Name)},
		},
		Tag: "look",
	}
	masq := Rule{Exprs: []expr.Any{&expr.Masq{}}}
	els := []Element{
		{Key: []byte{10, 0, 0, 1}, Val: []byte{0, 0, 0, 1}, Comment: "one"},
		{Key: []byte{10, 0, 0, 2}, Val: []byte{0, 0, 0, 1}},
	}
	tx := baseTx()
	tx.AddMap(testTable, m)
	tx.AppendRule(testTable, testChain, lookup)
	tx.InsertRule(testTable, testChain, masq)
	tx.DeleteRule(testTable, testChain, 7, "x")
	tx.FlushChain(testTable, testChain)
	tx.FlushMap(testTable, m.Name)
	tx.DeleteChain(testTable, "plain")
	tx.DeleteTable(testTable)
	tx.CreateTable(testTable)
	ours := NewBatch(1, 0, nil)
	if err := tx.Encode(ours); err != nil {
		t.Fatal(err)
	}

	theirs, err := LibraryMessages(func(lib *nft.Conn) error {
		tb := &nft.Table{Name: string(testTable.Name), Family: testTable.Family}
		post := &nft.Chain{Name: string(testChain), Table: tb}
		lib.AddTable(tb)
		lib.AddChain(&nft.Chain{Name: string(testChain), Table: tb, Type: nft.ChainTypeNAT, Hooknum: nft.ChainHookPostrouting, Priority: nft.ChainPriorityNATSource})
		lib.AddChain(&nft.Chain{Name: "plain", Table: tb})
		set := &nft.Set{Table: tb, Name: string(m.Name), IsMap: true, KeyType: m.KeyType, DataType: m.DataType, ID: 0xabcdef}
		if err := lib.AddSet(set, nil); err != nil {
			return err
		}
		le := *lookup.Exprs[1].(*expr.Lookup)
		le.SetID = set.ID
		lib.AddRule(&nft.Rule{Table: tb, Chain: post, Exprs: []expr.Any{lookup.Exprs[0], &le}, UserData: []byte(lookup.Tag)})
		lib.InsertRule(&nft.Rule{Table: tb, Chain: post, Exprs: masq.Exprs})
		if err := lib.DelRule(&nft.Rule{Table: tb, Chain: post, Handle: 7}); err != nil {
			return err
		}
		lib.FlushChain(post)
		lib.FlushSet(set)
		lib.DelChain(&nft.Chain{Name: "plain", Table: tb})
		lib.DelTable(tb)
		lib.CreateTable(tb)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := ours.Messages()
	if err != nil {
		t.Fatal(err)
	}
	ourID, theirID := setID(t, got), setID(t, theirs)
	diffs, err := ours.DiffLibrary(theirs, func(m netlink.Message, o bool) string {
		if o {
			return sameID(m.Data, ourID)
		}
		return sameID(m.Data, theirID)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Error(d)
	}
	if testing.Verbose() && len(diffs) == 0 {
		t.Logf("%d messages match", len(got))
	}

	// Elements (Batch.Elements, the fast path) are checked in the kernel
	// (TestNetlinkMaps): the library adds attributes natgw does not send.
	b := NewBatch(1, 0, nil)
	tx = &Tx{}
	tx.AddElements(testTable, m.Name, els...)
	if err := tx.Encode(b); err != nil || b.Len() != 1 {
		t.Fatalf("elements: %d messages (%v), want 1", b.Len(), err)
	}
}

// setID returns the NFTA_SET_ID of the one NEWSET message among ms.
func setID(t *testing.T, ms []netlink.Message) []byte {
	t.Helper()
	for _, m := range ms {
		if uint16(m.Header.Type)&0xff != unix.NFT_MSG_NEWSET {
			continue
		}
		attrs, err := netlink.UnmarshalAttributes(m.Data[4:])
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range attrs {
			if a.Type == unix.NFTA_SET_ID {
				return a.Data
			}
		}
	}
	t.Fatal("no NEWSET message with a set id")
	return nil
}

// sameID is data in hex with id replaced by a marker, so that two
// encodings that number their sets differently compare.
func sameID(data, id []byte) string {
	return strings.ReplaceAll(fmt.Sprintf("%x", data), fmt.Sprintf("%x", id), "<id....>")
}
