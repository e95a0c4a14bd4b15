package scenario

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/natgw/natgw/bench/report"
	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/procfs"
)

// The row for held exec sessions: at least s7SessMinPods gateway
// pods at full size, every one connected again within s7SessMaxReconnect
// of the API server answering after its restart.
const (
	s7SessMinPods      = 50
	s7SessMaxReconnect = 10 * time.Second
	// s7SessMaxPods bounds the node's capacity: netlab.EIP has 200
	// addresses, one per gateway.
	s7SessMaxPods = 190
	// s7LeaseName is natgw-controller's leader election lease
	// (controller/cmd/natgw-controller: LeaderElectionID).
	s7LeaseName = "natgw-controller.kubeovn.io"
)

// s7SessSizes is the size of the held-sessions part.
type s7SessSizes struct {
	// Pods is the number of gateway pods; 0: as many as the node holds
	// (its allocatable pods less those it runs), at least s7SessMinPods.
	Pods int
	// FIPs per gateway (each gateway has one EIP, and an EIP holds one
	// floating IP: more than 1 leaves the others refused, Conflict).
	FIPs int
	// Window is how long CPU time is measured in each state.
	Window time.Duration
	// WaitGone makes the clean-up wait until the part's gateway pods are
	// gone (another part follows on the same cluster); without it the
	// StatefulSets are deleted and the cluster's tear-down stops what is
	// left (190 pods took more than 5 min to go on this 2-core machine).
	WaitGone bool
}

// procUse is one process's use in one state.
type procUse struct {
	// CPU is CPU time ÷ wall time over the window (1 = one core busy).
	CPU float64
	// RSS is VmRSS (bytes) at the window's end.
	RSS float64
}

// s7Load is kube-apiserver's and kubelet's use in one state, with the
// machine's load average when its window ended.
type s7Load struct {
	APIServer, Kubelet procUse
	LoadAvg            string
}

// s7SessResult is what the held-sessions part measured.
type s7SessResult struct {
	N, FIPs int
	Window  time.Duration
	// Idle: no gateway pod; Pods: the N gateway pods running, no session;
	// Held: the N pods, a session held to each.
	Idle, Pods, Held s7Load
	// ConnectAll is from the VpcNatGateways' creation to every gateway
	// connected.
	ConnectAll time.Duration
	// APIDown is from the restart's start to the API server answering
	// /readyz again; Reconnect from then to every gateway connected again
	// (a new agent in its pod and natgw_gateway_connected 1).
	APIDown, Reconnect time.Duration
	// ReconnectErr says why not every gateway reconnected ("" when all did).
	ReconnectErr string
	// Lost is the nftables ruleset lines of the gateway pods gone after
	// the reconnect; Rewritten how many pods' rulesets (with handles)
	// changed at all.
	Lost, Rewritten int
	// APIWrites is how many of natgw's objects (gateways, EIPs, FIPs)
	// changed resourceVersion across the restart; Resyncs the full syncs
	// natgw-controller sent (natgw_resyncs_total, every reason) and
	// Reconnects its natgw_transport_reconnects_total, both as deltas.
	APIWrites           int
	Resyncs, Reconnects float64
	// ResyncReasons is Resyncs by natgw_resyncs_total's reason label
	// ("bootid": a controller process's first connect to the agent).
	ResyncReasons map[string]float64
	// LeaderBefore and LeaderAfter are the leader election lease's holder
	// (pod name and process id) before and after the restart.
	LeaderBefore, LeaderAfter string
	// ControllerRestarts is how many times the controller pods' containers
	// restarted across the API server's restart (a leader that lost its
	// lease exits).
	ControllerRestarts int
	// CleanupErr says what the clean-up after the measurement failed at
	// ("" when nothing): it does not void the figures.
	CleanupErr string
}

// perSession is the cost of one session: (with − without) ÷ n (NaN when n
// is not positive).
func perSession(with, without float64, n int) float64 {
	if n <= 0 {
		return math.NaN()
	}
	return (with - without) / float64(n)
}

// cpuCores is CPU time used between two samples ÷ the wall time between
// them (NaN when wall is not positive or the CPU time went backwards: the
// process was replaced).
func cpuCores(before, after, wall time.Duration) float64 {
	if wall <= 0 || after < before {
		return math.NaN()
	}
	return float64(after-before) / float64(wall)
}

// linesLost counts the lines of before that after does not hold (as a
// multiset: a line twice before and once after is one lost).
func linesLost(before, after string) int {
	have := map[string]int{}
	for _, l := range strings.Split(after, "\n") {
		have[strings.TrimSpace(l)]++
	}
	lost := 0
	for _, l := range strings.Split(before, "\n") {
		l = strings.TrimSpace(l)
		if l == "" {
			continue
		}
		if have[l] > 0 {
			have[l]--
			continue
		}
		lost++
	}
	return lost
}

// changedVersions counts the names of before whose resourceVersion in
// after differs (a name gone counts).
func changedVersions(before, after map[string]string) int {
	n := 0
	for k, v := range before {
		if after[k] != v {
			n++
		}
	}
	return n
}

