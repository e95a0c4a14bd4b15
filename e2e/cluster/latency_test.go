package cluster_test

import (
	"fmt"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/nat"
)

// TestLatency measures the real path (clusterstack.Measure, which bench
// scenario 7 runs too): FIP create→Ready through the deployed controller
// and the pod-exec transport, paced and as a burst of 200; and the
// per-request cost of a long-lived exec session (natgw's way) against one
// `kubectl exec` per request (upstream's way), side by side on the same
// gateway pod. Afterwards the pod's namespace holds nothing.
func TestLatency(t *testing.T) {
	fw.ForEachDataplane(t, func(t *testing.T, dp string) {
		name := "l-" + dp[:3]
		s, _, g := readyGateway(t, dp, name, 1)
		sz := clusterstack.DefaultSizes
		var eips []string
		var objs []client.Object
		for _, e := range createEIPs(s, name, 0, sz.Burst) {
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
			Gateway: name, Dataplane: nat.DataplaneName(dp), Pod: g.Pod.Name, EIPs: eips,
			InternalIP: func(i int) string { return fmt.Sprintf("10.250.%d.%d", i/250, i%250+1) },
			Config:     cfg, Client: wc, Clientset: cs, Kubectl: env.c.Kubectl,
		}, sz)
		if err != nil {
			t.Fatal(err)
		}
		left, _, _ := deleteAll(t, s, g, 90*time.Second)
		clusterSummary(t, "latency", dp, append(r.KV(), "leaked_kernel_entries", left)...)
	})
}
