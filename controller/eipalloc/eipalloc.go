package eipalloc

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/nat"
)

var (
	// VipGVK is Kube-OVN's Vip (cluster-scoped).
	VipGVK = schema.GroupVersionKind{Group: "kubeovn.io", Version: "v1", Kind: "Vip"}
	// eipGVK is the owner kind of natgw's Vips.
	eipGVK = v1.GroupVersion.WithKind("IptablesEIP")
)

const (
	// NamePrefix starts the name of every Vip natgw creates.
	NamePrefix = "natgw-eip-"
	// FieldManager is the field manager of natgw's writes.
	FieldManager = "natgw-controller"
	// ManagedByLabel marks natgw's Vips (value FieldManager), so that a
	// cache or a watch can select them. Kube-OVN keeps labels it does not
	// know when it writes the Vip (vip.go:404-411, 470-474).
	ManagedByLabel = "app.kubernetes.io/managed-by"

	hashLen = 16
)

var (
	// ErrInvalid wraps errors about an EIP's fields (the field and value
	// are named).
	ErrInvalid = errors.New("invalid iptables eip")
	// ErrNotOwned wraps errors about a Vip of the EIP's name that the EIP
	// does not own.
	ErrNotOwned = errors.New("vip not owned by the iptables eip")
	// ErrSubnet wraps errors about the EIP's external subnet.
	ErrSubnet = errors.New("external subnet unusable")
	// ErrConflict wraps errors about a Vip whose reservation no longer
	// matches the EIP (spec.v4ip or the subnet changed after it was made).
	ErrConflict = errors.New("eip spec differs from its reservation")
)

// VipName is the name of eip's Vip: NamePrefix+eip. When that is longer
// than a DNS subdomain (253, the API server's limit for a custom resource's
// name; the Vip CRD adds none), the EIP's name is cut and a hash of the
// whole name appended: natgw-eip-<first 226 characters, without trailing
// '-' or '.'>-<16 hex digits of sha256(eip)>, still deterministic, still
// 253 characters at most and distinct per EIP name. EIPOfVip uses the owner
// reference, not the name, so a cut name loses nothing.
func VipName(eip string) string {
	n := NamePrefix + eip
	if len(n) <= validation.DNS1123SubdomainMaxLength {
		return n
	}
	sum := sha256.Sum256([]byte(eip))
	keep := validation.DNS1123SubdomainMaxLength - len(NamePrefix) - 1 - hashLen
	head := strings.TrimRight(eip[:keep], "-.")
	return NamePrefix + head + "-" + hex.EncodeToString(sum[:])[:hashLen]
}

// Allocator reserves EIP addresses through Kube-OVN Vips.
type Allocator struct {
	// Client writes Vips and reads Vips and Subnets (a manager's client:
	// its reads may come from a cache).
	Client client.Client
	// APIReader, when set, confirms with a live read that a Vip the
	// Client no longer finds is gone from the API before Release reports
	// done (a cache may not have seen a Vip created a moment ago).
	APIReader client.Reader
}

// Ensure creates the EIP's Vip when missing (create only: a Vip is never
// updated, patched or applied by natgw) and returns the reserved IPv4
// address once Kube-OVN wrote it to the Vip's status.v4ip, or the zero
// Addr while the reservation is pending (no Vip in the cache yet, no status
// yet, or the Vip being deleted). An error names the field and value that
// prevent the reservation: bad input (ErrInvalid), the external subnet
// (ErrSubnet), a Vip of the EIP's name owned by something else
// (ErrNotOwned), or spec.v4ip or the subnet changed after the reservation
// (ErrConflict).
func (a *Allocator) Ensure(ctx context.Context, e *v1.IptablesEIP) (netip.Addr, error) {
	if e == nil {
		return netip.Addr{}, fmt.Errorf("reserve eip: %w: nil object", ErrInvalid)
	}
	addr, err := a.ensure(ctx, e)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("reserve eip %s: %w", e.Name, err)
	}
	return addr, nil
}