// s7SessName is the held-sessions part's gateway i.
func s7SessName(i int) string { return fmt.Sprintf("s7s%03d", i) }

// s7SessPod is one gateway pod of the part.
type s7SessPod struct {
	Gateway, Pod string
	NetNS        string // /proc/PID/ns/net of its container
	NSLink       string // readlink of NetNS (net:[inode])
}

// s7RunSessions is the held-sessions part of scenario 7: N
// gateway pods in upstream's StatefulSet shape (as many as the node holds
// at full size), each with one EIP and sz.FIPs FIPs through natgw-controller's
// exec transport; kube-apiserver's and kubelet's CPU and memory with no
// gateway pod, with the N pods and no session, and with a session held to
// each; then kube-apiserver restarted and the time from it answering again
// until every gateway is connected again, with what the restart cost
// (rules lost, rulesets rewritten, API writes, resyncs).
func s7RunSessions(ctx context.Context, c *cluster.Cluster, repo string, sz s7SessSizes, logf func(string, ...any)) (res *s7SessResult, err error) {
	cfg := c.Config()
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	_, cl, err := s7Client(c)
	if err != nil {
		return nil, err
	}
	image, err := clusterstack.GatewayImage(repo, "nftables")
	if err != nil {
		return nil, err
	}
	n := sz.Pods
	if n == 0 {
		if n, err = s7NodeRoom(ctx, cs, cfg.NodeName); err != nil {
			return nil, err
		}
		n = min(n, s7SessMaxPods)
		if n < s7SessMinPods {
			return nil, fmt.Errorf("node %s holds %d more pods, want at least %d", cfg.NodeName, n, s7SessMinPods)
		}
	}
	res = &s7SessResult{N: n, FIPs: sz.FIPs, Window: sz.Window}
	pids := func() (int, int, error) { return s7DaemonPids(cfg) }

	logf("held sessions: idle (no gateway pod), %v window", sz.Window)
	if res.Idle, err = s7MeasureLoad(ctx, pids, sz.Window); err != nil {
		return nil, err
	}
	logf("held sessions: idle: %s", res.Idle)

	lab, err := netlab.New(ctx)
	if err != nil {
		return nil, err
	}
	measured := false
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		cerr := errors.Join(s7Cleanup(cctx, cl), s7SessDeletePods(cctx, cs, n, sz.WaitGone), lab.Close())
		switch {
		case cerr == nil:
		case measured && err == nil:
			// The figures stand; the report says what the clean-up left.
			res.CleanupErr = cerr.Error()
			logf("held sessions: clean-up: %v", cerr)
		default:
			err = errors.Join(err, cerr)
		}
	}()
	ext, err := lab.NS("ext-sess")
	if err != nil {
		return nil, err
	}
	logf("held sessions: %d gateway pods", n)
	start := time.Now()
	if err := s7SessCreatePods(ctx, cs, image, n); err != nil {
		return nil, err
	}
	pods, err := s7SessWaitPods(ctx, c, cs, n, 10*time.Minute)
	if err != nil {
		return nil, err
	}
	for i, p := range pods {
		if err := netlab.Veth(
			netlab.End{NS: p.NetNS, Name: "net1", Addrs: []netip.Prefix{netip.PrefixFrom(netlab.GWExtAddr, netlab.ExtNet.Bits())}},
			netlab.End{NS: ext, Name: fmt.Sprintf("g%d", i)},
		); err != nil {
			return nil, fmt.Errorf("pod %s: attach net1: %w", p.Pod, err)
		}
	}
	logf("held sessions: %d pods running in %v; pods without sessions, %v window", n, time.Since(start).Round(time.Millisecond), sz.Window)
	if res.Pods, err = s7MeasureLoad(ctx, pids, sz.Window); err != nil {
		return nil, err
	}
	logf("held sessions: %d pods, no session: %s", n, res.Pods)

	mc := &s7Metrics{cs: cs, hc: &http.Client{Timeout: time.Second}}
	start = time.Now()
	if err := s7SessCreateObjects(ctx, cl, n, sz.FIPs); err != nil {
		return nil, err
	}
	if _, err := s7SessWaitConnected(ctx, mc, pods, nil, 5*time.Minute); err != nil {
		return nil, err
	}
	res.ConnectAll = time.Since(start)
	if err := s7SessWaitReady(ctx, cl, n, n*sz.FIPs, 3*time.Minute); err != nil {
		return nil, err
	}
	logf("held sessions: %d gateways connected in %v, every EIP and FIP Ready; sessions held, %v window", n, res.ConnectAll.Round(time.Millisecond), sz.Window)
	if res.Held, err = s7MeasureLoad(ctx, pids, sz.Window); err != nil {
		return nil, err
	}
	logf("held sessions: %d sessions held: %s", n, res.Held)

	logf("held sessions: restarting kube-apiserver")
	if err := s7SessRestart(ctx, c, cs, cl, mc, pods, res); err != nil {
		return res, err
	}
	measured = true
	logf("held sessions: API down %v, reconnect all %v (%s), %d rule lines lost, %d rulesets rewritten, %d API writes, resyncs %s, %d controller restarts, leader %q → %q",
		res.APIDown.Round(time.Millisecond), res.Reconnect.Round(time.Millisecond), cmp.Or(res.ReconnectErr, "all"), res.Lost, res.Rewritten, res.APIWrites,
		s7ResyncsText(res.Resyncs, res.ResyncReasons), res.ControllerRestarts, res.LeaderBefore, res.LeaderAfter)
	return res, nil
}

