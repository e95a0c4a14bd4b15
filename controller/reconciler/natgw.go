package reconciler

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/gateway"
	"github.com/natgw/natgw/nat"
)

// natGatewayReconciler programs a VpcNatGateway's routes (spec.routes via
// the VPC interface, and the default route via the configured external
// gateway) and hands data plane changes (the natgw.kubeovn.io/dataplane
// annotation) to the gateway's manager.
type natGatewayReconciler struct {
	*Deps
}

func (r *natGatewayReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	g := &v1.VpcNatGateway{}
	if err := r.Client.Get(ctx, req.NamespacedName, g); err != nil {
		if apierrors.IsNotFound(err) {
			return r.reapVanished(ctx, nat.KindRoute, req.Name, func(v trackVal) ([]string, error) {
				uids, f := r.routesOn(ctx, v.gateway, v.uid)
				if f != nil {
					return nil, f
				}
				return uids, nil
			})
		}
		return ctrl.Result{}, err
	}
	uid := string(g.UID)
	log := logr.FromContextOrDiscard(ctx).WithValues("uid", uid)
	ctx = logr.NewContext(ctx, log)
	// The manager re-reads the data plane annotation.
	r.Registry.Kick(g.Name)

	if !g.DeletionTimestamp.IsZero() {
		if !hasFinalizer(g) {
			return ctrl.Result{}, nil
		}
		routes, f := r.routesOn(ctx, g.Name, uid)
		if f != nil {
			if errors.Is(f.err, gateway.ErrUnknownGateway) {
				return r.finishDelete(ctx, log, g, nat.KindRoute, nil, nil)
			}
			log.Info("listing the gateway's routes failed; keeping the finalizer", "reason", f.msg)
			return f.result()
		}
		res, err := r.finishDelete(ctx, log, g, nat.KindRoute, routes, []string{g.Name})
		if err == nil && res.IsZero() {
			r.tracked().forget(nat.KindRoute, g.Name, uid)
		}
		return res, err
	}

	ok, res, err := r.ensureMeta(ctx, log, g, nil)
	if !ok {
		return res, err
	}
	cfg, known := r.Registry.Lookup(g.Name)
	if !known {
		return r.finish(ctx, log, g, fail(v1.ReasonGatewayNotFound, "gateway %s is not configured in natgw-controller's gateway config", g.Name))
	}
	want, err := routeObjects(g, cfg)
	if err != nil {
		return r.finish(ctx, log, g, fail(v1.ReasonInvalid, "%v", err))
	}
	gw, err := r.Registry.Get(g.Name)
	if err == nil {
		err = gw.Apply(ctx, want...)
	}
	if err != nil {
		return r.finish(ctx, log, g, classify(g.Name, err))
	}
	// Routes no longer in the spec.
	have, f := r.routesOn(ctx, g.Name, uid)
	if f != nil {
		return r.finish(ctx, log, g, f)
	}
	keep := map[string]bool{}
	for _, o := range want {
		keep[o.UID] = true
	}
	var stale []string
	for _, u := range have {
		if !keep[u] {
			stale = append(stale, u)
		}
	}
	if err := gw.Delete(ctx, nat.KindRoute, stale...); err != nil {
		return r.finish(ctx, log, g, classify(g.Name, err))
	}
	r.tracked().set(nat.KindRoute, g.Name, uid, g.Name)
	log.V(1).Info("routes programmed", "routes", len(want), "removed", len(stale))
	before := g.DeepCopy()
	g.Status.ObservedGeneration = g.Generation
	setCondition(&g.Status.Conditions, readyCondition(g.Name), g.Generation)
	return ctrl.Result{}, r.patchStatus(ctx, g, before)
}

// routesOn lists the UIDs of gateway gwName's route objects owned by uid.
func (r *natGatewayReconciler) routesOn(ctx context.Context, gwName, uid string) ([]string, *failure) {
	gw, err := r.Registry.Get(gwName)
	if err != nil {
		f := classify(gwName, err)
		f.err = err
		return nil, f
	}
	objs, err := gw.List(ctx)
	if err != nil {
		return nil, classify(gwName, err)
	}
	var out []string
	for _, o := range objs {
		if owner, ok := routeOwner(o.UID); ok && owner == uid && o.Kind == nat.KindRoute {
			out = append(out, o.UID)
		}
	}
	return out, nil
}

func (r *natGatewayReconciler) finish(ctx context.Context, log logr.Logger, g *v1.VpcNatGateway, f *failure) (ctrl.Result, error) {
	log.Info("routes not programmed", "reason", f.reason, "message", f.msg)
	r.event(g, f)
	before := g.DeepCopy()
	g.Status.ObservedGeneration = g.Generation
	setCondition(&g.Status.Conditions, f.condition(), g.Generation)
	if err := r.patchStatus(ctx, g, before); err != nil {
		return ctrl.Result{}, errors.Join(f.err, err)
	}
	return f.result()
}

// dataplaneOf returns the data plane a VpcNatGateway's annotation asks for
// ("" when none).
func dataplaneOf(g *v1.VpcNatGateway) (string, error) {
	dp := g.Annotations[DataplaneAnnotation]
	switch dp {
	case "", "nftables", "iptables":
		return dp, nil
	}
	return "", fmt.Errorf("VpcNatGateway %s: annotation %s=%q is not nftables or iptables", g.Name, DataplaneAnnotation, dp)
}
