package nattest

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

func (s *suite) tests() []test {
	return []test{
		s.familyTest("RoundTrip", s.testRoundTrip),
		s.familyTest("Idempotent", s.testIdempotent),
		s.familyTest("Update", s.testUpdate),
		s.familyTest("Conflicts", s.testConflicts),
		s.familyTest("InvalidBatch", s.testInvalid),
		s.familyTest("Reopen", s.testReopen),
		s.familyTest("LostState", s.testLostState),
		s.familyTest("Sync", s.testSync),
		s.familyTest("Concurrent", s.testConcurrent),
		s.familyTest("ConcurrentOpen", s.testConcurrentOpen),
		s.familyTest("Canceled", s.testCanceled),
		s.familyTest("LargeSync", s.testLargeSync),
		{"Link", s.testLink},
		{"Packets", s.testPackets},
		{"ShareDNAT", s.testShare},
	}
}

var (
	vm1 = netlab.VMAddr(0) // 198.51.100.10
	vm2 = netlab.VMAddr(1) // 198.51.100.11
	vm3 = netlab.VMAddr(2) // 198.51.100.12
)

// sample is one object of every kind and shape: EIPs with and without QoS,
// a FIP, TCP and UDP DNATs on one port of one EIP, overlapping SNATs (one
// with random-fully), and routes through each device.
func sample() []nat.Object {
	return []nat.Object{
		EIP(UID(nat.KindEIP, 0), netlab.EIP(0)),
		EIPQoS(UID(nat.KindEIP, 1), netlab.EIP(1), nat.QoS{IngressRateMbps: 10, IngressBurstMbit: 1, EgressRateMbps: 20, EgressBurstMbit: 2}),
		EIP(UID(nat.KindEIP, 2), netlab.EIP(2)),
		EIPQoS(UID(nat.KindEIP, 3), netlab.EIP(3), nat.QoS{EgressRateMbps: 5}),
		FIP(UID(nat.KindFIP, 0), netlab.EIP(0), vm1),
		DNAT(UID(nat.KindDNAT, 0), netlab.EIP(1), nat.TCP, 2222, vm2, 8080),
		DNAT(UID(nat.KindDNAT, 1), netlab.EIP(1), nat.UDP, 2222, vm2, 8081),
		SNAT(UID(nat.KindSNAT, 0), netlab.EIP(2), prefix("198.51.100.0/24"), false),
		SNAT(UID(nat.KindSNAT, 1), netlab.EIP(3), prefix("198.51.100.8/30"), true),
		Route(UID(nat.KindRoute, 0), prefix("203.0.113.0/24"), vm1, nat.DeviceInternal),
		Route(UID(nat.KindRoute, 1), prefix("0.0.0.0/0"), netlab.ExtAddr, nat.DeviceExternal),
	}
}

// testRoundTrip applies every kind one object at a time, then deletes them
// one at a time; then all in one batch, deleted in one batch. List follows
// each step, and after deleting everything the kernel is as right after
// the backend was opened.
func (s *suite) testRoundTrip(t *testing.T, f family) {
	e := s.stateEnv(t, f)
	objs := sampleOf(f)
	for i, o := range objs {
		e.apply(o)
		e.wantList("after applying "+o.String(), objs[:i+1]...)
	}
	for i := len(objs) - 1; i >= 0; i-- {
		e.del(objs[i].UID)
		e.wantList("after deleting "+objs[i].String(), objs[:i]...)
	}
	e.wantEquiv("after deleting every object one by one", e.empty)

	e.apply(objs...)
	e.wantList("after applying all in one batch", objs...)
	all := e.kernel()
	e.del(nat.UIDs(objs)...)
	e.wantList("after deleting all in one batch")
	e.wantEquiv("after deleting all in one batch", e.empty)

	// Applying the batch again lands in the same kernel state.
	e.apply(objs...)
	e.wantEquiv("after applying the batch a second time", all)
}

