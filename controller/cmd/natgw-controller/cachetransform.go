package main

import (
	"unique"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// stripCache is the cache's transform: managedFields and kubectl's
// last-applied-configuration annotation dropped, and the strings that
// repeat across objects interned (internObject); objects that are not
// metav1.Object (tombstones) pass unchanged.
//
// Nothing else is dropped: the reconcilers compute their status and
// metadata patches from the difference between a cached object and its
// modified copy, so every field of a cached object is either read or
// carried into such a diff unchanged.
func stripCache(in any) (any, error) {
	in, err := stripFields(in)
	if err != nil {
		return in, err
	}
	internObject(in)
	return in, nil
}

// stripFields drops managedFields and kubectl's last-applied-configuration
// annotation (the transform before interning; BenchmarkCacheHeap's
// baseline).
func stripFields(in any) (any, error) {
	in, err := stripManagedFields(in)
	if err != nil {
		return in, err
	}
	if o, ok := in.(metav1.Object); ok {
		if a := o.GetAnnotations(); a != nil {
			if _, ok := a[corev1.LastAppliedConfigAnnotation]; ok {
				delete(a, corev1.LastAppliedConfigAnnotation)
				o.SetAnnotations(a)
			}
		}
	}
	return in, nil
}

var stripManagedFields = cache.TransformStripManagedFields()

// intern replaces *s with the canonical copy of its value (Go's unique
// package): equal strings of many cached objects (a gateway's name, an
// EIP's name and address, label and annotation keys, finalizers, condition
// reasons and messages) then share one backing array instead of one each
// that the decoder allocated. The value is unchanged.
func intern(s *string) {
	if *s != "" {
		*s = unique.Make(*s).Value()
	}
}

// internStrings interns every element of ss in place.
func internStrings(ss []string) {
	for i := range ss {
		intern(&ss[i])
	}
}

// internMap returns m with its keys and values interned (a new map of the
// same entries); an empty map is nil (an object whose only annotation was
// kubectl's last-applied-configuration keeps no empty map, ~50 B; every
// reader treats nil and empty alike, as the API does).
func internMap(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[unique.Make(k).Value()] = unique.Make(v).Value()
	}
	return out
}

// internMeta interns the object's type and the metadata that repeats
// across objects: namespace, labels, annotations, finalizers and owner
// references. Name, UID and resourceVersion are each object's own.
func internMeta(tm *metav1.TypeMeta, om *metav1.ObjectMeta) {
	intern(&tm.APIVersion)
	intern(&tm.Kind)
	intern(&om.Namespace)
	intern(&om.GenerateName)
	om.Labels = internMap(om.Labels)
	om.Annotations = internMap(om.Annotations)
	internStrings(om.Finalizers)
	for i := range om.OwnerReferences {
		r := &om.OwnerReferences[i]
		intern(&r.APIVersion)
		intern(&r.Kind)
		intern(&r.Name)
	}
}

// internConditions interns the conditions' type, status, reason and
// message (the message names the gateway or the failure, shared by many
// objects).
func internConditions(cs []v1.Condition) {
	for i := range cs {
		c := &cs[i]
		intern(&c.Type)
		s := string(c.Status)
		intern(&s)
		c.Status = metav1.ConditionStatus(s)
		intern(&c.Reason)
		intern(&c.Message)
	}
}

// internNAT interns a NAT object's metadata, conditions and the spec and
// status strings fields points to.
func internNAT(tm *metav1.TypeMeta, om *metav1.ObjectMeta, conds []v1.Condition, fields ...*string) {
	internMeta(tm, om)
	for _, f := range fields {
		intern(f)
	}
	internConditions(conds)
}

// internObject interns the repeating strings of a cached object: for the
// NAT kinds every field of spec and status but the object's own name (an
// internal address is shared by its spec and status, an EIP's name and
// address and a gateway's name by all the rules on them); for any other
// metav1.Object its metadata's (labels, annotations, finalizers,
// namespace).
func internObject(in any) {
	switch o := in.(type) {
	case *v1.IptablesEIP:
		s, st := &o.Spec, &o.Status
		internNAT(&o.TypeMeta, &o.ObjectMeta, st.Conditions, &s.V4ip, &s.V6ip, &s.MacAddress, &s.NatGwDp, &s.QoSPolicy, &s.ExternalSubnet,
			&st.IP, &st.Nat, &st.Redo, &st.QoSPolicy)
	case *v1.IptablesFIPRule:
		s, st := &o.Spec, &o.Status
		internNAT(&o.TypeMeta, &o.ObjectMeta, st.Conditions, &s.EIP, &s.InternalIP, &st.V4ip, &st.V6ip, &st.NatGwDp, &st.Redo, &st.InternalIP)
	case *v1.IptablesDnatRule:
		s, st := &o.Spec, &o.Status
		internNAT(&o.TypeMeta, &o.ObjectMeta, st.Conditions, &s.EIP, &s.ExternalPort, &s.Protocol, &s.InternalIP, &s.InternalPort, &s.Type,
			&st.V4ip, &st.V6ip, &st.NatGwDp, &st.Redo, &st.Protocol, &st.InternalIP, &st.InternalPort, &st.ExternalPort)
	case *v1.IptablesSnatRule:
		s, st := &o.Spec, &o.Status
		internNAT(&o.TypeMeta, &o.ObjectMeta, st.Conditions, &s.EIP, &s.InternalCIDR, &st.V4ip, &st.V6ip, &st.NatGwDp, &st.Redo, &st.InternalCIDR)
	case metav1.Object:
		if l := o.GetLabels(); len(l) > 0 {
			o.SetLabels(internMap(l))
		}
		if a := o.GetAnnotations(); len(a) > 0 {
			o.SetAnnotations(internMap(a))
		}
		if f := o.GetFinalizers(); f != nil {
			internStrings(f)
			o.SetFinalizers(f) // unstructured returns a copy
		}
	}
}