func (a *Allocator) ensure(ctx context.Context, e *v1.IptablesEIP) (netip.Addr, error) {
	static, err := Validate(e)
	if err != nil {
		return netip.Addr{}, err
	}
	if a == nil || a.Client == nil {
		return netip.Addr{}, errors.New("allocator has no client")
	}
	adopted, err := KubeOVNAllocated(e)
	if err != nil {
		return netip.Addr{}, err
	}
	name := VipName(e.Name)
	vip := newUnstructured(VipGVK)
	err = a.Client.Get(ctx, client.ObjectKey{Name: name}, vip)
	switch {
	case apierrors.IsNotFound(err) && adopted.IsValid():
		return adopted, nil
	case apierrors.IsNotFound(err):
		if err := a.checkSubnet(ctx, kubeovn.EIPExternalSubnet(e), static); err != nil {
			return netip.Addr{}, err
		}
		if err := a.Client.Create(ctx, NewVip(e), client.FieldOwner(FieldManager)); err != nil {
			if apierrors.IsAlreadyExists(err) {
				// Created meanwhile (by an earlier pass the cache
				// has not seen): read again on the next pass.
				return netip.Addr{}, nil
			}
			return netip.Addr{}, fmt.Errorf("create vip %s: %w", name, err)
		}
		return netip.Addr{}, nil
	case err != nil:
		return netip.Addr{}, fmt.Errorf("get vip %s: %w", name, err)
	}
	if adopted.IsValid() {
		if ok, _ := owned(e, vip); ok {
			if v4, _, _ := unstructured.NestedString(vip.Object, "status", "v4ip"); v4 == "" {
				// A request natgw made before it adopted the address:
				// Kube-OVN refuses it (the address is held under the
				// EIP's own name) and would retry it for ever.
				return adopted, a.withdraw(ctx, vip)
			}
		}
	}
	return Reserved(e, vip)
}

// KubeOVNAllocated returns the address Kube-OVN's own IptablesEIP handler
// allocated to e while its VPC NAT gateway feature was on (a gateway
// migrated to natgw), or the zero Addr when e has none. Such an address is
// held in Kube-OVN's IPAM under the EIP's own name, not under a Vip:
// handleAddIptablesEip acquires it with the key e.Name
// (vpc_nat_gw_eip.go:109-118), Kube-OVN's restart reserves it again from
// the EIP's status.ip whatever the feature (init.go:498-507), and its
// deletion path, which runs with the feature off, releases that key
// before it removes its finalizer (vpc_nat_gw_eip.go:205-248). The mark of
// that allocation is Kube-OVN's finalizer on the EIP with status.ip set:
// Kube-OVN adds the finalizer only on paths that run with the feature on,
// after the address is allocated (createOrUpdateEipCR,
// vpc_nat_gw_eip.go:719, and the update path after its feature check,
// :273-277 and :345). natgw
// uses that reservation as it is (a Vip asking for the same address would
// be refused by Kube-OVN's IPAM as a conflict) and Release leaves it to
// Kube-OVN. A spec.v4ip other than status.ip is refused (ErrConflict), as
// upstream refuses changing an allocated EIP's address
// (vpc_nat_gw_eip.go:267-271).
func KubeOVNAllocated(e *v1.IptablesEIP) (netip.Addr, error) {
	if e == nil || e.Status.IP == "" || !slices.Contains(e.Finalizers, v1.Finalizer) {
		return netip.Addr{}, nil
	}
	ip, err := nat.ParseUnicastIPv4("status.ip", e.Status.IP)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: allocated by Kube-OVN: %v", ErrInvalid, err)
	}
	if e.Spec.V4ip != "" && e.Spec.V4ip != e.Status.IP {
		return netip.Addr{}, fmt.Errorf("%w: spec.v4ip %q differs from the address %s Kube-OVN allocated (status.ip; Kube-OVN does not change an allocated address; recreate the eip)", ErrConflict, e.Spec.V4ip, e.Status.IP)
	}
	return ip, nil
}

// withdraw deletes vip, an unanswered request of natgw's (UID
// precondition: never another Vip of that name).
func (a *Allocator) withdraw(ctx context.Context, vip *unstructured.Unstructured) error {
	if vip.GetDeletionTimestamp() != nil {
		return nil
	}
	err := a.Client.Delete(ctx, vip, client.Preconditions{UID: ptr.To(vip.GetUID())})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("withdraw vip %s: %w", vip.GetName(), err)
	}
	return nil
}