// testIdempotent applies twice and deletes twice.
func (s *suite) testIdempotent(t *testing.T, f family) {
	e := s.stateEnv(t, f)
	objs := sampleOf(f)
	e.apply(objs...)
	k := e.kernel()
	e.apply(objs...)
	e.wantKernel("second apply of the same objects", k)
	e.wantList("second apply of the same objects", objs...)
	e.apply(objs[3], objs[5])
	e.wantKernel("apply of a subset already present", k)
	e.del(objs[4].UID, objs[5].UID)
	k2 := e.kernel()
	e.del(objs[4].UID, objs[5].UID)
	e.wantKernel("second delete of the same UIDs", k2)
	e.del("no-such-uid", UID(nat.KindFIP, 999))
	e.wantKernel("delete of unknown UIDs", k2)
	e.del(nat.UIDs(objs)...)
	e.del(nat.UIDs(objs)...)
	e.wantEquiv("delete of everything, twice", e.empty)
	e.wantList("delete of everything, twice")
}

// testUpdate re-applies UIDs with another spec: List shows the new spec and
// the kernel is exactly as if the new spec had been applied alone.
func (s *suite) testUpdate(t *testing.T, f family) {
	u := func(k nat.Kind) string { return UID(k, 100) }
	eip4, eip5 := f.eip(4), f.eip(5)
	vm1, vm2 := f.vm(0), f.vm(1)
	// Addresses and prefixes no object of sampleOf(f) uses.
	spare1, spare2 := f.vm(10), f.vm(11)
	net25, net26 := f.pick("198.51.100.128/25", "2001:db8:100::80/121"), f.pick("198.51.100.128/26", "2001:db8:100::80/122")
	EIP := f.eipObject
	EIPQoS := f.eipQoS
	cases := []struct {
		name     string
		old, new nat.Object
	}{
		{"fip internal IP", FIP(u(nat.KindFIP), eip4, spare1), FIP(u(nat.KindFIP), eip4, spare2)},
		{"fip EIP", FIP(u(nat.KindFIP), eip4, spare1), FIP(u(nat.KindFIP), eip5, spare1)},
		{"dnat internal port", DNAT(u(nat.KindDNAT), eip4, nat.TCP, 80, vm1, 8080), DNAT(u(nat.KindDNAT), eip4, nat.TCP, 80, vm1, 9090)},
		{"dnat external port and protocol", DNAT(u(nat.KindDNAT), eip4, nat.TCP, 80, vm1, 8080), DNAT(u(nat.KindDNAT), eip4, nat.UDP, 53, vm1, 8080)},
		{"snat CIDR", SNAT(u(nat.KindSNAT), eip4, net25, false), SNAT(u(nat.KindSNAT), eip4, net26, false)},
		{"snat random-fully", SNAT(u(nat.KindSNAT), eip4, net25, false), SNAT(u(nat.KindSNAT), eip4, net25, true)},
		{"eip QoS added", EIP(u(nat.KindEIP), eip4), EIPQoS(u(nat.KindEIP), eip4, nat.QoS{IngressRateMbps: 100})},
		{"eip QoS changed", EIPQoS(u(nat.KindEIP), eip4, nat.QoS{IngressRateMbps: 100}), EIPQoS(u(nat.KindEIP), eip4, nat.QoS{IngressRateMbps: 50, EgressRateMbps: 40, EgressBurstMbit: 4})},
		{"eip QoS removed", EIPQoS(u(nat.KindEIP), eip4, nat.QoS{IngressRateMbps: 100}), EIP(u(nat.KindEIP), eip4)},
		{"eip address", EIP(u(nat.KindEIP), eip4), EIP(u(nat.KindEIP), eip5)},
		{"route next hop", Route(u(nat.KindRoute), f.pick("10.1.0.0/16", "2001:db8:400::/48"), vm1, nat.DeviceInternal), Route(u(nat.KindRoute), f.pick("10.1.0.0/16", "2001:db8:400::/48"), vm2, nat.DeviceInternal)},
	}
	if f.v6 {
		// A dual-stack EIP: its IPv4 address added and removed beside
		// the IPv6 one.
		dual := DualEIP(u(nat.KindEIP), netlab.EIP(4), eip4)
		cases = append(cases, struct {
			name     string
			old, new nat.Object
		}{"eip IPv4 address added", EIP(u(nat.KindEIP), eip4), dual}, struct {
			name     string
			old, new nat.Object
		}{"eip IPv4 address removed", dual, EIP(u(nat.KindEIP), eip4)})
	}
	e := s.stateEnv(t, f)
	// Other objects stay untouched by every update.
	others := sampleOf(f)
	e.apply(others...)
	base := e.kernel()
	for _, tc := range cases {
		e.run(tc.name, func(t *testing.T) {
			e.apply(tc.old)
			e.apply(tc.new)
			e.wantList("after update", append(slices.Clone(others), tc.new)...)
			updated := e.kernel()
			e.del(tc.new.UID)
			e.wantEquiv("after deleting the updated object", base)
			e.apply(tc.new)
			e.wantEquiv("new spec applied alone vs. update", updated)
			e.del(tc.new.UID)
		})
	}
}

