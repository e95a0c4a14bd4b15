package reconciler

import (
	"fmt"
	"net/http"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/procfs"
)

// burstFIPs is the size of TestBurstCounts' burst: one FIP per EIP (a FIP
// takes its EIP whole), as scenario 3's burst has them.
const burstFIPs = 100

// TestBurstCounts creates burstFIPs FIPs at once (16 parallel clients, as
// scenario 3's burst) on as many Ready EIPs against the real reconcilers,
// waits until all are Ready and the controller is quiet, then deletes them
// at once, and counts per FIP what the controller did: reconciles of each
// kind, API writes (by request), 409 conflicts, requeues and gateway
// calls. What the counts must stay within: one reconcile of the FIP and one
// of its EIP per create and per delete (the EIP's for its status.nat); two
// writes per created FIP (its status, the EIP's status.nat "" → "fip")
// and one per deleted FIP (status.nat back to ""); no conflict; one
// gateway call per FIP created and deleted (the FIP's own: the EIP on the
// gateway does not change when a FIP takes or leaves it). Every EIP's
// status.nat must still follow its FIP (the real change).
func TestBurstCounts(t *testing.T) {
	// Client-side rate limiting (client-go's token bucket): the time
	// requests waited in it.
	ctrlmetrics.RegisterRESTClientMetrics(ctrlmetrics.MetricRateLimiterLatency)
	reqs := &requestCounter{}
	e := newEnv(t, envOptions{admission: true, wrapTransport: reqs.wrap})

	eips := make([]*v1.IptablesEIP, burstFIPs)
	fips := make([]*v1.IptablesFIPRule, burstFIPs)
	for i := range eips {
		eips[i] = e.eip(fmt.Sprintf("eip-%d", i), netlab.EIP(i))
		fips[i] = e.fip(fmt.Sprintf("fip-%d", i), fmt.Sprintf("eip-%d", i), netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i + 1)}))
	}
	parallelDo(t, len(eips), 16, func(i int) error { return e.c.Create(e.ctx, eips[i]) })
	e.waitAll(&v1.IptablesEIPList{}, burstFIPs, "EIPs Ready with status.nat \"\"", func(o client.Object) bool {
		ip := o.(*v1.IptablesEIP)
		return ip.Status.Ready && ip.Status.Nat == ""
	})
	e.quiet(reqs)

	// Create burst.
	c0 := takeCounts(t, reqs)
	t0 := time.Now()
	parallelDo(t, len(fips), 16, func(i int) error { return e.c.Create(e.ctx, fips[i]) })
	e.waitAll(&v1.IptablesFIPRuleList{}, burstFIPs, "FIPs Ready", func(o client.Object) bool {
		ready, _, gen := readyOf(o)
		return ready && gen == o.GetGeneration()
	})
	readySpan := time.Since(t0)
	e.waitAll(&v1.IptablesEIPList{}, burstFIPs, "EIPs with status.nat \"fip\"", func(o client.Object) bool {
		ip := o.(*v1.IptablesEIP)
		return ip.Status.Ready && ip.Status.Nat == "fip"
	})
	e.quiet(reqs)
	created := takeCounts(t, reqs).sub(c0)
	la, _ := procfs.LoadAverage() // the wall times below are given with the load
	t.Logf("create burst of %d FIPs (all Ready after %v, /proc/loadavg %s): %s", burstFIPs, readySpan.Round(time.Millisecond), la, created.perFIP(burstFIPs))
	t.Logf("create burst, FIP controller: %s", created.workerNote("iptables-fip-rule", 4, readySpan))

	// Delete burst.
	c1 := takeCounts(t, reqs)
	parallelDo(t, len(fips), 16, func(i int) error { return e.c.Delete(e.ctx, fips[i]) })
	e.waitAll(&v1.IptablesFIPRuleList{}, 0, "FIPs gone", nil)
	e.waitAll(&v1.IptablesEIPList{}, burstFIPs, "EIPs with status.nat \"\" again", func(o client.Object) bool {
		ip := o.(*v1.IptablesEIP)
		return ip.Status.Ready && ip.Status.Nat == ""
	})
	e.quiet(reqs)
	deleted := takeCounts(t, reqs).sub(c1)
	t.Logf("delete burst of %d FIPs: %s", burstFIPs, deleted.perFIP(burstFIPs))

	n := float64(burstFIPs)
	for _, b := range []struct {
		phase string
		got   float64
		max   float64
		what  string
	}{
		{"create", created.reconciles["iptables-fip-rule"] / n, 1.05, "FIP reconciles per FIP"},
		{"create", created.reconciles["iptables-eip"] / n, 1.05, "EIP reconciles per FIP"},
		{"create", float64(created.writeTotal()) / n, 2, "controller API writes per FIP"},
		{"create", float64(created.conflicts) / n, 0, "409 conflicts per FIP"},
		{"create", created.applies["eip"] / n, 0, "gateway applies of the EIP per FIP"},
		{"create", created.applies["fip"] / n, 1, "gateway applies of the FIP per FIP"},
		{"delete", deleted.reconciles["iptables-fip-rule"] / n, 1.05, "FIP reconciles per FIP"},
		{"delete", deleted.reconciles["iptables-eip"] / n, 1.05, "EIP reconciles per FIP"},
		{"delete", float64(deleted.writeTotal()) / n, 2, "controller API writes per FIP (finalizer, status.nat)"},
		{"delete", float64(deleted.conflicts) / n, 0, "409 conflicts per FIP"},
		{"delete", deleted.applies["eip"] / n, 0, "gateway applies of the EIP per FIP"},
	} {
		if b.got > b.max {
			t.Errorf("%s burst: %.2f %s, want ≤ %.2f", b.phase, b.got, b.what, b.max)
		}
	}
	// Every FIP was programmed and removed once: the counts above are not
	// low because work was skipped.
	if got := created.applies["fip"]; got < n {
		t.Errorf("create burst: %.0f gateway applies of FIPs for %d FIPs", got, burstFIPs)
	}
	if got := deleted.deletes["fip"]; got < n {
		t.Errorf("delete burst: %.0f gateway deletes of FIPs for %d FIPs", got, burstFIPs)
	}

	// A new session (the agent restarted) brings every EIP back through
	// its reconcile (the gateway's connection events): what was applied
	// over the old session counts for nothing there, and each EIP is
	// handed to the gateway's manager again. The reconnect's converge
	// re-read the agent's kernel and found each held exactly, so the
	// manager answers without an agent call (gateway.Manager.Apply).
	c2 := takeCounts(t, reqs)
	e.tr.breakAll()
	e.eventually(60*time.Second, "every EIP reconciled again over the new session", func() error {
		d := takeCounts(t, reqs).sub(c2)
		if d.unchanged < n {
			return fmt.Errorf("%.0f EIPs handed to the gateway again since the session broke (%.0f reconciles)", d.unchanged, d.reconciles["iptables-eip"])
		}
		return nil
	})
	if got := takeCounts(t, reqs).sub(c2).applies["eip"]; got != 0 {
		t.Errorf("%.0f agent applies of EIPs the reconnect's converge found held exactly, want 0", got)
	}
	e.waitAll(&v1.IptablesEIPList{}, burstFIPs, "EIPs Ready after the reconnect", func(o client.Object) bool {
		return o.(*v1.IptablesEIP).Status.Ready
	})
}

