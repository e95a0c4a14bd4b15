package conntrack

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	ct "github.com/ti-mo/conntrack"

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

func TestFlushMarkAndDeleteByAddr(t *testing.T) {
	ns := testNS(t)
	c, err := Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	eipA, eipB := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.11")
	addFlow(t, c, "192.0.2.1", "192.0.2.10", 1000, MarkOf(eipA))
	addFlow(t, c, "192.0.2.1", "192.0.2.10", 1001, MarkOf(eipA))
	addFlow(t, c, "192.0.2.1", "192.0.2.11", 1000, MarkOf(eipB))
	addFlow(t, c, "198.51.100.10", "192.0.2.1", 1000, 0)

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
	if err := c.FlushMark(context.Background(), MarkOf(eipA), 0xffffffff); err != nil {
		t.Fatal(err)
	}
	if n := count(eipA); n != 0 {
		t.Fatalf("flows of %s after FlushMark = %d, want 0", eipA, n)
	}
	if n := count(eipB); n != 1 {
		t.Fatalf("flows of %s after flushing another mark = %d, want 1", eipB, n)
	}
	n, err := c.DeleteByAddr([]netip.Addr{eipB, netip.MustParseAddr("198.51.100.10")})
	if err != nil || n != 2 {
		t.Fatalf("DeleteByAddr = %d, %v; want 2, nil", n, err)
	}
	if n := count(eipB, netip.MustParseAddr("198.51.100.10")); n != 0 {
		t.Fatalf("flows left after DeleteByAddr = %d", n)
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
