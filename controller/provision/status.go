package provision

import (
	"encoding/json"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// Changed says whether the spec fields the gateway's StatefulSet was last
// built from (recorded in the status: external subnets, node selector,
// tolerations, affinity) differ from the spec: upstream then rebuilds the
// StatefulSet, which recreates the pod, and rewrites the status
// (isVpcNatGwChanged, pkg/controller/vpc_nat_gateway.go:165-179). Other
// spec fields are read when the StatefulSet is built, as upstream does:
// spec.routes are programmed live through the agent (natgw's VpcNatGateway
// reconciler; upstream's subnet-route-add), lanIp is immutable (upstream's
// webhook), spec.annotations count at creation.
//
// Absent and empty count as equal (natgw's Affinity is a pointer where
// upstream's is a struct).
func Changed(g *v1.VpcNatGateway) bool {
	s, st := g.Spec, g.Status
	return !slices.Equal(s.ExternalSubnets, st.ExternalSubnets) ||
		!slices.Equal(s.Selector, st.Selector) ||
		!sameTolerations(s.Tolerations, st.Tolerations) ||
		!equality.Semantic.DeepEqual(affinity(s.Affinity), affinity(st.Affinity))
}

func sameTolerations(a, b []corev1.Toleration) bool {
	if len(a) == 0 && len(b) == 0 {
		return true
	}
	return equality.Semantic.DeepEqual(a, b)
}

func affinity(a *corev1.Affinity) corev1.Affinity {
	if a == nil {
		return corev1.Affinity{}
	}
	return *a
}

// statusBody is the status that upstream's patchNatGwStatus writes
// (pkg/controller/vpc_nat_gateway.go:1295-1339): the four fields copied
// from the spec, sent whole in a JSON merge patch of the status
// subresource. An empty list is sent as null (removed), an absent affinity
// as {}, as upstream's types encode them. status.qosPolicy is not sent:
// it belongs to the QoS reconcile (upstream's patch repeats the value it
// read, which writes "" where there was none).
type statusBody struct {
	Status struct {
		ExternalSubnets []string            `json:"externalSubnets"`
		Selector        []string            `json:"selector"`
		Tolerations     []corev1.Toleration `json:"tolerations"`
		Affinity        corev1.Affinity     `json:"affinity"`
	} `json:"status"`
}

// StatusPatch returns the merge patch that records g's spec in its status
// (see statusBody).
func StatusPatch(g *v1.VpcNatGateway) ([]byte, error) {
	var b statusBody
	s := g.Spec
	if len(s.ExternalSubnets) > 0 {
		b.Status.ExternalSubnets = s.ExternalSubnets
	}
	if len(s.Selector) > 0 {
		b.Status.Selector = s.Selector
	}
	if len(s.Tolerations) > 0 {
		b.Status.Tolerations = s.Tolerations
	}
	b.Status.Affinity = affinity(s.Affinity)
	return json.Marshal(b)
}
