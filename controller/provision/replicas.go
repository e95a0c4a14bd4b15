package provision

import (
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/transport"
)

// The number of gateway replicas (controller/docs/operations.md,
// "Two-replica gateways"). One rule, read by the
// admission webhook (controller/admission) and by the provisioner's
// reconcile: Replicas says what a VpcNatGateway asks for and whether it is
// valid, ReplicasChange whether a live gateway may go from one value to
// another.
const (
	// ReplicasAnnotation on a VpcNatGateway asks for its number of
	// replicas where the CRDs have no spec.replicas (Kube-OVN v1.16.2's
	// prune it; Kube-OVN master's and natgw's have it). On the pod
	// template of a gateway provisioned with two replicas it says so
	// ("2"); a single gateway's template does not carry it. The exec
	// transport reads it on the pods (transport.ReplicasAnnotation, the
	// one definition).
	ReplicasAnnotation = transport.ReplicasAnnotation
	// MaxReplicas is the most replicas natgw runs: one active, one standby.
	MaxReplicas = 2
)

var (
	replicasPath           = field.NewPath("spec", "replicas")
	replicasAnnotationPath = field.NewPath("metadata", "annotations").Key(ReplicasAnnotation)
)

// replicasWant is the detail of every refused value.
const replicasWant = "want 1 (one gateway pod) or 2 (an active and a hot standby)"

// Replicas returns the number of gateway replicas g asks for: the
// annotation ReplicasAnnotation when present, else spec.replicas, else 1.
// A value other than 1 or 2 (0, negative, 3 or more, not an integer) is an
// error naming the field and the value. The annotation and spec.replicas
// must agree when both are set, except that spec.replicas 1 (the CRD's
// default, which the API server fills in) yields to the annotation.
func Replicas(g *v1.VpcNatGateway) (int32, *field.Error) {
	n := int32(1)
	spec := g.Spec.Replicas
	if spec != nil {
		if *spec < 1 || *spec > MaxReplicas {
			return 0, field.Invalid(replicasPath, *spec, replicasWant)
		}
		n = *spec
	}
	s, ok := g.Annotations[ReplicasAnnotation]
	if !ok {
		return n, nil
	}
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 32)
	if err != nil {
		return 0, field.Invalid(replicasAnnotationPath, s, "not an integer: "+replicasWant)
	}
	if v < 1 || v > MaxReplicas {
		return 0, field.Invalid(replicasAnnotationPath, s, replicasWant)
	}
	if spec != nil && *spec != 1 && int32(v) != *spec {
		return 0, field.Invalid(replicasAnnotationPath, s, fmt.Sprintf("disagrees with spec.replicas %d (the annotation is for CRDs without spec.replicas: set one of the two)", *spec))
	}
	return int32(v), nil
}

// ReplicasChange says whether a gateway provisioned with from replicas may
// be provisioned with to: only when they are equal. A single gateway's pod
// holds spec.lanIp as its own eth0 address and its agent adds the EIPs
// itself; a two-replica gateway's pods have addresses of their own and
// the floating lanIp and EIPs follow the active replica (as Kube-OVN
// master's HA gateway, which sets no static address either). Going from
// one to the other changes the pod template, so the StatefulSet would
// replace the running pod (a gap in traffic), and during the rollout the
// new HA pod would lead alone while the old single pod still held the
// addresses. Refused instead, with the way out in the message: a new
// gateway with the other number.
func ReplicasChange(from, to int32) *field.Error {
	if from == to {
		return nil
	}
	return field.Forbidden(replicasPath, fmt.Sprintf(
		"the gateway runs %d replica(s) and cannot change to %d in place (spec.replicas or annotation %s): "+
			"a single gateway's pod owns lanIp as its own address, a two-replica gateway's lanIp and EIPs float between its pods; "+
			"create a new VpcNatGateway with %d replicas and move the EIPs to it", from, to, ReplicasAnnotation, to))
}

// LeaseName is the name of the coordination.k8s.io Lease that fences a
// two-replica gateway's active replica (`natgw ha --fence-lease
// NAMESPACE/NAME`, nat/ha/leasefence), in the gateway pods' namespace:
// the StatefulSet's name. The gateway pods' ServiceAccount
// (GatewayServiceAccount) may get, create and update it
// (controller/config/ha).
func LeaseName(gateway string) string { return StatefulSetName(gateway) }

// GatewayServiceAccount is the ServiceAccount of a two-replica gateway's
// pods, in their namespace, bound to the Lease role of controller/config/ha
// (a single gateway's pods keep the namespace's default, as upstream's).
const GatewayServiceAccount = "natgw-gateway"

// ProvisionedReplicas says how many replicas a gateway StatefulSet's pod
// template was built for: 2 when it carries ReplicasAnnotation "2" (haPod), else
// 1. (Not the StatefulSet's spec.replicas, which anyone may scale.)
func ProvisionedReplicas(annotations map[string]string) int32 {
	if annotations[ReplicasAnnotation] == strconv.Itoa(MaxReplicas) {
		return MaxReplicas
	}
	return 1
}
