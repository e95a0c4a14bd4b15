package ha_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat/ha"
)

// loneReplica is one replica in a namespace of its own (net1 and eth0
// stubs, no peer), with a file fence the test can hold.
type loneReplica struct {
	t     *testing.T
	ns    string
	fence ha.FileFence
	r     *ha.Replica
	roles chan ha.Role
	done  chan error
}

func newLoneReplica(t *testing.T, eips []netip.Prefix) *loneReplica {
	t.Helper()
	if why := netlab.Unavailable(); why != "" {
		t.Skip(why)
	}
	lab := netlab.ForTest(t)
	ns, err := lab.NS("gw")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlab.Stub(ns, "net1", netip.MustParsePrefix("192.0.2.251/24")); err != nil {
		t.Fatal(err)
	}
	if err := netlab.Stub(ns, "eth0", netip.MustParsePrefix("198.51.100.2/24")); err != nil {
		t.Fatal(err)
	}
	l := &loneReplica{t: t, ns: ns, fence: ha.FileFence{Path: filepath.Join(t.TempDir(), "lease")},
		roles: make(chan ha.Role, 16), done: make(chan error, 1)}
	l.r, err = ha.New(ha.Config{ID: "gwa", NetNS: ns, EIPs: eips, Fence: l.fence,
		Local: netip.MustParseAddrPort("198.51.100.2:7400"), Peer: netip.MustParseAddrPort("198.51.100.3:7400"),
		Interval: 20 * time.Millisecond,
		OnRole:   func(r ha.Role, _ string) { l.roles <- r }})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *loneReplica) run() {
	ctx, cancel := context.WithCancel(context.Background())
	go func() { l.done <- l.r.Run(ctx) }()
	l.t.Cleanup(func() {
		cancel()
		select {
		case <-l.done:
		case <-time.After(10 * time.Second):
			l.t.Error("replica did not stop")
		}
	})
}

// waitRole waits for the next role change to want.
func (l *loneReplica) waitRole(want ha.Role) {
	l.t.Helper()
	select {
	case got := <-l.roles:
		if got != want {
			l.t.Fatalf("role changed to %s, want %s", got, want)
		}
	case <-time.After(5 * time.Second):
		l.t.Fatalf("no role change to %s within 5 s", want)
	}
}

// waitEIPs waits until net1 holds exactly the replica's own address and
// want (IPv4 and IPv6, link-local addresses left out).
func (l *loneReplica) waitEIPs(what string, want ...netip.Prefix) {
	l.t.Helper()
	want = append([]netip.Prefix{netip.MustParsePrefix("192.0.2.251/24")}, want...)
	slices.SortFunc(want, netip.Prefix.Compare)
	var got []netip.Prefix
	deadline := time.Now().Add(3 * time.Second)
	for {
		var err error
		if got, err = netlab.Addrs(l.ns, "net1"); err != nil {
			l.t.Fatal(err)
		}
		got6, err := netlab.Addrs6(l.ns, "net1")
		if err != nil {
			l.t.Fatal(err)
		}
		got = append(got, got6...)
		slices.SortFunc(got, netip.Prefix.Compare)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			l.t.Fatalf("%s: net1 holds %v, want %v", what, got, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSetEIPs changes the floating EIP set at run time: the active replica
// adds new EIPs and removes dropped ones; a standby only records the set
// and claims the one current at its takeover; bad input changes nothing.
func TestSetEIPs(t *testing.T) {
	a, b, c := netip.MustParsePrefix("192.0.2.10/24"), netip.MustParsePrefix("192.0.2.11/24"), netip.MustParsePrefix("192.0.2.12/32")
	d6, e6 := netip.MustParsePrefix("2001:db8:2::10/64"), netip.MustParsePrefix("2001:db8:2::11/128")
	t.Run("active", func(t *testing.T) {
		l := newLoneReplica(t, []netip.Prefix{a})
		l.run()
		l.waitRole(ha.RoleActive)
		l.waitEIPs("takeover", a)
		steps := []struct {
			what string
			set  []netip.Prefix
		}{
			{"add", []netip.Prefix{a, b}},
			{"drop", []netip.Prefix{b}},
			{"add a /32", []netip.Prefix{b, c}},
			{"same address, other length", []netip.Prefix{b, netip.PrefixFrom(c.Addr(), 24)}},
			{"add IPv6 EIPs", []netip.Prefix{b, d6, e6}},
			{"drop one IPv6 EIP", []netip.Prefix{b, e6}},
			{"none", nil},
			{"back", []netip.Prefix{a}},
		}
		for _, s := range steps {
			if err := l.r.SetEIPs(s.set); err != nil {
				t.Fatalf("%s: %v", s.what, err)
			}
			l.waitEIPs(s.what, s.set...)
		}
		bad := []netip.Prefix{b, netip.MustParsePrefix("::ffff:192.0.2.13/120")}
		if err := l.r.SetEIPs(bad); err == nil || !strings.Contains(err.Error(), "::ffff:192.0.2.13/120") {
			t.Fatalf("SetEIPs(%v): %v, want an error naming the IPv4-mapped prefix", bad, err)
		}
		if got := l.r.EIPs(); !slices.Equal(got, []netip.Prefix{a}) {
			t.Fatalf("after a refused set: EIPs %v, want %v", got, []netip.Prefix{a})
		}
		time.Sleep(100 * time.Millisecond) // a few turns
		l.waitEIPs("after a refused set", a)
		if l.r.Role() != ha.RoleActive {
			t.Fatalf("role %s, want active", l.r.Role())
		}
	})
	t.Run("standby", func(t *testing.T) {
		l := newLoneReplica(t, []netip.Prefix{a})
		// Another holder keeps the lease: the replica stays standby.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		held := make(chan struct{})
		if err := l.fence.Acquire(ctx, "other", time.Second); err != nil {
			t.Fatal(err)
		}
		go func() {
			defer close(held)
			for ctx.Err() == nil {
				_ = l.fence.Acquire(ctx, "other", time.Second)
				time.Sleep(50 * time.Millisecond)
			}
		}()
		l.run()
		time.Sleep(300 * time.Millisecond) // > detection interval: it asks and is refused
		if err := l.r.SetEIPs([]netip.Prefix{b, c}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if l.r.Role() != ha.RoleStandby {
			t.Fatalf("role %s while another holds the lease, want standby", l.r.Role())
		}
		l.waitEIPs("standby")
		cancel()
		<-held
		if err := l.fence.Release(context.Background(), "other"); err != nil {
			t.Fatal(err)
		}
		l.waitRole(ha.RoleActive)
		l.waitEIPs("takeover after the set changed", b, c)
	})
}