// testConflicts checks that refused objects change nothing, also when the
// batch holds valid objects too.
func (s *suite) testConflicts(t *testing.T, f family) {
	eip0, eip1, eip5 := f.eip(0), f.eip(1), f.eip(5)
	vm1, vm2, vm3 := f.vm(0), f.vm(1), f.vm(2)
	vpc := f.vpcNet()
	fipA := FIP("fip-a", eip0, vm1)
	dnatA := DNAT("dnat-a", eip1, nat.TCP, 2222, vm2, 8080)
	snatA := SNAT("snat-a", f.eip(2), vpc, false)
	fresh := SNAT("snat-new", f.eip(3), f.pick("198.51.100.64/26", "2001:db8:100::40/122"), false)
	dst := f.pick("203.0.113.0/24", "2001:db8:300::/48")
	cases := []struct {
		name  string
		setup []nat.Object
		bad   []nat.Object
	}{
		{"second FIP on an EIP", []nat.Object{fipA}, []nat.Object{FIP("fip-b", eip0, vm2)}},
		{"second FIP for an internal IP", []nat.Object{fipA}, []nat.Object{FIP("fip-b", eip5, vm1)}},
		{"DNAT on a FIP's EIP", []nat.Object{fipA}, []nat.Object{DNAT("dnat-b", eip0, nat.TCP, 22, vm2, 22)}},
		{"FIP on a DNAT's EIP", []nat.Object{dnatA}, []nat.Object{FIP("fip-b", eip1, vm3)}},
		{"duplicate DNAT", []nat.Object{dnatA}, []nat.Object{DNAT("dnat-b", eip1, nat.TCP, 2222, vm3, 9090)}},
		{"duplicate SNAT CIDR", []nat.Object{snatA}, []nat.Object{SNAT("snat-b", f.eip(3), vpc, true)}},
		{"duplicate EIP address", []nat.Object{f.eipObject("eip-a", eip0)}, []nat.Object{f.eipObject("eip-b", eip0)}},
		{"duplicate route destination", []nat.Object{Route("route-a", dst, vm1, nat.DeviceInternal)},
			[]nat.Object{Route("route-b", dst, vm2, nat.DeviceInternal)}},
		{"two FIPs on one EIP in one batch", nil, []nat.Object{FIP("fip-b", eip5, vm2), FIP("fip-c", eip5, vm3)}},
		{"valid object with a conflicting one", []nat.Object{fipA}, []nat.Object{fresh, FIP("fip-b", eip0, vm2)}},
		{"conflicting one before a valid object", []nat.Object{fipA, dnatA}, []nat.Object{DNAT("dnat-b", eip1, nat.TCP, 2222, vm3, 1), fresh}},
		{"update into a conflict", []nat.Object{fipA, dnatA}, []nat.Object{FIP("fip-a", eip1, vm1)}},
	}
	if f.v6 {
		// A dual-stack EIP's IPv6 address is taken like an IPv6-only one's.
		cases = append(cases, struct {
			name  string
			setup []nat.Object
			bad   []nat.Object
		}{"IPv6 address of a dual-stack EIP", []nat.Object{DualEIP("eip-a", netlab.EIP(0), eip0)}, []nat.Object{f.eipObject("eip-b", eip0)}})
	}
	e := s.stateEnv(t, f)
	for _, tc := range cases {
		e.run(tc.name, func(t *testing.T) {
			if len(tc.setup) > 0 {
				e.apply(tc.setup...)
			}
			before := e.kernel()
			err := e.tryApply(tc.bad...)
			wantErr(t, "apply "+describe(tc.bad), err, nat.ErrConflict)
			e.wantKernel("after a refused apply", before)
			e.wantList("after a refused apply", tc.setup...)
			// The same conflict in a Sync is refused too.
			err = e.trySync(append(slices.Clone(tc.setup), tc.bad...)...)
			wantErr(t, "sync with a conflict", err, nat.ErrConflict)
			e.wantKernel("after a refused sync", before)
			e.wantList("after a refused sync", tc.setup...)
			e.del(nat.UIDs(tc.setup)...)
			e.wantEquiv("after deleting the case's objects", e.empty)
		})
	}
}

