package clusterstack

import (
	"context"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/nat"
)

// Sizes of a latency measurement: paced FIPs (one at a time, each waited
// for), the burst (all created at once), and the requests of the
// per-request cost comparison.
type Sizes struct {
	Paced, Burst             int
	SessionReqs, KubectlReqs int
}

// DefaultSizes are the sizes the latency measurement needs: ≥ 30 paced
// requests, a burst of 200.
var DefaultSizes = Sizes{Paced: 30, Burst: 200, SessionReqs: 200, KubectlReqs: 20}

// Target is a deployed gateway to measure: its VpcNatGateway name, data
// plane and running pod, at least Sizes.Burst Ready EIPs on it, and the
// clients to reach the cluster.
type Target struct {
	Gateway   string
	Dataplane nat.DataplaneName
	Pod       string
	EIPs      []string
	// InternalIP is the internal address of FIP i (distinct per i).
	InternalIP func(i int) string
	Config     *rest.Config
	Client     client.WithWatch
	Clientset  kubernetes.Interface
	// Kubectl runs kubectl against the cluster (cluster.Cluster.Kubectl).
	Kubectl func(ctx context.Context, stdin io.Reader, args ...string) (string, error)
}

// Result is one measurement.
type Result struct {
	Sizes
	// Paced and Burst are each FIP's create→Ready; BurstAll from the
	// burst's first create to its last Ready.
	Paced, Burst []time.Duration
	BurstAll     time.Duration
	// SessionOpen is the opening of a long-lived exec session (pod
	// look-up, exec, agent start, handshake); SessionReq its requests;
	// KubectlReq one `kubectl exec` per request (upstream's way).
	SessionOpen time.Duration
	SessionReq  []time.Duration
	KubectlReq  []time.Duration
}

// KV is the result as summary key/value pairs.
func (r *Result) KV() []any {
	return []any{
		"paced_n", r.Sizes.Paced, "paced_ready_p50", Pct(r.Paced, 50), "paced_ready_p99", Pct(r.Paced, 99),
		"burst_n", r.Sizes.Burst, "burst_ready_p50", Pct(r.Burst, 50), "burst_ready_p99", Pct(r.Burst, 99), "burst_all_ready_in", r.BurstAll,
		"exec_session_open", r.SessionOpen, "exec_session_req_p50", Pct(r.SessionReq, 50), "exec_session_req_p99", Pct(r.SessionReq, 99),
		"kubectl_exec_req_p50", Pct(r.KubectlReq, 50), "kubectl_exec_req_p99", Pct(r.KubectlReq, 99),
	}
}

