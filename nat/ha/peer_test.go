package ha_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat/ha"
)

// TestSetPeer starts two replicas that do not know each other's address
// (Config.Peer zero, as a pod whose sibling has not started): the first to
// take the shared fence leads alone; once SetPeer gives each the other's
// address the other stays standby, hears the active's beats and gets a
// full conntrack dump (its receiver counts a session), and no second
// takeover happens. Bad addresses are refused naming the value.
func TestSetPeer(t *testing.T) {
	if why := netlab.Unavailable(); why != "" {
		t.Skip(why)
	}
	lab := netlab.ForTest(t)
	fence := ha.FileFence{Path: filepath.Join(t.TempDir(), "lease")}
	var nss [2]string
	in := [2]netip.Prefix{netip.MustParsePrefix("198.51.100.2/24"), netip.MustParsePrefix("198.51.100.3/24")}
	for i := range nss {
		ns, err := lab.NS([]string{"pa", "pb"}[i])
		if err != nil {
			t.Fatal(err)
		}
		if err := netlab.Stub(ns, "net1", netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(251 + i)}), 24)); err != nil {
			t.Fatal(err)
		}
		nss[i] = ns
	}
	if err := netlab.Veth(netlab.End{NS: nss[0], Name: "eth0", Addrs: []netip.Prefix{in[0]}},
		netlab.End{NS: nss[1], Name: "eth0", Addrs: []netip.Prefix{in[1]}}); err != nil {
		t.Fatal(err)
	}
	var rs [2]*ha.Replica
	for i := range rs {
		var err error
		rs[i], err = ha.New(ha.Config{ID: []string{"pa", "pb"}[i], NetNS: nss[i], Fence: fence,
			EIPs:     []netip.Prefix{netip.MustParsePrefix("192.0.2.10/24")},
			Local:    netip.AddrPortFrom(in[i].Addr(), 7400),
			Interval: labInterval(t),
			// What is tested is SetPeer, not the timing: ten missed
			// beats (a lease of 10.5 intervals) keep a late renewal
			// under -race on a loaded machine from swapping the roles,
			// which the check below would take for SetPeer's fault.
			Misses: 10})
		if err != nil {
			t.Fatal(err)
		}
		if p := rs[i].Peer(); p.IsValid() {
			t.Fatalf("replica %d: Peer() = %s before SetPeer, want none", i, p)
		}
	}
	if err := rs[0].SetPeer(netip.MustParseAddrPort("198.51.100.3:0")); err == nil || !strings.Contains(err.Error(), "198.51.100.3:0") {
		t.Fatalf("SetPeer without port: %v, want an error naming it", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	t.Cleanup(func() {
		cancel()
		for range rs {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Error("replica did not stop")
			}
		}
	})
	// The first starts alone and leads.
	go func() { done <- rs[0].Run(ctx) }()
	waitFor(t, "the lone replica leads", 5*time.Second, func() bool { return rs[0].Role() == ha.RoleActive })
	go func() { done <- rs[1].Run(ctx) }()
	for i, p := range []netip.AddrPort{netip.AddrPortFrom(in[1].Addr(), 7400), netip.AddrPortFrom(in[0].Addr(), 7400)} {
		if err := rs[i].SetPeer(p); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the standby gets a full dump from the active", 10*time.Second, func() bool {
		st := rs[1].Status()
		return st.Receiver.Dumps > 0 && rs[0].Status().Sender.Connects > 0
	})
	time.Sleep(15 * labInterval(t)) // 15 turns
	s0, s1 := rs[0].Status(), rs[1].Status()
	if s0.Role != ha.RoleActive || s1.Role != ha.RoleStandby || s0.ToActive != 1 || s1.ToActive != 0 || s0.ToStandby != 0 {
		t.Fatalf("after SetPeer: %+v / %+v, want the first active once, the second standby", s0, s1)
	}
}

func waitFor(t *testing.T, what string, within time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
