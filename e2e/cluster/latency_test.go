package cluster_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/transport"
	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/netlab"
)

// Latency measurement sizes: paced FIPs (one at a time, each waited for)
// and the burst (all created at once).
const (
	pacedFIPs   = 30
	burstFIPs   = 200
	sessionReqs = 200
	kubectlReqs = 20
)

// readyWatch records when each FIP of the cluster is first seen Ready (for
// its current generation), from one watch.
type readyWatch struct {
	mu    sync.Mutex
	ready map[string]time.Time
	w     watch.Interface
}

func startReadyWatch(t *testing.T, s *fw.Stack) *readyWatch {
	t.Helper()
	cfg, err := env.c.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	wc, err := client.NewWithWatch(cfg, client.Options{Scheme: fw.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	w, err := wc.Watch(s.Ctx, &v1.IptablesFIPRuleList{})
	if err != nil {
		t.Fatal(err)
	}
	rw := &readyWatch{ready: map[string]time.Time{}, w: w}
	go func() {
		for ev := range w.ResultChan() {
			fip, ok := ev.Object.(*v1.IptablesFIPRule)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			if r := fw.ReadyOf(fip); r.Current && r.Status == metav1.ConditionTrue {
				now := time.Now()
				rw.mu.Lock()
				if _, seen := rw.ready[fip.Name]; !seen {
					rw.ready[fip.Name] = now
				}
				rw.mu.Unlock()
			}
		}
	}()
	t.Cleanup(w.Stop)
	return rw
}

// wait returns when name was seen Ready (at most timeout).
func (rw *readyWatch) wait(ctx context.Context, name string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		rw.mu.Lock()
		at, ok := rw.ready[name]
		rw.mu.Unlock()
		if ok {
			return at, nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("FIP %s not Ready within %v", name, timeout)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// pct returns the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p/100*float64(len(s))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(s) {
		i = len(s) - 1
	}
	return s[i]
}

// TestLatency measures the real path: FIP create→Ready through the deployed
// controller and the pod-exec transport, paced and as a burst of 200; and
// the per-request cost of a long-lived exec session (natgw's way) against
// one `kubectl exec` per request (upstream's way), side by side on the same
// gateway pod.
func TestLatency(t *testing.T) {
	fw.ForEachDataplane(t, func(t *testing.T, dp string) {
		s := newStack(t, dp)
		lab := netlab.ForTest(t)
		name := "l-" + dp[:3]
		g := startGateway(t, s, lab, name, 1)
		gwObj := &v1.VpcNatGateway{}
		gwObj.Name = name
		s.WaitReady(gwObj)
		var eips []*v1.IptablesEIP
		for i := 0; i < burstFIPs; i++ {
			e := fw.EIP(fmt.Sprintf("%s-e%d", name, i), name, netlab.EIP(i))
			s.Create(e)
			eips = append(eips, e)
		}
		for _, e := range eips {
			s.WaitReady(e)
		}
		rw := startReadyWatch(t, s)
		internal := func(i int) string { return fmt.Sprintf("10.250.%d.%d", i/250, i%250+1) }
		fip := func(tag string, i int) *v1.IptablesFIPRule {
			f := fw.FIP(fmt.Sprintf("%s-%s%d", name, tag, i), eips[i].Name, g.VMs[0].Addr)
			f.Spec.InternalIP = internal(i)
			return f
		}

		// Paced: one FIP at a time, each waited for.
		var paced []time.Duration
		for i := 0; i < pacedFIPs; i++ {
			f := fip("p", i)
			start := time.Now()
			s.Create(f)
			at, err := rw.wait(s.Ctx, f.Name, 30*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			paced = append(paced, at.Sub(start))
		}
		if err := s.Client.DeleteAllOf(s.Ctx, &v1.IptablesFIPRule{}); err != nil {
			t.Fatal(err)
		}
		fw.Eventually(t, s.Ctx, time.Minute, "paced FIPs gone", func() error {
			var l v1.IptablesFIPRuleList
			if err := s.Client.List(s.Ctx, &l); err != nil {
				return err
			}
			if len(l.Items) > 0 {
				return fmt.Errorf("%d FIPs left", len(l.Items))
			}
			return nil
		})

		// Burst: every FIP at once (8 creating goroutines).
		starts := make([]time.Time, burstFIPs)
		var wg sync.WaitGroup
		burstStart := time.Now()
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := w; i < burstFIPs; i += 8 {
					f := fip("b", i)
					starts[i] = time.Now()
					if err := s.Client.Create(s.Ctx, f); err != nil {
						t.Errorf("create %s: %v", f.Name, err)
					}
				}
			}(w)
		}
		wg.Wait()
		var burst []time.Duration
		var last time.Time
		for i := 0; i < burstFIPs; i++ {
			at, err := rw.wait(s.Ctx, fip("b", i).Name, 2*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			burst = append(burst, at.Sub(starts[i]))
			if at.After(last) {
				last = at
			}
		}
		burstAll := last.Sub(burstStart)

		// Per-request cost: a long-lived exec session of our own to the
		// same pod (info requests: no kernel change behind the
		// controller's back) against one kubectl exec per request.
		cfg, err := env.c.RESTConfig()
		if err != nil {
			t.Fatal(err)
		}
		cs, err := env.c.Clientset()
		if err != nil {
			t.Fatal(err)
		}
		ex := &transport.Exec{Config: cfg, Client: cs, Namespace: gatewayNamespace, Command: "/natgw", Log: logr.Discard()}
		openStart := time.Now()
		sess, err := ex.Open(s.Ctx, transport.Gateway{Name: name, Dataplane: dp})
		if err != nil {
			t.Fatal(err)
		}
		openIn := time.Since(openStart)
		var sessReq []time.Duration
		for i := 0; i < sessionReqs; i++ {
			st := time.Now()
			if _, err := sess.Info(s.Ctx); err != nil {
				t.Fatal(err)
			}
			sessReq = append(sessReq, time.Since(st))
		}
		if err := sess.Close(); err != nil {
			t.Errorf("close session: %v", err)
		}
		var kubectlReq []time.Duration
		for i := 0; i < kubectlReqs; i++ {
			st := time.Now()
			if _, err := env.c.Kubectl(s.Ctx, nil, "-n", gatewayNamespace, "exec", g.Pod.Name, "-c", transport.GatewayContainer,
				"--", "/kube-ovn/nat-gateway.sh", "get-iptables-version"); err != nil {
				t.Fatal(err)
			}
			kubectlReq = append(kubectlReq, time.Since(st))
		}
		s.DeleteAll(90 * time.Second)
		k, err := fw.ReadKernel(s.Ctx, g.Gateway, dp)
		if err != nil {
			t.Fatal(err)
		}
		left := k.Count() + len(k.EIPAddrs())
		if left > 0 {
			t.Errorf("%d entries and EIP addresses %v left in the pod's namespace", k.Count(), k.EIPAddrs())
		}
		clusterSummary(t, "latency", dp,
			"paced_n", pacedFIPs, "paced_ready_p50", pct(paced, 50), "paced_ready_p99", pct(paced, 99),
			"burst_n", burstFIPs, "burst_ready_p50", pct(burst, 50), "burst_ready_p99", pct(burst, 99), "burst_all_ready_in", burstAll,
			"exec_session_open", openIn, "exec_session_req_p50", pct(sessReq, 50), "exec_session_req_p99", pct(sessReq, 99),
			"kubectl_exec_req_p50", pct(kubectlReq, 50), "kubectl_exec_req_p99", pct(kubectlReq, 99),
			"leaked_kernel_entries", left)
	})
}
