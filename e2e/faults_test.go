package e2e

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/netlab"
)

// stormCycles is the size of the change storms of scenario 4.
const stormCycles = 600

// stormWithFaults runs a storm of FIP create→delete cycles on two gateways
// and calls fault n times while it runs, evenly spread over its cycles
// (fault i when (i+1)/(n+1) of them are done); then checks that everything
// converged: no object stuck, nothing leaked, a fresh FIP on every EIP
// Ready with traffic. It returns the storm's figures and the time from the
// storm's end to convergence.
//
// The storm's cycles need no controller (a FIP deleted before its finalizer
// is added just goes), so a slow fault (a controller restart) could see the
// storm end before the next fault: cycles from raceParallel past a fault's
// point wait until that fault has been injected, which still leaves up to
// raceParallel cycles in flight during every fault.
func stormWithFaults(t *testing.T, s *fw.Stack, f fw.Family, n int, fault func(i int) error) (raceStats, aftermath, time.Duration) {
	t.Helper()
	eips := createRaceEIPs(t, s, f)
	at := make([]int64, n)
	injected := make([]chan struct{}, n)
	for i := range at {
		at[i] = int64((i + 1) * stormCycles / (n + 1))
		injected[i] = make(chan struct{})
	}
	gate := func(cycle int64) {
		for i := range at {
			if cycle < at[i]+raceParallel {
				return
			}
			select {
			case <-injected[i]:
			case <-s.Ctx.Done():
				return
			}
		}
	}
	var st raceStats
	var progress atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		st = runRace(t, s, eips, stormCycles, raceParallel, "storm", &progress, gate)
	}()
	for i := 0; i < n; i++ {
		_, err := fw.Wait(s.Ctx, 2*time.Minute, func() error {
			select {
			case <-done:
				return nil
			default:
			}
			if p := progress.Load(); p < at[i] {
				return fmt.Errorf("%d of %d cycles", p, at[i])
			}
			return nil
		})
		select {
		case <-done:
			t.Errorf("storm ended before fault %d", i+1)
		default:
		}
		if err != nil {
			t.Errorf("fault %d: storm stalled: %v", i+1, err)
		}
		if err := fault(i); err != nil {
			t.Errorf("fault %d: %v", i+1, err)
		}
		close(injected[i])
	}
	wg.Wait()
	end := time.Now()
	a := raceAftermath(t, s, eips, 3*time.Minute)
	return st, a, time.Since(end)
}

// faultStorm runs one storm-with-faults scenario on both data planes (race
// topology) with IPv4 objects, and on the nftables data plane with IPv6
// ones on a dual-stack topology, and records its summary lines. newFault returns, for a fresh
// stack, the fault to inject n times and the fault's own figures, read
// after the storm; the storm's and the aftermath's figures follow them.
func faultStorm(t *testing.T, scenario string, n int, newFault func(s *fw.Stack) (fault func(i int) error, figures func() []any)) {
	// On upstream's CRDs, as TestRace.
	run := func(t *testing.T, dp string, set crdtest.Set, f fw.Family) {
		s := fw.New(t, fw.Options{Dataplane: dp, Gateways: raceTopology(), CRDs: set, IPv6: f == fw.IPv6})
		if f == fw.IPv6 {
			dp += "/ipv6"
		}
		fault, figures := newFault(s)
		st, a, conv := stormWithFaults(t, s, f, n, fault)
		kv := append([]any{"crds", set, "unknown_field_warnings", checkUnknownFields(t, s), "storm_cycles", st.cycles}, figures()...)
		kv = append(kv, "api_retries", st.createErrors+st.deleteErrors, "storm_took", st.took,
			"stuck_terminating", a.stuck, "leaked_at_drain", a.leakedAtDrain, "reaped_after_drain", a.reapedAfterDrain, "leaked_after_sweep", a.leaked,
			"fresh_fips_ready_in", a.freshReady, "converged_after_storm_in", conv)
		fw.Summary(t, scenario, dp, kv...)
	}
	fw.ForEachDataplaneOn(t, crdtest.Upstream, func(t *testing.T, dp string, set crdtest.Set) { run(t, dp, set, fw.IPv4) })
	// IPv6 EIPs and FIPs on a dual-stack topology.
	t.Run("nftables-ipv6", func(t *testing.T) { run(t, "nftables", crdtest.Upstream, fw.IPv6) })
}

