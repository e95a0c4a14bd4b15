package reconciler

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/gateway"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// TestWritesPerRule counts the controller's writes to a FIP from its create
// to Ready (and a moment after, so that a late write shows), as the API
// server's watch reports them: with the admission policy the FIP is created
// with natgw's finalizer and the only write is its status; without it the
// controller adds the finalizer first (one more write); --rule-labels adds
// the label write back. The create response carries the finalizer exactly
// when the policy is installed.
func TestWritesPerRule(t *testing.T) {
	for _, tc := range []struct {
		name       string
		admission  bool
		ruleLabels bool
		want       int
	}{
		{"admission-policy", true, false, 1},
		{"no-admission-policy", false, false, 2},
		{"admission-policy-rule-labels", true, true, 2},
		{"no-admission-policy-rule-labels", false, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, envOptions{admission: tc.admission, ruleLabels: tc.ruleLabels})
			eip := e.eip("eip", netlab.EIP(7))
			e.create(eip)
			e.waitReady(eip)
			if tc.admission && eip.Labels[v1.LabelVpcNatGwName] != e.gwName {
				t.Errorf("EIP labels %v: the policy sets %s from spec.natGwDp", eip.Labels, v1.LabelVpcNatGwName)
			}

			w := e.watchFIPs()

			f := e.fip("fip", "eip", e.gw.VMs[0].Addr)
			e.create(f)
			if got := containsString(f.Finalizers, Finalizer); got != tc.admission {
				t.Errorf("create response finalizers %v (admission policy installed: %v)", f.Finalizers, tc.admission)
			}
			e.waitReady(f)
			_, hasLabel := f.Labels[v1.LabelEIPV4IP]
			if hasLabel != tc.ruleLabels || (tc.ruleLabels && f.Labels[v1.LabelVpcNatGwName] != e.gwName) {
				t.Errorf("labels %v with --rule-labels=%v", f.Labels, tc.ruleLabels)
			}

			writes := 0
			settle := time.After(time.Second)
		drain:
			for {
				select {
				case ev, ok := <-w.ResultChan():
					if !ok {
						break drain
					}
					if o, isFIP := ev.Object.(*v1.IptablesFIPRule); isFIP && o.UID == f.UID && ev.Type == watch.Modified {
						writes++
						t.Logf("write %d: resourceVersion %s finalizers %v labels %v status %+v", writes, o.ResourceVersion, o.Finalizers, o.Labels, o.Status)
					}
				case <-settle:
					break drain
				}
			}
			if writes != tc.want {
				t.Errorf("controller writes to the FIP from create to Ready: %d, want %d", writes, tc.want)
			}
			for _, o := range []client.Object{f, eip} {
				if err := e.c.Delete(e.ctx, o); err != nil {
					t.Fatal(err)
				}
				e.waitGone(o, 30*time.Second)
			}
		})
	}
}

// TestDeleteAfterCrashBeforeStatus is the crash window the rule labels used
// to cover: a controller programmed a FIP (with natgw's finalizer, given at
// creation by the admission policy) and died before its status write, so
// neither a label nor status.natGwDp names the gateway. A new controller
// process must still delete it from the gateway when the FIP is deleted,
// whether the delete comes after it connected or while no controller ran:
// it asks the gateway registry which agents hold the UID. Both data planes.
func TestDeleteAfterCrashBeforeStatus(t *testing.T) {
	for _, dp := range dataplanes {
		for _, tc := range []struct {
			name            string
			deleteWhileDown bool
		}{
			{"deleted-after-restart", false},
			{"deleted-while-down", true},
		} {
			t.Run(string(dp)+"/"+tc.name, func(t *testing.T) {
				testDeleteAfterCrash(t, dp, tc.deleteWhileDown)
			})
		}
	}
}

