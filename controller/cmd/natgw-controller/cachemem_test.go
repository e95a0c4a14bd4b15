package main

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/internal/heapstat"
)

// cacheKinds are the NAT kinds BenchmarkCacheHeap and the transform's
// tests fill, in the shape Kube-OVN's users and natgw leave them: created by
// `kubectl apply` (last-applied annotation, managedFields of kubectl and
// of natgw-controller's status and metadata writes), upstream's labels
// (--rule-labels), natgw's finalizer, a status with the Ready condition
// as the reconcilers write it.
var cacheKinds = []string{"IptablesEIP", "IptablesFIPRule", "IptablesDnatRule", "IptablesSnatRule"}

// benchGateways is how many gateways the generated objects spread over.
const benchGateways = 100

// natObject returns object i of kind: on gateway i%benchGateways; a FIP
// and an SNAT have an EIP each, ten DNATs share one.
func natObject(kind string, i int) client.Object { return natObjectShaped(kind, i, false) }

// natObjectShaped is natObject; bare leaves out what kubectl and
// --rule-labels add (labels, the last-applied annotation, kubectl's
// managedFields entry): an object a program created, as natgw-bench's
// scenario 6 does.
func natObjectShaped(kind string, i int, bare bool) client.Object {
	gw := fmt.Sprintf("gw-%03d", i%benchGateways)
	eipOf := func(e int) (string, string) {
		return fmt.Sprintf("eip-%06d", e), fmt.Sprintf("172.%d.%d.%d", 16+e>>16, e>>8&255, e&255)
	}
	internal := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
	now := metav1.NewTime(time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC))
	cond := []v1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.ReasonProgrammed,
		Message: "programmed on gateway " + gw, ObservedGeneration: 1, LastUpdateTime: now, LastTransitionTime: now}}
	meta := func(name, v4ip string, spec any) metav1.ObjectMeta {
		applied, _ := json.Marshal(map[string]any{"apiVersion": v1.GroupVersion.String(), "kind": kind, "metadata": map[string]any{"name": name}, "spec": spec})
		fields := func(s string) *metav1.FieldsV1 { return &metav1.FieldsV1{Raw: []byte(s)} }
		if bare {
			now := now
			return metav1.ObjectMeta{
				Name: name, UID: types.UID(fmt.Sprintf("%08x-1111-4222-8333-%012x", i, i)), ResourceVersion: fmt.Sprint(1000000 + i),
				Generation: 1, CreationTimestamp: now, Finalizers: []string{reconciler.Finalizer},
				ManagedFields: []metav1.ManagedFieldsEntry{
					{Manager: "natgw-bench", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: v1.GroupVersion.String(), Time: &now, FieldsType: "FieldsV1",
						FieldsV1: fields(`{"f:spec":{".":{},"f:eip":{},"f:internalIp":{}}}`)},
					{Manager: "natgw-controller", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: v1.GroupVersion.String(), Time: &now, FieldsType: "FieldsV1",
						FieldsV1: fields(`{"f:metadata":{"f:finalizers":{".":{},"v:\"natgw.kubeovn.io/finalizer\"":{}}}}`)},
					{Manager: "natgw-controller", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: v1.GroupVersion.String(), Time: &now, FieldsType: "FieldsV1", Subresource: "status",
						FieldsV1: fields(`{"f:status":{".":{},"f:conditions":{},"f:natGwDp":{},"f:ready":{},"f:v4ip":{}}}`)},
				},
			}
		}
		return metav1.ObjectMeta{
			Name: name, UID: types.UID(fmt.Sprintf("%08x-1111-4222-8333-%012x", i, i)), ResourceVersion: fmt.Sprint(1000000 + i),
			Generation: 1, CreationTimestamp: now,
			Labels:      map[string]string{v1.LabelEIPV4IP: v4ip, v1.LabelVpcNatGwName: gw},
			Annotations: map[string]string{corev1.LastAppliedConfigAnnotation: string(applied) + "\n"},
			Finalizers:  []string{reconciler.Finalizer},
			ManagedFields: []metav1.ManagedFieldsEntry{
				{Manager: "kubectl-client-side-apply", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: v1.GroupVersion.String(), Time: &now, FieldsType: "FieldsV1",
					FieldsV1: fields(`{"f:metadata":{"f:annotations":{".":{},"f:kubectl.kubernetes.io/last-applied-configuration":{}}},"f:spec":{".":{},"f:eip":{},"f:internalIp":{}}}`)},
				{Manager: "natgw-controller", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: v1.GroupVersion.String(), Time: &now, FieldsType: "FieldsV1",
					FieldsV1: fields(`{"f:metadata":{"f:finalizers":{".":{},"v:\"natgw.kubeovn.io/finalizer\"":{}},"f:labels":{".":{},"f:ovn.kubernetes.io/eip_v4_ip":{},"f:ovn.kubernetes.io/vpc-nat-gw-name":{}}}}`)},
				{Manager: "natgw-controller", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: v1.GroupVersion.String(), Time: &now, FieldsType: "FieldsV1", Subresource: "status",
					FieldsV1: fields(`{"f:status":{".":{},"f:conditions":{},"f:natGwDp":{},"f:ready":{},"f:v4ip":{}}}`)},
			},
		}
	}
	tm := metav1.TypeMeta{APIVersion: v1.GroupVersion.String(), Kind: kind}
	switch kind {
	case "IptablesEIP":
		name, v4 := eipOf(i)
		spec := v1.IptablesEIPSpec{V4ip: v4, NatGwDp: gw, ExternalSubnet: "ovn-vpc-external-network"}
		return &v1.IptablesEIP{TypeMeta: tm, ObjectMeta: meta(name, v4, spec), Spec: spec,
			Status: v1.IptablesEIPStatus{Ready: true, IP: v4, Nat: "fip", Conditions: cond}}
	case "IptablesFIPRule":
		eip, v4 := eipOf(i)
		spec := v1.IptablesFIPRuleSpec{EIP: eip, InternalIP: internal}
		return &v1.IptablesFIPRule{TypeMeta: tm, ObjectMeta: meta(fmt.Sprintf("fip-%06d", i), v4, spec), Spec: spec,
			Status: v1.IptablesFIPRuleStatus{Ready: true, V4ip: v4, NatGwDp: gw, InternalIP: internal, Conditions: cond}}
	case "IptablesDnatRule":
		eip, v4 := eipOf(i / 10)
		port := fmt.Sprint(10000 + i%10)
		spec := v1.IptablesDnatRuleSpec{EIP: eip, ExternalPort: port, Protocol: "tcp", InternalIP: internal, InternalPort: "80"}
		return &v1.IptablesDnatRule{TypeMeta: tm, ObjectMeta: meta(fmt.Sprintf("dnat-%06d", i), v4, spec), Spec: spec,
			Status: v1.IptablesDnatRuleStatus{Ready: true, V4ip: v4, NatGwDp: gw, Protocol: "tcp", InternalIP: internal, InternalPort: "80", ExternalPort: port, Conditions: cond}}
	case "IptablesSnatRule":
		eip, v4 := eipOf(i)
		cidr := fmt.Sprintf("10.%d.%d.0/24", i>>8&255, i&255)
		spec := v1.IptablesSnatRuleSpec{EIP: eip, InternalCIDR: cidr}
		return &v1.IptablesSnatRule{TypeMeta: tm, ObjectMeta: meta(fmt.Sprintf("snat-%06d", i), v4, spec), Spec: spec,
			Status: v1.IptablesSnatRuleStatus{Ready: true, V4ip: v4, NatGwDp: gw, InternalCIDR: cidr, Conditions: cond}}
	}
	panic("unknown kind " + kind)
}

