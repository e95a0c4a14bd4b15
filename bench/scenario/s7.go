package scenario

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/natgw/natgw/bench/report"
	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// s7Result is one data plane's measurement.
type s7Result struct {
	dp string
	r  *clusterstack.Result
}

// RunS7 measures the exec path in a real cluster: the single-node
// Kubernetes of internal/cluster with natgw deployed as the cluster e2e
// deploys it (controller/config, two replicas, --transport=exec), one
// gateway pod per data plane, and clusterstack.Measure (what e2e/cluster's
// TestLatency measures): FIP create→Ready paced and as a burst through pod
// exec, and a long-lived exec session's request against one `kubectl exec`
// per request (upstream's way). Last, s7RunHA: the paced create→Ready on a
// provisioned nftables gateway of one replica against one of two (issue
// 23's ratio, target ≤ 1.5).
func RunS7(ctx context.Context, e *Env) error {
	e.Progress.Scenario("scenario 7: the exec path in a real cluster (kubelet, containerd, natgw-controller pods, gateway pods)")
	sec := e.Report.Section("s7", "Scenario 7: the exec path in a real cluster")
	repo, err := cluster.RepoRoot()
	if err != nil {
		sec.NotRun = err.Error()
		return nil
	}
	cfg := cluster.Defaults(cluster.Config{Images: clusterstack.Images(repo), Log: os.Stderr}, repo)
	if why := s7Missing(cfg); why != "" {
		sec.NotRun = why
		return nil
	}
	sz := clusterstack.DefaultSizes
	if e.Quick {
		sz = clusterstack.Sizes{Paced: 30, Burst: 50, SessionReqs: 50, KubectlReqs: 10}
	}
	start := time.Now()
	c, err := cluster.Up(ctx, cfg)
	if err != nil {
		sec.NotRun = fmt.Sprintf("the cluster did not come up: %v", err)
		return fmt.Errorf("scenario 7: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
		defer cancel()
		if err := c.Down(dctx); err != nil {
			e.Progress.Printf("scenario 7: cluster down: %v", err)
		}
	}()
	upIn := time.Since(start)
	if err := clusterstack.DeployController(ctx, c, repo); err != nil {
		sec.NotRun = fmt.Sprintf("natgw-controller not deployed: %v", err)
		return fmt.Errorf("scenario 7: %w", err)
	}
	e.Progress.Printf("cluster up in %v, controller deployed in %v", upIn.Round(time.Millisecond), (time.Since(start) - upIn).Round(time.Millisecond))
	only, err := s7OnlyPart()
	if err != nil {
		sec.NotRun = err.Error()
		return fmt.Errorf("scenario 7: %w", err)
	}
	var results []s7Result
	var errs []error
	for i, dp := range s3Dataplanes {
		if only != "" {
			break
		}
		e.Progress.Printf("[%d/%d] %s: gateway pod, %d EIPs, %d paced FIPs, a burst of %d", i+1, len(s3Dataplanes), dp, sz.Burst, sz.Paced, sz.Burst)
		r, err := s7Dataplane(ctx, c, repo, dp, sz)
		if err != nil {
			errs = append(errs, fmt.Errorf("scenario 7, %s data plane: %w", dp, err))
			continue
		}
		results = append(results, s7Result{dp: dp, r: r})
	}
	if only == "" {
		reportS7(e.Report, sec, results, upIn)
	} else {
		sec.Notes = append(sec.Notes, s7OnlyEnv+"="+only+": only the held-sessions part ran (development).")
	}
	ssz := s7SessSizes{Pods: 0, FIPs: 1, Window: 30 * time.Second}
	if e.Quick {
		ssz = s7SessSizes{Pods: 10, FIPs: 1, Window: 10 * time.Second}
	}
	// The two-replica comparison follows on this cluster: it needs the
	// part's pods gone.
	ssz.WaitGone = only == ""
	e.Progress.Printf("held sessions: gateway pods through the exec transport (%s), kube-apiserver and kubelet per session, a kube-apiserver restart", s7SessPodsText(ssz.Pods))
	sess, err := s7RunSessions(ctx, c, repo, ssz, e.Progress.Printf)
	sessNotRun := ""
	if err != nil {
		errs = append(errs, fmt.Errorf("scenario 7, held sessions: %w", err))
		sess, sessNotRun = nil, err.Error()
	}
	reportS7Sessions(e.Report, sec, sess, sessNotRun)
	if only != "" {
		return errors.Join(errs...)
	}
	// Last: it turns the deployed controller into the provisioner.
	e.Progress.Printf("two-replica comparison (nftables): Kube-OVN's controller, natgw-controller --provision-gateways --ha-gateways, %d paced FIPs on a gateway of one replica and one of two, alternating", sz.Paced)
	ha, notRun, err := s7RunHA(ctx, c, cfg, repo, sz.Paced, e.Progress.Printf)
	if err != nil {
		errs = append(errs, fmt.Errorf("scenario 7, two replicas: %w", err))
		notRun = err.Error()
	}
	reportS7HA(e.Report, sec, ha, notRun)
	return errors.Join(errs...)
}

// s7Missing says what the cluster needs that is not built ("" when
// nothing).
func s7Missing(cfg cluster.Config) string {
	if why := cluster.Missing(cfg); why != "" {
		return why + " (`make cluster-assets image cluster-images` builds it)"
	}
	if why := netlab.Unavailable(); why != "" {
		return why
	}
	for _, img := range cfg.Images {
		if _, err := os.Stat(img); err != nil {
			return img + " missing (`make image cluster-images` builds it)"
		}
	}
	return ""
}

// s7Dataplane starts gateway "s7-<dp>" (its StatefulSet, net1 attached as
// Multus would to an external namespace, the VpcNatGateway, sz.Burst
// EIPs), measures it and removes it all.
func s7Dataplane(ctx context.Context, c *cluster.Cluster, repo, dp string, sz clusterstack.Sizes) (_ *clusterstack.Result, err error) {
	name := "s7-" + dp[:3]
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	rc, cl, err := s7Client(c)
	if err != nil {
		return nil, err
	}
	image, err := clusterstack.GatewayImage(repo, dp)
	if err != nil {
		return nil, err
	}
	sts := clusterstack.GatewayStatefulSet(name, image)
	if _, err := cs.AppsV1().StatefulSets(clusterstack.GatewayNamespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create statefulset: %w", err)
	}
	lab, err := netlab.New(ctx)
	if err != nil {
		return nil, err
	}
	gw := &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{reconciler.DataplaneAnnotation: dp}},
		Spec: v1.VpcNatGatewaySpec{Vpc: "vpc-" + name, Subnet: "subnet-" + name}}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		err = errors.Join(err, s7Cleanup(cctx, cl), s7DeleteStatefulSet(cctx, c, sts.Name, name), lab.Close())
	}()
	pod, err := clusterstack.WaitGatewayPod(ctx, cs, name, nil, 2*time.Minute)
	if err != nil {
		return nil, err
	}
	pid, err := clusterstack.ContainerPid(ctx, c, pod)
	if err != nil {
		return nil, err
	}
	ext, err := lab.NS("ext-" + dp)
	if err != nil {
		return nil, err
	}
	if err := netlab.Veth(
		netlab.End{NS: fmt.Sprintf("/proc/%d/ns/net", pid), Name: "net1", Addrs: []netip.Prefix{netip.PrefixFrom(netlab.GWExtAddr, netlab.ExtNet.Bits())}},
		netlab.End{NS: ext, Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(netlab.ExtAddr, netlab.ExtNet.Bits())}},
	); err != nil {
		return nil, fmt.Errorf("attach net1: %w", err)
	}
	if err := cl.Create(ctx, gw); err != nil {
		return nil, fmt.Errorf("create VpcNatGateway: %w", err)
	}
	var eips []string
	for i := 0; i < sz.Burst; i++ {
		e := &v1.IptablesEIP{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-e%d", name, i)},
			Spec: v1.IptablesEIPSpec{V4ip: netlab.EIP(i).String(), NatGwDp: name}}
		if err := cl.Create(ctx, e); err != nil {
			return nil, fmt.Errorf("create %s: %w", e.Name, err)
		}
		eips = append(eips, e.Name)
	}
	if err := s7WaitEIPsReady(ctx, cl, len(eips)); err != nil {
		return nil, err
	}
	return clusterstack.Measure(ctx, clusterstack.Target{
		Gateway: name, Dataplane: nat.DataplaneName(dp), Pod: pod.Name, EIPs: eips,
		InternalIP: func(i int) string { return fmt.Sprintf("10.250.%d.%d", i/250, i%250+1) },
		Config:     rc, Client: cl, Clientset: cs, Kubectl: c.Kubectl,
	}, sz)
}

