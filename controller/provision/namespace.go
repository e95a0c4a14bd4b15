package provision

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// The namespace of a gateway's workload (controller/docs/operations.md,
// "The gateway's namespace"). Kube-OVN master's VpcNatGateway has
// spec.namespace: the namespace of the gateway's StatefulSet and pods,
// kube-ovn-controller's own when empty; master refuses a change of it on a
// live gateway in its webhook. One rule here, read by the provisioner
// (StatefulSet, Lease, lanIp Vip), the exec transport (through
// Exec.NamespaceOf) and the admission webhook (NamespaceChange).

var namespacePath = field.NewPath("spec", "namespace")

// GatewayNamespace returns the namespace of g's workload: g's
// spec.namespace when set, else configured (natgw's gateway namespace,
// Options.Namespace).
func GatewayNamespace(g *v1.VpcNatGateway, configured string) string {
	if g != nil && g.Spec.Namespace != "" {
		return g.Spec.Namespace
	}
	return configured
}

// NamespaceChange says whether a gateway whose workload lives in namespace
// from may move to namespace to: only when they are equal. A move would
// create a second StatefulSet (and a second set of gateway pods claiming
// the same lanIp and EIPs) in the new namespace while the old one still
// runs; as Kube-OVN master, natgw refuses it, with the way out in the
// message.
func NamespaceChange(from, to string) *field.Error {
	if from == to {
		return nil
	}
	return field.Forbidden(namespacePath, fmt.Sprintf(
		"the gateway's workload namespace %q cannot change to %q (\"\" is natgw's configured namespace; spec.namespace is immutable, as in Kube-OVN master): "+
			"create a new VpcNatGateway in the other namespace and move the EIPs to it", from, to))
}

// AllowedNamespace says whether ns is a namespace the provisioner may place
// a gateway in: the configured one or one of extra (Options.
// GatewayNamespaces; the manager's cache and natgw-controller's RBAC cover
// exactly these).
func AllowedNamespace(ns, configured string, extra []string) bool {
	if ns == configured {
		return true
	}
	for _, e := range extra {
		if e == ns {
			return true
		}
	}
	return false
}
