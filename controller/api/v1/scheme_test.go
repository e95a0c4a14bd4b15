package v1_test

import (
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// TestNewScheme: the scheme knows the built-in kinds natgw-controller
// reads and writes and every kind of natgw's API, each under its group.
func TestNewScheme(t *testing.T) {
	s, err := v1.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		obj         runtime.Object
		group, kind string
	}{
		{&corev1.Pod{}, "", "Pod"},
		{&corev1.Event{}, "", "Event"},
		{&coordinationv1.Lease{}, "coordination.k8s.io", "Lease"},
		{&v1.VpcNatGateway{}, "kubeovn.io", "VpcNatGateway"},
		{&v1.IptablesEIP{}, "kubeovn.io", "IptablesEIP"},
		{&v1.IptablesFIPRule{}, "kubeovn.io", "IptablesFIPRule"},
		{&v1.IptablesDnatRule{}, "kubeovn.io", "IptablesDnatRule"},
		{&v1.IptablesSnatRule{}, "kubeovn.io", "IptablesSnatRule"},
		{&v1.QoSPolicy{}, "kubeovn.io", "QoSPolicy"},
	} {
		gvks, _, err := s.ObjectKinds(c.obj)
		if err != nil || len(gvks) != 1 || gvks[0].Group != c.group || gvks[0].Kind != c.kind {
			t.Errorf("%T: kinds %v, %v; want %s %s", c.obj, gvks, err, c.group, c.kind)
		}
	}
	if s2, err := v1.NewScheme(); err != nil || s2 == s {
		t.Errorf("a second NewScheme: %p, %v; want a new scheme", s2, err)
	}
}