// Validate checks the fields of e that Ensure uses and returns the static
// address (the zero Addr when spec.v4ip is empty).
func Validate(e *v1.IptablesEIP) (netip.Addr, error) {
	if e == nil {
		return netip.Addr{}, fmt.Errorf("%w: nil object", ErrInvalid)
	}
	if e.Name == "" {
		return netip.Addr{}, fmt.Errorf("%w: metadata.name is empty", ErrInvalid)
	}
	if msgs := validation.IsDNS1123Subdomain(e.Name); len(msgs) > 0 {
		return netip.Addr{}, fmt.Errorf("%w: metadata.name %q: %s", ErrInvalid, e.Name, strings.Join(msgs, "; "))
	}
	if e.UID == "" {
		return netip.Addr{}, fmt.Errorf("%w: metadata.uid is empty (the Vip's owner reference needs it; pass the object read from the API)", ErrInvalid)
	}
	sub := kubeovn.EIPExternalSubnet(e)
	if msgs := validation.IsDNS1123Subdomain(sub); len(msgs) > 0 {
		return netip.Addr{}, fmt.Errorf("%w: spec.externalSubnet %q: %s", ErrInvalid, sub, strings.Join(msgs, "; "))
	}
	if e.Spec.V4ip == "" {
		return netip.Addr{}, nil
	}
	ip, err := nat.ParseUnicastIPv4("spec.v4ip", e.Spec.V4ip)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return ip, nil
}

// NewVip is the Vip natgw creates for e: name VipName(e.Name), label
// ManagedByLabel, e as controlling owner (blockOwnerDeletion), spec.subnet
// the external subnet, spec.v4ip and spec.v6ip e's when set. spec.type and
// spec.namespace stay empty (an IPAM reservation only, no OVN port: see
// the package comment) and there is no status (the CRD has no status
// subresource: a status sent here would be stored).
func NewVip(e *v1.IptablesEIP) *unstructured.Unstructured {
	u := newUnstructured(VipGVK)
	u.SetName(VipName(e.Name))
	u.SetLabels(map[string]string{ManagedByLabel: FieldManager})
	u.SetOwnerReferences([]metav1.OwnerReference{{
		APIVersion:         eipGVK.GroupVersion().String(),
		Kind:               eipGVK.Kind,
		Name:               e.Name,
		UID:                e.UID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}})
	spec := map[string]any{"subnet": kubeovn.EIPExternalSubnet(e)}
	if e.Spec.V4ip != "" {
		spec["v4ip"] = e.Spec.V4ip
	}
	if e.Spec.V6ip != "" {
		// Kube-OVN asks its IPAM for "v4,v6" (vip.go:97-111,
		// util.GetStringIP); on a dual-stack subnet a family not given
		// is drawn at random (ipam.go:126-143).
		spec["v6ip"] = e.Spec.V6ip
	}
	u.Object["spec"] = spec
	return u
}

// NewVipObject is an empty Vip (for a controller-runtime watch or a Get).
func NewVipObject() *unstructured.Unstructured { return newUnstructured(VipGVK) }

func newUnstructured(gvk schema.GroupVersionKind) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u
}