// testInvalid checks that a batch with one invalid object changes nothing.
func (s *suite) testInvalid(t *testing.T, f family) {
	vm1, vm2, vm3 := f.vm(0), f.vm(1), f.vm(2)
	// In IPv4 an IPv6 EIP with an IPv4 internal address; in IPv6 the
	// reverse.
	mixed := FIP("fip-bad", addr("2001:db8::1"), vm1)
	eipLen := nat.EIP{Address: netlab.EIP(8), PrefixLen: 33}
	if f.v6 {
		mixed = FIP("fip-bad", f.eip(9), f.other().vm(0))
		eipLen = nat.EIP{V6Address: f.eip(8), V6PrefixLen: 129}
	}
	good := FIP("fip-good", f.eip(6), vm3)
	cases := []struct {
		name string
		bad  nat.Object
	}{
		{"DNAT port 0", DNAT("dnat-bad", f.eip(1), nat.TCP, 0, vm2, 80)},
		{"DNAT protocol", DNAT("dnat-bad", f.eip(1), "icmp", 80, vm2, 80)},
		{"FIP of two families", mixed},
		{"SNAT CIDR with host bits", SNAT("snat-bad", f.eip(2), f.pick("198.51.100.5/24", "2001:db8:100::5/64"), false)},
		{"UID with a space", FIP("bad uid", f.eip(7), vm2)},
		{"empty UID", FIP("", f.eip(7), vm2)},
		{"EIP prefix length", nat.Object{UID: "eip-bad", Kind: nat.KindEIP, EIP: &eipLen}},
		{"two payloads", nat.Object{UID: "two", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: f.eip(8), InternalIP: vm1}, SNAT: &nat.SNAT{EIP: f.eip(8), InternalCIDR: f.vpcNet()}}},
		{"route device", Route("route-bad", f.pick("203.0.113.0/24", "2001:db8:300::/48"), vm1, "eth7")},
	}
	e := s.stateEnv(t, f)
	present := sampleOf(f)
	e.apply(present...)
	before := e.kernel()
	for _, tc := range cases {
		e.run(tc.name, func(t *testing.T) {
			for _, batch := range [][]nat.Object{{good, tc.bad}, {tc.bad, good}} {
				err := e.tryApply(batch...)
				wantErr(t, "apply "+describe(batch), err, nat.ErrInvalid)
				e.wantKernel("after a refused apply", before)
				e.wantList("after a refused apply", present...)
			}
			err := e.trySync(good, tc.bad)
			wantErr(t, "sync with an invalid object", err, nat.ErrInvalid)
			e.wantKernel("after a refused sync", before)
			e.wantList("after a refused sync", present...)
		})
	}
}

// wantReopenReload checks that the applied objs survive a reopen (List,
// kernel and BootID unchanged) and then a Reload (List unchanged).
func (e *env) wantReopenReload(objs ...nat.Object) {
	e.t.Helper()
	k, boot := e.kernel(), e.dp.BootID()
	e.reopen()
	e.wantList("after reopen", objs...)
	e.wantKernel("reopen must not change the kernel", k)
	if got := e.dp.BootID(); got != boot {
		e.t.Errorf("BootID after reopen = %q, want %q (kernel state was kept)", got, boot)
	}
	ctx, cancel := e.opCtx()
	defer cancel()
	e.touch()
	if err := e.dp.Reload(ctx); err != nil {
		e.t.Errorf("reload: %v", err)
	}
	e.wantList("after reload", objs...)
}

// testReopen closes the backend, opens a new one on the same namespace,
// and deletes by UID with it.
func (s *suite) testReopen(t *testing.T, f family) {
	e := s.stateEnv(t, f)
	objs := sampleOf(f)
	e.apply(objs...)
	if e.dp.BootID() == "" {
		t.Errorf("BootID is empty")
	}
	e.wantReopenReload(objs...)
	// Delete by UID only, half now, half after another reopen.
	e.del(nat.UIDs(objs[:5])...)
	e.wantList("after delete by UID after reopen", objs[5:]...)
	e.reopen()
	e.wantList("after second reopen", objs[5:]...)
	e.del(nat.UIDs(objs[5:])...)
	e.wantList("after deleting the rest")
	e.wantEquiv("after deleting everything after reopens", e.empty)
}