// s7Client is the measurement's client of c: natgw's kinds, no
// client-side rate limit to speak of (the controller, not client-go's 5/s,
// sets the pace).
func s7Client(c *cluster.Cluster) (*rest.Config, client.WithWatch, error) {
	rc, err := c.RESTConfig()
	if err != nil {
		return nil, nil, err
	}
	rc.QPS, rc.Burst = 500, 1000
	scheme, err := v1.NewScheme()
	if err != nil {
		return nil, nil, err
	}
	cl, err := client.NewWithWatch(rc, client.Options{Scheme: scheme})
	if err != nil {
		return nil, nil, err
	}
	return rc, cl, nil
}

func s7WaitEIPsReady(ctx context.Context, cl client.Client, n int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var l v1.IptablesEIPList
		if err := cl.List(ctx, &l); err != nil {
			return err
		}
		ready := 0
		for _, e := range l.Items {
			if e.Status.Ready {
				ready++
			}
		}
		if ready >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d EIPs Ready after 2m", ready, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// s7Cleanup deletes the FIPs, the EIPs and the gateway, in that order,
// each kind waited for (the controller's finalizers released).
func s7Cleanup(ctx context.Context, cl client.Client) error {
	for _, k := range []struct {
		obj  client.Object
		list client.ObjectList
	}{
		{&v1.IptablesFIPRule{}, &v1.IptablesFIPRuleList{}},
		{&v1.IptablesEIP{}, &v1.IptablesEIPList{}},
		{&v1.VpcNatGateway{}, &v1.VpcNatGatewayList{}},
	} {
		if err := cl.DeleteAllOf(ctx, k.obj); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %T: %w", k.obj, err)
		}
		for {
			if err := cl.List(ctx, k.list); err != nil {
				return err
			}
			if meta.LenList(k.list) == 0 {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%T not gone: %w", k.obj, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// s7DeleteStatefulSet deletes the gateway's StatefulSet and waits for its
// pods to be gone.
func s7DeleteStatefulSet(ctx context.Context, c *cluster.Cluster, sts, gw string) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	err = cs.AppsV1().StatefulSets(clusterstack.GatewayNamespace).Delete(ctx, sts, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete statefulset %s: %w", sts, err)
	}
	for {
		pods, err := cs.CoreV1().Pods(clusterstack.GatewayNamespace).List(ctx, metav1.ListOptions{LabelSelector: transport.GatewayPodSelector(gw).String()})
		if err == nil && len(pods.Items) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("statefulset %s: pods not gone: %w", sts, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// reportS7 writes the table and the metrics: create→Ready per data plane,
// and the per-request cost of the exec session against kubectl exec (the
// ratio is how many times cheaper a request on the long-lived session is).
func reportS7(r *report.Report, sec *report.Section, results []s7Result, upIn time.Duration) {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	f := func(d time.Duration) string {
		if d >= time.Second {
			return fmt.Sprintf("%.2f s", d.Seconds())
		}
		return fmt.Sprintf("%.1f ms", ms(d))
	}
	sec.Text = append(sec.Text,
		"natgw as users deploy it, in the single-node Kubernetes of `internal/cluster` (kubelet, containerd, runc, bridge CNI; "+
			"cluster up in "+upIn.Round(time.Millisecond).String()+"): natgw-controller from its image with `controller/config` "+
			"(two replicas, leader election, `--transport=exec`), one gateway pod per data plane in upstream's StatefulSet shape. "+
			"The same measurement as the cluster e2e's `TestLatency` (`internal/clusterstack.Measure`).")
	t := report.Table{
		Caption: "**FIP create→Ready through pod exec** (from the Create call to the Ready condition seen on one watch), and **one request's cost**: " +
			"an info request on a long-lived exec session (`natgw serve` started once) against one `kubectl exec` per request " +
			"(upstream's way: `nat-gateway.sh get-iptables-version` in the same pod).",
		Header: []string{"data plane", "paced p50", "paced p99", "burst p50", "burst p99", "burst all Ready", "session open", "session req p50", "session req p99", "kubectl exec p50", "kubectl exec p99", "kubectl / session"},
	}
	for _, res := range results {
		x := res.r
		sp50, kp50 := clusterstack.Pct(x.SessionReq, 50), clusterstack.Pct(x.KubectlReq, 50)
		ratio := report.Advantage(ms(sp50), ms(kp50), false)
		t.Rows = append(t.Rows, []string{res.dp,
			f(clusterstack.Pct(x.Paced, 50)), f(clusterstack.Pct(x.Paced, 99)),
			f(clusterstack.Pct(x.Burst, 50)), f(clusterstack.Pct(x.Burst, 99)), f(x.BurstAll),
			f(x.SessionOpen), f(sp50), f(clusterstack.Pct(x.SessionReq, 99)), f(kp50), f(clusterstack.Pct(x.KubectlReq, 99)),
			fmt.Sprintf("%.0f×", ratio)})
		p := "s7_" + res.dp + "_"
		r.AddMetric(
			report.NewMetric(p+"fip_ready_paced_p50", "ms", report.LowerIsBetter, ms(clusterstack.Pct(x.Paced, 50)), math.NaN(), ""),
			report.NewMetric(p+"fip_ready_paced_p99", "ms", report.LowerIsBetter, ms(clusterstack.Pct(x.Paced, 99)), math.NaN(), ""),
			report.NewMetric(p+"fip_ready_burst_p50", "ms", report.LowerIsBetter, ms(clusterstack.Pct(x.Burst, 50)), math.NaN(), ""),
			report.NewMetric(p+"fip_ready_burst_p99", "ms", report.LowerIsBetter, ms(clusterstack.Pct(x.Burst, 99)), math.NaN(), ""),
			report.NewMetric(p+"exec_request_p50", "ms", report.LowerIsBetter, ms(sp50), ms(kp50), "kubectl exec per request"),
		)
	}
	sec.Tables = append(sec.Tables, t)
	if len(results) > 0 {
		x := results[0].r
		sec.Notes = append(sec.Notes, fmt.Sprintf("%d paced FIPs, a burst of %d (8 creating goroutines), %d session requests, %d kubectl execs per data plane.",
			x.Sizes.Paced, x.Sizes.Burst, x.Sizes.SessionReqs, x.Sizes.KubectlReqs))
	}
}

// s7OnlyEnv names the variable that runs one part of scenario 7 alone
// (development): "sessions" runs only the held-sessions part.
const s7OnlyEnv = "NATGW_BENCH_S7"

// s7OnlyPart returns the part s7OnlyEnv selects ("" when unset: all).
func s7OnlyPart() (string, error) {
	switch v := os.Getenv(s7OnlyEnv); v {
	case "", "sessions":
		return v, nil
	default:
		return "", fmt.Errorf("%s %q: want \"sessions\" or unset", s7OnlyEnv, v)
	}
}