// isEIP says whether ref names an IptablesEIP of natgw's group.
func isEIP(ref *metav1.OwnerReference) bool {
	if ref == nil || ref.Kind != eipGVK.Kind {
		return false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == eipGVK.Group
}

// owned says whether vip's controlling owner is e (by UID), and describes
// the owner otherwise.
func owned(e *v1.IptablesEIP, vip client.Object) (bool, string) {
	ref := metav1.GetControllerOf(vip)
	switch {
	case ref == nil:
		return false, "no controlling owner"
	case !isEIP(ref):
		return false, fmt.Sprintf("controlled by %s %s %s", ref.APIVersion, ref.Kind, ref.Name)
	case ref.UID != e.UID:
		return false, fmt.Sprintf("controlled by IptablesEIP %s uid %s, not uid %s", ref.Name, ref.UID, e.UID)
	}
	return true, ""
}

// Reserved reads e's reservation from its Vip (as read from the API): the
// address in status.v4ip, the zero Addr while Kube-OVN has not written it
// or while the Vip is being deleted, or an error when the Vip is not e's
// or no longer matches e.
func Reserved(e *v1.IptablesEIP, vip *unstructured.Unstructured) (netip.Addr, error) {
	name := vip.GetName()
	if ok, why := owned(e, vip); !ok {
		return netip.Addr{}, fmt.Errorf("%w: vip %s exists but is not owned by iptables eip %s (uid %s): %s", ErrNotOwned, name, e.Name, e.UID, why)
	}
	if vip.GetDeletionTimestamp() != nil {
		return netip.Addr{}, nil
	}
	str := func(path ...string) string {
		s, _, _ := unstructured.NestedString(vip.Object, path...)
		return s
	}
	if sub := str("spec", "subnet"); sub != kubeovn.EIPExternalSubnet(e) {
		return netip.Addr{}, fmt.Errorf("%w: spec.externalSubnet %q (effective %q) differs from vip %s spec.subnet %q (Kube-OVN does not move a Vip between subnets; recreate the eip)", ErrConflict, e.Spec.ExternalSubnet, kubeovn.EIPExternalSubnet(e), name, sub)
	}
	specV4, statusV4, mac := str("spec", "v4ip"), str("status", "v4ip"), str("status", "mac")
	if statusV4 == "" {
		if e.Spec.V4ip != "" && specV4 != e.Spec.V4ip {
			return netip.Addr{}, fmt.Errorf("%w: spec.v4ip %q differs from vip %s spec.v4ip %q requested earlier (recreate the eip to change it)", ErrConflict, e.Spec.V4ip, name, specV4)
		}
		if mac != "" {
			return netip.Addr{}, fmt.Errorf("%w: vip %s has status.mac %q but no status.v4ip: subnet %q gave no IPv4 address", ErrSubnet, name, mac, kubeovn.EIPExternalSubnet(e))
		}
		return netip.Addr{}, nil
	}
	ip, err := nat.ParseUnicastIPv4("status.v4ip", statusV4)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("vip %s: %w", name, err)
	}
	if e.Spec.V4ip != "" && e.Spec.V4ip != statusV4 {
		return netip.Addr{}, fmt.Errorf("%w: spec.v4ip %q differs from the address %s reserved in vip %s (Kube-OVN does not change a reserved address; recreate the eip)", ErrConflict, e.Spec.V4ip, statusV4, name)
	}
	return ip, nil
}

// ReservedV6 returns the IPv6 address Kube-OVN reserved for e in its Vip
// (status.v6ip: on a dual-stack external subnet Kube-OVN reserves one
// address of each family for a Vip, vip.go:106-114 with
// ipam.GetRandomAddress or ipam.GetStaticAddress, which adds the family
// not asked for, ipam.go:68-143, and writes both to the Vip's status,
// vip.go:404-424), or the zero Addr when there is none: no Vip (an
// adopted EIP, whose IPv6 address Kube-OVN wrote to spec.v6ip), not e's,
// being deleted, an IPv4-only subnet, or no status yet. A spec.v6ip other
// than status.v6ip is ErrConflict; a status.v6ip natgw cannot program is
// an error naming it.
func (a *Allocator) ReservedV6(ctx context.Context, e *v1.IptablesEIP) (netip.Addr, error) {
	if a == nil || a.Client == nil || e == nil {
		return netip.Addr{}, nil
	}
	name := VipName(e.Name)
	vip := newUnstructured(VipGVK)
	if err := a.Client.Get(ctx, client.ObjectKey{Name: name}, vip); err != nil {
		if apierrors.IsNotFound(err) {
			return netip.Addr{}, nil
		}
		return netip.Addr{}, fmt.Errorf("reserved ipv6 of eip %s: get vip %s: %w", e.Name, name, err)
	}
	if ok, _ := owned(e, vip); !ok || vip.GetDeletionTimestamp() != nil {
		return netip.Addr{}, nil
	}
	v6, _, _ := unstructured.NestedString(vip.Object, "status", "v6ip")
	if v6 == "" {
		return netip.Addr{}, nil
	}
	ip, err := nat.ParseUnicastIPv6("status.v6ip", v6)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("vip %s: %w", name, err)
	}
	if e.Spec.V6ip != "" && e.Spec.V6ip != v6 {
		return netip.Addr{}, fmt.Errorf("%w: spec.v6ip %q differs from the address %s reserved in vip %s (Kube-OVN does not change a reserved address; recreate the eip)", ErrConflict, e.Spec.V6ip, v6, name)
	}
	return ip, nil
}

