package vpclb

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	nft "github.com/google/nftables"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
)

// TestParse: the two init containers' forms are read; any other form, a
// CIDR with host bits, or a family mismatch is refused with the argument
// named.
func TestParse(t *testing.T) {
	for _, tc := range []struct {
		prog, args string
		want       string // "" accepted; else a substring of the error
	}{
		{"ip", "-4 route replace 10.96.0.0/12 via 10.0.0.1", ""},
		{"ip", "route replace 10.96.0.5 via 10.0.0.1", ""},
		{"ip", "-6 route replace fd00:10:96::/112 via fd00::1", ""},
		{"ip", "route add 10.96.0.0/12 via 10.0.0.1", "natgw serves only"},
		{"ip", "-4 route replace 10.96.0.0/12 via fd00::1", `gateway "fd00::1"`},
		{"ip", "-6 route replace 10.96.0.0/12 via 10.0.0.1", `gateway "10.0.0.1"`},
		{"ip", "route replace 10.96.0.1/12 via 10.0.0.1", "host bits set (want 10.96.0.0/12)"},
		{"ip", "route replace svc via 10.0.0.1", `destination "svc"`},
		{"iptables", "-t nat -I POSTROUTING -d 10.96.0.0/12 -j MASQUERADE", ""},
		{"ip6tables", "-t nat -I POSTROUTING -d fd00:10:96::/112 -j MASQUERADE", ""},
		{"iptables", "-t nat -A POSTROUTING -d 10.96.0.0/12 -j MASQUERADE", "natgw serves only `iptables"},
		{"iptables", "-t nat -I POSTROUTING -d fd00:10:96::/112 -j MASQUERADE", "not an IPv4 CIDR"},
		{"ip6tables", "-t nat -I POSTROUTING -d 10.96.0.0/12 -j MASQUERADE", "not an IPv6 CIDR"},
		{"iptables", "-t nat -I POSTROUTING -d 10.96.0.1/12 -j MASQUERADE", `-d "10.96.0.1/12": host bits set`},
	} {
		var err error
		if tc.prog == "ip" {
			_, err = ParseRoute(strings.Fields(tc.args))
		} else {
			_, err = ParseMasquerade(tc.prog, strings.Fields(tc.args))
		}
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s %s: %v, want %q", tc.prog, tc.args, err, tc.want)
		}
	}
}

// TestInsertAndReplace programs a masquerade of each family and a route in
// a namespace the test makes and reads them back from the kernel; a second
// masquerade is inserted first, as -I.
func TestInsertAndReplace(t *testing.T) {
	lab := netlab.ForTest(t)
	ns, err := lab.NS("lb")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlab.Stub(ns, "eth0", netip.MustParsePrefix("10.0.0.2/24"), netip.MustParsePrefix("fd00::2/64")); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, cidr := range layoutCIDRs {
		m := Masquerade{Dst: netip.MustParsePrefix(cidr)}
		if err := netns.Do(ns, m.Insert); err != nil {
			t.Fatalf("insert %s: %v", cidr, err)
		}
	}
	out, err := netlab.NftTable(ctx, ns, "ip", nftconn.VPCLBTable)
	if err != nil {
		t.Fatal(err)
	}
	second, first := strings.Index(out, "ip daddr 10.100.0.0/16 masquerade"), strings.Index(out, "ip daddr 10.96.0.0/12 masquerade")
	if first < 0 || second < 0 || second > first {
		t.Fatalf("ip table:\n%s\nwant both masquerades, the later one first", out)
	}
	out6, err := netlab.NftTable(ctx, ns, "ip6", nftconn.VPCLBTable)
	if err != nil || !strings.Contains(out6, "ip6 daddr fd00:10:96::/112 masquerade") {
		t.Fatalf("ip6 table: %q, %v", out6, err)
	}
	// The golden layout (TestLayoutGolden) says what the kernel lists.
	f := fakeTables(t)
	for fam, listing := range map[nft.TableFamily]string{nft.TableFamilyIPv4: out, nft.TableFamilyIPv6: out6} {
		if miss := f.NotListed(nftconn.Table{Family: fam, Name: nftconn.VPCLBTable}, listing); miss != nil {
			t.Errorf("the kernel does not list %q as the golden layout has it:\n%s", miss, listing)
		}
	}
	r := Route{Dst: netip.MustParsePrefix("10.96.0.0/12"), Via: netip.MustParseAddr("10.0.0.1")}
	if err := netns.Do(ns, r.Replace); err != nil {
		t.Fatal(err)
	}
	if out, err := netlab.Exec(ctx, ns, "", "ip", "-4", "route", "show", "10.96.0.0/12"); err != nil || !strings.Contains(out, "via 10.0.0.1 dev eth0") {
		t.Fatalf("route: %q, %v", out, err)
	}
}
