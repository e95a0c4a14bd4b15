package provision

import (
	"context"
	"fmt"
	"reflect"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/eipalloc"
)

// AAPsAnnotation is Kube-OVN's allowed-address-pairs annotation on a pod
// (v1.16.2 pkg/util/const.go AAPsAnnotation): the names of the Vips whose
// address the pod may answer for. Kube-OVN's controller makes each such
// Vip an OVN virtual logical switch port whose virtual parents are the
// annotated pods' ports (pkg/controller/vip.go handleUpdateVirtualParents),
// so OVN delivers the Vip's address to whichever parent last announced it
// by ARP: the active replica's gratuitous ARP at takeover.
const AAPsAnnotation = "ovn.kubernetes.io/aaps"

// LanVipPrefix starts the name of a two-replica gateway's lanIp Vip.
const LanVipPrefix = "natgw-lan-"

// LanVipName is the name of gateway's lanIp Vip (a VpcNatGateway's name is
// at most 63 characters: the Vip name stays a valid DNS subdomain).
func LanVipName(gateway string) string { return LanVipPrefix + gateway }

// NewLanVip is the Kube-OVN Vip natgw creates for a two-replica gateway g
// whose pods run in namespace ns: name LanVipName, g as controlling owner
// (blockOwnerDeletion; the garbage collector deletes it with g), label
// eipalloc.ManagedByLabel, spec.namespace ns (Kube-OVN only lets pods of
// the Vip's namespace be its parents), spec.subnet g's subnet, spec.v4ip
// the lanIp and spec.selector the gateway pods' app label. spec.type stays
// empty: Kube-OVN then reserves the address in its IPAM, creates the
// virtual port and sets as its parents the selected pods that list the
// Vip in AAPsAnnotation (Build puts it in the two-replica pod template).
func NewLanVip(g *v1.VpcNatGateway, ns string) *unstructured.Unstructured {
	u := eipalloc.NewVipObject()
	u.SetName(LanVipName(g.Name))
	u.SetLabels(map[string]string{eipalloc.ManagedByLabel: FieldManager})
	u.SetOwnerReferences([]metav1.OwnerReference{{
		APIVersion:         v1.GroupVersion.String(),
		Kind:               "VpcNatGateway",
		Name:               g.Name,
		UID:                g.UID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}})
	u.Object["spec"] = lanVipSpec(g, ns)
	return u
}

func lanVipSpec(g *v1.VpcNatGateway, ns string) map[string]any {
	return map[string]any{
		"namespace": ns,
		"subnet":    g.Spec.Subnet,
		"v4ip":      g.Spec.LanIP,
		"selector":  []any{"app:" + StatefulSetName(g.Name)},
	}
}

// lanVip makes sure g's lanIp Vip (NewLanVip) exists and says whether
// Kube-OVN has reserved the lanIp for it (status.v4ip). It creates it when
// missing; an existing one that g does not control is left alone and
// reported as an error (natgw never changes what it does not own); one g
// controls whose spec fields natgw sets differ (the lanIp or the subnet
// changed) is deleted so that Kube-OVN releases the old reservation
// (re-created once it is gone). Fields others set (the status, Kube-OVN's
// finalizer) are never written.
func (r *Reconciler) lanVip(ctx context.Context, log logr.Logger, g *v1.VpcNatGateway) (reserved bool, err error) {
	want := NewLanVip(g, GatewayNamespace(g, r.opts.Namespace))
	live := eipalloc.NewVipObject()
	err = r.api.Get(ctx, types.NamespacedName{Name: want.GetName()}, live)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.client.Create(ctx, want, client.FieldOwner(FieldManager)); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return false, nil
			}
			return false, fmt.Errorf("create Vip %s for the lanIp %s: %w", want.GetName(), g.Spec.LanIP, err)
		}
		log.Info("lanIp Vip created", "vip", want.GetName(), "lanIp", g.Spec.LanIP)
		live = want
	case err != nil:
		return false, fmt.Errorf("get Vip %s: %w", want.GetName(), err)
	}
	if !metav1.IsControlledBy(live, g) {
		return false, fmt.Errorf("vip %s exists and is not controlled by VpcNatGateway %s: natgw leaves it alone and does not make the lanIp %s follow the active replica", live.GetName(), g.Name, g.Spec.LanIP)
	}
	spec, _, _ := unstructured.NestedMap(live.Object, "spec")
	for k, v := range lanVipSpec(g, GatewayNamespace(g, r.opts.Namespace)) {
		if !reflect.DeepEqual(spec[k], v) {
			if !live.GetDeletionTimestamp().IsZero() {
				return false, nil
			}
			if err := r.client.Delete(ctx, live, client.Preconditions{UID: ptr.To(live.GetUID())}); err != nil && !apierrors.IsNotFound(err) {
				return false, fmt.Errorf("delete Vip %s (spec.%s %v, want %v): %w", live.GetName(), k, spec[k], v, err)
			}
			log.Info("lanIp Vip deleted to be re-created", "vip", live.GetName(), "field", "spec."+k, "had", spec[k], "want", v)
			return false, nil
		}
	}
	ip, _, _ := unstructured.NestedString(live.Object, "status", "v4ip")
	return ip == g.Spec.LanIP, nil
}
