// Package kubeovn is natgw-controller's read-only view of Kube-OVN's own
// network objects (kubeovn.io/v1 Subnet and Vpc) and what replace mode
// derives from them as Kube-OVN v1.16.2's controller does: a gateway's
// external subnet, its external and internal gateways, the routes to the
// VPC's other subnets, an EIP's prefix length.
//
// natgw has no Go types for these objects and never writes them: they are
// read as unstructured objects from the cache. The comments cite Kube-OVN
// v1.16.2's source (module github.com/kubeovn/kube-ovn@v1.16.2) by
// file:line; no upstream code is copied.
package kubeovn

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// DefaultExternalNetwork is the external subnet (and NAD) of a gateway
// whose spec.externalSubnets is empty and of an EIP whose
// spec.externalSubnet is empty (pkg/util/net.go:25,
// pkg/util/vpc_nat_gateway.go:71-76, util.GetExternalNetwork).
const DefaultExternalNetwork = "ovn-vpc-external-network"

// OvnProvider is Kube-OVN's default provider (pkg/util/const.go:210).
const OvnProvider = "ovn"

// SubnetGVK is Kube-OVN's Subnet.
var SubnetGVK = schema.GroupVersionKind{Group: "kubeovn.io", Version: "v1", Kind: "Subnet"}

// VpcGVK is Kube-OVN's Vpc (only its existence is read).
var VpcGVK = schema.GroupVersionKind{Group: "kubeovn.io", Version: "v1", Kind: "Vpc"}

// Subnet is what natgw reads of a kubeovn.io/v1 Subnet.
type Subnet struct {
	Name               string
	Vpc                string
	Provider           string
	CIDRBlock          string
	Gateway            string
	Vlan               string
	U2OInterconnection bool
	// Validated: the Subnet's condition Validated is True (Kube-OVN's own
	// check of the subnet, SubnetStatus.IsValidated, pkg/apis/kubeovn/v1/subnet.go:285).
	Validated bool
}

// SubnetFrom reads a Subnet from Kube-OVN's object.
func SubnetFrom(u *unstructured.Unstructured) Subnet {
	str := func(f ...string) string {
		s, _, _ := unstructured.NestedString(u.Object, f...)
		return s
	}
	u2o, _, _ := unstructured.NestedBool(u.Object, "spec", "u2oInterconnection")
	s := Subnet{
		Name: u.GetName(), Vpc: str("spec", "vpc"), Provider: str("spec", "provider"),
		CIDRBlock: str("spec", "cidrBlock"), Gateway: str("spec", "gateway"), Vlan: str("spec", "vlan"),
		U2OInterconnection: u2o,
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Validated" && m["status"] == "True" {
			s.Validated = true
		}
	}
	return s
}

// NewSubnet returns an empty unstructured Subnet (for watches and Gets).
func NewSubnet() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(SubnetGVK)
	return u
}

// ListSubnets reads every Subnet through r (the cache), by name.
func ListSubnets(ctx context.Context, r client.Reader) (map[string]Subnet, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(SubnetGVK.GroupVersion().WithKind(SubnetGVK.Kind + "List"))
	if err := r.List(ctx, list); err != nil {
		return nil, fmt.Errorf("list Subnets: %w", err)
	}
	out := make(map[string]Subnet, len(list.Items))
	for i := range list.Items {
		s := SubnetFrom(&list.Items[i])
		out[s.Name] = s
	}
	return out, nil
}

// IsOvnProvider says whether provider is an OVN provider: "", "ovn" or
// <name>.<namespace>.ovn (pkg/util/subnet.go:5-13, isOvnSubnet
// pkg/controller/subnet.go:1943).
func IsOvnProvider(provider string) bool {
	if provider == "" || provider == OvnProvider {
		return true
	}
	f := strings.Split(provider, ".")
	return len(f) == 3 && f[2] == OvnProvider
}

// SplitIP splits a comma-separated address/CIDR list into its IPv4 and
// IPv6 parts, the last of each family winning (util.SplitStringIP,
// pkg/util/net.go:400-418).
func SplitIP(s string) (v4, v6 string) {
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		host := p
		if i := strings.IndexByte(p, '/'); i >= 0 {
			host = p[:i]
		}
		a, err := netip.ParseAddr(host)
		switch {
		case err != nil:
		case a.Is4():
			v4 = p
		default:
			v6 = p
		}
	}
	return v4, v6
}

// GatewayExternalSubnet is a gateway's external subnet: the first of
// spec.externalSubnets, else DefaultExternalNetwork
// (util.GetNatGwExternalNetwork, pkg/util/vpc_nat_gateway.go:71-76).
func GatewayExternalSubnet(g *v1.VpcNatGateway) string {
	if len(g.Spec.ExternalSubnets) == 0 {
		return DefaultExternalNetwork
	}
	return g.Spec.ExternalSubnets[0]
}

// EIPExternalSubnet is an EIP's external subnet: spec.externalSubnet, else
// DefaultExternalNetwork (util.GetExternalNetwork, used by
// handleAddIptablesEip, pkg/controller/vpc_nat_gw_eip.go:87).
func EIPExternalSubnet(e *v1.IptablesEIP) string {
	if e.Spec.ExternalSubnet == "" {
		return DefaultExternalNetwork
	}
	return e.Spec.ExternalSubnet
}

// VPCSubnets are the subnets of VPC vpc that a gateway routes to, sorted
// by name: validated OVN subnets, VLAN ones only with U2O interconnection
// (the filter of genNatGwStatefulSet, vpc_nat_gateway.go:958-1023, and of
// handleUpdateNatGwSubnetRoute, vpc_nat_gateway.go:646-666). A subnet
// belongs to the VPC its spec.vpc names (Kube-OVN keeps the Vpc's
// status.subnets from it).
func VPCSubnets(vpc string, subnets map[string]Subnet) []Subnet {
	var out []Subnet
	for _, s := range subnets {
		if s.Vpc != vpc || !IsOvnProvider(s.Provider) || !s.Validated || (s.Vlan != "" && !s.U2OInterconnection) {
			continue
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
