package reconciler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/gateway"
	"github.com/natgw/natgw/nat"
)

// natGatewayReconciler programs a VpcNatGateway's routes (spec.routes via
// the VPC interface, and the default route via the configured external
// gateway) and its gateway-wide QoS (spec.qosPolicy, vpcnatgateway_qos.go; recorded in
// status.qosPolicy as upstream does), and hands data plane changes (the
// natgw.kubeovn.io/dataplane annotation) to the gateway's manager.
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
	// The manager re-reads the data plane annotation and switches when it
	// changed; nothing else of the object is the manager's (routes and
	// QoS are programmed below), so the kick is only that check (one
	// cache read), not a drift check of the gateway's objects: drift and
	// orphans are found by the manager's periodic checks.
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
		// The gateway's QoS goes with it (the pod may outlive the object
		// when natgw does not provision it).
		if gw, err := r.Registry.Get(g.Name); err == nil {
			if err := gw.SetQoS(ctx, nil); err != nil {
				f := classify(g.Name, err)
				log.Info("removing the gateway's QoS failed; keeping the finalizer", "reason", f.msg)
				return f.result()
			}
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
	net, f := r.gatewayNetwork(ctx, g, cfg)
	if f != nil {
		return r.finish(ctx, log, g, f)
	}
	want, err := routeObjects(g, net)
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
	if f := r.programQoS(ctx, g, gw); f != nil {
		return r.finish(ctx, log, g, f)
	}
	return ctrl.Result{}, r.setReady(ctx, g, readyCondition(g.Name))
}

// programQoS makes the gateway hold the gateway-wide QoS of g's
// spec.qosPolicy (none when unset) and records the policy in
// status.qosPolicy, as upstream's patchNatGwQoSStatus does once its
// qos-add succeeded. A refused policy leaves the gateway without
// gateway-wide QoS (upstream deleted the old policy's rules before its add
// failed) and status.qosPolicy as it was.
func (r *natGatewayReconciler) programQoS(ctx context.Context, g *v1.VpcNatGateway, gw *gateway.Manager) *failure {
	rules, f := r.gatewayQoS(ctx, g)
	if f != nil {
		if f.err == nil {
			if err := gw.SetQoS(ctx, nil); err != nil {
				logr.FromContextOrDiscard(ctx).Info("removing the gateway's QoS of a refused policy failed", "error", err.Error())
			}
		}
		return f
	}
	if err := gw.SetQoS(ctx, rules); err != nil {
		return classify(g.Name, err)
	}
	if g.Status.QoSPolicy != g.Spec.QoSPolicy {
		before := g.DeepCopy()
		g.Status.QoSPolicy = g.Spec.QoSPolicy
		res, err := r.patchStatusFresh(ctx, g, before)
		if err != nil {
			f := fail(v1.ReasonProgramFailed, "record status.qosPolicy: %v", err)
			f.err = err
			return f
		}
		if !res.IsZero() {
			// Read from a cache older than the stored gateway: its status
			// and Events stay as they are until a fresh read decides.
			f := fail(v1.ReasonProgramFailed, "record status.qosPolicy: the gateway changed since it was read")
			f.requeueAfter, f.quiet = res.RequeueAfter, true
			return f
		}
	}
	return nil
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
	if res, ok := quietResult(log, f); ok {
		return res, nil
	}
	log.Info("gateway not programmed", "reason", f.reason, "message", f.msg)
	r.event(g, f)
	if err := r.setReady(ctx, g, f.condition()); err != nil {
		return ctrl.Result{}, errors.Join(f.err, err)
	}
	return f.result()
}

// setReady stores the gateway's Ready condition in its ReadyAnnotation
// (upstream's VpcNatGateway status has no conditions), by metadata patch.
func (r *natGatewayReconciler) setReady(ctx context.Context, g *v1.VpcNatGateway, c v1.Condition) error {
	var conds []v1.Condition
	if cur := v1.GatewayReady(g); cur != nil {
		conds = append(conds, *cur)
	}
	setCondition(&conds, c, g.Generation)
	val, err := json.Marshal(conds[0])
	if err != nil {
		return fmt.Errorf("encode the Ready condition: %w", err)
	}
	if g.Annotations[v1.ReadyAnnotation] == string(val) {
		return nil
	}
	before := g.DeepCopy()
	if g.Annotations == nil {
		g.Annotations = map[string]string{}
	}
	g.Annotations[v1.ReadyAnnotation] = string(val)
	// A JSON merge patch of one annotation key merges into the map: no
	// lock needed, nothing else is sent.
	if err := r.Client.Patch(ctx, g, client.MergeFrom(before)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("write the Ready annotation: %w", err)
	}
	return nil
}

// dataplaneOf returns the data plane a VpcNatGateway's annotation asks for
// ("" when none).
func dataplaneOf(g *v1.VpcNatGateway) (nat.DataplaneName, error) {
	v := g.Annotations[DataplaneAnnotation]
	if v == "" {
		return "", nil
	}
	dp, err := nat.ParseDataplaneName("annotation "+DataplaneAnnotation, v)
	if err != nil {
		return "", fmt.Errorf("VpcNatGateway %s: %w", g.Name, err)
	}
	return dp, nil
}