// String is the load's figures for the progress log.
func (l s7Load) String() string {
	return fmt.Sprintf("kube-apiserver CPU %.1f %% VmRSS %.1f MiB, kubelet CPU %.1f %% VmRSS %.1f MiB (load %s)",
		100*l.APIServer.CPU, l.APIServer.RSS/(1<<20), 100*l.Kubelet.CPU, l.Kubelet.RSS/(1<<20), l.LoadAvg)
}

// s7SessRestart restarts kube-apiserver and fills res's restart figures.
// A gateway that did not reconnect within 5 minutes is in
// res.ReconnectErr, not an error.
func s7SessRestart(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, cl client.Client, mc *s7Metrics, pods []s7SessPod, res *s7SessResult) error {
	rulesBefore, handlesBefore, err := s7SessRulesets(ctx, pods)
	if err != nil {
		return err
	}
	versBefore, err := s7SessVersions(ctx, cl)
	if err != nil {
		return err
	}
	restartsBefore, err := s7ControllerRestarts(ctx, cs)
	if err != nil {
		return err
	}
	mBefore, err := mc.scrape(ctx)
	if err != nil {
		return err
	}
	agentsBefore, err := s7Agents()
	if err != nil {
		return err
	}
	res.LeaderBefore = s7Leader(ctx, cs)
	begin := time.Now()
	if err := c.Restart(ctx, "kube-apiserver"); err != nil {
		return err
	}
	if err := c.WaitAPI(ctx, 2*time.Minute); err != nil {
		return err
	}
	res.APIDown = time.Since(begin)
	if res.Reconnect, err = s7SessWaitConnected(ctx, mc, pods, agentsBefore, 5*time.Minute); err != nil {
		res.ReconnectErr = err.Error()
	}
	// What the reconnect cost, once it settled: the reconnect's converge
	// (and the controller's resweep after it) done.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(6 * time.Second):
	}
	rulesAfter, handlesAfter, err := s7SessRulesets(ctx, pods)
	if err != nil {
		return err
	}
	for i := range pods {
		res.Lost += linesLost(rulesBefore[i], rulesAfter[i])
		if handlesBefore[i] != handlesAfter[i] {
			res.Rewritten++
		}
	}
	versAfter, err := s7SessVersions(ctx, cl)
	if err != nil {
		return err
	}
	res.APIWrites = changedVersions(versBefore, versAfter)
	mAfter, err := mc.scrape(ctx)
	if err != nil {
		return err
	}
	var gws []string
	for _, p := range pods {
		gws = append(gws, p.Gateway)
	}
	res.ResyncReasons, res.Reconnects = s7CounterDeltas(mBefore, mAfter, gws)
	for _, v := range res.ResyncReasons {
		res.Resyncs += v
	}
	res.LeaderAfter = s7Leader(ctx, cs)
	restartsAfter, err := s7ControllerRestarts(ctx, cs)
	if err != nil {
		return err
	}
	res.ControllerRestarts = restartsAfter - restartsBefore
	return nil
}

// s7NodeRoom is how many more pods node holds: its allocatable pods less
// the pods bound to it that have not ended, less one spare.
func s7NodeRoom(ctx context.Context, cs kubernetes.Interface, node string) (int, error) {
	nd, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return 0, fmt.Errorf("node %s: %w", node, err)
	}
	pods, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return 0, fmt.Errorf("pods of node %s: %w", node, err)
	}
	used := 0
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			used++
		}
	}
	return int(nd.Status.Allocatable.Pods().Value()) - used - 1, nil
}

// s7DaemonPids finds the lab's kube-apiserver and kubelet (one lab per
// machine: internal/cluster's lock), by the arguments internal/cluster
// starts them with.
func s7DaemonPids(cfg cluster.Config) (api, kubelet int, err error) {
	if api, err = procfs.FindOne("kube-apiserver", fmt.Sprintf("--secure-port=%d", cfg.APIPort)); err != nil {
		return 0, 0, err
	}
	if kubelet, err = procfs.FindOne("kubelet", "--config="+filepath.Join(cfg.Base, "kubelet/config.yaml")); err != nil {
		return 0, 0, err
	}
	return api, kubelet, nil
}

