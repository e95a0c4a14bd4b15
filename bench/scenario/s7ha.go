package scenario

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/natgw/natgw/bench/report"
	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/kubeovn"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// s7HAMaxRatio is the HA bound: Create→Ready paced p50 with two
// replicas ÷ with one.
const s7HAMaxRatio = 1.5

// s7HAResult is the paced create→Ready of the same cycle on a provisioned
// single gateway and a provisioned two-replica one.
type s7HAResult struct {
	One, Two []time.Duration
	// Lag is the largest natgw_gateway_standby_lag_seconds of the
	// two-replica gateway scraped from natgw-controller during its cycle;
	// LagScrapes how many scrapes answered (0: not seen).
	Lag        time.Duration
	LagScrapes int
}

// s7 HA lab addressing: Kube-OVN's VPC subnet shares the cluster's pod
// CIDR (the bridge CNI hands out .2-.199, cluster.PodRangeEnd), Kube-OVN's
// IPAM only .240-.254; the lanIps are in that range. The external subnet
// is netlab.ExtNet with the EIPs (netlab.EIP) excluded.
const (
	s7HAVPC       = "vpc-s7ha"
	s7HASubnet    = "subnet-s7ha"
	s7HALanOne    = "10.244.77.250"
	s7HALanTwo    = "10.244.77.253"
	s7HAVPCExcl   = "10.244.77.1..10.244.77.239"
	s7HAVPCGW     = "10.244.77.1"
	s7HAEIPsFirst = "192.0.2.10"
	s7HAEIPsLast  = "192.0.2.209"
)

// s7HA measures, for the nftables data plane, the paced create→Ready
// cycle of Measure (n FIPs, each on its own EIP) on a gateway with one
// replica and on one with two, both provisioned by natgw-controller
// --provision-gateways --ha-gateways (controller/config/ha applied) with
// Kube-OVN's controller giving the pods their addresses; the test plays
// Multus (both replicas' net1 ports of one bridge in an external
// namespace, as TestHAFailoverCluster does). Both gateways run at once and
// their FIPs alternate (clusterstack.MeasurePaced with both targets), so
// the two see the same load. It turns the deployed controller into the
// provisioner: run it after the other measurements.
func s7HA(ctx context.Context, c *cluster.Cluster, cfg cluster.Config, repo string, n int, cl client.WithWatch, logf func(string, ...any)) (_ *s7HAResult, err error) {
	if 2*n > 200 {
		return nil, fmt.Errorf("%d paced FIPs per gateway: want at most 100 (netlab.EIP has 200 addresses)", n)
	}
	image, err := clusterstack.GatewayImage(repo, "nftables")
	if err != nil {
		return nil, err
	}
	pfx, err := netip.ParsePrefix(cfg.PodCIDR)
	if err != nil {
		return nil, fmt.Errorf("pod CIDR %q: %w", cfg.PodCIDR, err)
	}
	k, err := clusterstack.StartKubeOVN(ctx, c, clusterstack.KubeOVNSetup{Repo: repo, Cluster: cfg, Image: image, Network: kubeovn.Network{
		ExternalCIDR: netlab.ExtNet.String(), ExternalGateway: netlab.ExtAddr.String(),
		ExternalExclude: []string{netlab.ExtAddr.String(), s7HAEIPsFirst + ".." + s7HAEIPsLast},
		VPC:             s7HAVPC, VPCSubnet: s7HASubnet, VPCCIDR: pfx.String(), VPCGateway: s7HAVPCGW,
		VPCExclude: []string{s7HAVPCExcl},
	}})
	if err != nil {
		return nil, fmt.Errorf("Kube-OVN: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		err = errors.Join(err, k.Stop(sctx))
	}()
	if err := clusterstack.EnableHAProvisioning(ctx, c, repo, image); err != nil {
		return nil, err
	}
	lab, err := netlab.New(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, lab.Close()) }()
	ext, err := lab.NS("ext-ha")
	if err != nil {
		return nil, err
	}
	if err := netlab.Bridge(ext, "br0"); err != nil {
		return nil, err
	}
	if err := netlab.AddAddr(ext, "br0", netip.PrefixFrom(netlab.ExtAddr, netlab.ExtNet.Bits())); err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
		defer cancel()
		err = errors.Join(err, s7Cleanup(cctx, cl), s7WaitPodsGone(cctx, c, s7HAName(1)), s7WaitPodsGone(cctx, c, s7HAName(2)))
	}()
	var tgs []clusterstack.Target
	for _, replicas := range []int{1, 2} {
		logf("two-replica comparison: a provisioned gateway with %d replica(s), net1 attached, %d EIPs", replicas, n)
		eips, err := s7HAGateway(ctx, c, cl, ext, replicas, (replicas-1)*n, n)
		if err != nil {
			return nil, fmt.Errorf("%d replica(s): %w", replicas, err)
		}
		tgs = append(tgs, clusterstack.Target{
			Gateway: s7HAName(replicas), Dataplane: nat.DataplaneNftables, EIPs: eips, Client: cl,
			InternalIP: func(i int) string { return fmt.Sprintf("10.25%d.%d.%d", replicas, i/250, i%250+1) },
		})
	}
	logf("two-replica comparison: %d paced FIPs on each gateway, alternating", n)
	sctx, stop := context.WithCancel(ctx)
	res := &s7HAResult{}
	var wg sync.WaitGroup
	wg.Go(func() { res.Lag, res.LagScrapes = s7ScrapeLag(sctx, c, s7HAName(2)) })
	ds, err := clusterstack.MeasurePaced(ctx, n, tgs...)
	stop()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	res.One, res.Two = ds[0], ds[1]
	return res, nil
}