// captureIndexer records the field indexes reconciler.RegisterIndexes
// registers, per kind.
type captureIndexer map[string]map[string]client.IndexerFunc

func (c captureIndexer) IndexField(_ context.Context, obj client.Object, field string, f client.IndexerFunc) error {
	k := fmt.Sprintf("%T", obj)
	if c[k] == nil {
		c[k] = map[string]client.IndexerFunc{}
	}
	c[k][field] = f
	return nil
}

// natgwIndexers returns the indexers an informer of obj's kind has in
// natgw-controller: the namespace index and natgw's field indexes,
// keyed as controller-runtime's IndexField keys them (cluster-scoped
// objects under "__all_namespaces/").
func natgwIndexers(tb testing.TB, obj client.Object) toolscache.Indexers {
	c := captureIndexer{}
	if err := reconciler.RegisterIndexes(context.Background(), c); err != nil {
		tb.Fatal(err)
	}
	ix := toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc}
	for field, f := range c[fmt.Sprintf("%T", obj)] {
		ix["field:"+field] = func(o any) ([]string, error) {
			vals := f(o.(client.Object))
			out := make([]string, len(vals))
			for i, v := range vals {
				out[i] = "__all_namespaces/" + v
			}
			return out, nil
		}
	}
	return ix
}

// benchTransforms are the cache transforms the benchmarks compare: none,
// the one before interning (strip) and stripCache (intern).
var benchTransforms = []struct {
	name string
	f    toolscache.TransformFunc
}{
	{"none", func(o any) (any, error) { return o, nil }},
	{"strip", stripFields},
	{"intern", stripCache},
}

