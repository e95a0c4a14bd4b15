package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
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
)

// Storm parameters: at least stormCycles FIP create→delete cycles per data
// plane from stormWorkers workers over stormEIPs EIPs, while the faults
// run one after the other.
const (
	stormCycles  = 500
	stormWorkers = 4
	stormEIPs    = 3
)

// faultResult is one fault and how long the system took to be whole again.
type faultResult struct {
	name string
	took time.Duration
	err  error
}

// TestFaults: a create→delete storm of FIPs on a gateway pod while, one
// after the other, the gateway pod is deleted (the StatefulSet makes a new
// one: new boot id, one sync; the test re-attaches net1 as Multus would),
// the exec stream is cut (the agent process in the pod is killed on the
// node), the leader controller pod is deleted, and the kube-apiserver is
// restarted. Afterwards no object is stuck terminating, the pod's kernel
// state holds nothing but the EIPs (then nothing once they are deleted),
// and a fresh FIP carries real traffic.
func TestFaults(t *testing.T) {
	fw.ForEachDataplane(t, func(t *testing.T, dp string) {
		s := newStack(t, dp)
		lab := netlab.ForTest(t)
		name := "f-" + dp[:3]
		g := startGateway(t, s, lab, name, stormEIPs)
		gwObj := &v1.VpcNatGateway{}
		gwObj.Name = name
		s.WaitReady(gwObj)
		cs, err := env.c.Clientset()
		if err != nil {
			t.Fatal(err)
		}
		var eips []*v1.IptablesEIP
		for i := 0; i < stormEIPs; i++ {
			e := fw.EIP(fmt.Sprintf("%s-e%d", name, i), name, netlab.EIP(10+i))
			s.Create(e)
			eips = append(eips, e)
		}
		for _, e := range eips {
			s.WaitReady(e)
		}

		var cycles, apiErrs atomic.Int64
		faultsDone := make(chan []faultResult, 1)
		ctx, cancel := context.WithTimeout(s.Ctx, 8*time.Minute)
		defer cancel()
		go func() { faultsDone <- runFaults(ctx, t, s, cs, lab, g) }()

		start := time.Now()
		var wg sync.WaitGroup
		var results []faultResult
		stop := make(chan struct{})
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
					i := (w + n) % stormEIPs
					fip := fw.FIP(fmt.Sprintf("%s-w%d-%d", name, w, n), eips[i].Name, g.VMs[i].Addr)
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
					cycles.Add(1)
				}
			}(w)
		}
		// Stop when the faults are over and the cycles are enough.
		for results == nil || cycles.Load() < stormCycles {
			select {
			case results = <-faultsDone:
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				close(stop)
				wg.Wait()
				t.Fatalf("storm: %v after %d cycles", ctx.Err(), cycles.Load())
			}
			if t.Failed() {
				break
			}
		}
		close(stop)
		wg.Wait()
		stormIn := time.Since(start)

		// Converge: every FIP gone, the pod's kernel holds only the EIPs.
		var leaked int
		converge := fw.Eventually(t, s.Ctx, 2*time.Minute, "storm converged", func() error {
			var fips v1.IptablesFIPRuleList
			if err := s.Client.List(s.Ctx, &fips); err != nil {
				return err
			}
			if len(fips.Items) > 0 {
				return fmt.Errorf("%d FIPs left, e.g. %s (deleting since %v)", len(fips.Items), fips.Items[0].Name, fips.Items[0].DeletionTimestamp)
			}
			k, err := fw.ReadKernel(s.Ctx, g.Gateway, dp)
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

		// The recovered stack still programs and carries traffic.
		final := fw.FIP(name+"-final", eips[0].Name, g.VMs[0].Addr)
		s.Create(final)
		s.WaitReady(final)
		s.CheckPaths(30*time.Second, g.ExtTo(fw.TCP, netlab.EIP(10), fw.VMPort, 0), g.VMOut(fw.UDP, 0, netlab.EIP(10)))

		delIn := s.DeleteAll(90 * time.Second)
		k, err := fw.ReadKernel(s.Ctx, g.Gateway, dp)
		if err != nil {
			t.Fatal(err)
		}
		left := k.Count() + len(k.EIPAddrs())
		if left > 0 {
			t.Errorf("after deleting everything: %d entries, EIP addresses %v in the pod's namespace:\n%s", k.Count(), k.EIPAddrs(), k.Dump)
		}
		stuck, err := s.ObjectUIDs()
		if err != nil {
			t.Fatal(err)
		}
		kv := []any{"cycles", cycles.Load(), "workers", stormWorkers, "storm_in", stormIn, "api_retries", apiErrs.Load()}
		for _, r := range results {
			if r.err != nil {
				t.Errorf("fault %s: %v", r.name, r.err)
			}
			kv = append(kv, r.name+"_recovered_in", r.took)
		}
		kv = append(kv, "converge_in", converge, "leaked_kernel_entries", leaked, "left_after_delete_all", left,
			"delete_all_in", delIn, "stuck_terminating", len(stuck))
		clusterSummary(t, "storm-faults", dp, kv...)
	})
}

