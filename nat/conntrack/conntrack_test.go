package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/netns"
)

// testNS creates a throw-away named namespace for the test.
func testNS(t *testing.T) *netns.NS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace and writes conntrack entries")
	}
	name := fmt.Sprintf("ngw-ct-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	ns, err := netns.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func addFlow(t *testing.T, c *Cleaner, src, dst string, sport uint16, mark uint32) {
	t.Helper()
	f := ct.NewFlow(17, 0, netip.MustParseAddr(src), netip.MustParseAddr(dst), sport, 53, 120, mark)
	if err := c.conn.Create(f); err != nil {
		t.Fatalf("create flow %s->%s: %v", src, dst, err)
	}
}

// TestFlushMarkAndDeleteByAddr: in each family, FlushMark deletes the
// entries of its mark and family only (an entry of the other family with
// the same mark stays), and DeleteByAddr the entries of its addresses.
func TestFlushMarkAndDeleteByAddr(t *testing.T) {
	ns := testNS(t)
	c, err := Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const id6a, id6b = 0x00010001, 0x00010002 // IPv6 EIPs' mark ids
	for _, tc := range []struct {
		name                     string
		family, other            uint8
		client, eipA, eipB, peer string
		markA, markB             uint32
		otherClient, otherDst    string // an entry of the other family carrying markA
	}{
		{"IPv4", unix.AF_INET, unix.AF_INET6, "192.0.2.1", "192.0.2.10", "192.0.2.11", "198.51.100.10",
			MarkOf(netip.MustParseAddr("192.0.2.10")), MarkOf(netip.MustParseAddr("192.0.2.11")), "2001:db8::1", "2001:db8::99"},
		{"IPv6", unix.AF_INET6, unix.AF_INET, "2001:db8::1", "2001:db8::10", "2001:db8::11", "2001:db8:100::10",
			id6a, id6b, "192.0.2.1", "192.0.2.99"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eipA, eipB, peer := netip.MustParseAddr(tc.eipA), netip.MustParseAddr(tc.eipB), netip.MustParseAddr(tc.peer)
			other := netip.MustParseAddr(tc.otherDst)
			addFlow(t, c, tc.client, tc.eipA, 1000, tc.markA)
			addFlow(t, c, tc.client, tc.eipA, 1001, tc.markA)
			addFlow(t, c, tc.client, tc.eipB, 1000, tc.markB)
			addFlow(t, c, tc.peer, tc.client, 1000, 0)
			addFlow(t, c, tc.otherClient, tc.otherDst, 1000, tc.markA)
			count := func(a ...netip.Addr) int {
				t.Helper()
				n, err := c.Count(a)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			if n := count(eipA); n != 2 {
				t.Fatalf("flows of %s before flush = %d, want 2", eipA, n)
			}
			if err := c.FlushMark(context.Background(), tc.family, tc.markA, 0xffffffff); err != nil {
				t.Fatal(err)
			}
			if n := count(eipA); n != 0 {
				t.Fatalf("flows of %s after FlushMark = %d, want 0", eipA, n)
			}
			if n := count(eipB); n != 1 {
				t.Fatalf("flows of %s after flushing another mark = %d, want 1", eipB, n)
			}
			if n := count(other); n != 1 {
				t.Fatalf("flows of %s (family %d, the same mark) after FlushMark of family %d = %d, want 1", other, tc.other, tc.family, n)
			}
			n, err := c.DeleteByAddr([]netip.Addr{eipB, peer, other})
			if err != nil || n != 3 {
				t.Fatalf("DeleteByAddr = %d, %v; want 3, nil", n, err)
			}
			if n := count(eipB, peer, other); n != 0 {
				t.Fatalf("flows left after DeleteByAddr = %d", n)
			}
		})
	}
	if err := c.FlushMark(context.Background(), unix.AF_UNSPEC, 1, 0xffffffff); err == nil {
		t.Error("FlushMark(AF_UNSPEC): no error, want one naming the family")
	}
}

func TestMarkOf(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint32
	}{{"192.0.2.10", 0xc000020a}, {"0.0.0.1", 1}, {"255.255.255.254", 0xfffffffe}} {
		if got := MarkOf(netip.MustParseAddr(tc.in)); got != tc.want {
			t.Errorf("MarkOf(%s) = %#x, want %#x", tc.in, got, tc.want)
		}
	}
}

// TestMarkID6Range: IPv6 EIPs' mark ids lie above a share identity's
// slot counts (up to 65536) and below every IPv4 EIP's mark (MarkOf of
// 1.0.0.0, the lowest IPv4 EIP).
func TestMarkID6Range(t *testing.T) {
	if MarkID6Min <= 65536 || MarkID6Min > MarkID6Max {
		t.Errorf("mark ids %#x..%#x: want a range above 65536", MarkID6Min, MarkID6Max)
	}
	if low := MarkOf(netip.MustParseAddr("1.0.0.0")); MarkID6Max >= low {
		t.Errorf("MarkID6Max %#x reaches the lowest IPv4 EIP's mark %#x", MarkID6Max, low)
	}
}
