package reconciler

import (
	"context"
	"net/netip"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/kubeovn"
)

// subnetRetry is the requeue delay of an object whose Subnet is missing or
// unusable (the Subnet watch also brings it back when the Subnet changes).
const subnetRetry = 10 * time.Second

// gatewayNetwork is gateway g's external gateway and VPC subnet routes:
// with Kube-OVN's Subnets as the source (Deps.Subnets set), what
// kubeovn.GatewayNetwork derives from them; else the gateway config's
// external gateway and no VPC routes.
func (d *Deps) gatewayNetwork(ctx context.Context, g *v1.VpcNatGateway, cfg gwconfig.Entry) (kubeovn.Network, *failure) {
	if d.Subnets == nil {
		return kubeovn.Network{ExternalGateway: cfg.ExternalGatewayAddr(), ExternalGatewayV6: cfg.ExternalGatewayV6Addr()}, nil
	}
	subnets, err := kubeovn.ListSubnets(ctx, d.Subnets)
	if err != nil {
		f := fail(v1.ReasonSubnetNotReady, "%v", err)
		f.err = err
		return kubeovn.Network{}, f
	}
	n, err := kubeovn.GatewayNetwork(g, subnets)
	if err != nil {
		f := fail(v1.ReasonSubnetNotReady, "VpcNatGateway %s: %v", g.Name, err)
		f.requeueAfter = subnetRetry
		return kubeovn.Network{}, f
	}
	return n, nil
}

// eipPrefixLen is the prefix lengths of EIP e's addresses on the
// external interface (IPv4, IPv6): its external subnet's CIDRs
// (Deps.Subnets set; IPv6 0 for a subnet without an IPv6 CIDR), else the
// gateway config's.
func (d *Deps) eipPrefixLen(ctx context.Context, e *v1.IptablesEIP, cfg gwconfig.Entry) (int, int, *failure) {
	if d.Subnets == nil {
		return cfg.ExternalPrefixLen, cfg.ExternalV6PrefixLen, nil
	}
	name := kubeovn.EIPExternalSubnet(e)
	u := kubeovn.NewSubnet()
	if err := d.Subnets.Get(ctx, types.NamespacedName{Name: name}, u); err != nil {
		f := fail(v1.ReasonSubnetNotReady, "external subnet %q: %v", name, err)
		if apierrors.IsNotFound(err) {
			f.requeueAfter = subnetRetry
		} else {
			f.err = err
		}
		return 0, 0, f
	}
	sub := kubeovn.SubnetFrom(u)
	n, err := kubeovn.EIPPrefixLen(sub)
	if err == nil {
		var n6 int
		if n6, err = kubeovn.EIPV6PrefixLen(sub); err == nil {
			return n, n6, nil
		}
	}
	f := fail(v1.ReasonSubnetNotReady, "%v", err)
	f.requeueAfter = subnetRetry
	return 0, 0, f
}

// defaultRoute and defaultRouteV6 are the destinations of the routes via
// the external gateways.
var (
	defaultRoute   = netip.MustParsePrefix("0.0.0.0/0")
	defaultRouteV6 = netip.MustParsePrefix("::/0")
)