// s7MeasureLoad samples both daemons' CPU time at the start and the end of
// window, and their VmRSS at the end.
func s7MeasureLoad(ctx context.Context, pids func() (int, int, error), window time.Duration) (s7Load, error) {
	api, kubelet, err := pids()
	if err != nil {
		return s7Load{}, err
	}
	var c0 [2]time.Duration
	for i, p := range []int{api, kubelet} {
		if c0[i], err = procfs.CPUTime(p); err != nil {
			return s7Load{}, fmt.Errorf("pid %d: %w", p, err)
		}
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return s7Load{}, ctx.Err()
	case <-time.After(window):
	}
	var out [2]procUse
	wall := time.Since(t0)
	for i, p := range []int{api, kubelet} {
		c1, err := procfs.CPUTime(p)
		if err != nil {
			return s7Load{}, fmt.Errorf("pid %d: %w", p, err)
		}
		rss, _, err := procfs.Memory(p)
		if err != nil {
			return s7Load{}, err
		}
		out[i] = procUse{CPU: cpuCores(c0[i], c1, wall), RSS: rss}
	}
	la, _ := procfs.LoadAverage() // "" when unreadable
	return s7Load{APIServer: out[0], Kubelet: out[1], LoadAvg: la}, nil
}

// s7SessCreatePods creates the part's n gateway StatefulSets (8 at a time).
func s7SessCreatePods(ctx context.Context, cs kubernetes.Interface, image string, n int) error {
	return s7Parallel(n, 8, func(i int) error {
		sts := clusterstack.GatewayStatefulSet(s7SessName(i), image)
		if _, err := cs.AppsV1().StatefulSets(clusterstack.GatewayNamespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create statefulset %s: %w", sts.Name, err)
		}
		return nil
	})
}

// s7Parallel runs fn(0..n-1), workers at a time, and joins their errors.
func s7Parallel(n, workers int, fn func(i int) error) error {
	var mu sync.Mutex
	var errs []error
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

// s7SessWaitPods waits until each of the n gateways has a running pod and
// returns them with their network namespaces, in gateway order.
func s7SessWaitPods(ctx context.Context, c *cluster.Cluster, cs kubernetes.Interface, n int, limit time.Duration) ([]s7SessPod, error) {
	deadline := time.Now().Add(limit)
	for {
		pods, err := cs.CoreV1().Pods(clusterstack.GatewayNamespace).List(ctx, metav1.ListOptions{LabelSelector: transport.GatewayPodLabel + "=true"})
		running := map[string]*corev1.Pod{}
		if err == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				gw := strings.TrimPrefix(p.Labels["app"], transport.GatewayAppPrefix)
				if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 &&
					p.Status.ContainerStatuses[0].State.Running != nil {
					running[gw] = p
				}
			}
		}
		have := 0
		for i := range n {
			if running[s7SessName(i)] != nil {
				have++
			}
		}
		if have == n {
			tasks, err := c.Ctr(ctx, "tasks", "ls")
			if err != nil {
				return nil, err
			}
			var out []s7SessPod
			for i := range n {
				p := running[s7SessName(i)]
				pid := clusterstack.TaskPID(tasks, p.Status.ContainerStatuses[0].ContainerID, true)
				if pid == 0 {
					return nil, fmt.Errorf("pod %s: no running task", p.Name)
				}
				ns := fmt.Sprintf("/proc/%d/ns/net", pid)
				link, err := procfs.NetNS(pid)
				if err != nil {
					return nil, fmt.Errorf("pod %s: %w", p.Name, err)
				}
				out = append(out, s7SessPod{Gateway: s7SessName(i), Pod: p.Name, NetNS: ns, NSLink: link})
			}
			return out, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d gateway pods running after %v (%v)", have, n, limit, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// s7SessCreateObjects creates gateway i's VpcNatGateway (nftables), its
// EIP (netlab.EIP(i)) and fips FIPs on it, for every i < n.
func s7SessCreateObjects(ctx context.Context, cl client.Client, n, fips int) error {
	return s7Parallel(n, 8, func(i int) error {
		name := s7SessName(i)
		gw := &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{reconciler.DataplaneAnnotation: "nftables"}},
			Spec: v1.VpcNatGatewaySpec{Vpc: "vpc-" + name, Subnet: "subnet-" + name}}
		if err := cl.Create(ctx, gw); err != nil {
			return fmt.Errorf("create VpcNatGateway %s: %w", name, err)
		}
		eip := &v1.IptablesEIP{ObjectMeta: metav1.ObjectMeta{Name: name + "-e"},
			Spec: v1.IptablesEIPSpec{V4ip: netlab.EIP(i).String(), NatGwDp: name}}
		if err := cl.Create(ctx, eip); err != nil {
			return fmt.Errorf("create %s: %w", eip.Name, err)
		}
		for j := range fips {
			f := &v1.IptablesFIPRule{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-f%d", name, j)},
				Spec: v1.IptablesFIPRuleSpec{EIP: eip.Name, InternalIP: fmt.Sprintf("10.251.%d.%d", i, j+1)}}
			if err := cl.Create(ctx, f); err != nil {
				return fmt.Errorf("create %s: %w", f.Name, err)
			}
		}
		return nil
	})
}