// parallelDo runs do(0..n-1) on clients goroutines and fails t on the
// first error.
func parallelDo(t *testing.T, n, clients int, do func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := do(i); err != nil {
					errs <- err
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// waitAll waits until the test's objects of list's kind number n and each
// passes ok (nil: any).
func (e *env) waitAll(list client.ObjectList, n int, what string, ok func(client.Object) bool) {
	e.t.Helper()
	e.eventually(120*time.Second, what, func() error {
		if err := e.c.List(e.ctx, list, client.MatchingLabels{testLabel: e.case_}); err != nil {
			return err
		}
		items := itemsOf(list)
		if len(items) != n {
			return fmt.Errorf("%d objects, want %d", len(items), n)
		}
		bad := 0
		for _, o := range items {
			if ok != nil && !ok(o) {
				bad++
			}
		}
		if bad > 0 {
			return fmt.Errorf("%d of %d not yet", bad, n)
		}
		return nil
	})
}

// quiet waits until the controller has made no request and run no
// reconcile for a second (requeues after a conflict or a stale read run
// within 100 ms), at most 30 s.
func (e *env) quiet(reqs *requestCounter) {
	e.t.Helper()
	last := takeCounts(e.t, reqs)
	stable := time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		cur := takeCounts(e.t, reqs)
		if cur.total() != last.total() {
			last, stable = cur, time.Now()
			continue
		}
		if time.Since(stable) >= time.Second {
			return
		}
	}
	e.t.Fatal("the controller did not go quiet within 30 s")
}

// requestCounter counts the controller's requests to the API server that
// are not reads (by method, resource and subresource) and its 409s.
type requestCounter struct {
	mu        sync.Mutex
	writes    map[string]int
	conflicts int
	all       int
}

func (r *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.all++
		if req.Method != http.MethodGet {
			if r.writes == nil {
				r.writes = map[string]int{}
			}
			r.writes[req.Method+" "+resourcePath(req.URL.Path)]++
		}
		if err == nil && resp.StatusCode == http.StatusConflict {
			r.conflicts++
		}
		return resp, err
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// resourcePath is the resource (and subresource) of an API path:
// /apis/kubeovn.io/v1/iptables-eips/NAME/status is iptables-eips/status.
func resourcePath(p string) string {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	// apis/GROUP/VERSION/[namespaces/NS/]RESOURCE[/NAME[/SUB]] or api/v1/...
	i := 3
	if len(parts) > 0 && parts[0] == "api" {
		i = 2
	}
	if len(parts) > i+1 && parts[i] == "namespaces" {
		i += 2
	}
	if len(parts) <= i {
		return p
	}
	if len(parts) > i+2 {
		return parts[i] + "/" + parts[i+2]
	}
	return parts[i]
}

// burstCounts are the counters TestBurstCounts reads: the controller's
// requests (requestCounter) and its metrics in controller-runtime's
// registry (reconciles by controller and result, gateway calls by op and
// kind, client-side rate limiting).
type burstCounts struct {
	writes       map[string]int
	conflicts    int
	requests     int
	reconciles   map[string]float64 // by controller
	results      map[string]float64 // "controller result" (success, error, requeue, requeue_after)
	reconcileSec map[string]float64 // by controller
	queueSec     map[string]float64 // time items waited in the work queue, by controller
	applies      map[string]float64 // gateway apply calls by kind
	deletes      map[string]float64 // gateway delete calls by kind
	unchanged    float64            // objects the gateway manager did not send (held exactly)
	rateWaits    float64            // observations of rest_client_rate_limiter_duration_seconds
	rateWaitSec  float64
}

func takeCounts(t testing.TB, reqs *requestCounter) burstCounts {
	t.Helper()
	c := burstCounts{writes: map[string]int{}, reconciles: map[string]float64{}, results: map[string]float64{},
		reconcileSec: map[string]float64{}, queueSec: map[string]float64{}, applies: map[string]float64{}, deletes: map[string]float64{}}
	reqs.mu.Lock()
	for k, v := range reqs.writes {
		c.writes[k] = v
	}
	c.conflicts, c.requests = reqs.conflicts, reqs.all
	reqs.mu.Unlock()
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetName() {
			case "controller_runtime_reconcile_total":
				c.reconciles[label(m, "controller")] += m.GetCounter().GetValue()
				c.results[label(m, "controller")+" "+label(m, "result")] += m.GetCounter().GetValue()
			case "controller_runtime_reconcile_time_seconds":
				c.reconcileSec[label(m, "controller")] += m.GetHistogram().GetSampleSum()
			case "workqueue_queue_duration_seconds":
				c.queueSec[label(m, "name")] += m.GetHistogram().GetSampleSum()
			case "natgw_program_duration_seconds":
				switch label(m, "op") {
				case "apply":
					c.applies[label(m, "kind")] += float64(m.GetHistogram().GetSampleCount())
				case "delete":
					c.deletes[label(m, "kind")] += float64(m.GetHistogram().GetSampleCount())
				}
			case "natgw_gateway_unchanged_applies_total":
				c.unchanged += m.GetCounter().GetValue()
			case "rest_client_rate_limiter_duration_seconds":
				c.rateWaits += float64(m.GetHistogram().GetSampleCount())
				c.rateWaitSec += m.GetHistogram().GetSampleSum()
			}
		}
	}
	return c
}

