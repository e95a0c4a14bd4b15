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
		return kubeovn.Network{ExternalGateway: cfg.ExternalGatewayAddr()}, nil
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

// eipPrefixLen is the prefix length of EIP e's address on the external
// interface: its external subnet's (Deps.Subnets set), else the gateway
// config's.
func (d *Deps) eipPrefixLen(ctx context.Context, e *v1.IptablesEIP, cfg gwconfig.Entry) (int, *failure) {
	if d.Subnets == nil {
		return cfg.ExternalPrefixLen, nil
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
		return 0, f
	}
	n, err := kubeovn.EIPPrefixLen(kubeovn.SubnetFrom(u))
	if err != nil {
		f := fail(v1.ReasonSubnetNotReady, "%v", err)
		f.requeueAfter = subnetRetry
		return 0, f
	}
	return n, nil
}

// defaultRoute is the destination of the route via the external gateway.
var defaultRoute = netip.MustParsePrefix("0.0.0.0/0")
