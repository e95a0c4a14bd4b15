// Package admission is natgw-controller's validating admission webhook for
// the kubeovn.io/v1 NAT CRDs in replace mode: the checks Kube-OVN v1.16.2's
// webhook makes (pkg/webhook/vpc_nat_gateway.go), which cannot run while
// Kube-OVN's VPC NAT gateway feature is off (its webhook then refuses every
// NAT object: ValidateVpcNatGatewayConfig), plus the conflicts natgw's
// reconcile would otherwise only report after the fact. Every refusal names
// the field and the value (a 422 Invalid status with field causes), or, for
// a deletion, the objects in the way.
//
// Checks, by kind and operation (upstream's unless marked natgw):
//
//	VpcNatGateway   create, update  metadata.name: vpc-nat-gw-<name> fits a StatefulSet name (52 characters);
//	                                spec.vpc, spec.subnet set and, with KubeOVN, existing; spec.lanIp an
//	                                address in spec.subnet's cidrBlock (KubeOVN); tolerations' operator
//	                                (Equal, Exists) and effect (NoSchedule, PreferNoSchedule, NoExecute);
//	                                spec.qosPolicy existing; the number of replicas 1 or 2
//	                                (natgw: spec.replicas or the annotation natgw.kubeovn.io/replicas,
//	                                provision.Replicas)
//	                update          spec.namespace unchanged (Kube-OVN master; natgw: provision.NamespaceChange);
//	                                the number of replicas unchanged (natgw: provision.ReplicasChange)
//	                delete          refused while an IptablesEIP (spec.natGwDp) not itself being deleted
//	                                names the gateway
//	IptablesEIP     create, update  spec.natGwDp set; spec.v4ip an IPv4 address (natgw: the reconcile's
//	                                own check); spec.v6ip lower case; with KubeOVN the external subnet
//	                                exists and holds spec.v4ip (not its gateway: natgw); no other EIP of
//	                                the external subnet has the address (natgw)
//	                update          spec.natGwDp immutable once set; the spec immutable once status.ready,
//	                                unless status.redo changes with it (natgw: spec.qosPolicy may change,
//	                                natgw reprograms an EIP's QoS in place)
//	                delete          refused while ready and a FIP, DNAT or SNAT not itself being deleted
//	                                uses it
//	IptablesFIPRule create, update  spec.eip set and existing; the spec programmable (spec.internalIp);
//	                                the EIP used by no DNAT (upstream) and no other FIP (natgw)
//	IptablesDnatRule create, update spec.eip set and existing; the spec programmable (ports, protocol,
//	                                spec.internalIp); the EIP used by no FIP (upstream); nat.State's
//	                                DNAT rules against the EIP's other DNATs (natgw): an exclusive
//	                                spec.type holds its protocol and external port alone, share
//	                                rules on one port are its backends (Kube-OVN master), each
//	                                internal address and port once
//	IptablesSnatRule create, update spec.eip set and existing; spec.internalCIDR programmable
//
// Updates are checked only when the spec changes (as upstream; for a
// VpcNatGateway also when its replicas annotation changes).
// The spec checks are the reconcile's own (reconciler.CheckEIP,
// reconciler.CheckRule), so that a refusal says what a reconcile would
// report. The webhook reads through the manager's cache with the indexes
// reconciler.RegisterIndexes registers; Kube-OVN's Subnets and Vpcs only
// with Validator.KubeOVN (--network-source=kube-ovn).
//
// The ValidatingWebhookConfiguration and its Service are in
// controller/config/webhook; controller/README.md says how to deploy them.
package admission