// total changes whenever the controller does anything.
func (c burstCounts) total() float64 {
	s := float64(c.requests)
	for _, v := range c.reconciles {
		s += v
	}
	return s
}

func (c burstCounts) writeTotal() int {
	n := 0
	for _, v := range c.writes {
		n += v
	}
	return n
}

// sub is c minus an earlier b.
func (c burstCounts) sub(b burstCounts) burstCounts {
	d := c
	d.writes = map[string]int{}
	for k, v := range c.writes {
		if v -= b.writes[k]; v != 0 {
			d.writes[k] = v
		}
	}
	d.conflicts -= b.conflicts
	d.requests -= b.requests
	subf := func(a, b map[string]float64) map[string]float64 {
		out := map[string]float64{}
		for k, v := range a {
			if v -= b[k]; v != 0 {
				out[k] = v
			}
		}
		return out
	}
	d.reconciles, d.results, d.reconcileSec = subf(c.reconciles, b.reconciles), subf(c.results, b.results), subf(c.reconcileSec, b.reconcileSec)
	d.queueSec, d.applies, d.deletes = subf(c.queueSec, b.queueSec), subf(c.applies, b.applies), subf(c.deletes, b.deletes)
	d.unchanged = c.unchanged - b.unchanged
	d.rateWaits -= b.rateWaits
	d.rateWaitSec -= b.rateWaitSec
	return d
}