// testLostState recreates the gateway namespace (what a pod restart does:
// the kernel state is gone): a backend opened on it starts empty, with a new
// BootID, and takes the objects again.
func (s *suite) testLostState(t *testing.T, f family) {
	e := s.stateEnv(t, f)
	objs := sampleOf(f)
	e.apply(objs...)
	boot := e.dp.BootID()
	e.closeDP()
	e.recreateNS()
	e.openDP()
	e.check("open on a recreated namespace")
	if got := e.dp.BootID(); got == "" || got == boot {
		t.Errorf("BootID after the kernel state was lost = %q, want a new one (was %q)", got, boot)
	}
	e.wantList("after the kernel state was lost")
	e.sync(objs...)
	e.wantList("after a resync", objs...)
	if got := e.dp.BootID(); got == boot {
		t.Errorf("BootID after resync = %q, the lost state's", got)
	}
}

// testSync replaces the whole state in one call.
func (s *suite) testSync(t *testing.T, f family) {
	e := s.stateEnv(t, f)
	objs := sampleOf(f)
	e.apply(objs...)
	desired := []nat.Object{
		objs[0], objs[2], objs[7], objs[9], // kept
		FIP(objs[4].UID, f.eip(0), f.vm(2)),                                            // updated
		DNAT("dnat-new", f.eip(5), nat.TCP, 443, f.vm(1), 8443),                        // new
		SNAT("snat-new", f.eip(2), netip.PrefixFrom(f.vm(2), f.vm(2).BitLen()), false), // new
	}
	e.sync(desired...)
	e.wantList("after sync", desired...)
	synced := e.kernel()
	e.sync(desired...)
	e.wantKernel("second sync of the same set", synced)
	e.sync()
	e.wantList("after sync to nothing")
	e.wantEquiv("after sync to nothing", e.empty)
	e.apply(desired...)
	e.wantEquiv("the synced set applied from empty vs. sync", synced)
	e.sync(objs...)
	e.wantList("after sync back", objs...)
}

// testConcurrent applies and deletes from several goroutines at once.
func (s *suite) testConcurrent(t *testing.T, f family) {
	e := s.stateEnv(t, f)
	const workers, per = 4, 6
	var want []nat.Object
	var wg sync.WaitGroup
	errs := make(chan error, workers*per*2)
	for w := 0; w < workers; w++ {
		var mine []nat.Object
		for i := 0; i < per; i++ {
			n := w*per + i
			mine = append(mine, FIP(UID(nat.KindFIP, n), f.benchAddr(100, 64, w<<8|i), f.benchAddr(10, 0, w<<8|i)))
		}
		want = append(want, mine[:per/2]...)
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := e.opCtx()
			defer cancel()
			for _, o := range mine {
				if err := e.dp.Apply(ctx, o); err != nil {
					errs <- fmt.Errorf("apply %s: %w", o, err)
				}
			}
			for _, o := range mine[per/2:] {
				if err := e.dp.Delete(ctx, o.UID); err != nil {
					errs <- fmt.Errorf("delete %s: %w", o.UID, err)
				}
			}
		}()
	}
	wg.Wait()
	e.touch()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	e.check("concurrent applies and deletes")
	e.wantList("after concurrent applies and deletes", want...)
	k := e.kernel()
	e.reopen()
	e.wantList("after concurrent applies and deletes, reopened", want...)
	e.wantKernel("reopen after concurrent changes", k)
}

