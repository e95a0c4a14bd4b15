package netlab

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// TestPing: a host on the link answers every echo request; an address
// nobody has answers none; bad arguments are refused.
func TestPing(t *testing.T) {
	l := ForTest(t)
	a, err := l.NS("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.NS("b")
	if err != nil {
		t.Fatal(err)
	}
	if err := Veth(End{NS: a, Name: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.8.0.1/24")}},
		End{NS: b, Name: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.8.0.2/24")}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The first request waits for ARP (lost while a new veth has no
	// carrier yet, then retried after a second).
	if rtts, err := Ping(ctx, a, netip.MustParseAddr("10.8.0.2"), 1, 0, 3*time.Second); err != nil || len(rtts) != 1 {
		t.Fatalf("first ping: %v replies, %v", rtts, err)
	}
	for _, tc := range []struct {
		dst  string
		want int
	}{{"10.8.0.2", 5}, {"10.8.0.9", 0}} {
		rtts, err := Ping(ctx, a, netip.MustParseAddr(tc.dst), 5, 10*time.Millisecond, 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if len(rtts) != tc.want {
			t.Errorf("ping %s: %d replies, want %d", tc.dst, len(rtts), tc.want)
		}
		for _, r := range rtts {
			if r <= 0 || r > 100*time.Millisecond {
				t.Errorf("ping %s: RTT %v on a veth", tc.dst, r)
			}
		}
	}
	if _, err := Ping(ctx, a, netip.MustParseAddr("2001:db8::1"), 1, 0, time.Second); err == nil {
		t.Error("ping of an IPv6 address: no error")
	}
	if _, err := Ping(ctx, a, netip.MustParseAddr("10.8.0.2"), 0, 0, time.Second); err == nil {
		t.Error("ping with count 0: no error")
	}
}
