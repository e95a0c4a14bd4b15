package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/procfs"
)

// Storm parameters: one storm phase per fault, each at least phaseCycles
// FIP create→delete cycles (stormWorkers workers over stormEIPs EIPs), so
// that the phases total at least stormCycles.
const (
	stormCycles  = 500
	stormWorkers = 4
	stormEIPs    = 3
)

// fault is one fault injected mid-storm. inject returns once the fault is
// done (the test's own repairs included, e.g. net1 re-attached).
type fault struct {
	name   string
	inject func(ctx context.Context) error
}

// TestFaults: a create→delete storm of FIPs on a gateway pod, in phases,
// one per fault: the gateway pod deleted (the StatefulSet makes a new one:
// new boot id, one sync; the test re-attaches net1 as Multus would), the
// exec stream cut (the agent process in the pod killed on the node), the
// kubelet restarted (every exec stream through it breaks), the leader
// controller pod deleted, and the kube-apiserver restarted. Each phase
// storms until the fault is injected and recovered from (a new agent
// serves the gateway and it is Ready) and it has done its share of the
// cycles, then converges: no FIP left (none stuck terminating) and the
// pod's kernel state holds nothing but the EIPs. Each phase prints its own
// summary line; the last line checks the total, that a fresh FIP carries
// real traffic, and that deleting everything leaves nothing.
func TestFaults(t *testing.T) {
	fw.ForEachDataplane(t, func(t *testing.T, dp string) {
		name := "f-" + dp[:3]
		s, lab, g := readyGateway(t, dp, name, stormEIPs)
		cs, err := env.c.Clientset()
		if err != nil {
			t.Fatal(err)
		}
		eips := createEIPs(s, name, 10, stormEIPs)
		for _, e := range eips {
			s.WaitReady(e)
		}
		faults := []fault{
			{"gateway-pod-deleted", func(ctx context.Context) error {
				if err := cs.CoreV1().Pods(gatewayNamespace).Delete(ctx, g.Pod.Name, metav1.DeleteOptions{}); err != nil {
					return err
				}
				return g.Attach(ctx, t, env.c, cs, lab, len(g.VMs))
			}},
			{"exec-stream-cut", func(context.Context) error {
				_, err := killAgents(g.NetNS)
				return err
			}},
			{"kubelet-restarted", func(ctx context.Context) error {
				return env.c.Restart(ctx, "kubelet")
			}},
			{"leader-pod-deleted", func(ctx context.Context) error {
				return deleteLeader(ctx, cs)
			}},
			{"apiserver-restarted", func(ctx context.Context) error {
				if err := env.c.Restart(ctx, "kube-apiserver"); err != nil {
					return err
				}
				return env.c.WaitAPI(ctx, 2*time.Minute)
			}},
		}
		perPhase := (stormCycles + len(faults) - 1) / len(faults)
		var total int64
		for i, f := range faults {
			ok := t.Run(f.name, func(t *testing.T) {
				total += stormPhase(t, s, g, eips, fmt.Sprintf("%s-p%d", name, i), perPhase, f)
			})
			if !ok {
				break
			}
		}
		if t.Failed() {
			return
		}
		if total < stormCycles {
			t.Errorf("storm: %d cycles, want >= %d", total, stormCycles)
		}

		// The recovered stack still programs and carries traffic.
		final := fw.FIP(name+"-final", eips[0].Name, g.VMs[0].Addr)
		s.Create(final)
		s.WaitReady(final)
		s.CheckPaths(30*time.Second, g.ExtTo(fw.TCP, netlab.EIP(10), fw.VMPort, 0), g.VMOut(fw.UDP, 0, netlab.EIP(10)))

		left, delIn, stuck := deleteAll(t, s, g, 90*time.Second)
		clusterSummary(t, "storm-faults", dp, "cycles", total, "phases", len(faults), "workers", stormWorkers,
			"left_after_delete_all", left, "delete_all_in", delIn, "stuck_terminating", stuck)
	})
}

