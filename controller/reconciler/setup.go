package reconciler

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/eipalloc"
	"github.com/natgw/natgw/controller/gateway"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/nat"
)

// EIPIndex indexes rules (IptablesFIPRule, IptablesDnatRule,
// IptablesSnatRule) by spec.eip in the manager's cache (RegisterIndexes).
const EIPIndex = "spec.eip"

// GatewayIndex indexes IptablesEIPs by spec.natGwDp (RegisterIndexes): a gateway's desired
// set and its connection events read only that gateway's EIPs (and, by
// EIPIndex, their rules), so their cost follows the gateway's objects,
// not every object of every gateway (the cache deep-copies what a List
// returns).
const GatewayIndex = "spec.natGwDp"

// DefaultWorkers is natgw-controller's default --workers: the reconciles
// of one kind that run at once. A reconcile mostly waits (for the agent's
// transaction and the API server's status write), so a burst of creates
// is reconciled about as fast as the API server takes them only with
// enough of them waiting at once: with 4, a burst of 1,000 FIPs on a
// 2-core machine was Ready 4 s after the last create returned; with 16,
// 0.2 s (bench/README, scenario 3). Per-gateway ordering comes from the
// agent, and a key is never reconciled twice at once.
const DefaultWorkers = 16

// Config configures Setup.
type Config struct {
	// Workers is MaxConcurrentReconciles of every controller
	// (natgw-controller: DefaultWorkers unless --workers says).
	Workers int
	// RemoveUpstreamFinalizer: see Deps.
	RemoveUpstreamFinalizer bool
	// RuleLabels: see Deps.
	RuleLabels bool
	// KubeOVNNetwork takes gateways' networks from Kube-OVN's Subnets
	// (Deps.Subnets is the manager's cache; Subnets are watched) and
	// reserves EIP addresses in Kube-OVN's IPAM through Vips (Deps.Alloc;
	// Vips are watched). Needs Kube-OVN's Subnet and Vip CRDs.
	KubeOVNNetwork bool
	// Gateway configures the gateway managers (Source is filled in).
	Gateway gateway.Options
	// SkipNameValidationForTest lets several managers register the same
	// controllers in one process (tests and benchmarks; never set by
	// natgw-controller).
	SkipNameValidationForTest bool
}