// testConcurrentOpen opens several backends at once on a gateway whose
// kernel state is empty, as when the agent starts while an operator runs
// `natgw list`: every open succeeds, all agree on one BootID, and what one
// applies another lists after a Reload.
func (s *suite) testConcurrentOpen(t *testing.T, f family) {
	e := s.stateEnv(t, f)
	const rounds, openers = 5, 6
	for round := 0; round < rounds; round++ {
		e.closeDP()
		e.recreateNS()
		dps := make([]nat.Dataplane, openers)
		errs := make([]error, openers)
		var wg sync.WaitGroup
		for i := range dps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := e.opCtx()
				defer cancel()
				dps[i], errs[i] = s.open(ctx, e.cfg)
			}()
		}
		wg.Wait()
		var open []nat.Dataplane
		for i, dp := range dps {
			if errs[i] != nil {
				t.Errorf("round %d: opener %d of %d: %v", round, i, openers, errs[i])
				continue
			}
			open = append(open, dp)
		}
		if len(open) > 0 {
			boot := open[0].BootID()
			for i, dp := range open[1:] {
				if got := dp.BootID(); got != boot {
					t.Errorf("round %d: BootID of open backend %d = %q, of backend 0 = %q", round, i+1, got, boot)
				}
			}
			e.dp, e.name = open[0], open[0].Name()
			e.check(fmt.Sprintf("round %d: concurrent opens", round))
			fip := FIP(UID(nat.KindFIP, round), f.eip(round), f.vm(0))
			e.apply(fip)
			ctx, cancel := e.opCtx()
			other := open[len(open)-1]
			err := other.Reload(ctx)
			var got []nat.Object
			if err == nil {
				got, err = other.List(ctx)
			}
			cancel()
			if err != nil {
				t.Errorf("round %d: reload and list on another backend: %v", round, err)
			} else if want := []nat.Object{fip}; !objectsEqual(got, want) {
				t.Errorf("round %d: reload and list on another backend after apply:\n%s", round, objectsDiff(want, got))
			}
		}
		for _, dp := range open[1:] {
			if err := dp.Close(); err != nil {
				t.Errorf("round %d: close: %v", round, err)
			}
		}
		if t.Failed() {
			return
		}
	}
}

// testCanceled calls every state-changing method with a context that is
// already done: each fails with the context's error and changes nothing.
func (s *suite) testCanceled(t *testing.T, f family) {
	e := s.stateEnv(t, f)
	objs := sampleOf(f)
	e.apply(objs[:4]...)
	before := e.kernel()
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	calls := []struct {
		name string
		call func() error
	}{
		{"apply", func() error { return e.dp.Apply(ctx, objs[4:]...) }},
		{"delete", func() error { return e.dp.Delete(ctx, nat.UIDs(objs[:4])...) }},
		{"sync", func() error { return e.dp.Sync(ctx, objs[4:]) }},
	}
	for _, c := range calls {
		e.touch()
		err := c.call()
		e.check(c.name + " with a canceled context")
		wantErr(t, c.name+" with a canceled context", err, context.Canceled)
		e.wantKernel(c.name+" with a canceled context", before)
		e.wantList(c.name+" with a canceled context", objs[:4]...)
	}
}

// testLargeSync syncs thousands of objects in one call (more than one
// netlink message batch or restore chunk), reads them back after a reopen
// and removes them in one call.
func (s *suite) testLargeSync(t *testing.T, f family) {
	const fips, dnats = 3000, 1000
	e := s.stateEnv(t, f)
	var objs []nat.Object
	for i := 0; i < fips; i++ {
		if f.v6 {
			objs = append(objs, FIP(UID(nat.KindFIP, i), f.benchAddr(100, 64, i), f.benchAddr(10, 0, i)))
		} else {
			objs = append(objs, benchFIP(i))
		}
	}
	for i := 0; i < dnats; i++ {
		eip := netip.AddrFrom4([4]byte{100, 127, byte(i / 200), byte(i % 200)})
		in := netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
		if f.v6 {
			eip, in = f.benchAddr(100, 127, i), f.benchAddr(10, 200, i)
		}
		objs = append(objs, DNAT(UID(nat.KindDNAT, i), eip, nat.TCP, uint16(1000+i), in, 80))
	}
	e.sync(objs...)
	if got := len(e.list()); got != len(objs) {
		t.Fatalf("after a sync of %d objects: List has %d", len(objs), got)
	}
	e.reopen()
	e.wantList("after a large sync and reopen", objs...)
	// Delete half by UID in one call, then sync to nothing.
	e.del(nat.UIDs(objs[:len(objs)/2])...)
	e.wantList("after deleting half", objs[len(objs)/2:]...)
	e.sync()
	e.wantList("after sync to nothing")
	e.wantEquiv("after sync to nothing", e.empty)
}
