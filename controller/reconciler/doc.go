// Package reconciler holds natgw-controller's reconcilers for the
// kubeovn.io/v1 NAT CRDs, one file set per reconciled kind:
//
//	VpcNatGateway                     vpcnatgateway.go (Reconcile, Ready, routes, data plane annotation),
//	                                  vpcnatgateway_qos.go (its gateway-wide QoS, spec.qosPolicy)
//	IptablesEIP                       iptableseip.go
//	IptablesFIPRule, IptablesDnatRule, iptablesrules.go (one generic reconciler, ruleReconciler[T]),
//	IptablesSnatRule                  iptablesrules_kinds.go (what differs per kind)
//	QoSPolicy                         qospolicy.go
//
// Shared by all: common.go (Deps, finalizers, status and meta patches,
// failures), translate.go (API objects to nat.Objects through nat's one
// parser), check.go (the same checks exported for admission), network.go
// (a gateway's external network), predicates.go, tracker.go, indexread.go,
// gatewayevents.go (gateway events as requests), source.go (gateway.Source)
// and setup.go (registration with the manager).
//
// Every reconciler is finalizer first:
//
//  1. Get; NotFound → done (the gateway's orphan sweep covers leftovers).
//  2. Being deleted → delete by UID on the gateway(s) it was programmed on
//     → remove the finalizer only after the gateway confirmed.
//  3. No finalizer → add it in one metadata patch with optimistic lock
//     (none when the admission policy of controller/config/admission put
//     it there at creation); if that fails (NotFound, terminating,
//     conflict) nothing is programmed. A successful patch is the API server's word that the
//     object exists, is not terminating and carries the finalizer, so
//     programming follows in the same pass. No write sends a whole
//     object: metadata by patch, status by patch of the fields natgw owns
//     through the status subresource, so fields natgw's types do not know
//     are never dropped.
//  4. Resolve (EIP object, its gateway, its address) and validate → apply
//     one nat.Object keyed by the object's UID (a spec update is one apply:
//     old out, new in, in one transaction) → status (ready, conditions with
//     observedGeneration) and an Event on every failure.
//
// The package also implements gateway.Source: the desired set of a gateway
// and the live-read orphan confirmation.
package reconciler
