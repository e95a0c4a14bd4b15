package scenario

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/bench/stats"
	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// s3Dataplanes are measured in this order; the first is "ours" in the
// metrics, the second the baseline.
var s3Dataplanes = []string{string(nat.DataplaneNftables), string(nat.DataplaneIptables)}

// s3Observe, when set (tests), gets every data plane's result.
var s3Observe func(*s3Result)

// s3Warmup FIPs go through the paced cycle before the measured ones.
const s3Warmup = 1

// s3EIPPrefixLen is the prefix length of the EIP addresses (fillers in
// 100.64.0.0/16) on the gateway's external interface.
const s3EIPPrefixLen = 16

// s3Phase is one way of creating and deleting FIPs (burst or paced).
type s3Phase struct {
	n int
	// ready and gone are per-FIP create→Ready and delete→gone latencies,
	// createCall the Create request alone (the API server's write).
	ready, gone, createCall stats.Summary
	// Burst only: from the first Create call to the last one returned,
	// to the last FIP Ready; from the first Delete call to the last
	// returned, to the last FIP gone.
	createSpan, readySpan, deleteSpan, goneSpan time.Duration
	// Burst only: mutating requests the API server served from the
	// first Create (Delete) until the last FIP was Ready (gone), the
	// benchmark's own included.
	createWrites, deleteWrites float64
	// Burst only: CPU time kube-apiserver and etcd used over the same
	// spans as the writes.
	createCPU, deleteCPU time.Duration
	// Burst only: the mutating requests from the first Create until the
	// last FIP was Ready, by kind.
	createByKey writeCounts
	// Burst only: the same FIPs created by the same clients with no
	// controller running (their span, from the first Create to the last
	// returned): the API server's rate for plain creates of these objects.
	plainN    int
	plainSpan time.Duration
	// Paced only: the controller's reconciles over the measured cycles
	// (create and delete of every FIP), by controller name.
	reconciles map[string]reconcileStats
}

// s3Result is one data plane's run.
type s3Result struct {
	dp                   string
	apiUp, eipsReady     time.Duration
	eips                 int
	paced, burst         *s3Phase
	kernelFIPsAfterBurst int
	log                  string // the controller's log, kept when the run failed
	err                  error
}

// RunS3 measures the controller path: natgw-controller (in-process, the
// same packages and wiring as the binary with --transport=local) against a
// real kube-apiserver + etcd, driving `natgw serve` in a gateway
// namespace, once per data plane.
func RunS3(ctx context.Context, e *Env) error {
	return runS3(ctx, e, e.plan())
}

func runS3(ctx context.Context, e *Env, plan Plan) error {
	e.Progress.Scenario("scenario 3: controller path (kube-apiserver + etcd, natgw-controller, natgw serve)")
	sec := e.Report.Section("s3", "Scenario 3: controller path")
	switch {
	case e.Natgw == "":
		sec.NotRun = "the natgw binary was not given (-natgw), and the controller drives `natgw serve`"
		return nil
	case envtestReady(e) != "":
		sec.NotRun = envtestReady(e)
		return errors.New(sec.NotRun)
	}
	// One control plane per data plane; with S3StartTogether all start
	// at once before the first run (an idle one costs little CPU),
	// otherwise each just before its run.
	planes := make([]*planeStart, len(s3Dataplanes))
	if plan.S3StartTogether {
		for i := range planes {
			planes[i] = startPlane(e)
		}
	}
	next := 0
	defer func() {
		// Runs cut short (ctx) leave started planes behind: stop them.
		for _, p := range planes[next:] {
			if p != nil {
				if cp, _, err := p.wait(); err == nil {
					cp.Close()
				}
			}
		}
	}()
	var results []*s3Result
	var errs []error
	for i, dp := range s3Dataplanes {
		if planes[i] == nil {
			planes[i] = startPlane(e)
		}
		next = i + 1
		r := runS3Dataplane(ctx, e, plan, dp, fmt.Sprintf("[%d/%d] %s", i+1, len(s3Dataplanes), dp), planes[i])
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if r.err != nil {
			errs = append(errs, fmt.Errorf("scenario 3, %s data plane: %w", dp, r.err))
			e.Progress.Printf("%s data plane: FAILED: %v", dp, r.err)
		}
		results = append(results, r)
		if s3Observe != nil {
			s3Observe(r)
		}
	}
	reportS3(e, plan, sec, results)
	return errors.Join(errs...)
}

// planeStart is a control plane starting in the background.
type planeStart struct {
	done chan struct{}
	cp   *controlPlane
	up   time.Duration
	err  error
}

func startPlane(e *Env) *planeStart {
	p := &planeStart{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		t0 := time.Now()
		p.cp, p.err = startControlPlane(e)
		p.up = time.Since(t0)
	}()
	return p
}

// wait returns the started control plane, how long its start took, or
// why it failed.
func (p *planeStart) wait() (*controlPlane, time.Duration, error) {
	<-p.done
	return p.cp, p.up, p.err
}

// runS3Dataplane takes the control plane of p (and stops it at the end),
// builds a fresh gateway topology and controller for dp, makes the EIPs,
// then measures paced and burst FIPs.
func runS3Dataplane(ctx context.Context, e *Env, plan Plan, dp, label string, p *planeStart) *s3Result {
	r := &s3Result{dp: dp}
	e.Progress.Printf("%s: kube-apiserver + etcd", label)
	cp, up, err := p.wait()
	if err != nil {
		r.err = err
		return r
	}
	defer func() {
		if err := cp.Close(); err != nil && r.err == nil {
			r.err = err
		}
	}()
	r.apiUp = up
	r.err = withLab(ctx, func(l *netlab.Lab) error {
		return measureS3(ctx, e, plan, cp, l, r, label)
	})
	return r
}