// checkSubnet checks, before a Vip is created, what Kube-OVN would refuse
// only in its log: the subnet exists (vip.go:91-95), has an IPv4 CIDR
// (vpc_nat_gw_eip.go:122-126), and a static address is inside it
// (ipam/subnet.go:396-399) and not its gateway.
func (a *Allocator) checkSubnet(ctx context.Context, name string, static netip.Addr) error {
	s := kubeovn.NewSubnet()
	if err := a.Client.Get(ctx, client.ObjectKey{Name: name}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%w: spec.externalSubnet: subnet %q not found", ErrSubnet, name)
		}
		return fmt.Errorf("get subnet %s: %w", name, err)
	}
	cidrs, _, _ := unstructured.NestedString(s.Object, "spec", "cidrBlock")
	gw, _, _ := unstructured.NestedString(s.Object, "spec", "gateway")
	return CheckSubnet(name, cidrs, gw, static)
}

// CheckSubnet checks a subnet's spec.cidrBlock (comma-separated, as
// kubeovn.SplitIP reads it: the last of each family) and
// spec.gateway against a static address (zero: none).
func CheckSubnet(name, cidrBlock, gateway string, static netip.Addr) error {
	v4, err := kubeovn.Subnet{Name: name, CIDRBlock: cidrBlock}.V4CIDR()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSubnet, err)
	}
	if !static.IsValid() {
		return nil
	}
	if !v4.Contains(static) {
		return fmt.Errorf("%w: spec.v4ip %s is outside subnet %q spec.cidrBlock %s", ErrSubnet, static, name, v4)
	}
	if g4, _ := kubeovn.SplitIP(gateway); g4 == static.String() {
		return fmt.Errorf("%w: spec.v4ip %s is subnet %q's gateway", ErrSubnet, static, name)
	}
	return nil
}

// Release deletes the EIP's Vip and reports done once no Vip owned by the
// EIP is left in the API: Kube-OVN's finalizer holds the Vip until the
// address is released in its IPAM (vip.go:189-220). A Vip of the EIP's
// name that the EIP does not own is neither deleted nor waited for (it is
// not the EIP's reservation).
func (a *Allocator) Release(ctx context.Context, e *v1.IptablesEIP) (bool, error) {
	if e == nil {
		return false, fmt.Errorf("release eip: %w: nil object", ErrInvalid)
	}
	done, err := a.release(ctx, e)
	if err != nil {
		return false, fmt.Errorf("release eip %s: %w", e.Name, err)
	}
	return done, nil
}

func (a *Allocator) release(ctx context.Context, e *v1.IptablesEIP) (bool, error) {
	if e.Name == "" {
		return false, fmt.Errorf("%w: metadata.name is empty", ErrInvalid)
	}
	if e.UID == "" {
		return false, fmt.Errorf("%w: metadata.uid is empty (pass the object read from the API)", ErrInvalid)
	}
	if a == nil || a.Client == nil {
		return false, errors.New("allocator has no client")
	}
	name := VipName(e.Name)
	vip := newUnstructured(VipGVK)
	err := a.Client.Get(ctx, client.ObjectKey{Name: name}, vip)
	if apierrors.IsNotFound(err) && a.APIReader != nil {
		vip = newUnstructured(VipGVK)
		err = a.APIReader.Get(ctx, client.ObjectKey{Name: name}, vip)
	}
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("get vip %s: %w", name, err)
	}
	if ok, _ := owned(e, vip); !ok {
		return true, nil
	}
	if vip.GetDeletionTimestamp() != nil {
		return false, nil
	}
	err = a.Client.Delete(ctx, vip,
		client.Preconditions{UID: ptr.To(vip.GetUID())},
		client.PropagationPolicy(metav1.DeletePropagationBackground))
	switch {
	case apierrors.IsNotFound(err):
		// Gone already; the next pass confirms it.
		return false, nil
	case apierrors.IsConflict(err):
		// The UID precondition failed: another Vip of that name now.
		return false, nil
	case err != nil:
		return false, fmt.Errorf("delete vip %s: %w", name, err)
	}
	return false, nil
}

// EIPOfVip maps a Vip to the IptablesEIP that controls it, for a
// controller-runtime Watches on unstructured Vips
// (handler.EnqueueRequestsFromMapFunc(eipalloc.EIPOfVip)). Vips not
// controlled by an IptablesEIP map to nothing.
func EIPOfVip(_ context.Context, o client.Object) []reconcile.Request {
	if o == nil {
		return nil
	}
	if v := reflect.ValueOf(o); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil
	}
	ref := metav1.GetControllerOf(o)
	if !isEIP(ref) || ref.Name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: ref.Name}}}
}