// s7SessWaitReady waits until eips EIPs and fips FIPs are Ready.
func s7SessWaitReady(ctx context.Context, cl client.Client, eips, fips int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		var el v1.IptablesEIPList
		var fl v1.IptablesFIPRuleList
		re, rf := 0, 0
		if err := cl.List(ctx, &el); err == nil {
			for _, e := range el.Items {
				if e.Status.Ready {
					re++
				}
			}
		}
		if err := cl.List(ctx, &fl); err == nil {
			for _, f := range fl.Items {
				if f.Status.Ready {
					rf++
				}
			}
		}
		if re >= eips && rf >= fips {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d EIPs and %d of %d FIPs Ready after %v", re, eips, rf, fips, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// s7Metrics scrapes natgw-controller's pods' metrics (pod IP:8080; the pod
// IPs remembered while the API server is away).
type s7Metrics struct {
	cs  kubernetes.Interface
	hc  *http.Client
	ips []string
}

// s7Snapshot is natgw-controller's per-gateway state: connected is the
// largest over its pods (only the leader runs gateways); procs holds each
// pod's (by IP) process counters, which a container restart resets.
type s7Snapshot struct {
	connected map[string]float64
	procs     map[string]s7Proc
}

// s7Proc is one natgw-controller process's counters.
type s7Proc struct {
	// start is process_start_time_seconds: a new value is a new process
	// (the container restarted), whose counters began at 0.
	start float64
	// resyncs is natgw_resyncs_total by gateway and reason; reconnects
	// natgw_transport_reconnects_total by gateway.
	resyncs    map[[2]string]float64
	reconnects map[string]float64
}

// s7ParseProc reads one natgw-controller's metrics exposition: the
// per-gateway connected gauge and the process's counters.
func s7ParseProc(text string) (map[string]float64, s7Proc, error) {
	ps, err := parseProm(text)
	if err != nil {
		return nil, s7Proc{}, err
	}
	connected := map[string]float64{}
	pr := s7Proc{resyncs: map[[2]string]float64{}, reconnects: map[string]float64{}}
	for _, p := range ps {
		gw := p.labels["gateway"]
		switch p.name {
		case "process_start_time_seconds":
			pr.start = p.value
		case "natgw_gateway_connected":
			if gw != "" {
				connected[gw] = max(connected[gw], p.value)
			}
		case "natgw_resyncs_total":
			if gw != "" {
				pr.resyncs[[2]string{gw, p.labels["reason"]}] += p.value
			}
		case "natgw_transport_reconnects_total":
			if gw != "" {
				pr.reconnects[gw] += p.value
			}
		}
	}
	return connected, pr, nil
}

// s7CounterDeltas is what natgw-controller counted between two snapshots
// for gateways: full syncs by reason and transport reconnects, summed
// over its pods. A pod whose process is new in after (another
// process_start_time_seconds, or not scraped before) counts all of after:
// its counters began at 0 (a leader that lost its lease exits and its
// container restarts; subtracting the old process's counts would hide the
// new one's syncs).
func s7CounterDeltas(before, after s7Snapshot, gateways []string) (resyncs map[string]float64, reconnects float64) {
	want := map[string]bool{}
	for _, g := range gateways {
		want[g] = true
	}
	resyncs = map[string]float64{}
	for ip, a := range after.procs {
		b, ok := before.procs[ip]
		if !ok || b.start != a.start {
			b = s7Proc{}
		}
		for k, v := range a.resyncs {
			if want[k[0]] {
				if d := v - b.resyncs[k]; d != 0 {
					resyncs[k[1]] += d
				}
			}
		}
		for g, v := range a.reconnects {
			if want[g] {
				reconnects += v - b.reconnects[g]
			}
		}
	}
	return resyncs, reconnects
}

func (m *s7Metrics) scrape(ctx context.Context) (s7Snapshot, error) {
	lctx, cancel := context.WithTimeout(ctx, time.Second)
	pods, err := m.cs.CoreV1().Pods(clusterstack.ControllerNS).List(lctx, metav1.ListOptions{})
	cancel()
	if err == nil {
		var ips []string
		for _, p := range pods.Items {
			if p.Status.PodIP != "" && p.DeletionTimestamp == nil {
				ips = append(ips, p.Status.PodIP)
			}
		}
		m.ips = ips
	}
	snap := s7Snapshot{connected: map[string]float64{}, procs: map[string]s7Proc{}}
	var errs []error
	for _, ip := range m.ips {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ip+":8080/metrics", nil)
		if err != nil {
			return snap, err
		}
		resp, err := m.hc.Do(req)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		connected, pr, err := s7ParseProc(string(body))
		if err != nil {
			return snap, fmt.Errorf("natgw-controller %s: %w", ip, err)
		}
		snap.procs[ip] = pr
		for gw, v := range connected {
			snap.connected[gw] = max(snap.connected[gw], v)
		}
	}
	if len(snap.procs) == 0 {
		return snap, fmt.Errorf("no natgw-controller pod's metrics answered (%d pods): %w", len(m.ips), errors.Join(errs...))
	}
	return snap, nil
}

// s7Leader is the holder of natgw-controller's leader election lease
// ("" when there is none or it cannot be read: a figure for the report,
// not a condition of the run).
func s7Leader(ctx context.Context, cs kubernetes.Interface) string {
	l, err := cs.CoordinationV1().Leases(clusterstack.ControllerNS).Get(ctx, s7LeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// s7Agents maps network namespaces (net:[inode]) to the `natgw serve`
// processes running in them.
func s7Agents() (map[string][]int, error) {
	pids, err := procfs.Find(func(argv []string) bool {
		return len(argv) >= 2 && filepath.Base(argv[0]) == "natgw" && argv[1] == "serve"
	})
	if err != nil {
		return nil, err
	}
	out := map[string][]int{}
	for _, p := range pids {
		if l, err := procfs.NetNS(p); err == nil {
			out[l] = append(out[l], p)
		}
	}
	return out, nil
}

// s7SessWaitConnected waits (up to limit) until every pod's gateway is
// connected: natgw_gateway_connected 1 and, when before is set, a `natgw
// serve` in its pod that is not one of before's (the session is a new
// one). It returns how long that took.
func s7SessWaitConnected(ctx context.Context, mc *s7Metrics, pods []s7SessPod, before map[string][]int, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(limit)
	for {
		snap, serr := mc.scrape(ctx)
		var agents map[string][]int
		var aerr error
		if before != nil {
			agents, aerr = s7Agents()
		}
		var waiting []string
		for _, p := range pods {
			ok := serr == nil && snap.connected[p.Gateway] == 1
			if ok && before != nil {
				ok = aerr == nil && slices.ContainsFunc(agents[p.NSLink], func(pid int) bool { return !slices.Contains(before[p.NSLink], pid) })
			}
			if !ok {
				waiting = append(waiting, p.Gateway)
			}
		}
		if len(waiting) == 0 {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("%d of %d gateways not connected after %v (first: %s; metrics: %v, agents: %v)",
				len(waiting), len(pods), limit, waiting[0], serr, aerr)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// s7SessRulesets reads each pod's `nft list ruleset` and `nft -a list
// ruleset` (with handles: a rewritten rule has a new handle).
func s7SessRulesets(ctx context.Context, pods []s7SessPod) (rules, handles []string, err error) {
	for _, p := range pods {
		r, err := netlab.NftRuleset(ctx, p.NetNS)
		if err != nil {
			return nil, nil, fmt.Errorf("pod %s: %w", p.Pod, err)
		}
		h, err := netlab.Exec(ctx, p.NetNS, "", "nft", "-a", "list", "ruleset")
		if err != nil {
			return nil, nil, fmt.Errorf("pod %s: %w", p.Pod, err)
		}
		rules, handles = append(rules, r), append(handles, h)
	}
	return rules, handles, nil
}

// s7SessVersions maps natgw's objects (kind/name) to their resourceVersion.
func s7SessVersions(ctx context.Context, cl client.Client) (map[string]string, error) {
	out := map[string]string{}
	var gl v1.VpcNatGatewayList
	var el v1.IptablesEIPList
	var fl v1.IptablesFIPRuleList
	for _, l := range []client.ObjectList{&gl, &el, &fl} {
		if err := cl.List(ctx, l); err != nil {
			return nil, fmt.Errorf("list %T: %w", l, err)
		}
	}
	for _, o := range gl.Items {
		out["gw/"+o.Name] = o.ResourceVersion
	}
	for _, o := range el.Items {
		out["eip/"+o.Name] = o.ResourceVersion
	}
	for _, o := range fl.Items {
		out["fip/"+o.Name] = o.ResourceVersion
	}
	return out, nil
}

// s7ControllerRestarts sums natgw-controller's pods' container restarts.
func s7ControllerRestarts(ctx context.Context, cs kubernetes.Interface) (int, error) {
	pods, err := cs.CoreV1().Pods(clusterstack.ControllerNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, fmt.Errorf("natgw-controller pods: %w", err)
	}
	n := 0
	for _, p := range pods.Items {
		for _, st := range p.Status.ContainerStatuses {
			n += int(st.RestartCount)
		}
	}
	return n, nil
}

// s7SessDeletePods deletes the part's StatefulSets and, when wait, waits
// until no gateway pod of the part is left.
func s7SessDeletePods(ctx context.Context, cs kubernetes.Interface, n int, wait bool) error {
	err := s7Parallel(n, 8, func(i int) error {
		err := cs.AppsV1().StatefulSets(clusterstack.GatewayNamespace).Delete(ctx, transport.GatewayAppPrefix+s7SessName(i), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete statefulset %s: %w", s7SessName(i), err)
		}
		return nil
	})
	if err != nil || !wait {
		return err
	}
	for {
		pods, err := cs.CoreV1().Pods(clusterstack.GatewayNamespace).List(ctx, metav1.ListOptions{LabelSelector: transport.GatewayPodLabel + "=true"})
		left := 0
		if err == nil {
			for _, p := range pods.Items {
				if strings.HasPrefix(p.Labels["app"], transport.GatewayAppPrefix+"s7s") {
					left++
				}
			}
		}
		if err == nil && left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("held sessions: %d gateway pods not gone: %w", left, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// reportS7Sessions writes the held-sessions part: the table of both
// daemons' use in the three states with the per-session cost, the restart
// figures, the reconnect target and the summary metrics. notRun, when set,
// says why there is no result.
func reportS7Sessions(r *report.Report, sec *report.Section, res *s7SessResult, notRun string) {
	tgName := "S7 every gateway's exec session back after a kube-apiserver restart (from the API server answering)"
	want := fmt.Sprintf("≤ %.0f s", s7SessMaxReconnect.Seconds())
	if res == nil {
		sec.Targets = append(sec.Targets, report.Target{Name: tgName, Want: want, Got: "not measured", Reason: notRun})
		return
	}
	mib := func(b float64) float64 { return b / (1 << 20) }
	pct := func(c float64) string { return fmt.Sprintf("%.1f %%", 100*c) }
	n := res.N
	t := report.Table{
		Caption: fmt.Sprintf("**Held exec sessions**: %d gateway pods in upstream's StatefulSet shape, each with one EIP and %d FIPs, "+
			"one long-lived `natgw serve` exec session to each through kube-apiserver and kubelet (natgw-controller `--transport=exec`). "+
			"CPU = CPU time ÷ wall time over a %v window (/proc/PID/stat; 100 %% = one core), memory = VmRSS at its end. "+
			"Per session = (held − pods without sessions) ÷ %d.", n, res.FIPs, res.Window, n),
		Header: []string{"state", "kube-apiserver CPU", "kube-apiserver VmRSS", "kubelet CPU", "kubelet VmRSS", "load average"},
	}
	row := func(name string, l s7Load) []string {
		return []string{name, pct(l.APIServer.CPU), fmt.Sprintf("%.1f MiB", mib(l.APIServer.RSS)), pct(l.Kubelet.CPU), fmt.Sprintf("%.1f MiB", mib(l.Kubelet.RSS)), l.LoadAvg}
	}
	apiCPU := perSession(res.Held.APIServer.CPU, res.Pods.APIServer.CPU, n)
	apiRSS := perSession(res.Held.APIServer.RSS, res.Pods.APIServer.RSS, n)
	kCPU := perSession(res.Held.Kubelet.CPU, res.Pods.Kubelet.CPU, n)
	kRSS := perSession(res.Held.Kubelet.RSS, res.Pods.Kubelet.RSS, n)
	t.Rows = append(t.Rows,
		row("no gateway pod", res.Idle),
		row(fmt.Sprintf("%d pods, no session", n), res.Pods),
		row(fmt.Sprintf("%d pods, %d sessions held", n, n), res.Held),
		[]string{"**per session**", fmt.Sprintf("%.3f %%", 100*apiCPU), fmt.Sprintf("%.0f KiB", apiRSS/1024), fmt.Sprintf("%.3f %%", 100*kCPU), fmt.Sprintf("%.0f KiB", kRSS/1024), ""},
	)
	sec.Tables = append(sec.Tables, t)
	reconnect := "not all"
	if res.ReconnectErr == "" {
		reconnect = fmt.Sprintf("%.2f s", res.Reconnect.Seconds())
	}
	rt := report.Table{
		Caption: "**kube-apiserver restarted** (`cluster.Restart`: SIGTERM, SIGKILL after 10 s, started again) with every session held: down = restart begun → /readyz answers; " +
			"reconnect = /readyz answers → every gateway connected again (a new `natgw serve` in its pod and `natgw_gateway_connected` 1 on natgw-controller, polled every 100 ms). " +
			"Rules lost: nftables ruleset lines of the pods gone afterwards; rewritten: pods whose ruleset with handles changed; API writes: natgw objects whose resourceVersion changed; " +
			"resyncs: full syncs natgw-controller sent (`natgw_resyncs_total`).",
		Header: []string{"gateways", "connect all (first)", "API down", "reconnect all", "rules lost", "rulesets rewritten", "API writes", "resyncs", "reconnects counted", "controller restarts"},
		Rows: [][]string{{strconv.Itoa(n), fmt.Sprintf("%.2f s", res.ConnectAll.Seconds()), fmt.Sprintf("%.2f s", res.APIDown.Seconds()), reconnect,
			strconv.Itoa(res.Lost), strconv.Itoa(res.Rewritten), strconv.Itoa(res.APIWrites), s7ResyncsText(res.Resyncs, res.ResyncReasons), fmt.Sprintf("%.0f", res.Reconnects), strconv.Itoa(res.ControllerRestarts)}},
	}
	sec.Tables = append(sec.Tables, rt)
	if res.CleanupErr != "" {
		sec.Notes = append(sec.Notes, "Held sessions: the clean-up after the measurement failed (the figures stand): "+res.CleanupErr)
	}
	if res.LeaderBefore != res.LeaderAfter {
		sec.Notes = append(sec.Notes, fmt.Sprintf("natgw-controller's leader changed across the kube-apiserver restart: lease holder %q before, %q after "+
			"(a leader that cannot renew its lease exits; the next leader is a new process, and a process's first connect to each agent is a full sync, reason bootid).",
			res.LeaderBefore, res.LeaderAfter))
	} else {
		sec.Notes = append(sec.Notes, fmt.Sprintf("natgw-controller's leader was the same process before and after the kube-apiserver restart (lease holder %q).", res.LeaderBefore))
	}
	tg := report.Target{Name: tgName, Want: want + ", no rule lost, no write", Got: reconnect}
	var why []string
	if res.ReconnectErr != "" {
		why = append(why, res.ReconnectErr)
	} else if res.Reconnect > s7SessMaxReconnect {
		why = append(why, fmt.Sprintf("took %.2f s", res.Reconnect.Seconds()))
	}
	if res.Lost > 0 || res.Rewritten > 0 || res.APIWrites > 0 || res.Resyncs > 0 {
		why = append(why, fmt.Sprintf("%d rule lines lost, %d rulesets rewritten, %d API writes, %s resyncs", res.Lost, res.Rewritten, res.APIWrites, s7ResyncsText(res.Resyncs, res.ResyncReasons)))
	}
	tg.Pass = len(why) == 0
	if res.LeaderBefore != res.LeaderAfter {
		why = append(why, "natgw-controller's leader changed (a new process: its first connect to each agent is a full sync)")
	}
	if n < s7SessMinPods {
		// A caveat, not a miss: -quick's size.
		why = append(why, fmt.Sprintf("%d gateways (quick size; the row is for ≥ %d)", n, s7SessMinPods))
	}
	tg.Reason = strings.Join(why, "; ")
	sec.Targets = append(sec.Targets, tg)
	r.AddMetric(
		report.NewMetric("s7_sessions_gateways", "count", report.HigherIsBetter, float64(n), math.NaN(), ""),
		report.NewMetric("s7_sessions_apiserver_cpu_per_session", "% core", report.LowerIsBetter, 100*apiCPU, math.NaN(), ""),
		report.NewMetric("s7_sessions_apiserver_rss_per_session", "KiB", report.LowerIsBetter, apiRSS/1024, math.NaN(), ""),
		report.NewMetric("s7_sessions_kubelet_cpu_per_session", "% core", report.LowerIsBetter, 100*kCPU, math.NaN(), ""),
		report.NewMetric("s7_sessions_kubelet_rss_per_session", "KiB", report.LowerIsBetter, kRSS/1024, math.NaN(), ""),
		report.NewMetric("s7_sessions_apiserver_cpu_held", "% core", report.LowerIsBetter, 100*res.Held.APIServer.CPU, 100*res.Pods.APIServer.CPU, "pods without sessions"),
		report.NewMetric("s7_sessions_apiserver_rss_held", "MiB", report.LowerIsBetter, mib(res.Held.APIServer.RSS), mib(res.Pods.APIServer.RSS), "pods without sessions"),
		report.NewMetric("s7_sessions_kubelet_cpu_held", "% core", report.LowerIsBetter, 100*res.Held.Kubelet.CPU, 100*res.Pods.Kubelet.CPU, "pods without sessions"),
		report.NewMetric("s7_sessions_kubelet_rss_held", "MiB", report.LowerIsBetter, mib(res.Held.Kubelet.RSS), mib(res.Pods.Kubelet.RSS), "pods without sessions"),
		report.NewMetric("s7_sessions_apiserver_cpu_idle", "% core", report.LowerIsBetter, 100*res.Idle.APIServer.CPU, math.NaN(), ""),
		report.NewMetric("s7_sessions_kubelet_cpu_idle", "% core", report.LowerIsBetter, 100*res.Idle.Kubelet.CPU, math.NaN(), ""),
		report.NewMetric("s7_sessions_connect_all", "s", report.LowerIsBetter, res.ConnectAll.Seconds(), math.NaN(), ""),
		report.NewMetric("s7_sessions_apiserver_down", "s", report.LowerIsBetter, res.APIDown.Seconds(), math.NaN(), ""),
		report.NewMetric("s7_sessions_rules_lost", "lines", report.LowerIsBetter, float64(res.Lost), math.NaN(), ""),
		report.NewMetric("s7_sessions_restart_api_writes", "count", report.LowerIsBetter, float64(res.APIWrites), math.NaN(), ""),
		report.NewMetric("s7_sessions_restart_resyncs", "count", report.LowerIsBetter, res.Resyncs, math.NaN(), ""),
	)
	if res.ReconnectErr == "" {
		r.AddMetric(report.NewMetric("s7_sessions_reconnect_all", "s", report.LowerIsBetter, res.Reconnect.Seconds(), math.NaN(), ""))
	}
}

// s7ResyncsText is the full syncs' count with its reasons ("12 (bootid 10,
// connect 2)").
func s7ResyncsText(total float64, reasons map[string]float64) string {
	if len(reasons) == 0 {
		return fmt.Sprintf("%.0f", total)
	}
	var parts []string
	for _, r := range slices.Sorted(maps.Keys(reasons)) {
		parts = append(parts, fmt.Sprintf("%s %.0f", r, reasons[r]))
	}
	return fmt.Sprintf("%.0f (%s)", total, strings.Join(parts, ", "))
}

// s7SessPodsText says how many pods a size asks for.
func s7SessPodsText(pods int) string {
	if pods == 0 {
		return fmt.Sprintf("as many as the node holds, at least %d", s7SessMinPods)
	}
	return fmt.Sprintf("%d", pods)
}
