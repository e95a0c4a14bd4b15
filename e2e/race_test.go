package e2e

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	fw "github.com/natgw/natgw/e2e/framework"
)

// Scale of scenario 2: the 2,000 cycles per data plane. Measured
// here (2 loaded cores): 500 cycles take 12–14 s per data plane, so the
// full count fits the CI budget and is the default; E2E_FULL=1 asks for it
// explicitly, E2E_RACE_CYCLES=N for any other count.
const (
	fullCycles    = 2000
	defaultCycles = fullCycles
	raceParallel  = 8
	raceEIPsPerGW = 10
	raceGateways  = 2
)

func raceCycles() (int, string) {
	if n, err := strconv.Atoi(os.Getenv("E2E_RACE_CYCLES")); err == nil && n > 0 {
		return n, "E2E_RACE_CYCLES"
	}
	if os.Getenv("E2E_FULL") == "1" {
		return fullCycles, "E2E_FULL"
	}
	return defaultCycles, "default"
}

// raceEIP is one EIP of the race with the VPC host its FIPs point to.
type raceEIP struct {
	obj    *v1.IptablesEIP
	gw     *fw.Topology
	vm     int
	family fw.Family
}

func (e raceEIP) addr() netip.Addr {
	if e.family == fw.IPv6 {
		return netip.MustParseAddr(e.obj.Spec.V6ip)
	}
	return netip.MustParseAddr(e.obj.Spec.V4ip)
}

// raceTopology is two gateways with ten VPC hosts each.
func raceTopology() []fw.GatewaySpec {
	var out []fw.GatewaySpec
	for i := 1; i <= raceGateways; i++ {
		out = append(out, fw.GatewaySpec{Name: "gw" + strconv.Itoa(i), VMs: raceEIPsPerGW})
	}
	return out
}

// createRaceEIPs creates ten EIPs of family f per gateway and waits until
// they are Ready; EIP i of a gateway pairs with its VPC host i.
func createRaceEIPs(t *testing.T, s *fw.Stack, f fw.Family) []raceEIP {
	var eips []raceEIP
	var objs []client.Object
	for _, g := range s.Order {
		for i := 0; i < raceEIPsPerGW; i++ {
			e := fw.EIP(fmt.Sprintf("%s-eip%d", g.Name, i), g.Name, f.EIP(i))
			s.Create(e)
			eips = append(eips, raceEIP{obj: e, gw: g, vm: i, family: f})
			objs = append(objs, e)
		}
	}
	s.WaitReady(objs...)
	return eips
}

// raceStats are the figures of a run of create→delete cycles.
type raceStats struct {
	cycles       int
	took         time.Duration
	createErrors int64 // transient (API server down), retried
	deleteErrors int64
}