// Pct returns the p-th percentile (nearest rank) of ds.
func Pct(ds []time.Duration, p float64) time.Duration {
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

// Measure measures tg: FIP create→Ready through the deployed controller
// and the pod-exec transport, paced and as a burst (seen from one watch);
// then the per-request cost of a long-lived exec session of its own to the
// same pod (info requests: nothing changes behind the controller's back)
// against one `kubectl exec` per request running upstream's
// nat-gateway.sh get-iptables-version. It deletes its FIPs before it
// returns.
func Measure(ctx context.Context, tg Target, sz Sizes) (*Result, error) {
	if len(tg.EIPs) < sz.Burst || len(tg.EIPs) < sz.Paced {
		return nil, fmt.Errorf("latency: %d EIPs for a burst of %d and %d paced", len(tg.EIPs), sz.Burst, sz.Paced)
	}
	r := &Result{Sizes: sz}
	rw, err := startReadyWatch(ctx, tg.Client)
	if err != nil {
		return nil, err
	}
	defer rw.w.Stop()
	defer func() { _ = deleteFIPs(context.WithoutCancel(ctx), tg.Client) }()
	if r.Paced, err = paced(ctx, tg, rw, sz.Paced); err != nil {
		return nil, err
	}
	if err := deleteFIPs(ctx, tg.Client); err != nil {
		return nil, err
	}

	// Burst: every FIP at once (8 creating goroutines).
	starts := make([]time.Time, sz.Burst)
	errs := make(chan error, sz.Burst)
	var wg sync.WaitGroup
	burstStart := time.Now()
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < sz.Burst; i += 8 {
				f := tg.fip("b", i)
				starts[i] = time.Now()
				if err := tg.Client.Create(ctx, f); err != nil {
					errs <- fmt.Errorf("create %s: %w", f.Name, err)
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, err
	}
	var last time.Time
	for i := 0; i < sz.Burst; i++ {
		at, err := rw.wait(ctx, tg.fip("b", i).Name, 2*time.Minute)
		if err != nil {
			return nil, err
		}
		r.Burst = append(r.Burst, at.Sub(starts[i]))
		if at.After(last) {
			last = at
		}
	}
	r.BurstAll = last.Sub(burstStart)

	ex := &transport.Exec{Config: tg.Config, Client: tg.Clientset, Namespace: GatewayNamespace, Command: "/natgw", Log: logr.Discard()}
	openStart := time.Now()
	sess, err := ex.Open(ctx, transport.Endpoint{Name: tg.Gateway, Dataplane: tg.Dataplane})
	if err != nil {
		return nil, fmt.Errorf("open an exec session: %w", err)
	}
	r.SessionOpen = time.Since(openStart)
	for i := 0; i < sz.SessionReqs; i++ {
		st := time.Now()
		if _, err := sess.Info(ctx); err != nil {
			_ = sess.Close()
			return nil, fmt.Errorf("session request %d: %w", i, err)
		}
		r.SessionReq = append(r.SessionReq, time.Since(st))
	}
	if err := sess.Close(); err != nil {
		return nil, fmt.Errorf("close the exec session: %w", err)
	}
	for i := 0; i < sz.KubectlReqs; i++ {
		st := time.Now()
		if out, err := tg.Kubectl(ctx, nil, "-n", GatewayNamespace, "exec", tg.Pod, "-c", transport.GatewayContainer,
			"--", "/kube-ovn/nat-gateway.sh", "get-iptables-version"); err != nil {
			return nil, fmt.Errorf("kubectl exec: %w\n%s", err, out)
		}
		r.KubectlReq = append(r.KubectlReq, time.Since(st))
	}
	return r, deleteFIPs(ctx, tg.Client)
}

// fip is FIP i of the measurement part tag: on EIP i, internal address
// InternalIP(i).
func (tg Target) fip(tag string, i int) *v1.IptablesFIPRule {
	f := &v1.IptablesFIPRule{Spec: v1.IptablesFIPRuleSpec{EIP: tg.EIPs[i], InternalIP: tg.InternalIP(i)}}
	f.Name = fmt.Sprintf("%s-%s%d", tg.Gateway, tag, i)
	return f
}

// paced creates n FIPs one at a time, each waited for until Ready (30 s),
// and returns each one's create→Ready.
func paced(ctx context.Context, tg Target, rw *readyWatch, n int) ([]time.Duration, error) {
	var ds []time.Duration
	for i := 0; i < n; i++ {
		d, err := pacedOne(ctx, tg, rw, i)
		if err != nil {
			return nil, err
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// pacedOne creates paced FIP i of tg and returns its create→Ready (seen
// by rw, at most 30 s).
func pacedOne(ctx context.Context, tg Target, rw *readyWatch, i int) (time.Duration, error) {
	f := tg.fip("p", i)
	start := time.Now()
	if err := tg.Client.Create(ctx, f); err != nil {
		return 0, fmt.Errorf("create %s: %w", f.Name, err)
	}
	at, err := rw.wait(ctx, f.Name, 30*time.Second)
	if err != nil {
		return 0, err
	}
	return at.Sub(start), nil
}

// MeasurePaced is Measure's paced part (the same FIPs, client and Ready
// watch) on one or more targets in turn: FIP i of every target (in the
// order given), one at a time, each waited for until Ready, then FIP i+1;
// so targets compared in one call see the same moments of a shared
// machine's load. It returns each target's n create→Ready durations and
// deletes every FIP before it returns. Each target needs Gateway, EIPs
// (≥ n), InternalIP and Client; the first one's Client creates and
// watches.
func MeasurePaced(ctx context.Context, n int, tgs ...Target) ([][]time.Duration, error) {
	if len(tgs) == 0 {
		return nil, fmt.Errorf("latency: no target")
	}
	for _, tg := range tgs {
		if len(tg.EIPs) < n {
			return nil, fmt.Errorf("latency: gateway %s: %d EIPs for %d paced FIPs", tg.Gateway, len(tg.EIPs), n)
		}
	}
	cl := tgs[0].Client
	rw, err := startReadyWatch(ctx, cl)
	if err != nil {
		return nil, err
	}
	defer rw.w.Stop()
	out := make([][]time.Duration, len(tgs))
	for i := 0; i < n && err == nil; i++ {
		for j, tg := range tgs {
			tg.Client = cl
			var d time.Duration
			if d, err = pacedOne(ctx, tg, rw, i); err != nil {
				break
			}
			out[j] = append(out[j], d)
		}
	}
	if derr := deleteFIPs(context.WithoutCancel(ctx), cl); err == nil && derr != nil {
		return nil, derr
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// deleteFIPs deletes every FIP and waits (1 min) until they are gone.
func deleteFIPs(ctx context.Context, c client.Client) error {
	if err := c.DeleteAllOf(ctx, &v1.IptablesFIPRule{}); err != nil {
		return fmt.Errorf("delete FIPs: %w", err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var l v1.IptablesFIPRuleList
		if err := c.List(ctx, &l); err != nil {
			return err
		}
		if len(l.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d FIPs left 1m after deleting them", len(l.Items))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readyWatch records when each FIP is first seen Ready for its current
// generation, from one watch.
type readyWatch struct {
	mu    sync.Mutex
	ready map[string]time.Time
	w     watch.Interface
}

func startReadyWatch(ctx context.Context, c client.WithWatch) (*readyWatch, error) {
	w, err := c.Watch(ctx, &v1.IptablesFIPRuleList{})
	if err != nil {
		return nil, fmt.Errorf("watch FIPs: %w", err)
	}
	rw := &readyWatch{ready: map[string]time.Time{}, w: w}
	go func() {
		for ev := range w.ResultChan() {
			fip, ok := ev.Object.(*v1.IptablesFIPRule)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			st, _ := v1.SummaryOf(fip)
			c := st.ReadyCondition()
			if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != fip.Generation || st.ObservedGeneration != fip.Generation {
				continue
			}
			now := time.Now()
			rw.mu.Lock()
			if _, seen := rw.ready[fip.Name]; !seen {
				rw.ready[fip.Name] = now
			}
			rw.mu.Unlock()
		}
	}()
	return rw, nil
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