// perFIP says the counts per FIP of a burst of n.
func (c burstCounts) perFIP(n int) string {
	per := func(m map[string]float64) string {
		var parts []string
		for k, v := range m {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, v/float64(n)))
		}
		sort.Strings(parts)
		return strings.Join(parts, ", ")
	}
	var w []string
	for k, v := range c.writes {
		w = append(w, fmt.Sprintf("%s %.2f", k, float64(v)/float64(n)))
	}
	sort.Strings(w)
	return fmt.Sprintf("reconciles per FIP {%s} by result {%s}; API writes per FIP %.2f {%s}; 409s %d; gateway applies per FIP {%s}, deletes {%s}; client-side rate limiter waits %.0f (%.3f s)",
		per(c.reconciles), per(c.results), float64(c.writeTotal())/float64(n), strings.Join(w, ", "), c.conflicts, per(c.applies), per(c.deletes), c.rateWaits, c.rateWaitSec)
}

// workerNote says how busy a controller's workers were over span (reconcile
// time ÷ workers × span) and how long its items waited in the queue:
// wall-time figures, given with the load.
func (c burstCounts) workerNote(ctl string, workers int, span time.Duration) string {
	n := c.reconciles[ctl]
	if n == 0 {
		return "no reconciles"
	}
	return fmt.Sprintf("workers busy %.0f%% of %d × %v; mean reconcile %.1f ms; mean wait in the queue %.1f ms",
		100*c.reconcileSec[ctl]/(float64(workers)*span.Seconds()), workers, span.Round(time.Millisecond),
		1000*c.reconcileSec[ctl]/n, 1000*c.queueSec[ctl]/n)
}
