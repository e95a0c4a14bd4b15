package delayline

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
)

// pair builds a ── middle ── b with a delay line's two interfaces in the
// middle and returns the namespaces.
func pair(t *testing.T) (a, mid, b string) {
	t.Helper()
	lab := netlab.ForTest(t)
	var err error
	mk := func(role string) string {
		if err != nil {
			return ""
		}
		var n string
		n, err = lab.NS(role)
		return n
	}
	a, mid, b = mk("a"), mk("mid"), mk("b")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlab.Veth(netlab.End{NS: a, Name: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.1/24")}}, netlab.End{NS: mid, Name: "la"}); err != nil {
		t.Fatal(err)
	}
	if err := netlab.Veth(netlab.End{NS: mid, Name: "lb"}, netlab.End{NS: b, Name: "eth0", Addrs: []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")}}); err != nil {
		t.Fatal(err)
	}
	return a, mid, b
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestDelayByPing proves the added delay with real ICMP echo: without a line
// a and b cannot reach each other (the middle has no bridge), with one the
// median round trip is twice the one-way delay, plus a little.
func TestDelayByPing(t *testing.T) {
	a, mid, b := pair(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dst := netip.MustParseAddr("10.9.0.2")
	if rtts, err := netlab.Ping(ctx, a, dst, 3, 50*time.Millisecond, 300*time.Millisecond); err != nil || len(rtts) != 0 {
		t.Fatalf("without a delay line %s answered %d pings (err %v): the middle must not forward by itself", b, len(rtts), err)
	}
	for _, tc := range []struct {
		delay time.Duration
		slack time.Duration // allowed above 2×delay
	}{
		{0, 5 * time.Millisecond},
		{10 * time.Millisecond, 8 * time.Millisecond},
		{25 * time.Millisecond, 8 * time.Millisecond},
	} {
		t.Run(tc.delay.String(), func(t *testing.T) {
			l, err := Start(ctx, Options{NS: mid, A: "la", B: "lb", Delay: tc.delay})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			// Warm up: the neighbor entries left failed by the ping
			// without a line resolve again (ARP retries every second).
			if _, err := netlab.Ping(ctx, a, dst, 1, 0, 3*time.Second); err != nil {
				t.Fatal(err)
			}
			rtts, err := netlab.Ping(ctx, a, dst, 20, 20*time.Millisecond, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if len(rtts) < 18 {
				t.Fatalf("%d of 20 pings answered through a %v line", len(rtts), tc.delay)
			}
			m := median(rtts)
			t.Logf("one-way delay %v: median RTT %v over %d pings, %+v", tc.delay, m, len(rtts), l.Stats())
			if m < 2*tc.delay || m > 2*tc.delay+tc.slack {
				t.Errorf("one-way delay %v: median RTT %v, want [%v, %v]", tc.delay, m, 2*tc.delay, 2*tc.delay+tc.slack)
			}
		})
	}
}

func TestStartRefusesBadOptions(t *testing.T) {
	for _, o := range []Options{
		{A: "a", B: "b"},
		{NS: "x", A: "a", B: "a"},
		{NS: "x", A: "a", B: "b", Delay: -time.Millisecond},
	} {
		if l, err := Start(context.Background(), o); err == nil {
			l.Close()
			t.Errorf("Start(%+v) = nil error", o)
		}
	}
}