// Setup registers the field indexes, the gateway Registry (a leader-only
// Runnable started after the caches synced) and the six controllers (the
// five NAT kinds and QoSPolicy).
func Setup(ctx context.Context, mgr ctrl.Manager, cfg Config) (*gateway.Registry, error) {
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	deps := &Deps{
		Client:                  mgr.GetClient(),
		Informers:               mgr.GetCache(),
		APIReader:               mgr.GetAPIReader(),
		Recorder:                mgr.GetEventRecorder("natgw-controller"),
		RemoveUpstreamFinalizer: cfg.RemoveUpstreamFinalizer,
		RuleLabels:              cfg.RuleLabels,
		Log:                     cfg.Gateway.Log,
	}
	if cfg.KubeOVNNetwork {
		deps.Subnets = mgr.GetCache()
		// The allocator reads Vips and Subnets (unstructured) from the
		// cache, as the reconcilers read their own kinds.
		c, err := client.New(mgr.GetConfig(), client.Options{
			Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), HTTPClient: mgr.GetHTTPClient(),
			Cache: &client.CacheOptions{Reader: mgr.GetCache(), Unstructured: true},
		})
		if err != nil {
			return nil, fmt.Errorf("eip allocator client: %w", err)
		}
		deps.Alloc = &eipalloc.Allocator{Client: c, APIReader: mgr.GetAPIReader()}
	}
	gopts := cfg.Gateway
	gopts.Source = NewSource(deps)
	if gopts.Initial == nil {
		// Every VpcNatGateway in the cache: the Registry starts after the
		// caches synced, and connects them SyncParallel at a time.
		gopts.Initial = func(ctx context.Context) ([]string, error) {
			list := &v1.VpcNatGatewayList{}
			if err := deps.Client.List(ctx, list, client.UnsafeDisableDeepCopy); err != nil {
				return nil, fmt.Errorf("list VpcNatGateways: %w", err)
			}
			names := make([]string, len(list.Items))
			for i := range list.Items {
				names[i] = list.Items[i].Name
			}
			return names, nil
		}
	}
	if gopts.Deletes == nil {
		del, err := countDeletes(ctx, mgr.GetCache())
		if err != nil {
			return nil, err
		}
		gopts.Deletes = del
	}
	gev := &gatewayEvents{}
	gopts.OnConnection = gev.send
	reg := gateway.NewRegistry(gopts)
	deps.Registry = reg
	if err := mgr.Add(&registryRunnable{reg: reg, mgr: mgr}); err != nil {
		return nil, fmt.Errorf("add gateway registry: %w", err)
	}

	if err := RegisterIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return nil, err
	}
	opts := controller.Options{MaxConcurrentReconciles: cfg.Workers}
	if cfg.SkipNameValidationForTest {
		t := true
		opts.SkipNameValidation = &t
	}
	if err := setupRule(ctx, mgr, deps, fipKind, "iptables-fip-rule", opts); err != nil {
		return nil, err
	}
	if err := setupRule(ctx, mgr, deps, dnatKind, "iptables-dnat-rule", opts); err != nil {
		return nil, err
	}
	if err := setupRule(ctx, mgr, deps, snatKind, "iptables-snat-rule", opts); err != nil {
		return nil, err
	}

	toEIP := toNamed(RuleEIP)
	eipCtl := ctrl.NewControllerManagedBy(mgr).Named("iptables-eip").WithOptions(opts).
		For(&v1.IptablesEIP{}, builder.WithPredicates(specOrMetaChanged, deps.untrackedGone(nat.KindEIP))).
		Watches(&v1.IptablesFIPRule{}, toEIP, builder.WithPredicates(ruleUseChanged, notInitialList)).
		Watches(&v1.IptablesDnatRule{}, toEIP, builder.WithPredicates(ruleUseChanged, notInitialList)).
		Watches(&v1.IptablesSnatRule{}, toEIP, builder.WithPredicates(ruleUseChanged, notInitialList)).
		Watches(&v1.QoSPolicy{}, handler.EnqueueRequestsFromMapFunc(deps.eipsOfPolicy), builder.WithPredicates(specOrMetaChanged)).
		WatchesRawSource(gev.source(deps.eipsOfGateway))
	gwCtl := ctrl.NewControllerManagedBy(mgr).Named("vpc-nat-gateway").WithOptions(opts).
		For(&v1.VpcNatGateway{}, builder.WithPredicates(specOrMetaChanged)).
		Watches(&v1.QoSPolicy{}, handler.EnqueueRequestsFromMapFunc(deps.gatewaysOfPolicy), builder.WithPredicates(policyStatusChanged)).
		WatchesRawSource(gev.source(gatewayRequest))
	if deps.Subnets != nil {
		eipCtl = eipCtl.Watches(kubeovn.NewSubnet(), handler.EnqueueRequestsFromMapFunc(kubeovn.EIPsOfSubnet(deps.Client, deps.Log)), builder.WithPredicates(subnetChanged))
	}
	if deps.Alloc != nil {
		eipCtl = eipCtl.Watches(eipalloc.NewVipObject(), handler.EnqueueRequestsFromMapFunc(eipalloc.EIPOfVip))
	}
	if deps.Subnets != nil {
		gwCtl = gwCtl.Watches(kubeovn.NewSubnet(), handler.EnqueueRequestsFromMapFunc(kubeovn.GatewaysOfSubnet(deps.Client, deps.Log)), builder.WithPredicates(subnetChanged))
	}
	// QoSPolicy: its own finalizer, status and deletion hold (qospolicy.go).
	if err := setupQoSPolicy(ctx, mgr, deps, opts); err != nil {
		return nil, err
	}

	err := eipCtl.Complete(&eipReconciler{Deps: deps})
	if err != nil {
		return nil, fmt.Errorf("iptables-eip controller: %w", err)
	}
	err = gwCtl.Complete(&natGatewayReconciler{Deps: deps})
	if err != nil {
		return nil, fmt.Errorf("vpc-nat-gateway controller: %w", err)
	}
	return reg, nil
}

