package planes

import (
	"context"
	"flag"
	"path/filepath"
	"testing"

	nft "github.com/google/nftables"

	"github.com/natgw/natgw/internal/golden"
	"github.com/natgw/natgw/nat/nftconn"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestRemoveGolden: the removal of the emptied nftables data plane without
// a kernel. A namespace holding table inet natgw, a layout 1-3 table ip
// natgw and tables that are not the data plane's (ip natgw_lbsvc, ip6
// natgw): one transaction deletes the first two, the others stay; with
// only inet natgw left it deletes that one; with none it is empty. The
// transactions and the tables after them are compared with
// testdata/golden/remove.nft (go test -update rewrites it).
func TestRemoveGolden(t *testing.T) {
	ctx := context.Background()
	f := nftconn.NewFake()
	setup := &nftconn.Tx{}
	for _, tb := range []nftconn.Table{
		{Family: nft.TableFamilyINet, Name: nftconn.MainTable},
		{Family: nft.TableFamilyIPv4, Name: nftconn.MainTable},
		{Family: nft.TableFamilyIPv4, Name: nftconn.LBSvcTable},
		{Family: nft.TableFamilyIPv6, Name: nftconn.MainTable},
	} {
		setup.AddTable(tb)
	}
	if err := f.Apply(ctx, setup); err != nil {
		t.Fatal(err)
	}
	got := ""
	for i, more := range []func(){
		func() {},
		func() { // a second start after a crash left only inet natgw
			tx := &nftconn.Tx{}
			tx.AddTable(nftTables[0])
			if err := f.Apply(ctx, tx); err != nil {
				t.Fatal(err)
			}
		},
		func() {}, // nothing left: an empty transaction
	} {
		more()
		tx, err := nftRemoveTx(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		if want := []int{2, 1, 0}[i]; tx.Len() != want {
			t.Errorf("removal %d: %d operations, want %d", i+1, tx.Len(), want)
		}
		if err := nftRemoveOn(ctx, f); err != nil {
			t.Fatalf("removal %d: %v", i+1, err)
		}
		got += "# removal " + string(rune('1'+i)) + "\n" + tx.String() + "# left\n" + f.Dump()
	}
	if present, err := nftHeld(ctx, f); err != nil || len(present) != 0 {
		t.Fatalf("after the removals the data plane still holds %v (%v)", present, err)
	}
	golden.Check(t, filepath.Join("testdata", "golden", "remove.nft"), got, *update)
}
