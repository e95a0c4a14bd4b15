package reconciler

import (
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/gateway"
)

// TestStaleStatusRefused: the QoSPolicy and VpcNatGateway reconcilers,
// reading their object from a cache older than the stored one, must not
// overwrite the newer stored status: the write is refused as stale, the
// reconcile asks to run again after staleRetry with no error, and a fresh
// read then writes.
func TestStaleStatusRefused(t *testing.T) {
	e := newEnv(t, envOptions{noManager: true})
	deps := &Deps{Client: e.indexedClient(), APIReader: e.c, Log: testLog(t)}

	t.Run("QoSPolicy", func(t *testing.T) {
		p := e.policy("stale", v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{rule("in", v1.QoSDirectionIngress, "10", "1")}})
		p.Finalizers = []string{Finalizer}
		e.create(p)
		snap := p.DeepCopy() // as created: no status
		// A newer status stored since (another reconcile's write).
		const newer = "newer status, written after the snapshot"
		e.updateStatus(p, func() {
			p.Status.Conditions = []v1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.ReasonAccepted,
				Message: newer, ObservedGeneration: p.Generation, LastTransitionTime: metav1.Now()}}
		})
		r := &qosPolicyReconciler{Deps: &Deps{Client: &staleClient{Client: deps.Client, snap: snap}, APIReader: e.c, Log: deps.Log}}
		res, err := r.Reconcile(e.ctx, reqFor(snap))
		if err != nil || res.RequeueAfter != staleRetry {
			t.Errorf("stale reconcile: %+v, %v; want a retry after %v and no error", res, err, staleRetry)
		}
		cur := &v1.QoSPolicy{}
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(p), cur); err != nil {
			t.Fatal(err)
		}
		if c := v1.FindCondition(cur.Status.Conditions, v1.ConditionReady); c == nil || c.Message != newer {
			t.Errorf("stored Ready after the stale reconcile: %+v; want the newer %q kept", c, newer)
		}
		// A fresh read writes the policy's own status.
		r = &qosPolicyReconciler{Deps: deps}
		e.eventually(10*time.Second, "a fresh reconcile writes Accepted", func() error {
			if _, err := r.Reconcile(e.ctx, reqFor(p)); err != nil {
				return err
			}
			if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(p), cur); err != nil {
				return err
			}
			if c := v1.FindCondition(cur.Status.Conditions, v1.ConditionReady); c == nil || c.Message == newer || c.Reason != v1.ReasonAccepted {
				return fmt.Errorf("Ready %+v", c)
			}
			return nil
		})
	})

	t.Run("VpcNatGateway", func(t *testing.T) {
		src := &Deps{Client: deps.Client, APIReader: e.c, Log: testLog(t)}
		reg := gateway.NewRegistry(gateway.Options{Transport: e.tr, Source: NewSource(src), Config: gwconfigFor(e), DefaultDataplane: e.dataplane, Log: testLog(t)})
		src.Registry = reg
		gw := e.startRegistry(reg)
		g := e.gatewayObj()
		e.create(g)
		// Read when status.qosPolicy named an old policy and the spec none.
		e.updateStatus(g, func() { g.Status.QoSPolicy = "old" })
		snap := g.DeepCopy()
		// Since then the spec and the status name a newer policy.
		e.update(g, func() { g.Spec.QoSPolicy = "newer" })
		e.updateStatus(g, func() { g.Status.QoSPolicy = "newer" })
		r := &natGatewayReconciler{Deps: &Deps{Client: &staleClient{Client: deps.Client, snap: snap}, APIReader: e.c, Registry: reg, Log: deps.Log}}
		f := r.programQoS(e.ctx, snap.DeepCopy(), gw)
		if f == nil || !f.quiet || f.requeueAfter != staleRetry || f.err != nil {
			t.Errorf("programQoS from a stale read: %+v; want a quiet retry after %v", f, staleRetry)
		}
		cur := &v1.VpcNatGateway{}
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(g), cur); err != nil {
			t.Fatal(err)
		}
		if cur.Status.QoSPolicy != "newer" {
			t.Errorf("stored status.qosPolicy %q after the stale write; want %q kept", cur.Status.QoSPolicy, "newer")
		}
		// A fresh read of the same (spec without a policy) writes.
		fresh := snap.DeepCopy()
		fresh.ResourceVersion = cur.ResourceVersion
		if f := r.programQoS(e.ctx, fresh, gw); f != nil {
			t.Fatalf("programQoS from a fresh read: %+v", f)
		}
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(g), cur); err != nil {
			t.Fatal(err)
		}
		if cur.Status.QoSPolicy != "" {
			t.Errorf("status.qosPolicy %q after a fresh write, want none", cur.Status.QoSPolicy)
		}
		e.update(cur, func() { cur.Finalizers = nil })
		if err := e.c.Delete(e.ctx, cur); err != nil {
			t.Fatal(err)
		}
	})
}