// BenchmarkCacheHeap is the live heap an informer holds per cached NAT
// object in natgw-controller: n objects of each kind encoded as the API
// server sends them (JSON), decoded with the controller's scheme, passed
// through a cache transform and kept in a client-go Indexer with natgw's
// indexes; B/obj is the heap after runtime.GC over n, load-independent.
// Transforms: none, strip (managedFields and last-applied dropped, the
// transform before interning) and intern (stripCache). Shapes: kubectl
// (natObject: applied with kubectl, upstream's labels) and bare
// (natObjectShaped's bare: created by a program, as in natgw-bench).
func BenchmarkCacheHeap(b *testing.B) {
	const n = 10_000
	scheme, err := v1.NewScheme()
	if err != nil {
		b.Fatal(err)
	}
	dec := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	for _, shape := range []string{"kubectl", "bare"} {
		for _, kind := range cacheKinds {
			raw := make([][]byte, n)
			for i := range raw {
				if raw[i], err = json.Marshal(natObjectShaped(kind, i, shape == "bare")); err != nil {
					b.Fatal(err)
				}
			}
			for _, tr := range benchTransforms {
				b.Run(shape+"/"+kind+"/"+tr.name, func(b *testing.B) {
					for b.Loop() {
						h0 := heapstat.Live()
						var s toolscache.Indexer
						for i, data := range raw {
							obj, _, err := dec.Decode(data, nil, nil)
							if err != nil {
								b.Fatal(err)
							}
							if s == nil {
								s = toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, natgwIndexers(b, obj.(client.Object)))
							}
							o, err := tr.f(obj)
							if err != nil {
								b.Fatal(err)
							}
							if err := s.Add(o); err != nil {
								b.Fatalf("object %d: %v", i, err)
							}
						}
						h1 := heapstat.Live()
						if len(s.List()) != n {
							b.Fatalf("%d objects cached, want %d", len(s.List()), n)
						}
						runtime.KeepAlive(s)
						b.ReportMetric(float64(h1-h0)/n, "B/obj")
					}
				})
			}
		}
	}
}

// BenchmarkCacheTransformCPU is the CPU cost of the transform per object
// next to the decode it follows (ns/op: one decode and one transform of a
// bare FIP; none is the decode alone; compare in the same run, as wall
// time depends on the load, or count instructions with cachegrind).
func BenchmarkCacheTransformCPU(b *testing.B) {
	scheme, err := v1.NewScheme()
	if err != nil {
		b.Fatal(err)
	}
	dec := serializer.NewCodecFactory(scheme).UniversalDeserializer()
	raw, err := json.Marshal(natObjectShaped("IptablesFIPRule", 7, true))
	if err != nil {
		b.Fatal(err)
	}
	for _, tr := range benchTransforms {
		b.Run(tr.name, func(b *testing.B) {
			for b.Loop() {
				obj, _, err := dec.Decode(raw, nil, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tr.f(obj); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
