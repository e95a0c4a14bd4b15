package reconciler

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"sort"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/controller/gateway"
	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testsummary"
	"github.com/natgw/natgw/nat"
)

// TestCreateDeleteRace is the upstream leak: 200 FIPs on one EIP, each
// created and deleted at once with no pause. Afterwards no FIP may remain
// on the gateway, no object may be stuck terminating, and a new FIP on the
// same EIP must become Ready. On both data planes with natgw's CRDs, and on
// nftables with upstream's (no "unknown field" warning allowed).
func TestCreateDeleteRace(t *testing.T) {
	type run struct {
		name      string
		dp        nat.DataplaneName
		crds      crdtest.Set
		admission bool
	}
	d0, d1 := string(dataplanes[0]), string(dataplanes[1])
	runs := []run{{d0, dataplanes[0], crdtest.Natgw, false}, {d1, dataplanes[1], crdtest.Natgw, false},
		{"upstream-crds/" + d0, dataplanes[0], crdtest.Upstream, false},
		{"admission/" + d0, dataplanes[0], crdtest.Natgw, true}, {"admission/" + d1, dataplanes[1], crdtest.Natgw, true},
		{"upstream-crds/admission/" + d0, dataplanes[0], crdtest.Upstream, true}}
	for _, r := range runs {
		dp := r.dp
		t.Run(r.name, func(t *testing.T) {
			warnings := &warningCounter{}
			e := newEnv(t, envOptions{dataplane: dp, workers: 4, crds: r.crds, warnings: warnings, admission: r.admission})
			reapedBefore := metrics.CounterValue(metrics.VanishedReaped.WithLabelValues(string(nat.KindFIP)))
			defer func() {
				if n := warnings.unknown.Load(); n > 0 {
					t.Errorf("the controller got %d \"unknown field\" warnings, e.g. %v", n, warnings.first.Load())
				}
			}()
			eip := e.eip("eip", netlab.EIP(5))
			e.create(eip)
			e.waitReady(eip)

			const cycles = 200
			for i := range cycles {
				f := e.fip(fmt.Sprintf("race-%d", i), "eip", e.gw.VMs[0].Addr)
				e.create(f)
				if err := e.c.Delete(e.ctx, f); err != nil && !apierrors.IsNotFound(err) {
					t.Fatalf("delete %s: %v", f.Name, err)
				}
			}
			e.eventually(2*time.Minute, "all raced FIPs gone", func() error {
				list := &v1.IptablesFIPRuleList{}
				if err := e.c.List(e.ctx, list, client.MatchingLabels{testLabel: e.case_}); err != nil {
					return err
				}
				if n := len(list.Items); n > 0 {
					return fmt.Errorf("%d FIPs left (e.g. %s finalizers %v deleting %v)", n, list.Items[0].Name,
						list.Items[0].Finalizers, list.Items[0].DeletionTimestamp != nil)
				}
				return nil
			})
			// A FIP deleted while its finalizer was being added vanishes
			// from the API before natgw's reconcile of it ends: that
			// reconcile reaps its rule (it may still be running when the
			// list above comes back empty). Leaked is what is still on the
			// gateway once the reconcilers are idle.
			var n int
			t0 := time.Now()
			for {
				if n = countKind(e.kernelObjects(dp), nat.KindFIP); n == 0 || time.Since(t0) > 20*time.Second {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			if n == 0 && time.Since(t0) > 200*time.Millisecond {
				t.Logf("the last FIP rule left the gateway %v after the last FIP left the API server", time.Since(t0).Round(time.Millisecond))
			}
			if n != 0 {
				t.Errorf("%d FIP elements leaked on the gateway (still there 20 s after the last FIP left the API server)", n)
				all := &v1.IptablesFIPRuleList{}
				if err := e.c.List(e.ctx, all); err == nil {
					for i, x := range all.Items {
						if i < 5 {
							t.Logf("left: %s labels %v finalizers %v deleting %v", x.Name, x.Labels, x.Finalizers, x.DeletionTimestamp != nil)
						}
					}
					t.Logf("%d FIPs in the API server in total", len(all.Items))
				}
			}
			// Objects born with the finalizer never vanish without
			// natgw's deletion: the tracker's reap is not needed.
			reaped := metrics.CounterValue(metrics.VanishedReaped.WithLabelValues(string(nat.KindFIP))) - reapedBefore
			if r.admission && reaped != 0 {
				t.Errorf("%v FIPs vanished and were reaped although the admission policy created them with the finalizer", reaped)
			}
			testsummary.Record(t, fmt.Sprintf("RACE %s: %d create→delete cycles, vanished objects reaped: %v (admission policy: %v)", r.name, cycles, reaped, r.admission))
			f := e.fip("after", "eip", e.gw.VMs[1].Addr)
			e.create(f)
			e.waitReady(f)
			objs := e.kernelObjects(dp)
			if n := countKind(objs, nat.KindFIP); n != 1 {
				t.Errorf("%d FIPs on the gateway, want 1: %v", n, objs)
			}
		})
	}
}

// staleClient serves Get of one object from a snapshot (a cache that lags
// the API server) and everything else from the API server.
type staleClient struct {
	client.Client
	snap client.Object
}

func (s *staleClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if key == client.ObjectKeyFromObject(s.snap) && reflect.TypeOf(obj) == reflect.TypeOf(s.snap) {
		reflect.ValueOf(obj).Elem().Set(reflect.ValueOf(s.snap.DeepCopyObject()).Elem())
		return nil
	}
	return s.Client.Get(ctx, key, obj, opts...)
}

// TestFinalizerAddFailsNothingProgrammed drives the FIP reconciler with a
// cache that still shows a live object without the finalizer while the API
// server says: gone, terminating, or changed since. Adding the finalizer
// fails, and nothing may be programmed.
func TestFinalizerAddFailsNothingProgrammed(t *testing.T) {
	e := newEnv(t, envOptions{noManager: true})
	gcfg := gwconfigFor(e)
	deps := &Deps{Client: e.c, APIReader: e.c, Log: testLog(t)}
	// The reconciler reads through e.c (the cases below give it stale
	// views); the gateway's desired sets come from an indexed cache, as
	// in the binary.
	src := &Deps{Client: e.indexedClient(), APIReader: e.c, Log: testLog(t)}
	deps.Registry = gateway.NewRegistry(gateway.Options{Transport: e.tr, Source: NewSource(src), Config: gcfg, DefaultDataplane: e.dataplane, Log: testLog(t)})
	src.Registry = deps.Registry
	gw := e.startRegistry(deps.Registry)

	eip := e.programmedEIP("eip", netlab.EIP(6))

	// Each case returns the stale view the reconciler reads.
	cases := []struct {
		name  string
		stale func(t *testing.T, f *v1.IptablesFIPRule) *v1.IptablesFIPRule
	}{
		{"gone", func(t *testing.T, f *v1.IptablesFIPRule) *v1.IptablesFIPRule {
			snap := f.DeepCopy()
			if err := e.c.Delete(e.ctx, f); err != nil {
				t.Fatal(err)
			}
			return snap
		}},
		{"terminating", func(t *testing.T, f *v1.IptablesFIPRule) *v1.IptablesFIPRule {
			// Held by someone else's finalizer; the view is current
			// except that it missed the deletion.
			f.Finalizers = []string{"natgw.test/hold"}
			if err := e.c.Update(e.ctx, f); err != nil {
				t.Fatal(err)
			}
			if err := e.c.Delete(e.ctx, f); err != nil {
				t.Fatal(err)
			}
			if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(f), f); err != nil {
				t.Fatal(err)
			}
			snap := f.DeepCopy()
			snap.DeletionTimestamp = nil
			return snap
		}},
		{"changed", func(t *testing.T, f *v1.IptablesFIPRule) *v1.IptablesFIPRule {
			snap := f.DeepCopy()
			f.Labels["changed"] = "yes"
			if err := e.c.Update(e.ctx, f); err != nil {
				t.Fatal(err)
			}
			return snap
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := e.fip(tc.name, "eip", netip.AddrFrom4([4]byte{10, 9, 0, byte(i + 1)}))
			e.create(f)
			snap := tc.stale(t, f.DeepCopy())
			r := &ruleReconciler[*v1.IptablesFIPRule]{Deps: &Deps{
				Client: &staleClient{Client: e.c, snap: snap}, APIReader: e.c, Registry: deps.Registry, Log: deps.Log}, k: fipKind}
			res, err := r.Reconcile(e.ctx, reqFor(snap))
			if err != nil {
				t.Fatalf("reconcile: %v", err)
			}
			t.Logf("result %+v", res)
			objs, err := gw.List(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := hasUID(objs, snap.UID); ok {
				t.Fatalf("FIP %s programmed although its finalizer could not be added", snap.UID)
			}
			cur := &v1.IptablesFIPRule{}
			if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(snap), cur); err == nil {
				if containsString(cur.Finalizers, Finalizer) {
					t.Errorf("finalizer added: %v", cur.Finalizers)
				}
				cur.Finalizers = nil
				_ = e.c.Update(e.ctx, cur)
			}
		})
	}
	// Control: with an accurate read the same reconciler programs.
	f := e.fip("control", "eip", netip.MustParseAddr("10.9.0.100"))
	e.create(f)
	r := &ruleReconciler[*v1.IptablesFIPRule]{Deps: deps, k: fipKind}
	if _, err := r.Reconcile(e.ctx, reqFor(f)); err != nil {
		t.Fatal(err)
	}
	objs, err := gw.List(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := hasUID(objs, f.UID); !ok {
		t.Fatalf("control FIP not programmed: %v", objs)
	}
	if err := e.c.Delete(e.ctx, f); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(e.ctx, reqFor(f)); err != nil {
		t.Fatal(err)
	}
	e.waitGone(f, 10*time.Second)
	objs, _ = gw.List(e.ctx)
	if _, ok := hasUID(objs, f.UID); ok {
		t.Fatalf("control FIP still programmed after delete")
	}
	eip.Finalizers = nil
	if err := e.c.Update(e.ctx, eip); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// TestLatency200FIPs measures create→Ready of 200 FIPs (one per EIP) on
// each data plane and logs median and p99.
func TestLatency200FIPs(t *testing.T) {
	if testing.Short() {
		t.Skip("latency measurement skipped in -short mode")
	}
	for _, dp := range dataplanes {
		t.Run(string(dp), func(t *testing.T) {
			e := newEnv(t, envOptions{dataplane: dp, workers: 4})
			const n = 200
			for i := range n {
				e.create(e.eip(fmt.Sprintf("eip-%d", i), netlab.EIP(i)))
			}
			e.eventually(3*time.Minute, "200 EIPs ready", func() error {
				list := &v1.IptablesEIPList{}
				if err := e.c.List(e.ctx, list, client.MatchingLabels{testLabel: e.case_}); err != nil {
					return err
				}
				ready := 0
				for _, x := range list.Items {
					if x.Status.Ready {
						ready++
					}
				}
				if ready < n {
					return fmt.Errorf("%d/%d ready", ready, n)
				}
				return nil
			})

			created := make([]time.Time, n)
			readyAt := make([]time.Time, n)
			var mu sync.Mutex
			// Watch for readiness from a separate goroutine.
			w := e.watchFIPs()
			index := map[string]int{}
			for i := range n {
				index[fmt.Sprintf("%s-fip-%d", e.case_, i)] = i
			}
			allReady := make(chan struct{})
			go func() {
				count := 0
				for ev := range w.ResultChan() {
					f, ok := ev.Object.(*v1.IptablesFIPRule)
					if !ok || !f.Status.Ready {
						continue
					}
					now := time.Now()
					mu.Lock()
					i := index[f.Name]
					if readyAt[i].IsZero() {
						readyAt[i] = now
						count++
					}
					mu.Unlock()
					if count == n {
						close(allReady)
						return
					}
				}
			}()
			start := time.Now()
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := g; i < n; i += 4 {
						f := e.fip(fmt.Sprintf("fip-%d", i), fmt.Sprintf("eip-%d", i),
							netip.AddrFrom4([4]byte{10, 1, byte(i / 250), byte(1 + i%250)}))
						mu.Lock()
						created[i] = time.Now()
						mu.Unlock()
						if err := e.c.Create(e.ctx, f); err != nil {
							t.Errorf("create: %v", err)
						}
					}
				}()
			}
			wg.Wait()
			select {
			case <-allReady:
			case <-time.After(3 * time.Minute):
				t.Fatal("not all 200 FIPs became Ready within 3m")
			}
			total := time.Since(start)
			lat := make([]time.Duration, n)
			mu.Lock()
			for i := range n {
				lat[i] = readyAt[i].Sub(created[i])
			}
			mu.Unlock()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			if n := countKind(e.kernelObjects(dp), nat.KindFIP); n != 200 {
				t.Errorf("%d FIPs in the kernel, want 200", n)
			}
			testsummary.Record(t, fmt.Sprintf("LATENCY dataplane=%s: 200 FIPs create→Ready median %v p99 %v max %v (all 200 in %v, 4 creators, 4 workers)",
				dp, lat[n/2].Round(time.Millisecond), lat[n*99/100-1].Round(time.Millisecond), lat[n-1].Round(time.Millisecond), total.Round(time.Millisecond)))
		})
	}
}

func reqFor(o client.Object) ctrlRequest {
	return ctrlRequest{NamespacedName: types.NamespacedName{Name: o.GetName()}}
}

var _ = metav1.Now
