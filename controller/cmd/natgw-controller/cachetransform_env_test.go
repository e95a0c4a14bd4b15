package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/internal/apitest"
)

// TestCacheTransformWithAPIServer: a real kube-apiserver (envtest) and the
// controller's informer cache with cacheOptions' transform: a FIP applied
// as kubectl does (last-applied annotation, a user annotation, a label,
// natgw's finalizer, a status) is cached without managedFields and the
// last-applied annotation and otherwise as the API server holds it; it is
// found by natgw's EIP index; and a status merge patch computed from the
// cached copy, as the reconcilers compute theirs, sends the changed field
// only (the API server's object keeps its annotations, labels and
// finalizers; the cache follows).
func TestCacheTransformWithAPIServer(t *testing.T) {
	assets := apitest.RequireAssets(t)
	cfg := apitest.StartT(t, apitest.Environment(assets, apitest.CRDDir()))
	scheme := apitest.Scheme(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	spec := v1.IptablesFIPRuleSpec{EIP: "eip-1", InternalIP: "10.0.1.5"}
	applied, err := json.Marshal(map[string]any{"apiVersion": v1.GroupVersion.String(), "kind": "IptablesFIPRule", "metadata": map[string]any{"name": "fip-1"}, "spec": spec})
	if err != nil {
		t.Fatal(err)
	}
	fip := &v1.IptablesFIPRule{ObjectMeta: metav1.ObjectMeta{Name: "fip-1",
		Labels:      map[string]string{v1.LabelVpcNatGwName: "gw-1"},
		Annotations: map[string]string{corev1.LastAppliedConfigAnnotation: string(applied), "team.example/owner": "alice"},
		Finalizers:  []string{reconciler.Finalizer},
	}, Spec: spec}
	if err := c.Create(ctx, fip); err != nil {
		t.Fatalf("create IptablesFIPRule: %v", err)
	}
	before := fip.DeepCopy()
	fip.Status = v1.IptablesFIPRuleStatus{Ready: true, V4ip: "172.31.0.10", NatGwDp: "gw-1", InternalIP: "10.0.1.5",
		Conditions: []v1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.ReasonProgrammed, Message: "programmed on gateway gw-1", ObservedGeneration: 1}}}
	if err := c.Status().Patch(ctx, fip, client.MergeFrom(before)); err != nil {
		t.Fatalf("write status: %v", err)
	}

	ca, err := cache.New(cfg, func() cache.Options { o := cacheOptions(&flags{}); o.Scheme = scheme; return o }())
	if err != nil {
		t.Fatal(err)
	}
	if err := reconciler.RegisterIndexes(ctx, ca); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.GetInformer(ctx, &v1.IptablesFIPRule{}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = ca.Start(ctx) }()
	if !ca.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}

	live := &v1.IptablesFIPRule{}
	if err := c.Get(ctx, types.NamespacedName{Name: "fip-1"}, live); err != nil {
		t.Fatal(err)
	}
	if len(live.ManagedFields) == 0 {
		t.Fatal("the API server's object has no managedFields: the test checks nothing")
	}
	want := live.DeepCopy()
	want.ManagedFields = nil
	delete(want.Annotations, corev1.LastAppliedConfigAnnotation)
	list := &v1.IptablesFIPRuleList{}
	if err := ca.List(ctx, list, client.MatchingFields{reconciler.EIPIndex: "eip-1"}); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		t.Fatalf("%d FIPs by the EIP index, want 1", len(list.Items))
	}
	got := &list.Items[0]
	got.TypeMeta = want.TypeMeta
	if !apiEqual(got, want) {
		t.Errorf("cached FIP differs from the API server's beyond managedFields and last-applied:\n got %+v\nwant %+v", got, want)
	}

	// A reconciler's status write from the cached copy.
	cached := got.DeepCopy()
	before = cached.DeepCopy()
	cached.Status.Conditions[0].Message = "programmed on gateway gw-2"
	cached.Status.NatGwDp = "gw-2"
	if err := c.Status().Patch(ctx, cached, client.MergeFrom(before)); err != nil {
		t.Fatalf("status patch from the cached copy: %v", err)
	}
	if err := c.Get(ctx, types.NamespacedName{Name: "fip-1"}, live); err != nil {
		t.Fatal(err)
	}
	if live.Annotations[corev1.LastAppliedConfigAnnotation] != string(applied) || live.Annotations["team.example/owner"] != "alice" ||
		live.Labels[v1.LabelVpcNatGwName] != "gw-1" || len(live.Finalizers) != 1 || live.Status.NatGwDp != "gw-2" || live.Status.InternalIP != "10.0.1.5" {
		t.Errorf("after a status patch from the cached copy the API server holds %+v", live)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		f := &v1.IptablesFIPRule{}
		if err := ca.Get(ctx, types.NamespacedName{Name: "fip-1"}, f); err != nil {
			t.Fatal(err)
		}
		if f.Status.NatGwDp == "gw-2" {
			if f.Annotations["team.example/owner"] != "alice" || len(f.ManagedFields) != 0 {
				t.Errorf("cache after the update: %+v", f)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cache did not see the status patch within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// apiEqual compares two FIPs as the API serializes them (times at the
// second, as the API server stores them).
func apiEqual(a, b *v1.IptablesFIPRule) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}
