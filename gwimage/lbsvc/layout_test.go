package lbsvc

import (
	"context"
	"flag"
	"path/filepath"
	"strings"
	"testing"

	"github.com/natgw/natgw/internal/golden"
	"github.com/natgw/natgw/nat/nftconn"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func mustDNAT(t *testing.T, rule string) dnatSpec {
	t.Helper()
	d, err := parseDNATSpec(strings.Split(rule, ","))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// fakeDNAT does dnat-add's table steps for rule on f (no route): the DNAT,
// then the masquerade, each only when not there. It returns what was added.
func fakeDNAT(t *testing.T, f *nftconn.Fake, rule string) (dnat, masq bool) {
	t.Helper()
	ctx := context.Background()
	d := mustDNAT(t, rule)
	dnat, err := addDNAT(ctx, f, d)
	if err != nil {
		t.Fatal(err)
	}
	if dnat {
		if masq, err = addMasq(ctx, f, d.in); err != nil {
			t.Fatal(err)
		}
	}
	return dnat, masq
}

// TestLayoutGolden: the lb-svc table's layout without a kernel. Two
// dnat-add to one backend (TCP and UDP), the first repeated, then a
// dnat-del of the first and of one not there: the transactions sent and
// the table after them, compared with testdata/golden/lbsvc.nft (go test
// -update rewrites it). A repeated DNAT and a second masquerade to one
// backend add nothing.
func TestLayoutGolden(t *testing.T) {
	f := nftconn.NewFake()
	ctx := context.Background()
	for _, tc := range []struct {
		rule       string
		dnat, masq bool
	}{
		{"192.0.2.10,80,tcp,10.0.1.5,8080", true, true},
		{"192.0.2.10,80,tcp,10.0.1.5,8080", false, false},
		{"192.0.2.10,53,udp,10.0.1.5,5353", true, false},
	} {
		if dnat, masq := fakeDNAT(t, f, tc.rule); dnat != tc.dnat || masq != tc.masq {
			t.Errorf("dnat-add %s: added DNAT %v, masquerade %v; want %v, %v", tc.rule, dnat, masq, tc.dnat, tc.masq)
		}
	}
	added := f.Dump()
	for _, rule := range []string{"192.0.2.10,80,tcp,10.0.1.5,8080", "192.0.2.10,81,tcp,10.0.1.5,8080"} {
		if err := delDNAT(ctx, f, mustDNAT(t, rule)); err != nil {
			t.Fatalf("dnat-del %s: %v", rule, err)
		}
	}
	got := golden.Transcript(f.Applied, nil, "") + "\n# after the dnat-adds\n" + added + "\n# after the dnat-dels\n" + f.Dump()
	golden.Check(t, filepath.Join("testdata", "golden", "lbsvc.nft"), got, *update)
}