// RegisterIndexes registers the cache indexes the reconcilers, the
// Source and the admission webhook (controller/admission) read by; Setup
// calls it, a process without the reconcilers calls it itself: rules of each kind by spec.eip, EIPs by spec.natGwDp,
// EIPs and VpcNatGateways by spec.qosPolicy.
func RegisterIndexes(ctx context.Context, idx client.FieldIndexer) error {
	if err := indexField(ctx, idx, &v1.IptablesEIP{}, GatewayIndex, func(e *v1.IptablesEIP) string { return e.Spec.NatGwDp }); err != nil {
		return err
	}
	if err := indexField(ctx, idx, &v1.IptablesEIP{}, qosPolicyIndex, func(e *v1.IptablesEIP) string { return e.Spec.QoSPolicy }); err != nil {
		return err
	}
	if err := indexField(ctx, idx, &v1.VpcNatGateway{}, qosPolicyIndex, func(g *v1.VpcNatGateway) string { return g.Spec.QoSPolicy }); err != nil {
		return err
	}
	for _, err := range []error{
		indexByEIP(ctx, idx, fipKind),
		indexByEIP(ctx, idx, dnatKind),
		indexByEIP(ctx, idx, snatKind),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// indexByEIP indexes rule kind k by spec.eip.
func indexByEIP[T client.Object](ctx context.Context, idx client.FieldIndexer, k ruleKind[T]) error {
	return indexField(ctx, idx, k.newObj(), EIPIndex, k.eipName)
}

// indexField indexes the objects of obj's kind under name by the value
// f returns ("" indexes nothing).
func indexField[T client.Object](ctx context.Context, idx client.FieldIndexer, obj T, name string, f func(T) string) error {
	if err := idx.IndexField(ctx, obj, name, func(o client.Object) []string {
		if t, ok := o.(T); ok {
			if v := f(t); v != "" {
				return []string{v}
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("index %T by %s: %w", obj, name, err)
	}
	return nil
}

// toNamed maps an event to the cluster-scoped object that name(o) names
// (nothing for "").
func toNamed(name func(client.Object) string) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if n := name(o); n != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: n}}}
		}
		return nil
	})
}

