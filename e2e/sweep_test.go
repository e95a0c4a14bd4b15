package e2e

import (
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// sweepPeriod is the controller's sweep and drift period in the e2e runs.
const sweepPeriod = 2 * time.Second

// leakSet returns gateway objects under fresh UIDs that no API object has:
// an EIP with a FIP, and an EIP with a port DNAT and a CIDR SNAT. first
// is the index of the first of the two EIP addresses it uses.
func leakSet(first int) []nat.Object {
	uid := func() string { return string(uuid.NewUUID()) }
	e1, e2 := netlab.EIP(first), netlab.EIP(first+1)
	return []nat.Object{
		{UID: uid(), Kind: nat.KindEIP, EIP: &nat.EIP{Address: e1, PrefixLen: 24}},
		{UID: uid(), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: e1, InternalIP: netlab.VMAddr(2)}},
		{UID: uid(), Kind: nat.KindEIP, EIP: &nat.EIP{Address: e2, PrefixLen: 24}},
		{UID: uid(), Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: e2, Protocol: nat.UDP, ExternalPort: 53, InternalIP: netlab.VMAddr(2), InternalPort: fw.VMPort}},
		{UID: uid(), Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: e2, InternalCIDR: netip.MustParsePrefix("10.0.0.0/8")}},
	}
}

// waitLeaksGone waits until no kernel entry of leaks is left on g and
// their EIP addresses are gone, and returns how long it took.
func waitLeaksGone(t *testing.T, s *fw.Stack, g *fw.Topology, leaks []nat.Object, timeout time.Duration) time.Duration {
	t.Helper()
	return fw.Eventually(t, s.Ctx, timeout, "leaked entries removed", func() error {
		k, err := fw.ReadKernel(s.Ctx, g, s.Dataplane)
		if err != nil {
			return err
		}
		for _, o := range leaks {
			if e := k.Entries[o.UID]; len(e) > 0 {
				return fmt.Errorf("%s still on the gateway: %v", o.String(), e)
			}
			if o.Kind == nat.KindEIP {
				for _, p := range k.Addrs {
					if p.Addr() == o.EIP.Address {
						return fmt.Errorf("leaked EIP address %s still on %s", p, g.ExternalInterface)
					}
				}
			}
		}
		return nil
	})
}

// liveEntries returns the kernel entries of uids.
func liveEntries(t *testing.T, s *fw.Stack, g *fw.Topology, uids []string) map[string][]string {
	t.Helper()
	k, err := fw.ReadKernel(s.Ctx, g, s.Dataplane)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, u := range uids {
		out[u] = k.Entries[u]
		if len(out[u]) == 0 {
			t.Errorf("live object %s has no kernel entry", u)
		}
	}
	return out
}

// TestSweep is scenario 3: entries tagged with UIDs no object has are
// removed by the sweep — those left from before the controller started on
// its first connect, those added behind its back within one period — and
// the entries of live objects stay untouched.
func TestSweep(t *testing.T) {
	fw.ForEachDataplane(t, func(t *testing.T, dp string) {
		s := fw.New(t, fw.Options{Dataplane: dp, NoController: true,
			Controller: fw.ControllerOptions{SweepPeriod: sweepPeriod, DriftPeriod: sweepPeriod}})
		g := s.Order[0]
		live := []client.Object{
			fw.EIP("e-fip", g.Name, netlab.EIP(0)), fw.FIP("fip", "e-fip", netlab.VMAddr(0)),
			fw.EIP("e-dnat", g.Name, netlab.EIP(1)), fw.DNAT("dnat", "e-dnat", "tcp", 80, netlab.VMAddr(1), fw.VMPort),
		}
		for _, o := range live {
			s.Create(o)
		}
		// Leaks from before: on the gateway before the controller runs.
		before := leakSet(10)
		if err := fw.ApplyObjects(s.Ctx, s.Bin, g, dp, before); err != nil {
			t.Fatal(err)
		}
		k, err := fw.ReadKernel(s.Ctx, g, dp)
		if err != nil {
			t.Fatal(err)
		}
		preloaded := k.Count()
		if preloaded == 0 {
			t.Fatalf("preloading leaks left no entry:\n%s", k.Dump)
		}
		start := time.Now()
		s.StartController()
		// The sweep runs on connect: one period is plenty.
		waitLeaksGone(t, s, g, before, sweepPeriod+20*time.Second)
		onConnect := time.Since(start)
		s.WaitReady(live...)
		paths := []fw.Path{g.ExtTo(fw.TCP, netlab.EIP(0), fw.VMPort, 0), g.ExtTo(fw.TCP, netlab.EIP(1), 80, 1), g.VMOut(fw.TCP, 0, netlab.EIP(0))}
		s.CheckPaths(20*time.Second, paths...)
		var liveUIDs []string
		for _, o := range live {
			liveUIDs = append(liveUIDs, string(o.GetUID()))
		}
		snap := liveEntries(t, s, g, liveUIDs)

		// Leaks added behind the running controller's back.
		during := leakSet(20)
		injected := time.Now()
		if err := fw.ApplyObjects(s.Ctx, s.Bin, g, dp, during); err != nil {
			t.Fatal(err)
		}
		waitLeaksGone(t, s, g, during, 2*sweepPeriod+10*time.Second)
		removedIn := time.Since(injected)
		// One period, plus the pass itself and this poll, on 2 loaded cores.
		if limit := sweepPeriod + 2*time.Second; removedIn > limit {
			t.Errorf("leaks removed after %v, want within one sweep period (%v, %v with slack)", removedIn, sweepPeriod, limit)
		}
		after := liveEntries(t, s, g, liveUIDs)
		if !reflect.DeepEqual(snap, after) {
			t.Errorf("entries of live objects changed:\nbefore %v\nafter  %v", snap, after)
		}
		s.CheckPaths(20*time.Second, paths...)
		untouched := 0
		for _, u := range liveUIDs {
			if reflect.DeepEqual(snap[u], after[u]) {
				untouched += len(after[u])
			}
		}
		fw.Summary(t, "3-sweep", dp, "sweep_period", sweepPeriod,
			"preloaded_leak_objects", len(before), "preloaded_leak_entries", preloaded, "removed_after_controller_start_in", onConnect,
			"injected_leak_objects", len(during), "injected_removed_in", removedIn,
			"live_objects", len(live), "live_entries_untouched", untouched)
	})
}