// s3AdmissionDir is controller/config/admission next to the CRD directory
// (controller/config/crd): what `kubectl apply -k controller/config`
// installs with the CRDs.
func s3AdmissionDir(e *Env) string { return filepath.Join(filepath.Dir(e.CRDDir), "admission") }

func measureS3(ctx context.Context, e *Env, plan Plan, cp *controlPlane, l *netlab.Lab, r *s3Result, label string) (err error) {
	if err := cp.installAdmission(ctx, s3AdmissionDir(e)); err != nil {
		return err
	}
	gw, err := l.Gateway(netlab.GatewayOptions{Name: "gw", VMs: 1})
	if err != nil {
		return err
	}
	c, err := cp.client()
	if err != nil {
		return err
	}
	gwName := "gw-" + r.dp
	if err := c.Create(ctx, &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: gwName}, Spec: v1.VpcNatGatewaySpec{Vpc: "vpc1", Subnet: "subnet1"}}); err != nil {
		return fmt.Errorf("create VpcNatGateway %s: %w", gwName, err)
	}
	// The API server's rate for plain creates of the burst's FIPs, by the
	// same clients, before any controller runs.
	e.Progress.Printf("%s: plain creates of %d FIPs (no controller running), the API server's write rate", label, plan.S3Burst)
	plainSpan, err := plainCreates(ctx, c, plan)
	if err != nil {
		return err
	}
	logPath := filepath.Join(os.TempDir(), fmt.Sprintf("natgw-bench-s3-%s-%s.log", r.dp, l.ID()))
	rc, err := startController(ctx, cp, controllerOptions{
		Natgw: e.Natgw, Dataplane: nat.DataplaneName(r.dp), Workers: plan.S3Workers, LogPath: logPath,
		Gateways: gwconfig.Config{
			Defaults: gwconfig.Entry{ExternalPrefixLen: s3EIPPrefixLen},
			Gateways: []gwconfig.Entry{{Name: gwName, NetNS: gw.GW, ExternalGateway: netlab.ExtAddr.String(),
				ExternalInterface: gw.ExternalInterface, InternalInterface: gw.InternalInterface}},
		},
	})
	if err != nil {
		return err
	}
	defer func() {
		if serr := rc.Stop(); serr != nil && err == nil {
			err = serr
		}
		if err != nil {
			r.log = logPath
		} else {
			os.Remove(logPath)
		}
	}()
	w, err := watchFIPs(ctx, c)
	if err != nil {
		return err
	}
	defer w.Stop()
	timeout := func(n int) time.Duration { return 3*time.Minute + time.Duration(n)*300*time.Millisecond }

	// One EIP per FIP, all Ready before any FIP is made.
	r.eips = plan.S3Burst + s3Warmup + plan.S3Paced
	e.Progress.Printf("%s: %d EIPs", label, r.eips)
	t0 := time.Now()
	if err := parallel(ctx, r.eips, plan.S3Creators, func(i int) error {
		return createObj(ctx, c, framework.EIP(s3EIPName(i), gwName, Filler(i).EIP))
	}); err != nil {
		return err
	}
	if err := waitEIPsReady(ctx, c, r.eips, timeout(r.eips), func(ready int) {
		e.Progress.Step(ready, r.eips, "%s: EIPs Ready", label)
	}); err != nil {
		return err
	}
	r.eipsReady = time.Since(t0)

	// Paced: one FIP at a time, each waited for, on the last EIPs; the
	// first s3Warmup are a warm-up, checked in the kernel, not measured.
	paced := &s3Phase{n: plan.S3Paced}
	var readies, gones, calls []float64
	kernel := func() (framework.Kernel, error) {
		k, err := framework.ReadKernel(ctx, &framework.Topology{Gateway: gw, Name: gwName}, r.dp)
		if err != nil {
			return k, fmt.Errorf("read the gateway's kernel state: %w", err)
		}
		return k, nil
	}
	var rec0 map[string]reconcileStats
	for i := 0; i < s3Warmup+plan.S3Paced; i++ {
		warm := i < s3Warmup
		if i == s3Warmup {
			if rec0, err = reconciles(); err != nil {
				return err
			}
		}
		if warm {
			e.Progress.Step(i+1, s3Warmup, "%s: paced, warm-up (checked in the kernel)", label)
		} else {
			e.Progress.Step(i+1-s3Warmup, plan.S3Paced, "%s: paced, create → Ready → delete → gone, one FIP at a time", label)
		}
		k := plan.S3Burst + i
		f := framework.FIP(s3FIPName(k), s3EIPName(k), Filler(k).Internal)
		start := time.Now()
		if err := createObj(ctx, c, f); err != nil {
			return err
		}
		call := since(start)
		at, err := w.waitReady(ctx, timeout(1), f.Name)
		if err != nil {
			return fmt.Errorf("paced FIP %d: %w", i+1, err)
		}
		ready := at[0].Sub(start).Seconds()
		if warm {
			if kern, err := kernel(); err != nil {
				return err
			} else if len(kern.Entries[string(f.UID)]) == 0 {
				return fmt.Errorf("warm-up: FIP %s (%s) is Ready but has no entry in the gateway's %s state", f.Name, f.UID, r.dp)
			}
		}
		start = time.Now()
		if err := c.Delete(ctx, f); err != nil {
			return fmt.Errorf("delete IptablesFIPRule %s: %w", f.Name, err)
		}
		at, err = w.waitGone(ctx, timeout(1), f.Name)
		if err != nil {
			return fmt.Errorf("paced FIP %d: %w", i+1, err)
		}
		if warm {
			if kern, err := kernel(); err != nil {
				return err
			} else if len(kern.Entries[string(f.UID)]) != 0 {
				return fmt.Errorf("warm-up: FIP %s (%s) is gone but still in the gateway's %s state", f.Name, f.UID, r.dp)
			}
			continue
		}
		calls, readies, gones = append(calls, call), append(readies, ready), append(gones, at[0].Sub(start).Seconds())
	}
	rec1, err := reconciles()
	if err != nil {
		return err
	}
	paced.reconciles = map[string]reconcileStats{}
	for name, v := range rec1 {
		paced.reconciles[name] = v.sub(rec0[name])
	}
	paced.ready, paced.gone, paced.createCall = stats.Summarize(readies), stats.Summarize(gones), stats.Summarize(calls)
	r.paced = paced
	e.Progress.Printf("%s: paced (%d FIPs): create→Ready p50 %s p99 %s, delete→gone p50 %s p99 %s", label, paced.n,
		report.Seconds(paced.ready.Median), report.Seconds(paced.ready.P99), report.Seconds(paced.gone.Median), report.Seconds(paced.gone.P99))

	// Burst: every FIP created at once, then every one deleted at once.
	n := plan.S3Burst
	burst := &s3Phase{n: n, plainN: n, plainSpan: plainSpan}
	fips := make([]*v1.IptablesFIPRule, n)
	names := make([]string, n)
	for i := range fips {
		fips[i] = framework.FIP(s3FIPName(i), s3EIPName(i), Filler(i).Internal)
		names[i] = fips[i].Name
	}
	starts, ends := make([]time.Time, n), make([]time.Time, n)
	e.Progress.Printf("%s: burst, creating %d FIPs at once (%d parallel clients)", label, n, plan.S3Creators)
	l0, err := cp.load(ctx)
	if err != nil {
		return err
	}
	t0 = time.Now()
	if err := parallel(ctx, n, plan.S3Creators, func(i int) error {
		starts[i] = time.Now()
		err := createObj(ctx, c, fips[i])
		ends[i] = time.Now()
		return err
	}); err != nil {
		return err
	}
	burst.createSpan = time.Since(t0)
	readyAt, err := w.waitReady(ctx, timeout(n), names...)
	if err != nil {
		return fmt.Errorf("burst: %w", err)
	}
	l1, err := cp.load(ctx)
	if err != nil {
		return err
	}
	burst.createWrites, burst.createCPU, burst.createByKey = l1.writes-l0.writes, l1.cpu-l0.cpu, l1.byKey.sub(l0.byKey)
	var lat []float64
	calls = calls[:0]
	last := t0
	for i := range names {
		lat, calls = append(lat, readyAt[i].Sub(starts[i]).Seconds()), append(calls, ends[i].Sub(starts[i]).Seconds())
		if readyAt[i].After(last) {
			last = readyAt[i]
		}
	}
	burst.ready, burst.createCall, burst.readySpan = stats.Summarize(lat), stats.Summarize(calls), last.Sub(t0)
	// Every FIP of the burst is in the kernel, under its object's UID.
	k, err := kernel()
	if err != nil {
		return err
	}
	for _, f := range fips {
		if len(k.Entries[string(f.UID)]) > 0 {
			r.kernelFIPsAfterBurst++
		}
	}
	if r.kernelFIPsAfterBurst != n {
		return fmt.Errorf("burst: %d of %d Ready FIPs have entries in the gateway's %s state", r.kernelFIPsAfterBurst, n, r.dp)
	}
	e.Progress.Printf("%s: burst of %d: created in %s, all Ready after %s; create→Ready p50 %s p99 %s", label, n,
		report.Seconds(burst.createSpan.Seconds()), report.Seconds(burst.readySpan.Seconds()), report.Seconds(burst.ready.Median), report.Seconds(burst.ready.P99))

	e.Progress.Printf("%s: burst, deleting %d FIPs at once", label, n)
	if l0, err = cp.load(ctx); err != nil {
		return err
	}
	t0 = time.Now()
	if err := parallel(ctx, n, plan.S3Creators, func(i int) error {
		starts[i] = time.Now()
		if err := c.Delete(ctx, fips[i]); err != nil {
			return fmt.Errorf("delete IptablesFIPRule %s: %w", fips[i].Name, err)
		}
		return nil
	}); err != nil {
		return err
	}
	burst.deleteSpan = time.Since(t0)
	goneAt, err := w.waitGone(ctx, timeout(n), names...)
	if err != nil {
		return fmt.Errorf("burst delete: %w", err)
	}
	if l1, err = cp.load(ctx); err != nil {
		return err
	}
	burst.deleteWrites, burst.deleteCPU = l1.writes-l0.writes, l1.cpu-l0.cpu
	lat, last = lat[:0], t0
	for i := range names {
		lat = append(lat, goneAt[i].Sub(starts[i]).Seconds())
		if goneAt[i].After(last) {
			last = goneAt[i]
		}
	}
	burst.gone, burst.goneSpan = stats.Summarize(lat), last.Sub(t0)
	r.burst = burst
	if k, err = kernel(); err != nil {
		return err
	}
	for _, f := range fips {
		if len(k.Entries[string(f.UID)]) > 0 {
			return fmt.Errorf("burst delete: FIP %s (%s) is gone from the API server but still in the gateway's %s state", f.Name, f.UID, r.dp)
		}
	}
	e.Progress.Printf("%s: burst of %d: all gone after %s; delete→gone p50 %s p99 %s", label, n,
		report.Seconds(burst.goneSpan.Seconds()), report.Seconds(burst.gone.Median), report.Seconds(burst.gone.P99))
	return nil
}