// runRace runs n FIP create→delete cycles over eips, parallel at a time
// (each EIP used by one cycle at a time), with a random 0–20 ms between
// create and delete. API errors are retried (the fault scenarios stop the
// API server meanwhile), every one bounded.
func runRace(t *testing.T, s *fw.Stack, eips []raceEIP, n, parallel int, prefix string, progress *atomic.Int64, gate func(cycle int64)) raceStats {
	t.Helper()
	free := make(chan raceEIP, len(eips))
	for _, e := range eips {
		free <- e
	}
	var next atomic.Int64
	var st raceStats
	var wg sync.WaitGroup
	errs := make(chan error, parallel)
	start := time.Now()
	for w := 0; w < parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for {
				i := next.Add(1) - 1
				if i >= int64(n) || s.Ctx.Err() != nil {
					return
				}
				if gate != nil {
					gate(i)
				}
				e := <-free
				f := fw.FIP(fmt.Sprintf("%s-%d", prefix, i), e.obj.Name, e.family.VMAddr(e.vm))
				if err := retryAPI(s, &st.createErrors, func() error {
					err := s.Client.Create(s.Ctx, f)
					if apierrors.IsAlreadyExists(err) {
						// An earlier try reached the API server before it
						// went down (names are unique per cycle).
						return s.Get(f)
					}
					return err
				}); err != nil {
					errs <- fmt.Errorf("create %s: %w", f.Name, err)
					return
				}
				time.Sleep(time.Duration(rng.IntN(21)) * time.Millisecond)
				if err := retryAPI(s, &st.deleteErrors, func() error {
					if err := s.Client.Delete(s.Ctx, f); err != nil && !apierrors.IsNotFound(err) {
						return err
					}
					return nil
				}); err != nil {
					errs <- fmt.Errorf("delete %s: %w", f.Name, err)
					return
				}
				free <- e
				if progress != nil {
					progress.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	st.cycles = n
	st.took = time.Since(start)
	return st
}

// retryAPI retries fn for up to a minute (the API server may be down).
func retryAPI(s *fw.Stack, errCount *int64, fn func() error) error {
	_, err := fw.Wait(s.Ctx, time.Minute, func() error {
		err := fn()
		if err != nil {
			atomic.AddInt64(errCount, 1)
		}
		return err
	})
	return err
}

var errStillClean = errors.New("still clean")

// raceAftermath checks what scenario 2 promises after the cycles: every
// FIP gone (none stuck terminating), no entry left on any gateway whose
// object is gone, and a fresh FIP on every EIP Ready and passing traffic.
type aftermath struct {
	drain         time.Duration // until the last FIP object was gone
	stuck         int
	leakedAtDrain int // kernel entries of gone objects when the last FIP was gone, not removed by the controller's reap of vanished objects
	// reapedAfterDrain are entries of gone objects present when the last
	// FIP was gone that the controller's own deletion path removed right
	// after: objects deleted while their finalizer was being added, which
	// the controller programmed and remembers (reconciler's tracker), so
	// it deletes them when it sees them vanish. Not a leak; entries the
	// orphan sweep removed, or that stayed, are.
	reapedAfterDrain int
	leaked           int // ... after two sweep periods
	fipEntries       int
	freshReady       time.Duration
	freshPaths       time.Duration
}

func raceAftermath(t *testing.T, s *fw.Stack, eips []raceEIP, drainTimeout time.Duration) aftermath {
	t.Helper()
	var a aftermath
	start := time.Now()
	_, err := fw.Wait(s.Ctx, drainTimeout, func() error {
		l := &v1.IptablesFIPRuleList{}
		if err := s.Client.List(s.Ctx, l); err != nil {
			return err
		}
		a.stuck = len(l.Items)
		if a.stuck > 0 {
			return fmt.Errorf("%d FIPs left, e.g. %s (finalizers %v, deleting since %v)", a.stuck, l.Items[0].Name, l.Items[0].Finalizers, l.Items[0].DeletionTimestamp)
		}
		return nil
	})
	a.drain = time.Since(start)
	if err != nil {
		t.Errorf("FIPs stuck: %v", err)
	}
	atDrain, _ := leakedUIDs(t, s)
	a.reapedAfterDrain, a.leakedAtDrain = classifyDrainLeftovers(t, s, atDrain)
	if a.leakedAtDrain > 0 {
		t.Errorf("%d kernel entries of deleted objects when the last FIP was gone that the controller did not reap (the sweep would hide this leak)", a.leakedAtDrain)
	}
	// Watch two sweep periods (2 s each): no entry may appear (a late
	// apply) or stay. The wait ends early when one appears.
	_, _ = fw.Wait(s.Ctx, 2*2*time.Second, func() error {
		if n, _ := leaks(t, s); n > 0 {
			return nil
		}
		return errStillClean
	})
	a.leaked, a.fipEntries = leaks(t, s)
	if a.leaked > 0 || a.fipEntries > 0 {
		t.Errorf("after the sweep: %d entries of deleted objects, %d FIP entries", a.leaked, a.fipEntries)
	}

	// A fresh FIP on every EIP.
	var fresh []client.Object
	var paths []fw.Path
	for _, e := range eips {
		f := fw.FIP("fresh-"+e.obj.Name, e.obj.Name, e.family.VMAddr(e.vm))
		s.Create(f)
		fresh = append(fresh, f)
		paths = append(paths, e.gw.ExtTo(fw.TCP, e.addr(), fw.VMPort, e.vm))
	}
	start = time.Now()
	s.WaitReady(fresh...)
	a.freshReady = time.Since(start)
	a.freshPaths = s.CheckPaths(60*time.Second, paths...)
	return a
}

// leaks counts the kernel entries, on every gateway, whose owner is not in
// the API server, and the FIP entries (UIDs of FIP objects or of nothing).
func leaks(t *testing.T, s *fw.Stack) (gone, fips int) {
	t.Helper()
	byUID, fips := leakedUIDs(t, s)
	for _, n := range byUID {
		gone += n
	}
	return gone, fips
}

// leakedUIDs returns, by UID, the kernel entries on every gateway whose
// owner is not in the API server, and the count of FIP entries (UIDs of FIP
// objects or of nothing).
func leakedUIDs(t *testing.T, s *fw.Stack) (gone map[string]int, fips int) {
	t.Helper()
	uids, err := s.ObjectUIDs()
	if err != nil {
		t.Fatal(err)
	}
	gone = map[string]int{}
	for _, g := range s.Order {
		k, err := fw.ReadKernel(s.Ctx, g, s.Dataplane)
		if err != nil {
			t.Fatal(err)
		}
		for uid, es := range k.Entries {
			owner, ok := uids[uid]
			if !ok && len(es) > 0 {
				gone[uid] += len(es)
				t.Logf("gateway %s: entries of gone object %s: %v", g.Name, uid, es)
			}
			if !ok || len(owner) > 16 && owner[:16] == "IptablesFIPRule/" {
				fips += len(es)
			}
		}
	}
	return gone, fips
}

// reapSettle is how long entries of gone objects found at drain get to be
// reaped by the controller: far below the sweep period (2 s), which may
// still fall into it; the controller's log tells which of the two removed
// an entry.
const reapSettle = 500 * time.Millisecond

// classifyDrainLeftovers splits the entries of gone objects found when the
// last FIP was gone into those the controller's reconciler reaped within
// reapSettle (its log says "object vanished" for the UID, and no sweep
// named it) and the rest: leaks.
func classifyDrainLeftovers(t *testing.T, s *fw.Stack, atDrain map[string]int) (reaped, leaked int) {
	t.Helper()
	if len(atDrain) == 0 {
		return 0, 0
	}
	_, _ = fw.Wait(s.Ctx, reapSettle, func() error {
		now, _ := leakedUIDs(t, s)
		for uid := range atDrain {
			if now[uid] > 0 {
				return errStillClean
			}
		}
		return nil
	})
	now, _ := leakedUIDs(t, s)
	log := s.Ctrl.Log()
	for uid, n := range atDrain {
		how := reapedBy(log, uid)
		t.Logf("entries of gone object %s at drain: %d, %d left after %v, removed by: %s", uid, n, now[uid], reapSettle, how)
		if now[uid] == 0 && how == "reap" {
			reaped += n
		} else {
			leaked += n
		}
	}
	return reaped, leaked
}

// reapedBy says which part of the controller logged the removal of uid's
// rules: "reap" (the reconciler, for an object that vanished while its
// finalizer was being added), "sweep" (the orphan sweep, also when the
// reconciler logged it too), or "none".
func reapedBy(log, uid string) string {
	reaped, swept := false, false
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, uid) {
			continue
		}
		switch {
		case strings.Contains(l, "swept orphans"):
			swept = true
		case strings.Contains(l, "object vanished"):
			reaped = true
		}
	}
	switch {
	case swept:
		return "sweep"
	case reaped:
		return "reap"
	}
	return "none"
}