// s7HAName is the comparison's gateway of replicas replicas.
func s7HAName(replicas int) string { return fmt.Sprintf("s7ha%d", replicas) }

// s7HAGateway provisions gateway s7HAName(replicas), attaches its pods'
// net1 to ext's br0 and gives it n Ready EIPs (netlab.EIP(first) on); it
// returns their names. s7HA removes it all.
func s7HAGateway(ctx context.Context, c *cluster.Cluster, cl client.WithWatch, ext string, replicas, first, n int) ([]string, error) {
	name := s7HAName(replicas)
	lan := s7HALanOne
	if replicas == 2 {
		lan = s7HALanTwo
	}
	gw := &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1.VpcNatGatewaySpec{Vpc: s7HAVPC, Subnet: s7HASubnet, LanIP: lan, Replicas: ptr.To(int32(replicas))}}
	if err := cl.Create(ctx, gw); err != nil {
		return nil, fmt.Errorf("create VpcNatGateway %s: %w", name, err)
	}
	pods, err := clusterstack.WaitReplicaPods(ctx, c, clusterstack.GatewayNamespace, name, replicas, replicas, false, 4*time.Minute)
	if err != nil {
		return nil, err
	}
	for i, p := range pods {
		if err := clusterstack.AttachBridge(p, netlab.ExtNet.Bits(), ext, fmt.Sprintf("g%d%d", replicas, i), "br0"); err != nil {
			return nil, err
		}
	}
	if replicas == 2 {
		// Both containers Ready: natgw-ha is Ready once the rules are
		// synced (--rules-synced-file), so the pair is formed.
		if _, err := clusterstack.WaitReplicaPods(ctx, c, clusterstack.GatewayNamespace, name, replicas, replicas, true, 2*time.Minute); err != nil {
			return nil, err
		}
	}
	var eips []string
	for i := first; i < first+n; i++ {
		e := &v1.IptablesEIP{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-e%d", name, i)},
			Spec: v1.IptablesEIPSpec{V4ip: netlab.EIP(i).String(), NatGwDp: name}}
		if err := cl.Create(ctx, e); err != nil {
			return nil, fmt.Errorf("create %s: %w", e.Name, err)
		}
		eips = append(eips, e.Name)
	}
	// Every EIP of the comparison so far Ready (those of the gateway set
	// up before this one included).
	if err := s7WaitEIPsReady(ctx, cl, first+n); err != nil {
		return nil, err
	}
	return eips, nil
}

// s7WaitPodsGone waits until gateway gw has no pods at all (terminating
// ones included: clusterstack.ReplicaPods leaves those out).
func s7WaitPodsGone(ctx context.Context, c *cluster.Cluster, gw string) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	for {
		pods, err := cs.CoreV1().Pods(clusterstack.GatewayNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + transport.GatewayAppPrefix + gw})
		if err == nil && len(pods.Items) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gateway %s: pods not gone: %w", gw, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// s7ScrapeLag scrapes natgw-controller's pods' metrics every 100 ms until