func isEIP(uid string, eips []*v1.IptablesEIP) bool {
	for _, e := range eips {
		if string(e.UID) == uid {
			return true
		}
	}
	return false
}

// runFaults injects the faults one after the other, each once the gateway
// is Ready again after the previous one, and reports how long each took to
// recover.
func runFaults(ctx context.Context, t *testing.T, s *fw.Stack, cs kubernetes.Interface, lab *netlab.Lab, g *podGateway) []faultResult {
	settle := func() { time.Sleep(2 * time.Second) } // let the storm run between faults
	var out []faultResult
	do := func(name string, fn func() error) {
		settle()
		start := time.Now()
		err := fn()
		if err == nil {
			err = waitGatewayReady(ctx, s, g.Name)
		}
		out = append(out, faultResult{name: name, took: time.Since(start), err: err})
		t.Logf("fault %s: recovered in %v (err %v)", name, time.Since(start).Round(time.Millisecond), err)
	}
	do("gateway_pod_deleted", func() error {
		if err := cs.CoreV1().Pods(gatewayNamespace).Delete(ctx, g.Pod.Name, metav1.DeleteOptions{}); err != nil {
			return err
		}
		return g.attach(ctx, t, cs, lab, len(g.VMs))
	})
	do("exec_stream_cut", func() error {
		killed, err := killAgents(g.NetNS)
		if err != nil {
			return err
		}
		// The controller notices and starts a new agent over a new exec.
		_, err = fw.Wait(ctx, 2*time.Minute, func() error {
			pids, err := agentPids(g.NetNS)
			if err != nil {
				return err
			}
			for _, p := range pids {
				if !killed[p] {
					return nil
				}
			}
			return errors.New("no new natgw serve in the pod")
		})
		return err
	})
	do("leader_pod_deleted", func() error {
		l, err := cs.CoordinationV1().Leases(controllerNS).Get(ctx, controllerLease, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
		if err := cs.CoreV1().Pods(controllerNS).Delete(ctx, pod, metav1.DeleteOptions{}); err != nil {
			return err
		}
		// A new leader holds the lease.
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
	})
	do("apiserver_restarted", func() error {
		if err := env.c.Restart(ctx, "kube-apiserver"); err != nil {
			return err
		}
		return env.c.WaitAPI(ctx, 2*time.Minute)
	})
	return out
}

// waitGatewayReady waits for the VpcNatGateway's Ready condition (the
// controller holds a session to its pod).
func waitGatewayReady(ctx context.Context, s *fw.Stack, name string) error {
	gw := &v1.VpcNatGateway{}
	gw.Name = name
	_, err := fw.Wait(ctx, 2*time.Minute, func() error {
		if err := s.Client.Get(ctx, client.ObjectKeyFromObject(gw), gw); err != nil {
			return err
		}
		if r := fw.ReadyOf(gw); r.Status != metav1.ConditionTrue || !r.Current {
			return fmt.Errorf("%s", r)
		}
		return nil
	})
	return err
}

// agentPids lists the `natgw serve` processes running in network
// namespace ns (the far ends of the controller's exec sessions).
func agentPids(ns string) ([]int, error) {
	want, err := os.Readlink(ns)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || !strings.Contains(string(cmd), "natgw\x00serve") {
			continue
		}
		if n, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && n == want {
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
