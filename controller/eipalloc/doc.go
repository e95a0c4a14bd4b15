// Package eipalloc reserves an IptablesEIP's address in Kube-OVN's IPAM
// through a kubeovn.io/v1 Vip that natgw creates, one per IptablesEIP, so
// that natgw never runs a second allocator racing Kube-OVN's.
//
// In natgw-controller's replace mode Kube-OVN's VPC NAT gateway feature is
// off, and Kube-OVN's IptablesEIP handler refuses to allocate
// (pkg/controller/vpc_nat_gw_eip.go:75-77 returns "iptables nat gw not
// enable"). Kube-OVN's Vip controller still runs: its add, update,
// virtual-parent and delete workers are started unconditionally in
// startWorkers (pkg/controller/controller.go:1459-1462, no feature check
// around them; the informer handlers at controller.go:869-875 likewise).
//
// Facts of Kube-OVN v1.16.2 this package relies on (paths in
// github.com/kubeovn/kube-ovn@v1.16.2; read, not copied):
//
// The Vip CRD (charts/kube-ovn-v2/crds/kube-ovn-crd.yaml:2906-3053) is
// cluster-scoped (:2916), requires no field, has no name pattern (so the
// API server's DNS-subdomain rule, 253 characters, is the only name
// constraint), no CEL rules and no status subresource ("subresources: {}",
// :3053): status is written with the object, by whoever writes the object.
// Printer columns: .spec.namespace, .status.v4ip, .status.v6ip,
// .status.mac, .spec.subnet, .status.type (:2918-2936). natgw therefore
// only ever creates a minimal Vip (no status) and never updates, patches or
// applies it: a write of natgw's could reset the status Kube-OVN wrote, or
// change spec.v4ip, which Kube-OVN wrote itself.
//
// Reservation done: Kube-OVN treats status.mac != "" as "already ok"
// (pkg/controller/vip.go:79) and writes status.v4ip, status.v6ip and
// status.mac in one Update together with spec.v4ip/v6ip/macAddress (the
// allocated values), its finalizer "kubeovn.io/kube-ovn-controller" and
// the labels ovn.kubernetes.io/subnet=<subnet> and
// ovn.kubernetes.io/ip_reserved="" (vip.go:404-435; a Create with the same
// content when the Vip is missing from its cache, vip.go:369-397). natgw
// reads status.v4ip. status.mac set with status.v4ip empty means the
// subnet gave no IPv4 address (an IPv6-only subnet); upstream's own EIP
// path refuses that too ("subnet %s does not support ipv4",
// vpc_nat_gw_eip.go:122-126). No code writes a Vip condition
// (status.conditions exists in the type, pkg/apis/kubeovn/v1/vip.go:62,
// but vip.go never sets it).
//
// Failures are invisible on the object: a missing spec.subnet (vip.go:88-90),
// a subnet not found (vip.go:91-95), an unparsable static ip
// (ip.go:378-382), an address outside the subnet (ipam/subnet.go:396-420,
// ErrOutOfRange) or already held by another owner (ipam/subnet.go:455-465,
// ErrConflict, via ip.go:384-387) are returned to Kube-OVN's work queue and
// logged by kube-ovn-controller only; the Vip stays without status and is
// retried with back-off. natgw therefore checks what it can before it
// creates the Vip (the subnet exists and has an IPv4 CIDR; a static v4ip
// is IPv4, inside it, not its gateway) and otherwise reports "pending".
// A taken static address stays pending with the cause only in
// kube-ovn-controller's log.
//
// Default type: for spec.type "" no OVN NB object is created on add
// (the logical switch ports of vip.go:120-157 are for "switch_lb_vip" and
// "kube_host_vm_vip" only, pkg/util/const.go:57-58), and
// handleUpdateVirtualParents returns before creating a virtual port when
// spec.namespace is "" (vip.go:289-291). natgw leaves spec.type and
// spec.namespace empty, so the Vip is an IPAM reservation only. On delete
// Kube-OVN still calls DeleteLogicalSwitchPort(vip.Name) (vip.go:208),
// which reads its NB cache and does nothing when no such port exists
// (pkg/ovs/ovn-nb-logical_switch_port.go:798-806); the name prefix keeps
// that call from ever matching another port.
//
// Immutability: spec.namespace, spec.subnet and spec.type are documented
// immutable (pkg/apis/kubeovn/v1/vip.go:39-44) but nothing enforces it in
// the API; Kube-OVN refuses a spec.v4ip/v6ip/macAddress that differs from
// a non-empty status only with a logged error, "not support change v4 ip
// of vip" (vip.go:228-243). Upstream's EIP path refuses an EIP whose
// spec.v4ip changed after allocation as well (vpc_nat_gw_eip.go:267-271).
// natgw refuses both cases itself, naming the field.
//
// Naming: the IPAM key of a Vip is its name and its port name
// ovs.PodNameToPortName(name, spec.namespace, provider) (vip.go:96,
// pkg/ovs/util.go:22-27: "<name>.<namespace>" or
// "<name>.<namespace>.<provider>"). Upstream keys an IptablesEIP by the
// EIP's own name (vpc_nat_gw_eip.go:109-118), and Kube-OVN's restart
// rebuilds IPAM from Vips (pkg/controller/init.go:480-496) before
// IptablesEIPs (init.go:498-507) and OvnEips (init.go:511-520), keyed by
// their names. natgw's Vip is named "natgw-eip-<eip>" so that its key
// never equals the EIP's: Kube-OVN's IptablesEIP deletion path, which runs
// with the feature off and releases the key <eip>
// (vpc_nat_gw_eip.go:242-243), cannot release natgw's reservation. An
// OvnEip named "natgw-eip-<eip>" would share the key; avoid such names.
//
// Release: deleting the Vip. Kube-OVN's finalizer holds it until
// handleUpdateVirtualIP released the address in IPAM
// (ReleaseAddressByPod, vip.go:212-213) and removed the finalizer
// (vip.go:216, 558-592). Gone from the API = released.
//
// Adoption (a gateway migrated from Kube-OVN's feature to natgw's replace
// mode): an IptablesEIP whose address Kube-OVN's own EIP handler allocated
// already holds it in Kube-OVN's IPAM under the EIP's name, kept across
// Kube-OVN restarts (init.go:498-507) and released by Kube-OVN when the EIP
// is deleted, with its feature off too (vpc_nat_gw_eip.go:205-248). A Vip
// asking for that address would be refused as a conflict. Ensure therefore
// returns such an address as it is (KubeOVNAllocated: Kube-OVN's finalizer
// and status.ip on the EIP), creates no Vip, and withdraws an unanswered
// Vip an earlier natgw made for it; Release has nothing to release.
//
// Known upstream window: a Vip deleted while Kube-OVN's add worker is
// between its allocation and createOrUpdateVipCR is re-created by Kube-OVN
// (vip.go:367-397: not in its cache -> Create) without natgw's owner
// reference. Ensure then refuses it (not owned) and Release ignores it (it
// is not the EIP's); it must be removed by hand.
package eipalloc