// plainCreates creates the burst's FIPs (same names, same specs) with
// plan.S3Creators parallel clients while no controller runs, and returns
// the span from the first Create to the last one returned; then removes
// them (finalizer dropped, deleted) and waits until none is left.
func plainCreates(ctx context.Context, c client.Client, plan Plan) (time.Duration, error) {
	n := plan.S3Burst
	fips := make([]*v1.IptablesFIPRule, n)
	for i := range fips {
		fips[i] = framework.FIP(s3FIPName(i), s3EIPName(i), Filler(i).Internal)
	}
	t0 := time.Now()
	if err := parallel(ctx, n, plan.S3Creators, func(i int) error { return createObj(ctx, c, fips[i]) }); err != nil {
		return 0, fmt.Errorf("plain creates: %w", err)
	}
	span := time.Since(t0)
	// The admission policy gave them natgw's finalizer, which no
	// controller will remove: drop it, then delete.
	drop := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`))
	if err := parallel(ctx, n, plan.S3Creators, func(i int) error {
		if err := c.Patch(ctx, fips[i], drop); err != nil {
			return fmt.Errorf("drop the finalizers of plain FIP %s: %w", fips[i].Name, err)
		}
		if err := c.Delete(ctx, fips[i]); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete plain FIP %s: %w", fips[i].Name, err)
		}
		return nil
	}); err != nil {
		return 0, err
	}
	if _, err := framework.Wait(ctx, time.Minute, func() error {
		list := &v1.IptablesFIPRuleList{}
		if err := c.List(ctx, list); err != nil {
			return err
		}
		if len(list.Items) > 0 {
			return fmt.Errorf("%d plain FIPs left", len(list.Items))
		}
		return nil
	}); err != nil {
		return 0, fmt.Errorf("plain FIPs removed: %w", err)
	}
	return span, nil
}

// s3Writes is what the API server's counters say about a burst's writes
// from the first Create until the last FIP was Ready.
type s3Writes struct {
	// perFIP: writes to kubeovn.io objects per FIP, the benchmark's
	// creates excluded (the controller's writes); onFIPs: those to the
	// IptablesFIPRule objects themselves.
	perFIP, onFIPs float64
	// breakdown: each kind of request per FIP, largest first, the
	// benchmark's creates included and named.
	breakdown []string
	// plainRate: the API server's rate for plain creates (FIPs/s), floor:
	// (1 + perFIP) × N ÷ plainRate, ratio: last FIP Ready ÷ floor.
	plainRate float64
	floor     time.Duration
	ratio     float64
}

// s3WriteFigures computes s3Writes of a burst.
func s3WriteFigures(p *s3Phase) s3Writes {
	var w s3Writes
	if p == nil || p.n == 0 || p.createByKey == nil {
		return s3Writes{perFIP: math.NaN(), onFIPs: math.NaN(), plainRate: math.NaN(), ratio: math.NaN()}
	}
	creates := writeKey{verb: "POST", group: v1.GroupVersion.Group, resource: "iptables-fip-rules"}
	n := float64(p.n)
	var ctl, onFIPs float64
	keys := make([]writeKey, 0, len(p.createByKey))
	for k, v := range p.createByKey {
		keys = append(keys, k)
		if k.group != v1.GroupVersion.Group || k == creates {
			continue
		}
		ctl += v
		if k.resource == "iptables-fip-rules" {
			onFIPs += v
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if a, b := p.createByKey[keys[i]], p.createByKey[keys[j]]; a != b {
			return a > b
		}
		return keys[i].String() < keys[j].String()
	})
	for _, k := range keys {
		who := ""
		switch {
		case k == creates:
			who = " (the benchmark's creates)"
		case k.group != v1.GroupVersion.Group:
			who = " (not natgw's objects)"
		}
		w.breakdown = append(w.breakdown, fmt.Sprintf("%s %s%s", k, report.Count(p.createByKey[k]/n), who))
	}
	w.perFIP, w.onFIPs = ctl/n, onFIPs/n
	w.plainRate = math.NaN()
	w.ratio = math.NaN()
	if p.plainN > 0 && p.plainSpan > 0 {
		w.plainRate = float64(p.plainN) / p.plainSpan.Seconds()
		w.floor = time.Duration((1 + w.perFIP) * n / w.plainRate * float64(time.Second))
		if w.floor > 0 {
			w.ratio = p.readySpan.Seconds() / w.floor.Seconds()
		}
	}
	return w
}

func s3EIPName(i int) string { return fmt.Sprintf("eip-%04d", i) }
func s3FIPName(i int) string { return fmt.Sprintf("fip-%04d", i) }

// createObj creates obj, naming it in the error.
func createObj(ctx context.Context, c client.Client, obj client.Object) error {
	if err := c.Create(ctx, obj); err != nil {
		return fmt.Errorf("create %T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}

// parallel runs fn(0..n-1) on k goroutines and returns the first error
// (the remaining calls are skipped after one fails).
func parallel(ctx context.Context, n, k int, fn func(i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for range max(1, min(k, n)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					once.Do(func() { first = err; cancel() })
				}
			}
		}()
	}
feed:
	for i := 0; i < n; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return first
}

// waitEIPsReady polls until n IptablesEIPs are Ready.
func waitEIPsReady(ctx context.Context, c client.Client, n int, timeout time.Duration, progress func(ready int)) error {
	_, err := framework.Wait(ctx, timeout, func() error {
		list := &v1.IptablesEIPList{}
		if err := c.List(ctx, list); err != nil {
			if apierrors.IsTimeout(err) {
				return err
			}
			return fmt.Errorf("list IptablesEIPs: %w", err)
		}
		ready := 0
		var notReady string
		for i := range list.Items {
			r := framework.ReadyOf(&list.Items[i])
			if r.Status == metav1.ConditionTrue && r.Current {
				ready++
			} else if notReady == "" {
				notReady = list.Items[i].Name + ": " + r.String()
			}
		}
		progress(ready)
		if ready < n {
			return fmt.Errorf("%d of %d EIPs Ready (e.g. %s)", ready, n, notReady)
		}
		return nil
	})
	return err
}

// reconcileNote says how many reconciles per FIP the controllers ran in a
// paced run (create and delete of each), and their mean duration.
func reconcileNote(p *s3Phase) string {
	var parts []string
	for _, name := range []string{"iptables-fip-rule", "iptables-eip"} {
		rc := p.reconciles[name]
		if rc.Count == 0 || p.n == 0 {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s per FIP, mean %s", name, report.Count(float64(rc.Count)/float64(p.n)), report.Seconds(rc.Seconds/float64(rc.Count))))
	}
	if len(parts) == 0 {
		return ""
	}
	return "reconciles per create+delete cycle (controller-runtime's metrics): " + strings.Join(parts, "; ")
}

// s3Targets are scenario 3's targets (nftables data plane): the paced
// create→Ready, the controller writes per FIP and the burst ratio to the
// API-bound floor (the burst ratio's bound was 1.2 before).
const (
	s3TargetP50          = 30 * time.Millisecond
	s3TargetP99          = 150 * time.Millisecond
	s3TargetWritesPerFIP = 1.0
	s3TargetBurstRatio   = 1.1
)

func reportS3(e *Env, plan Plan, sec *report.Section, results []*s3Result) {
	sec.Text = append(sec.Text,
		"natgw-controller runs in the benchmark's process (the packages and wiring of the `natgw-controller` binary with `--transport=local`: "+
			"controller-runtime manager, reconciler.Setup, one `natgw serve --netns` child per gateway) against a real kube-apiserver + etcd "+
			"(envtest binaries from `make envtest-assets`, natgw's CRDs from controller/config/crd), with client-side rate limiting off as in a cluster. "+
			"Each data plane gets a fresh API server, a fresh gateway namespace and its own controller "+fmt.Sprintf("(%d workers). ", plan.S3Workers)+
			fmt.Sprintf("First %d EIPs are created and waited for (a FIP needs an EIP of its own); then: ", plan.S3Burst+s3Warmup+plan.S3Paced)+
			fmt.Sprintf("**paced**: %d FIPs one at a time (create, wait until Ready, delete, wait until gone, next) after %d warm-up FIP checked in the kernel: the per-object latency without queueing; ", plan.S3Paced, s3Warmup)+
			fmt.Sprintf("**burst**: %d FIPs created at once by %d parallel clients, then deleted at once. ", plan.S3Burst, plan.S3Creators)+
			"create→Ready runs from the start of the Create request until a watch on the API server delivers the object with Ready=True (reason Programmed) for its generation; "+
			"delete→gone from the start of the Delete request until the watch delivers its deletion (natgw's finalizer is removed after the kernel entries are). "+
			"After the burst every FIP's UID is checked in the gateway's kernel state (nft table or iptables-legacy-save), and after its deletion checked gone. "+
			"The API server has controller/config/admission installed as users install it (`kubectl apply -k controller/config`): FIPs are created with natgw's finalizer. "+
			"**Controller writes per FIP** are the API server's mutating requests to kubeovn.io objects (apiserver_request_total by verb, resource and subresource) "+
			"from the first Create of the burst until the last FIP was Ready, the benchmark's creates excluded, divided by the FIPs. "+
			"**Floor**: before the controller starts, the same FIPs are created by the same parallel clients with no controller running (then removed): "+
			"the API server's rate for plain creates of these objects, R; the burst cannot end before (1 + writes per FIP) × N ÷ R; "+
			"**ratio** = last FIP Ready (from the first Create) ÷ floor.")
	byDP := map[string]*s3Result{}
	for _, r := range results {
		byDP[r.dp] = r
	}
	lat := report.Table{Caption: "**create→Ready and delete→gone per FIP**, p50 / p90 / p99; rate = FIPs / (first request → last FIP Ready or gone)",
		Header: []string{"data plane", "variant", "FIPs", "create→Ready p50 / p90 / p99", "delete→gone p50 / p90 / p99", "Ready/s", "gone/s"}}
	where := report.Table{Caption: "**burst: where the time goes** — the API server's write rate seen by the clients, and the controller behind it",
		Header: []string{"data plane", "creates: all returned after", "API create rate", "Create request p50 / p99", "last FIP Ready after",
			"API writes until then (per FIP, per s)", "kube-apiserver + etcd CPU until then (share of all CPUs)",
			"deletes: all returned after", "last FIP gone after", "API writes until then (per FIP, per s)", "kube-apiserver + etcd CPU until then (share of all CPUs)"}}
	writes := report.Table{Caption: "**burst: controller writes per FIP and the API-bound floor** — writes from the first Create until the last FIP Ready, per FIP, by request (apiserver_request_total)",
		Header: []string{"data plane", "controller writes per FIP (create excluded)", "of which on the FIP objects", "requests per FIP", "plain creates (no controller): rate R",
			"floor (1 + writes per FIP) × N ÷ R", "last FIP Ready after", "ratio"}}
	setupCaption := "**set-up** (not part of the figures above)"
	if plan.S3StartTogether {
		setupCaption += "; the control planes of both data planes were started at the same time (quick mode), so each start shares the CPUs with the other"
	}
	setup := report.Table{Caption: setupCaption,
		Header: []string{"data plane", "kube-apiserver + etcd up", "EIPs created at once until all Ready", "EIPs Ready/s"}}
	for _, dp := range s3Dataplanes {
		r := byDP[dp]
		if r == nil {
			continue
		}
		if r.apiUp > 0 {
			row := []string{dp, report.Seconds(r.apiUp.Seconds()), "—", "—"}
			if r.eipsReady > 0 {
				row[2] = fmt.Sprintf("%d in %s", r.eips, report.Seconds(r.eipsReady.Seconds()))
				row[3] = report.Count(float64(r.eips) / r.eipsReady.Seconds())
			}
			setup.Rows = append(setup.Rows, row)
		}
		for _, v := range []struct {
			name string
			p    *s3Phase
		}{{"paced", r.paced}, {"burst", r.burst}} {
			if v.p == nil {
				lat.Rows = append(lat.Rows, []string{dp, v.name, "—", "failed", "failed", "—", "—"})
				continue
			}
			readyRate, goneRate := "—", "—"
			if v.p.readySpan > 0 {
				readyRate, goneRate = report.Count(float64(v.p.n)/v.p.readySpan.Seconds()), report.Count(float64(v.p.n)/v.p.goneSpan.Seconds())
			} else if v.p.ready.N > 0 {
				// Paced: one at a time, so the rate is 1 / (mean latency).
				readyRate, goneRate = report.Count(1/v.p.ready.Mean), report.Count(1/v.p.gone.Mean)
			}
			lat.Rows = append(lat.Rows, []string{dp, v.name, fmt.Sprint(v.p.n), pct(v.p.ready), pct(v.p.gone), readyRate, goneRate})
		}
		if b := r.burst; b != nil {
			where.Rows = append(where.Rows, []string{dp, report.Seconds(b.createSpan.Seconds()),
				report.Count(float64(b.n)/b.createSpan.Seconds()) + " /s",
				report.Seconds(b.createCall.Median) + " / " + report.Seconds(b.createCall.P99),
				report.Seconds(b.readySpan.Seconds()), writesCell(b.createWrites, b.n, b.readySpan), cpuCell(b.createCPU, b.readySpan),
				report.Seconds(b.deleteSpan.Seconds()), report.Seconds(b.goneSpan.Seconds()), writesCell(b.deleteWrites, b.n, b.goneSpan), cpuCell(b.deleteCPU, b.goneSpan)})
			w := s3WriteFigures(b)
			writes.Rows = append(writes.Rows, []string{dp, report.Count(w.perFIP), report.Count(w.onFIPs), strings.Join(w.breakdown, "; "),
				fmt.Sprintf("%d in %s, %s /s", b.plainN, report.Seconds(b.plainSpan.Seconds()), report.Count(w.plainRate)),
				report.Seconds(w.floor.Seconds()), report.Seconds(b.readySpan.Seconds()), fmt.Sprintf("%.2f", w.ratio)})
		}
		if r.paced != nil {
			if rc := reconcileNote(r.paced); rc != "" {
				sec.Notes = append(sec.Notes, fmt.Sprintf("%s, paced: %s.", dp, rc))
			}
		}
		if r.err != nil {
			note := fmt.Sprintf("%s data plane failed: %v", dp, r.err)
			if r.log != "" {
				note += fmt.Sprintf(" (controller log kept in %s)", r.log)
			}
			sec.Notes = append(sec.Notes, note)
		}
	}
	sec.Tables = append(sec.Tables, lat, where, writes, setup)
	s3TargetRows(plan, sec, byDP[s3Dataplanes[0]], byDP[s3Dataplanes[1]])
	s3Metrics(e, byDP[s3Dataplanes[0]], byDP[s3Dataplanes[1]])
	s3Plot(e, sec, results)
	sec.Notes = append(sec.Notes,
		"Rate: a paced run's FIPs/s is 1 / mean latency (one at a time); a burst's is FIPs / (first request → last FIP Ready or gone).",
		"The controller, the API server, etcd, the agent and the benchmark's clients share the machine's CPUs (see CPUs and load average above).")
}

// cpuShare is cpu as a share of what all of the machine's CPUs could give
// over span.
func cpuShare(cpu, span time.Duration) float64 {
	return cpu.Seconds() / (span.Seconds() * float64(runtime.NumCPU()))
}

// cpuCell formats CPU time used over span, with its share of all CPUs.
func cpuCell(cpu, span time.Duration) string {
	return fmt.Sprintf("%s (%.0f%%)", report.Seconds(cpu.Seconds()), 100*cpuShare(cpu, span))
}

// writesCell formats a count of API writes, per FIP and per second.
func writesCell(writes float64, n int, span time.Duration) string {
	return fmt.Sprintf("%s (%s, %s/s)", report.Count(writes), report.Count(writes/float64(n)), report.Count(writes/span.Seconds()))
}

// pct formats p50 / p90 / p99.
func pct(s stats.Summary) string {
	if s.N == 0 {
		return "—"
	}
	return fmt.Sprintf("%s / %s / %s", report.Seconds(s.Median), report.Seconds(s.P90), report.Seconds(s.P99))
}

func s3TargetRows(plan Plan, sec *report.Section, ours, base *s3Result) {
	var burst, paced *s3Phase
	if ours != nil {
		burst, paced = ours.burst, ours.paced
	}
	burstName := fmt.Sprintf("burst of %s FIPs%s", report.SizeLabel(plan.S3Burst), quickNote(plan.S3Burst, 1000))
	w := s3WriteFigures(burst)

	// Controller writes per FIP.
	t := report.Target{Name: "S3 controller writes per FIP (create excluded) on nftables, " + burstName,
		Want: "≤ " + report.Count(s3TargetWritesPerFIP), Got: report.Count(w.perFIP), Pass: w.perFIP <= s3TargetWritesPerFIP}
	switch {
	case math.IsNaN(w.perFIP):
		t.Got, t.Pass, t.Reason = "not measured", false, "the measurement failed (see the notes)"
	case !t.Pass:
		t.Reason = fmt.Sprintf("the writes per FIP were: %s. On the FIP objects alone: %s per FIP", strings.Join(w.breakdown, "; "), report.Count(w.onFIPs))
		if eip := burst.createByKey[writeKey{verb: "PATCH", group: v1.GroupVersion.Group, resource: "iptables-eips", subresource: "status"}] / float64(burst.n); eip > 0 {
			t.Reason += fmt.Sprintf(". %s per FIP is the status patch of the FIP's IptablesEIP: its status.nat goes from \"\" to \"fip\" "+
				"(upstream's schema; Kube-OVN's webhook reads it to refuse deleting an EIP in use), so it stays", report.Count(eip))
		}
	}
	sec.Targets = append(sec.Targets, t)

	// Burst: last FIP Ready against the API-bound floor.
	t = report.Target{Name: "S3 burst: last FIP Ready ÷ API-bound floor on nftables, " + burstName,
		Want: fmt.Sprintf("≤ %.1f", s3TargetBurstRatio), Got: fmt.Sprintf("%.2f", w.ratio), Pass: w.ratio <= s3TargetBurstRatio}
	switch {
	case math.IsNaN(w.ratio):
		t.Got, t.Pass, t.Reason = "not measured", false, "the measurement failed (see the notes)"
	case !t.Pass:
		t.Reason = fmt.Sprintf("floor (1 + %s) × %d ÷ %s/s = %s (plain creates by the same %d clients with no controller running), last FIP Ready after %s; "+
			"the floor assumes the controller's writes go as parallel as the %d clients' creates, and the controller runs %d workers per kind; ",
			report.Count(w.perFIP), burst.n, report.Count(w.plainRate), report.Seconds(w.floor.Seconds()), plan.S3Creators, report.Seconds(burst.readySpan.Seconds()),
			plan.S3Creators, plan.S3Workers) +
			s3MissReason(burst, paced)
	}
	sec.Targets = append(sec.Targets, t)

	// Paced create→Ready.
	pacedName := fmt.Sprintf("paced, one FIP at a time (%d)", plan.S3Paced)
	for _, q := range []struct {
		name  string
		bound time.Duration
		get   func(stats.Summary) float64
	}{{"p50", s3TargetP50, func(s stats.Summary) float64 { return s.Median }}, {"p99", s3TargetP99, func(s stats.Summary) float64 { return s.P99 }}} {
		got := math.NaN()
		if paced != nil {
			got = q.get(paced.ready)
		}
		t := maxTarget(fmt.Sprintf("S3 create→Ready %s on nftables, %s", q.name, pacedName), q.bound, got)
		if paced != nil && !t.Pass {
			t.Reason = s3MissReason(paced, nil)
		}
		sec.Targets = append(sec.Targets, t)
	}
}

// s3MissReason explains a missed latency target from the run's own figures.
func s3MissReason(p, paced *s3Phase) string {
	if p.readySpan > 0 { // burst
		why := fmt.Sprintf("a burst is a queue: the API server took the %d creates at %s/s (all returned after %s, Create request p50 %s); "+
			"the controller made them Ready at %s FIPs/s (last after %s) with %s API writes per FIP (the benchmark's create included; %s writes/s in all), "+
			"so a FIP waits behind the ones created before it",
			p.n, report.Count(float64(p.n)/p.createSpan.Seconds()), report.Seconds(p.createSpan.Seconds()), report.Seconds(p.createCall.Median),
			report.Count(float64(p.n)/p.readySpan.Seconds()), report.Seconds(p.readySpan.Seconds()),
			report.Count(p.createWrites/float64(p.n)), report.Count(p.createWrites/p.readySpan.Seconds()))
		share := cpuShare(p.createCPU, p.readySpan)
		why += fmt.Sprintf(". Over that span kube-apiserver and etcd alone used %s of CPU, %.0f%% of all %d CPUs (%s per API write)",
			report.Seconds(p.createCPU.Seconds()), 100*share, runtime.NumCPU(), report.Seconds(p.createCPU.Seconds()/p.createWrites))
		if share >= 0.5 {
			why += ", so the API server's write capacity on this machine, not natgw's programming, bounds the burst"
		}
		if paced != nil {
			why += fmt.Sprintf("; one at a time (paced) create→Ready is p50 %s, p99 %s", report.Seconds(paced.ready.Median), report.Seconds(paced.ready.P99))
		}
		return why
	}
	why := fmt.Sprintf("the Create request alone takes p50 %s (API server + etcd write); the rest is the controller's path "+
		"(watch event, agent request, status write, watch event to the client; a finalizer write first when the admission policy is not installed)", report.Seconds(p.createCall.Median))
	if rc := reconcileNote(p); rc != "" {
		why += "; " + rc
	}
	return why
}

func s3Metrics(e *Env, ours, base *s3Result) {
	const baseName = "natgw-controller, iptables data plane"
	phase := func(r *s3Result, burst bool) *s3Phase {
		switch {
		case r == nil:
			return nil
		case burst:
			return r.burst
		}
		return r.paced
	}
	val := func(p *s3Phase, f func(*s3Phase) float64) float64 {
		if p == nil {
			return math.NaN()
		}
		return f(p)
	}
	for _, burst := range []bool{false, true} {
		variant := "paced"
		if burst {
			variant = "burst"
		}
		o, b := phase(ours, burst), phase(base, burst)
		for _, m := range []struct {
			name string
			f    func(*s3Phase) float64
		}{
			{"create_ready.p50", func(p *s3Phase) float64 { return p.ready.Median }},
			{"create_ready.p99", func(p *s3Phase) float64 { return p.ready.P99 }},
			{"delete_gone.p50", func(p *s3Phase) float64 { return p.gone.Median }},
			{"delete_gone.p99", func(p *s3Phase) float64 { return p.gone.P99 }},
		} {
			e.Report.AddMetric(report.NewMetric("s3."+variant+"."+m.name, "s", report.LowerIsBetter, val(o, m.f), val(b, m.f), baseName))
		}
		if burst {
			readyRate := func(p *s3Phase) float64 { return float64(p.n) / p.readySpan.Seconds() }
			goneRate := func(p *s3Phase) float64 { return float64(p.n) / p.goneSpan.Seconds() }
			e.Report.AddMetric(
				report.NewMetric("s3.burst.ready_per_s", "FIPs/s", report.HigherIsBetter, val(o, readyRate), val(b, readyRate), baseName),
				report.NewMetric("s3.burst.gone_per_s", "FIPs/s", report.HigherIsBetter, val(o, goneRate), val(b, goneRate), baseName))
		}
	}
	// The two burst targets' figures (nftables): controller writes per FIP
	// and the last Ready over the API-bound floor (no baseline: the floor is
	// in the ratio).
	if o := phase(ours, true); o != nil {
		w := s3WriteFigures(o)
		e.Report.AddMetric(
			report.NewMetric("s3.burst.controller_writes_per_fip", "writes", report.LowerIsBetter, w.perFIP, math.NaN(), ""),
			report.NewMetric("s3.burst.last_ready_vs_api_floor", "ratio", report.LowerIsBetter, w.ratio, math.NaN(), ""))
	}
}

func s3Plot(e *Env, sec *report.Section, results []*s3Result) {
	cats := []string{"p50", "p90", "p99"}
	var panels []report.Panel
	for _, gone := range []bool{false, true} {
		title := "create → Ready per FIP"
		if gone {
			title = "delete → gone per FIP"
		}
		p := report.Panel{Title: title, XLabel: "percentile", YLabel: "latency (s), log scale", LogY: true, Categories: cats}
		for _, r := range results {
			for _, v := range []struct {
				name string
				p    *s3Phase
			}{{"paced", r.paced}, {"burst", r.burst}} {
				if v.p == nil {
					continue
				}
				s := v.p.ready
				if gone {
					s = v.p.gone
				}
				p.Series = append(p.Series, report.Series{Label: fmt.Sprintf("%s, %s (%d FIPs)", r.dp, v.name, v.p.n),
					Y: []float64{s.Median, s.P90, s.P99}, Dashed: r.dp != s3Dataplanes[0]})
			}
		}
		if !gone {
			p.Series = append(p.Series, report.Series{Label: "target on nftables (p50 ≤ 30 ms, p99 ≤ 150 ms)",
				Y: []float64{s3TargetP50.Seconds(), math.NaN(), s3TargetP99.Seconds()}, Dashed: true})
		}
		panels = append(panels, p)
	}
	path, name := e.plotPath("s3")
	if err := (report.Figure{Panels: panels}).Save(path); err != nil {
		sec.Notes = append(sec.Notes, "plot failed: "+err.Error())
		return
	}
	sec.Plot = name
}