// setupRule registers the controller of rule kind k: it
// watches its own objects, its EIPs (a rule waiting for its EIP is
// reconciled when the EIP appears or becomes ready), and the rules of every
// kind (a rule refused because its EIP was in use is retried when another
// rule on that EIP changes or goes away).
func setupRule[T client.Object](ctx context.Context, mgr ctrl.Manager, deps *Deps, k ruleKind[T], name string, opts controller.Options) error {
	r := &ruleReconciler[T]{Deps: deps, k: k}
	rulesOfEIP := func(onlyWaiting bool) handler.MapFunc {
		return func(ctx context.Context, o client.Object) []reconcile.Request {
			var eip string
			switch x := o.(type) {
			case *v1.IptablesEIP:
				eip = x.Name
			case *unstructured.Unstructured:
				// natgw's Vip of an EIP (--network-source=kube-ovn).
				for _, req := range eipalloc.EIPOfVip(ctx, x) {
					eip = req.Name
				}
			default:
				eip = RuleEIP(o)
			}
			if eip == "" {
				return nil
			}
			var reqs []reconcile.Request
			// Read-only (names, UIDs, Ready): the informer's own objects.
			if err := deps.eachIndexed(ctx, k.newObj(), k.newList(), EIPIndex, eip, func(c client.Object) {
				t, ok := c.(T)
				if !ok || onlyWaiting && (k.ready(t) || t.GetUID() == o.GetUID()) {
					return
				}
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: t.GetName()}})
			}); err != nil {
				deps.Log.Error(err, "map to rules of EIP", "eip", eip)
				return nil
			}
			return reqs
		}
	}
	waiting := handler.EnqueueRequestsFromMapFunc(rulesOfEIP(true))
	b := ctrl.NewControllerManagedBy(mgr).Named(name).WithOptions(opts).
		For(k.newObj(), builder.WithPredicates(specOrMetaChanged, deps.untrackedGone(k.kind))).
		Watches(&v1.IptablesEIP{}, handler.EnqueueRequestsFromMapFunc(rulesOfEIP(false)), builder.WithPredicates(eipChangedForRules, notInitialList)).
		Watches(&v1.IptablesFIPRule{}, waiting, builder.WithPredicates(specOrMetaChanged, notInitialList)).
		Watches(&v1.IptablesDnatRule{}, waiting, builder.WithPredicates(specOrMetaChanged, notInitialList)).
		Watches(&v1.IptablesSnatRule{}, waiting, builder.WithPredicates(specOrMetaChanged, notInitialList))
	if deps.Alloc != nil {
		// A rule reads its EIP's IPv6 address from the EIP's Vip
		// (Deps.eipAddrs): when Kube-OVN writes or changes status.v6ip
		// the EIP's own object does not change (status.ip stays the
		// IPv4 address), so the EIP watch above would not bring the
		// rules back.
		b = b.Watches(eipalloc.NewVipObject(), handler.EnqueueRequestsFromMapFunc(rulesOfEIP(false)), builder.WithPredicates(vipAddrsChanged))
	}
	err := b.Complete(r)
	if err != nil {
		return fmt.Errorf("%s controller: %w", name, err)
	}
	return nil
}

// RuleEIP returns a rule's spec.eip ("" for other objects).
func RuleEIP(o client.Object) string {
	switch r := o.(type) {
	case *v1.IptablesFIPRule:
		return r.Spec.EIP
	case *v1.IptablesDnatRule:
		return r.Spec.EIP
	case *v1.IptablesSnatRule:
		return r.Spec.EIP
	}
	return ""
}

// eipsOfPolicy maps a QoSPolicy to the EIPs that use it.
func (d *Deps) eipsOfPolicy(ctx context.Context, o client.Object) []reconcile.Request {
	return d.requestsByIndex(ctx, &v1.IptablesEIP{}, &v1.IptablesEIPList{}, qosPolicyIndex, o.GetName(), "map QoSPolicy to EIPs")
}

// requestsByIndex returns a request for each object of obj's kind (list
// is its list kind) whose index has value (a failed read is logged as
// what: a map function has no error to return, and the next event or
// resync maps again).
func (d *Deps) requestsByIndex(ctx context.Context, obj client.Object, list client.ObjectList, index, value, what string) []reconcile.Request {
	var reqs []reconcile.Request
	// Read-only (names): the informer's own objects.
	if err := d.eachIndexed(ctx, obj, list, index, value, func(o client.Object) {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: o.GetName()}})
	}); err != nil {
		d.Log.Error(err, what, index, value)
		return nil
	}
	return reqs
}

// registryRunnable starts the gateway Registry once the caches synced: a
// desired set computed from an empty cache would sync every gateway empty.
type registryRunnable struct {
	reg *gateway.Registry
	mgr manager.Manager
}

func (r *registryRunnable) NeedLeaderElection() bool { return true }

func (r *registryRunnable) Start(ctx context.Context) error {
	if !r.mgr.GetCache().WaitForCacheSync(ctx) {
		if ctx.Err() != nil {
			return nil
		}
		return errors.New("gateway registry: caches did not sync")
	}
	return r.reg.Start(ctx)
}