// stormPhase storms FIP create→delete cycles on g (names prefixed tag)
// while fault f is injected, until the gateway recovered and at least
// cycles cycles are done; then it waits for convergence, counts leaks and
// records the fault's summary line. It returns the cycles done.
func stormPhase(t *testing.T, s *fw.Stack, g *podGateway, eips []*v1.IptablesEIP, tag string, cycles int, f fault) int64 {
	ctx, cancel := context.WithTimeout(s.Ctx, 4*time.Minute)
	defer cancel()
	var done, apiErrs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < stormWorkers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				i := (w + n) % len(eips)
				fip := fw.FIP(fmt.Sprintf("%s-w%d-%d", tag, w, n), eips[i].Name, g.VMs[i].Addr)
				if err := retryAPI(ctx, &apiErrs, func() error { return s.Client.Create(ctx, fip) }); err != nil {
					t.Errorf("create %s: %v", fip.Name, err)
					return
				}
				if err := retryAPI(ctx, &apiErrs, func() error {
					err := s.Client.Delete(ctx, fip)
					if apierrors.IsNotFound(err) {
						return nil
					}
					return err
				}); err != nil {
					t.Errorf("delete %s: %v", fip.Name, err)
					return
				}
				done.Add(1)
			}
		}(w)
	}
	halt := func() {
		close(stop)
		wg.Wait()
	}

	// The fault, once the storm runs; recovered when an agent that was not
	// there before serves the gateway and the gateway is Ready.
	time.Sleep(time.Second)
	before, err := agentPids(g.NetNS)
	if err != nil {
		halt()
		t.Fatal(err)
	}
	faultAt := time.Now()
	cyclesBefore := done.Load()
	if err := f.inject(ctx); err != nil {
		halt()
		t.Fatalf("fault %s: %v", f.name, err)
	}
	_, err = fw.Wait(ctx, 2*time.Minute, func() error {
		pids, err := agentPids(g.NetNS)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(pids, func(p int) bool { return !slices.Contains(before, p) }) {
			return errors.New("no new natgw serve in the gateway pod")
		}
		return gatewayReady(ctx, s, g.Name)
	})
	recovered := time.Since(faultAt)
	if err != nil {
		halt()
		t.Fatalf("fault %s: not recovered: %v", f.name, err)
	}
	t.Logf("fault %s: recovered in %v", f.name, recovered.Round(time.Millisecond))
	for done.Load() < int64(cycles) && !t.Failed() && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	halt()
	stormIn := time.Since(start)

	// Converge: every FIP gone, the pod's kernel holds only the EIPs.
	var leaked, stuck int
	converge, cerr := fw.Wait(s.Ctx, 2*time.Minute, func() error {
		var fips v1.IptablesFIPRuleList
		if err := s.Client.List(s.Ctx, &fips); err != nil {
			return err
		}
		stuck = len(fips.Items)
		if stuck > 0 {
			return fmt.Errorf("%d FIPs left, e.g. %s (deleting since %v)", stuck, fips.Items[0].Name, fips.Items[0].DeletionTimestamp)
		}
		k, err := fw.ReadKernel(s.Ctx, g.Topology, s.Dataplane)
		if err != nil {
			return err
		}
		leaked = 0
		for uid, e := range k.Entries {
			if !isEIP(uid, eips) {
				leaked += len(e)
			}
		}
		if leaked > 0 {
			return fmt.Errorf("%d kernel entries of deleted FIPs in the pod's namespace", leaked)
		}
		return nil
	})
	if cerr != nil {
		t.Errorf("fault %s: storm did not converge: %v", f.name, cerr)
	}
	clusterSummary(t, "storm-"+f.name, s.Dataplane, "cycles", done.Load(), "cycles_before_fault", cyclesBefore,
		"workers", stormWorkers, "storm_in", stormIn, "api_retries", apiErrs.Load(), "recovered_in", recovered,
		"converge_in", converge, "leaked_kernel_entries", leaked, "stuck_terminating", stuck)
	return done.Load()
}

func isEIP(uid string, eips []*v1.IptablesEIP) bool {
	for _, e := range eips {
		if string(e.UID) == uid {
			return true
		}
	}
	return false
}

// deleteLeader deletes the controller pod holding the lease and waits for
// another to hold it.
func deleteLeader(ctx context.Context, cs kubernetes.Interface) error {
	l, err := cs.CoordinationV1().Leases(controllerNS).Get(ctx, controllerLease, metav1.GetOptions{})
	if err != nil {
		return err
	}
	pod, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	if err := cs.CoreV1().Pods(controllerNS).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
		return err
	}
	_, err = fw.Wait(ctx, 2*time.Minute, func() error {
		l, err := cs.CoordinationV1().Leases(controllerNS).Get(ctx, controllerLease, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if h := l.Spec.HolderIdentity; h == nil || *h == "" || strings.HasPrefix(*h, pod+"_") {
			return fmt.Errorf("lease still with %s", pod)
		}
		return nil
	})
	return err
}

// gatewayReady says why the VpcNatGateway is not Ready for its current
// generation (nil when it is).
func gatewayReady(ctx context.Context, s *fw.Stack, name string) error {
	gw := &v1.VpcNatGateway{}
	gw.Name = name
	if err := s.Client.Get(ctx, client.ObjectKeyFromObject(gw), gw); err != nil {
		return err
	}
	if r := fw.ReadyOf(gw); r.Status != metav1.ConditionTrue || !r.Current {
		return fmt.Errorf("%s", r)
	}
	return nil
}

// agentPids lists the `natgw serve` processes running in network
// namespace ns (the far ends of the controller's exec sessions).
func agentPids(ns string) ([]int, error) {
	want, err := os.Readlink(ns)
	if err != nil {
		return nil, err
	}
	agents, err := procfs.Find(func(argv []string) bool {
		return strings.Contains(strings.Join(argv, "\x00"), "natgw\x00serve")
	})
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, pid := range agents {
		if n, err := procfs.NetNS(pid); err == nil && n == want {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// killAgents kills every `natgw serve` in network namespace ns, as a
// broken exec stream ends them, and returns their pids.
func killAgents(ns string) (map[int]bool, error) {
	pids, err := agentPids(ns)
	if err != nil {
		return nil, err
	}
	killed := map[int]bool{}
	for _, pid := range pids {
		if p, err := os.FindProcess(pid); err == nil && p.Kill() == nil {
			killed[pid] = true
		}
	}
	if len(killed) == 0 {
		return nil, errors.New("no natgw serve process in the gateway pod")
	}
	return killed, nil
}

// retryAPI retries an API call through the API server's restart
// (connection refused, unavailable), counting the failed attempts.
func retryAPI(ctx context.Context, errs *atomic.Int64, fn func() error) error {
	for {
		err := fn()
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		if apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) {
			return err
		}
		errs.Add(1)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
