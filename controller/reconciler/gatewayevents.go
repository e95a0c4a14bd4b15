package reconciler

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// gatewayEvents turns a gateway manager's connection changes
// (gateway.Options.OnConnection) into reconciles of the objects that report
// the gateway's state: the VpcNatGateway (its Ready annotation) and its
// EIPs, whose Ready changes reach their rules through the rules' EIP watch
// (a rule whose EIP is down with its gateway says GatewayNotReady,
// resolveEIP). A gateway whose pod went away is then NotReady in the API
// (GatewayNotReady) instead of staying Ready while the kernel holds nothing,
// and Ready again once the manager reconnected and synced.
type gatewayEvents struct {
	mu    sync.Mutex
	chans []chan event.GenericEvent
}

// send fans a change out to every controller's channel
// without blocking (it runs under the manager's lock); a full channel
// drops it (1024 pending changes: the objects are reconciled anyway).
func (e *gatewayEvents) send(gw string, connected bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ev := event.GenericEvent{Object: &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: gw}}}
	for _, ch := range e.chans {
		select {
		case ch <- ev:
		default:
		}
	}
}

// source returns a controller source whose events (a gateway name) are
// mapped to requests by fn.
func (e *gatewayEvents) source(fn func(ctx context.Context, gw string) []reconcile.Request) source.Source {
	ch := make(chan event.GenericEvent, 1024)
	e.mu.Lock()
	e.chans = append(e.chans, ch)
	e.mu.Unlock()
	return source.Channel(ch, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		return fn(ctx, o.GetName())
	}))
}

// gatewayRequest maps a gateway change to its VpcNatGateway.
func gatewayRequest(_ context.Context, gw string) []reconcile.Request {
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: gw}}}
}

// eipsOfGateway maps a gateway change to the gateway's EIPs.
func (d *Deps) eipsOfGateway(ctx context.Context, gw string) []reconcile.Request {
	list := &v1.IptablesEIPList{}
	if err := d.Client.List(ctx, list, client.MatchingFields{GatewayIndex: gw}); err != nil {
		d.Log.Error(err, "map gateway to EIPs", "gateway", gw)
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, e := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: e.Name}})
	}
	return reqs
}