// TestFaults is scenario 4: each fault ends converged, with nothing leaked
// or lost, and the time to converge is reported.
func TestFaults(t *testing.T) {
	t.Run("AgentKill", func(t *testing.T) {
		faultStorm(t, "4a-agent-kill9", 3, func(s *fw.Stack) (func(int) error, func() []any) {
			kills := 0
			return func(i int) error {
					g := s.Order[i%len(s.Order)]
					n, err := s.Ctrl.KillAgents(g.GW)
					kills += n
					if err == nil && n == 0 {
						err = fmt.Errorf("no natgw serve running for %s", g.GW)
					}
					return err
				}, func() []any {
					return []any{"agents_killed", kills}
				}
		})
	})
	t.Run("ControllerRestart", func(t *testing.T) {
		faultStorm(t, "4b-controller-kill9-restart", 3, func(s *fw.Stack) (func(int) error, func() []any) {
			restarts := 0
			return func(int) error {
					if err := s.Ctrl.Restart(); err != nil {
						return err
					}
					restarts++
					return nil
				}, func() []any {
					return []any{"restarts", restarts}
				}
		})
	})
	t.Run("APIServerRestart", func(t *testing.T) {
		faultStorm(t, "4c-apiserver-restart", 1, func(s *fw.Stack) (func(int) error, func() []any) {
			var down time.Duration
			return func(int) error {
					start := time.Now()
					if err := s.API.Stop(); err != nil {
						return err
					}
					// Down for a while the storm keeps trying.
					time.Sleep(3 * time.Second)
					err := s.API.Start()
					down = time.Since(start)
					return err
				}, func() []any {
					return []any{"api_down", down}
				}
		})
	})
	t.Run("NamespaceRecreate", func(t *testing.T) {
		forEachRun(t, fw.Options{}, func(t *testing.T, s *fw.Stack, f fw.Family, dp string) {
			g := s.Order[0]
			o, gwObj := programLifecycle(t, s, g, f)
			before := checkProgrammed(t, s, g, append(o.all(), gwObj)).Count()
			// A pod restart: the agent dies with the namespace, which
			// comes back empty under the same name.
			start := time.Now()
			errc := make(chan error, 1)
			go func() { errc <- g.RecreateGW(s.Ctx) }()
			fw.Eventually(t, s.Ctx, 10*time.Second, "old namespace name removed", func() error {
				if _, err := os.Stat("/run/netns/" + g.GW); err == nil {
					return fmt.Errorf("%s still mounted", g.GW)
				}
				return nil
			})
			if _, err := s.Ctrl.KillAgents(g.GW); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			recreated := time.Since(start)
			paths := s.CheckPaths(60*time.Second, o.paths(g)...)
			k := checkProgrammed(t, s, g, append(o.all(), gwObj))
			conv := time.Since(start)
			fw.Summary(t, "4d-namespace-recreate", dp, "entries_before", before, "entries_after", k.Count(),
				"namespace_recreated_in", recreated, "paths_ok_after_recreate", paths, "converged_in", conv)
			if k.Count() != before {
				t.Errorf("kernel entries after the resync: %d, before: %d", k.Count(), before)
			}
		})
	})
	t.Run("FlushByHand", func(t *testing.T) {
		forEachRun(t, fw.Options{Controller: fw.ControllerOptions{DriftPeriod: sweepPeriod, SweepPeriod: sweepPeriod}}, func(t *testing.T, s *fw.Stack, f fw.Family, dp string) {
			g := s.Order[0]
			o, gwObj := programLifecycle(t, s, g, f)
			before, err := fw.ReadKernel(s.Ctx, g, s.Dataplane)
			if err != nil {
				t.Fatal(err)
			}
			flush := []string{"nft", "flush", "table", "inet", "natgw"}
			if s.Dataplane == "iptables" {
				flush = []string{"iptables-legacy", "-t", "nat", "-F"}
			}
			if _, err := netlab.Exec(s.Ctx, g.GW, "", flush...); err != nil {
				t.Fatal(err)
			}
			flushed := time.Now()
			// Traffic is broken now; the drift check repairs it.
			broken := o.paths(g)[0]
			broken.WantServer = ""
			brokenErr := broken.Check(s.Ctx)
			repaired := fw.Eventually(t, s.Ctx, 2*sweepPeriod+20*time.Second, "drift repaired", func() error {
				k, err := fw.ReadKernel(s.Ctx, g, s.Dataplane)
				if err != nil {
					return err
				}
				if k.Count() != before.Count() {
					return fmt.Errorf("kernel state not restored: %d entries, want %d", k.Count(), before.Count())
				}
				for _, p := range o.paths(g) {
					if err := p.Check(s.Ctx); err != nil {
						return err
					}
				}
				return nil
			})
			if limit := sweepPeriod + 3*time.Second; repaired > limit {
				t.Errorf("drift repaired after %v, want within one check period (%v, %v with slack)", repaired, sweepPeriod, limit)
			}
			checkProgrammed(t, s, g, append(o.all(), gwObj))
			fw.Summary(t, "4e-flush-by-hand", dp, "flush", fmt.Sprintf("%q", flush), "traffic_broken_by_flush", brokenErr == nil,
				"drift_period", sweepPeriod, "repaired_in", time.Since(flushed))
		})
	})
}

// programLifecycle creates scenario 1's objects of family f on g and waits
// until they are Ready and pass traffic.
func programLifecycle(t *testing.T, s *fw.Stack, g *fw.Topology, f fw.Family) (*lifecycleObjects, *v1.VpcNatGateway) {
	t.Helper()
	o := newLifecycleObjects(g.Name, f)
	for _, obj := range o.all() {
		s.Create(obj)
	}
	gwObj := &v1.VpcNatGateway{}
	gwObj.Name = g.Name
	s.WaitReady(append(o.all(), gwObj)...)
	s.CheckPaths(30*time.Second, o.paths(g)...)
	return o, gwObj
}