// TestRace is scenario 2: FIP create→delete cycles over 20 EIPs on two
// gateways, 8 in parallel, random 0–20 ms between create and delete. It
// runs on upstream Kube-OVN v1.16.2's CRDs, as on a cluster with Kube-OVN
// (natgw's own CRDs are a superset, proven by controller/crdtest; the other
// scenarios run on them), and the controller's log must hold no "unknown
// field" warning (a status field upstream's schema lacks). With the
// admission policy (controller/config/admission, installed as a user would)
// on both data planes: every FIP is born with natgw's finalizer, so none
// may vanish without natgw's deletion (vanished_reaped=0). Without it on
// nftables: the controller adds the finalizer, and a FIP deleted while that
// patch is in flight vanishes and is reaped (vanished_reaped ≥ 0).
func TestRace(t *testing.T) {
	n, why := raceCycles()
	fw.ForEachDataplaneOn(t, crdtest.Upstream, func(t *testing.T, dp string, set crdtest.Set) {
		testRace(t, dp, set, true, n, why, fw.IPv4)
	})
	t.Run("no-admission/"+fw.Dataplanes[0], func(t *testing.T) {
		testRace(t, fw.Dataplanes[0], crdtest.Upstream, false, n, why, fw.IPv4)
	})
	// IPv6 EIPs and FIPs on a dual-stack topology.
	t.Run("nftables-ipv6", func(t *testing.T) {
		testRace(t, "nftables", crdtest.Upstream, true, n, why, fw.IPv6)
	})
}