// ctx ends and returns the largest natgw_gateway_standby_lag_seconds of
// gateway gw seen and how many scrapes had it.
func s7ScrapeLag(ctx context.Context, c *cluster.Cluster, gw string) (time.Duration, int) {
	cs, err := c.Clientset()
	if err != nil {
		return 0, 0
	}
	hc := &http.Client{Timeout: time.Second}
	var most time.Duration
	seen := 0
	for ctx.Err() == nil {
		pods, err := cs.CoreV1().Pods(clusterstack.ControllerNS).List(ctx, metav1.ListOptions{})
		if err == nil {
			for _, p := range pods.Items {
				if p.Status.PodIP == "" {
					continue
				}
				resp, err := hc.Get("http://" + p.Status.PodIP + ":8080/metrics")
				if err != nil {
					continue
				}
				v, ok, _ := standbyLag(resp.Body, gw)
				_ = resp.Body.Close()
				if ok {
					seen++
					most = max(most, v)
				}
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return most, seen
}

// standbyLag finds gateway gw's natgw_gateway_standby_lag_seconds in a
// Prometheus text exposition (ok false when absent).
func standbyLag(r io.Reader, gw string) (time.Duration, bool, error) {
	prefix := `natgw_gateway_standby_lag_seconds{gateway="` + gw + `"}`
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false, fmt.Errorf("metric %s: no value", prefix)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil || v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, false, fmt.Errorf("metric %s: value %q: want a number of seconds ≥ 0", prefix, f[0])
		}
		return time.Duration(v * float64(time.Second)), true, nil
	}
	return 0, false, sc.Err()
}

// reportS7HA writes the two-replica comparison: its table (paced p50/p99
// for one and two replicas, the ratio, the standby's lag), the target
// (ratio ≤ s7HAMaxRatio) and the summary metrics. notRun, when set, says
// why there is no result.
func reportS7HA(r *report.Report, sec *report.Section, res *s7HAResult, notRun string) {
	tgName := fmt.Sprintf("S7 Create→Ready paced p50 with two replicas ÷ with one (nftables)")
	want := fmt.Sprintf("≤ %.1f", s7HAMaxRatio)
	if res == nil || len(res.One) == 0 || len(res.Two) == 0 {
		sec.Targets = append(sec.Targets, report.Target{Name: tgName, Want: want, Got: "not measured", Reason: notRun})
		return
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	p50one, p50two := clusterstack.Pct(res.One, 50), clusterstack.Pct(res.Two, 50)
	ratio := ms(p50two) / ms(p50one)
	lag := "not seen"
	if res.LagScrapes > 0 {
		lag = fmt.Sprintf("%.1f ms max (%d scrapes)", ms(res.Lag), res.LagScrapes)
	}
	t := report.Table{
		Caption: "**Create→Ready with two replicas** (nftables): the same paced cycle (FIPs one at a time, each on its own EIP, each waited for " +
			"until Ready, `clusterstack.MeasurePaced`) on a gateway of one replica and one of two, running at once, their FIPs alternating, both provisioned by natgw-controller " +
			"`--provision-gateways --ha-gateways` (`controller/config/ha`), Kube-OVN's controller addressing the pods, both replicas' net1 on one " +
			"external bridge. A two-replica FIP is Ready when the active holds it (the exec transport's Pair programs active and standby); " +
			"the standby's lag is natgw-controller's `natgw_gateway_standby_lag_seconds` scraped every 100 ms during the cycle.",
		Header: []string{"replicas", "FIPs", "paced p50", "paced p99", "two ÷ one (p50)", "standby lag"},
		Rows: [][]string{
			{"1", strconv.Itoa(len(res.One)), fmt.Sprintf("%.1f ms", ms(p50one)), fmt.Sprintf("%.1f ms", ms(clusterstack.Pct(res.One, 99))), "", ""},
			{"2", strconv.Itoa(len(res.Two)), fmt.Sprintf("%.1f ms", ms(p50two)), fmt.Sprintf("%.1f ms", ms(clusterstack.Pct(res.Two, 99))), fmt.Sprintf("%.2f", ratio), lag},
		},
	}
	sec.Tables = append(sec.Tables, t)
	sec.Targets = append(sec.Targets, report.Target{Name: tgName, Want: want, Got: fmt.Sprintf("%.2f (%.1f / %.1f ms)", ratio, ms(p50two), ms(p50one)), Pass: ratio <= s7HAMaxRatio})
	r.AddMetric(
		report.NewMetric("s7_ha_fip_ready_paced_p50", "ms", report.LowerIsBetter, ms(p50two), ms(p50one), "one replica"),
		report.NewMetric("s7_ha_fip_ready_paced_p99", "ms", report.LowerIsBetter, ms(clusterstack.Pct(res.Two, 99)), ms(clusterstack.Pct(res.One, 99)), "one replica"),
	)
	if res.LagScrapes > 0 {
		r.AddMetric(report.NewMetric("s7_ha_standby_lag_max", "ms", report.LowerIsBetter, ms(res.Lag), math.NaN(), ""))
	}
}

// s7RunHA runs s7HA when Kube-OVN's controller is built (notRun says why
// not otherwise).
func s7RunHA(ctx context.Context, c *cluster.Cluster, cfg cluster.Config, repo string, n int, logf func(string, ...any)) (*s7HAResult, string, error) {
	kc := clusterstack.KubeOVNSetup{Repo: repo, Cluster: cfg}.KubeOVNConfig(nil)
	if why := kubeovn.Missing(kc); why != "" {
		return nil, why + " (`make kubeovn-assets` builds it)", nil
	}
	_, cl, err := s7Client(c)
	if err != nil {
		return nil, "", err
	}
	res, err := s7HA(ctx, c, cfg, repo, n, cl, logf)
	return res, "", err
}
