package kubeovn

import (
	"context"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// GatewaysOfSubnet maps a Subnet event to the VpcNatGateways that name it
// (as their subnet or external subnet) or sit in its VPC (its CIDR is one
// of their routes), listed through r (the cache). controller-runtime maps
// both the old and the new object of an update, so a subnet that moves to
// another VPC reaches the gateways of both.
func GatewaysOfSubnet(r client.Reader, log logr.Logger) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		vpc := ""
		if u, ok := o.(*unstructured.Unstructured); ok {
			vpc = SubnetFrom(u).Vpc
		}
		list := &v1.VpcNatGatewayList{}
		if err := r.List(ctx, list); err != nil {
			log.Error(err, "map Subnet to VpcNatGateways", "subnet", o.GetName())
			return nil
		}
		var reqs []reconcile.Request
		for i := range list.Items {
			g := &list.Items[i]
			if g.Spec.Subnet == o.GetName() || GatewayExternalSubnet(g) == o.GetName() || (vpc != "" && g.Spec.Vpc == vpc) {
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: g.Name}})
			}
		}
		return reqs
	}
}

// EIPsOfSubnet maps a Subnet event to the IptablesEIPs whose external
// subnet it is (their prefix length is its CIDR's), listed through r.
func EIPsOfSubnet(r client.Reader, log logr.Logger) handler.MapFunc {
	return func(ctx context.Context, o client.Object) []reconcile.Request {
		list := &v1.IptablesEIPList{}
		if err := r.List(ctx, list); err != nil {
			log.Error(err, "map Subnet to IptablesEIPs", "subnet", o.GetName())
			return nil
		}
		var reqs []reconcile.Request
		for i := range list.Items {
			if e := &list.Items[i]; EIPExternalSubnet(e) == o.GetName() {
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: e.Name}})
			}
		}
		return reqs
	}
}