// testRace runs scenario 2 with EIPs and FIPs of family f (IPv6: on a
// dual-stack topology; the summary's dataplane is then dp+"/ipv6").
func testRace(t *testing.T, dp string, set crdtest.Set, admission bool, n int, why string, f fw.Family) {
	s := fw.New(t, fw.Options{Dataplane: dp, Gateways: raceTopology(), CRDs: set, NoAdmission: !admission, IPv6: f == fw.IPv6})
	if f == fw.IPv6 {
		dp += "/ipv6"
	}
	eips := createRaceEIPs(t, s, f)
	st := runRace(t, s, eips, n, raceParallel, "race", nil, nil)
	a := raceAftermath(t, s, eips, 3*time.Minute)
	warnings := checkUnknownFields(t, s)
	reaped := vanishedReaped(s.Ctrl.Log())
	if admission && reaped > 0 {
		t.Errorf("%d objects vanished without natgw's deletion and were reaped although the admission policy created them with the finalizer", reaped)
	}
	fw.Summary(t, "2-race", dp, "crds", set, "admission_policy", admission, "vanished_reaped", reaped, "unknown_field_warnings", warnings,
		"cycles", st.cycles, "cycles_source", strconv.Quote(why), "eips", len(eips), "gateways", len(s.Order), "parallel", raceParallel,
		"cycles_took", st.took, "cycles_per_s", fmt.Sprintf("%.1f", float64(st.cycles)/st.took.Seconds()),
		"api_retries", st.createErrors+st.deleteErrors,
		"drain", a.drain, "stuck_terminating", a.stuck, "leaked_at_drain", a.leakedAtDrain, "reaped_after_drain", a.reapedAfterDrain, "leaked_after_sweep", a.leaked,
		"fip_entries_left", a.fipEntries, "fresh_fips_ready_in", a.freshReady, "fresh_paths_ok_in", a.freshPaths)
}

// vanishedReaped counts the objects whose rule the controller's reconciler
// deleted because they vanished without natgw's deletion (its log line
// "object vanished ..." per object; the reconciler's reapVanished, metric
// natgw_vanished_reaped_total).
func vanishedReaped(log string) int {
	n := 0
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "object vanished") {
			n++
		}
	}
	return n
}

// checkUnknownFields fails the test when the controller's log holds an
// "unknown field" warning, and returns their number.
func checkUnknownFields(t *testing.T, s *fw.Stack) int {
	t.Helper()
	n := fw.UnknownFieldWarnings(s.Ctrl.Log())
	if n > 0 {
		t.Errorf("controller log holds %d \"unknown field\" warnings (a write with a field the %s CRDs lack)", n, s.CRDs)
	}
	return n
}

func TestReapedBy(t *testing.T) {
	const uid = "0b1c2d3e-0000-4000-8000-000000000001"
	reap := `time=T level=INFO msg="object vanished without natgw's deletion (deleted while its finalizer was being added); deleted its rule on the gateway" uid=` + uid + ` gateway=gw1`
	sweep := `time=T level=INFO msg="swept orphans" gateway=gw1 uids="[` + uid + ` other]" reason=sweep`
	other := `time=T level=INFO msg="swept orphans" gateway=gw1 uids="[other]" reason=sweep`
	for _, tc := range []struct {
		name, log, want string
	}{
		{"nothing", other, "none"},
		{"reap", other + "\n" + reap, "reap"},
		{"sweep", sweep, "sweep"},
		{"both: the sweep removed it first", sweep + "\n" + reap, "sweep"},
		{"both: reap then sweep", reap + "\n" + sweep, "sweep"},
	} {
		if got := reapedBy(tc.log, uid); got != tc.want {
			t.Errorf("%s: reapedBy = %q, want %q", tc.name, got, tc.want)
		}
	}
}
