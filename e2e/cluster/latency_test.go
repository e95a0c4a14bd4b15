package cluster_test

import (
	"fmt"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/netlab"
)

// TestLatency measures the real path (clusterstack.Measure, which bench
// scenario 7 runs too): FIP create→Ready through the deployed controller
// and the pod-exec transport, paced and as a burst of 200; and the
// per-request cost of a long-lived exec session (natgw's way) against one
// `kubectl exec` per request (upstream's way), side by side on the same
// gateway pod. Afterwards the pod's namespace holds nothing.
func TestLatency(t *testing.T) {
	fw.ForEachDataplane(t, func(t *testing.T, dp string) {
		s := newStack(t, dp)
		lab := netlab.ForTest(t)
		name := "l-" + dp[:3]
		g := startGateway(t, s, lab, name, 1)
		gwObj := &v1.VpcNatGateway{}
		gwObj.Name = name
		s.WaitReady(gwObj)
		sz := clusterstack.DefaultSizes
		var eips []string
		var objs []client.Object
		for i := 0; i < sz.Burst; i++ {
			e := fw.EIP(fmt.Sprintf("%s-e%d", name, i), name, netlab.EIP(i))
			s.Create(e)
			eips = append(eips, e.Name)
			objs = append(objs, e)
		}
		s.WaitReady(objs...)
		cfg, err := env.c.RESTConfig()
		if err != nil {
			t.Fatal(err)
		}
		cfg.QPS, cfg.Burst = 500, 1000 // the controller, not client-go's 5/s, sets the burst's pace
		wc, err := client.NewWithWatch(cfg, client.Options{Scheme: fw.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		cs, err := env.c.Clientset()
		if err != nil {
			t.Fatal(err)
		}
		r, err := clusterstack.Measure(s.Ctx, clusterstack.Target{
			Gateway: name, Dataplane: dp, Pod: g.Pod.Name, EIPs: eips,
			InternalIP: func(i int) string { return fmt.Sprintf("10.250.%d.%d", i/250, i%250+1) },
			Config:     cfg, Client: wc, Clientset: cs, Kubectl: env.c.Kubectl,
		}, sz)
		if err != nil {
			t.Fatal(err)
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
		clusterSummary(t, "latency", dp, append(r.KV(), "leaked_kernel_entries", left)...)
	})
}
