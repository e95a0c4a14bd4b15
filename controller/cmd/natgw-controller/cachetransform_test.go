package main

import (
	"fmt"
	"reflect"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// fillStrings sets every empty string field reachable from v (a pointer to
// a struct; slices of structs included) to a value naming the field, so
// that a transform that drops or changes any string field of spec and
// status shows in a comparison, fields added to the types later included.
func fillStrings(v reflect.Value, path string) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			fillStrings(v.Elem(), path)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillStrings(v.Field(i), path+"."+v.Type().Field(i).Name)
			}
		}
	case reflect.Slice:
		for i := range v.Len() {
			fillStrings(v.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
	case reflect.String:
		if v.String() == "" {
			v.SetString(path)
		}
	}
}

// TestStripCacheKeepsReadFields: per NAT kind, the transform drops
// managedFields and kubectl's last-applied annotation and nothing else:
// the output equals the input minus those two (every string field of
// spec and status filled, plus a namespace, an owner reference, a second
// finalizer and a user annotation), and every string equals the original.
func TestStripCacheKeepsReadFields(t *testing.T) {
	for _, kind := range cacheKinds {
		t.Run(kind, func(t *testing.T) {
			in := natObject(kind, 7)
			fillStrings(reflect.ValueOf(in).Elem().FieldByName("Spec").Addr(), "spec")
			fillStrings(reflect.ValueOf(in).Elem().FieldByName("Status").Addr(), "status")
			in.SetNamespace("team-a")
			in.SetGenerateName("gen-")
			in.SetFinalizers(append(in.GetFinalizers(), v1.Finalizer))
			in.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "owner", UID: "u-owner"}})
			a := in.GetAnnotations()
			a["team.example/owner"] = "alice"
			want := in.DeepCopyObject().(client.Object)
			want.SetManagedFields(nil)
			delete(want.GetAnnotations(), corev1.LastAppliedConfigAnnotation)
			if len(in.GetManagedFields()) == 0 || in.GetAnnotations()[corev1.LastAppliedConfigAnnotation] == "" {
				t.Fatal("fixture lacks managedFields or the last-applied annotation")
			}
			out, err := stripCache(in)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(out, want) {
				t.Errorf("transform changed more than managedFields and last-applied:\n got %+v\nwant %+v", out, want)
			}
		})
	}
}

// TestStripCacheEmptyAnnotations: an object whose only annotation was the
// last-applied one keeps no annotation map (nil), and one without
// annotations stays without.
func TestStripCacheEmptyAnnotations(t *testing.T) {
	in := natObject("IptablesFIPRule", 1)
	out, err := stripCache(in)
	if err != nil {
		t.Fatal(err)
	}
	if a := out.(client.Object).GetAnnotations(); a != nil {
		t.Errorf("annotations %v, want nil", a)
	}
}

// TestStripCacheShares: equal strings of two transformed objects share
// one backing array (the interning works), and the values are unchanged.
// The canonical copy lives while the transform runs; a garbage collection
// between the two transforms may drop it, so a few attempts are allowed.
func TestStripCacheShares(t *testing.T) {
	same := func(a, b string) bool { return a == b && unsafe.StringData(a) == unsafe.StringData(b) }
	for attempt := range 3 {
		// Two DNATs of one EIP on one gateway (natObject: ten per EIP).
		x, err := stripCache(natObject("IptablesDnatRule", 0))
		if err != nil {
			t.Fatal(err)
		}
		y, err := stripCache(natObject("IptablesDnatRule", benchGateways*10))
		if err != nil {
			t.Fatal(err)
		}
		a, b := x.(*v1.IptablesDnatRule), y.(*v1.IptablesDnatRule)
		if a.Status.NatGwDp != "gw-000" || a.Spec.EIP != "eip-000000" || a.Labels[v1.LabelVpcNatGwName] != "gw-000" || a.Status.Conditions[0].Reason != v1.ReasonProgrammed {
			t.Fatalf("values changed: %+v", a)
		}
		if same(a.Status.NatGwDp, b.Status.NatGwDp) && same(a.Status.NatGwDp, a.Labels[v1.LabelVpcNatGwName]) &&
			same(a.Spec.InternalPort, b.Spec.InternalPort) && same(a.Status.Conditions[0].Message, b.Status.Conditions[0].Message) &&
			same(a.Finalizers[0], b.Finalizers[0]) {
			return
		}
		t.Logf("attempt %d: not shared", attempt)
	}
	t.Error("equal strings of two cached objects do not share their bytes")
}

// TestStripCacheOtherKinds: objects of the other cached kinds (typed and
// unstructured) keep their labels, annotations and finalizers (interned),
// lose managedFields and last-applied.
func TestStripCacheOtherKinds(t *testing.T) {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("kubeovn.io/v1")
	u.SetKind("Vip")
	u.SetName("v")
	u.SetLabels(map[string]string{"app.kubernetes.io/managed-by": "natgw"})
	u.SetAnnotations(map[string]string{corev1.LastAppliedConfigAnnotation: "{}", "k": "v"})
	u.SetFinalizers([]string{"f1"})
	u.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "m"}})
	gw := &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: "g", Labels: map[string]string{"l": "1"}, Annotations: map[string]string{v1.ReadyAnnotation: "{}"}, Finalizers: []string{"f2"}}}
	for _, in := range []client.Object{u, gw} {
		labels, finalizers := in.GetLabels(), in.GetFinalizers()
		out, err := stripCache(in)
		if err != nil {
			t.Fatal(err)
		}
		o := out.(client.Object)
		if !reflect.DeepEqual(o.GetLabels(), labels) || !reflect.DeepEqual(o.GetFinalizers(), finalizers) || len(o.GetManagedFields()) != 0 {
			t.Errorf("%T: labels %v finalizers %v managedFields %v", in, o.GetLabels(), o.GetFinalizers(), o.GetManagedFields())
		}
		if _, ok := o.GetAnnotations()[corev1.LastAppliedConfigAnnotation]; ok || len(o.GetAnnotations()) != 1 {
			t.Errorf("%T: annotations %v, want one left", in, o.GetAnnotations())
		}
	}
	if _, err := stripCache("tombstone"); err != nil {
		t.Errorf("non-object: %v", err)
	}
}
