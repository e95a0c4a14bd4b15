package vpclb

import (
	"context"
	"flag"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/natgw/natgw/internal/golden"
	"github.com/natgw/natgw/nat/nftconn"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// layoutCIDRs are the masquerades both the golden test and the kernel
// test insert, in order.
var layoutCIDRs = []string{"10.96.0.0/12", "10.100.0.0/16", "10.96.0.5/32", "fd00:10:96::/112"}

// fakeTables inserts layoutCIDRs' masquerades into a Fake.
func fakeTables(t *testing.T) *nftconn.Fake {
	t.Helper()
	f := nftconn.NewFake()
	for _, cidr := range layoutCIDRs {
		if err := (Masquerade{Dst: netip.MustParsePrefix(cidr)}).InsertInto(context.Background(), f); err != nil {
			t.Fatalf("insert %s: %v", cidr, err)
		}
	}
	return f
}

// TestLayoutGolden: the vpc-lb tables' layout without a kernel: one
// insert's transaction and the tables after four inserts (the later
// masquerade first, as -I), compared with testdata/golden/vpclb.nft (go
// test -update rewrites it).
func TestLayoutGolden(t *testing.T) {
	f := fakeTables(t)
	got := "# insert 10.96.0.0/12\n" + f.Applied[0] + "\n# after inserting " + "10.96.0.0/12, 10.100.0.0/16, 10.96.0.5/32, fd00:10:96::/112\n" + f.Dump()
	golden.Check(t, filepath.Join("testdata", "golden", "vpclb.nft"), got, *update)
}