func testDeleteAfterCrash(t *testing.T, dp nat.DataplaneName, deleteWhileDown bool) {
	e := newEnv(t, envOptions{noManager: true, dataplane: dp})
	cached := e.indexedClient()
	deps := &Deps{Client: cached, APIReader: e.c, Log: testLog(t)}
	terminatingInCache := func(obj client.Object) {
		t.Helper()
		e.eventually(30*time.Second, "the cache sees "+obj.GetName()+" terminating", func() error {
			cur := obj.DeepCopyObject().(client.Object)
			if err := cached.Get(e.ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
				return err
			}
			if cur.GetDeletionTimestamp().IsZero() {
				return fmt.Errorf("not terminating in the cache yet")
			}
			return nil
		})
	}
	deps.Registry = gateway.NewRegistry(gateway.Options{Transport: e.tr, Source: NewSource(deps), Config: gwconfigFor(e), DefaultDataplane: dp, Log: testLog(t)})
	eips := &eipReconciler{Deps: deps}
	fips := &ruleReconciler[*v1.IptablesFIPRule]{Deps: deps, k: fipKind}

	eip := e.programmedEIP("eip", netlab.EIP(8))
	f := e.fip("fip", "eip", e.gw.VMs[0].Addr)
	f.Finalizers = []string{Finalizer}
	e.create(f)

	// The dead controller's work: both programmed, no status, no label.
	eipObj, fl := eips.build(e.ctx, eip, netip.Addr{})
	if fl != nil {
		t.Fatal(fl)
	}
	fipObj, err := fipObject(f, nat.EIP{Address: netlab.EIP(8)})
	if err != nil {
		t.Fatal(err)
	}
	e.natgwCLI(dp, "apply", eipObj, fipObj)
	// The new process starts once its cache holds both objects (as the
	// registry starts after the caches synced).
	e.eventually(30*time.Second, "the cache has the EIP's address and the FIP", func() error {
		ce, cf := &v1.IptablesEIP{}, &v1.IptablesFIPRule{}
		if err := cached.Get(e.ctx, client.ObjectKeyFromObject(eip), ce); err != nil {
			return err
		}
		if ce.Status.IP == "" {
			return fmt.Errorf("EIP status not in the cache yet")
		}
		return cached.Get(e.ctx, client.ObjectKeyFromObject(f), cf)
	})
	if _, ok := hasUID(e.kernelObjects(dp), f.UID); !ok {
		t.Fatal("setup: the FIP is not in the kernel")
	}
	if deleteWhileDown {
		if err := e.c.Delete(e.ctx, f); err != nil {
			t.Fatal(err)
		}
		terminatingInCache(f)
	}

	// The new controller process: its registry connects the gateway.
	gw := e.startRegistry(deps.Registry)
	// A call waits 2 s for the session; the first connect of a loaded
	// machine may take longer.
	var objs []nat.Object
	e.eventually(30*time.Second, "gateway connected", func() (err error) {
		objs, err = gw.List(e.ctx)
		return err
	})
	if _, ok := hasUID(objs, f.UID); !ok {
		t.Fatalf("the connected agent does not list the FIP: %v", objs)
	}
	if !deleteWhileDown {
		if err := e.c.Delete(e.ctx, f); err != nil {
			t.Fatal(err)
		}
		terminatingInCache(f)
	}
	cur := &v1.IptablesFIPRule{}
	if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(f), cur); err != nil {
		t.Fatal(err)
	}
	if cur.Status.NatGwDp != "" || cur.Labels[v1.LabelVpcNatGwName] != "" || cur.DeletionTimestamp.IsZero() {
		t.Fatalf("setup: want a terminating FIP without status or label naming a gateway, have status %+v labels %v", cur.Status, cur.Labels)
	}

	res, err := fips.Reconcile(e.ctx, reqFor(f))
	if err != nil || !res.IsZero() {
		t.Fatalf("reconcile of the deletion: %+v, %v", res, err)
	}
	e.waitGone(f, 10*time.Second)
	objs, err = gw.List(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := hasUID(objs, f.UID); ok {
		t.Errorf("the agent still lists the deleted FIP %s: %v", f.UID, objs)
	}
	if _, ok := hasUID(e.kernelObjects(dp), f.UID); ok {
		t.Errorf("the deleted FIP %s is still in the kernel", f.UID)
	}

	// The EIP's deletion follows the same path (its spec names the gateway).
	if err := e.c.Delete(e.ctx, eip); err != nil {
		t.Fatal(err)
	}
	terminatingInCache(eip)
	if _, err := eips.Reconcile(e.ctx, reqFor(eip)); err != nil {
		t.Fatal(err)
	}
	e.waitGone(eip, 10*time.Second)
	if n := len(e.kernelObjects(dp)); n != 0 {
		t.Errorf("%d objects left in the kernel: %v", n, fmt.Sprint(e.kernelObjects(dp)))
	}
}
