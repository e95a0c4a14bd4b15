package provision

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/controller/transport"
)

// FieldManager is the server-side apply field manager of the gateway
// StatefulSets.
const FieldManager = "natgw-controller"

// Event reasons (Warning events on the VpcNatGateway).
const (
	// ReasonProvisionFailed: the StatefulSet could not be built or applied
	// (the message says why; retried with backoff).
	ReasonProvisionFailed = "ProvisionFailed"
	// ReasonBGPUnsupported: spec.bgpSpeaker.enabled is set; the gateway is
	// provisioned without upstream's BGP speaker sidecar.
	ReasonBGPUnsupported = "BGPSpeakerUnsupported"
	// ReasonReplicasUnsupported: the gateway asks for two replicas
	// (Replicas) while two-replica provisioning is off (Options.HA):
	// natgw provisions one pod.
	ReasonReplicasUnsupported = "ReplicasUnsupported"
	// ReasonReplicasInvalid: spec.replicas or ReplicasAnnotation is not 1
	// or 2 (the admission webhook refuses it; without the webhook the
	// provisioner leaves the gateway's StatefulSet as it is).
	ReasonReplicasInvalid = "ReplicasInvalid"
	// ReasonReplicasChangeRefused: the number of replicas asked for
	// differs from the one the running gateway was provisioned with
	// (ReplicasChange); the StatefulSet keeps its number.
	ReasonReplicasChangeRefused = "ReplicasChangeRefused"
	// ReasonNamespaceNotAllowed: spec.namespace (Kube-OVN master) names a
	// namespace that is neither natgw's gateway namespace nor one of
	// Options.GatewayNamespaces (natgw-controller may not read or write
	// there); the gateway is not provisioned until it is allowed.
	ReasonNamespaceNotAllowed = "NamespaceNotAllowed"
	// ReasonNamespaceChangeRefused: spec.namespace of a live gateway
	// changed (NamespaceChange); its StatefulSet stays where it is.
	ReasonNamespaceChangeRefused = "NamespaceChangeRefused"
	// ReasonKubeOVNFeatureOn: Kube-OVN's own VPC NAT gateway feature is on
	// (FeatureConfigMap): natgw provisions nothing until it is off.
	ReasonKubeOVNFeatureOn = "KubeOVNFeatureOn"
)

// FeatureConfigMap is Kube-OVN's switch of its VPC NAT gateway feature, in
// its namespace (Options.Namespace): on when its key FeatureKey is "true";
// off when it is absent or says anything else (resyncVpcNatGwConfig,
// pkg/controller/vpc_nat_gateway.go:59-94). Replace mode needs it off: with
// it on, Kube-OVN's controller creates the same StatefulSets and programs
// the gateways itself.
const (
	FeatureConfigMap = "ovn-vpc-nat-gw-config"
	FeatureKey       = "enable-vpc-nat-gw"
)

// StatefulSetFinalizer is on every gateway StatefulSet natgw provisions.
// Kube-OVN's controller deletes the StatefulSet vpc-nat-gw-<name> of every
// VpcNatGateway each time it starts with its VPC NAT gateway feature off
// (resyncVpcNatGwConfig -> cleanUpVpcNatGw -> handleDelVpcNatGw,
// vpc_nat_gateway.go:59-78, :144-163, :1161-1171), natgw's included: the
// name is upstream's. Unheld, every restart of kube-ovn-controller would
// delete every gateway pod with it. Held, the deletion leaves the pod
// running; the provisioner orphans the pod, releases the StatefulSet, waits
// for the garbage collector to delete its ControllerRevisions and applies
// it again, and the new StatefulSet adopts the running pod (the same
// template: the same revision, no restart). When the VpcNatGateway is gone
// the finalizer is removed and the garbage collector deletes the pod.
const StatefulSetFinalizer = "natgw.kubeovn.io/gateway"

// rescueRetry is how often a held or missing StatefulSet is looked at again
// while its rescue waits for the API (the StatefulSet watch also brings it
// back).
const rescueRetry = time.Second

// ReasonGatewayHeld: a Normal event on the VpcNatGateway when its
// StatefulSet was deleted by someone else (Kube-OVN's cleanup) and natgw
// kept the pod running.
const ReasonGatewayHeld = "GatewayStatefulSetHeld"

// featureRetry is how often a gateway waiting for Kube-OVN's feature to be
// switched off is looked at again (the ConfigMap is also watched).
const featureRetry = 30 * time.Second

// Options configures the provisioner.
type Options struct {
	// Namespace of the gateway StatefulSets and pods whose VpcNatGateway
	// has no spec.namespace (upstream: kube-ovn-controller's namespace,
	// kube-system; GatewayNamespace decides); the exec transport's
	// default namespace.
	Namespace string
	// GatewayNamespaces are the other namespaces a VpcNatGateway's
	// spec.namespace may name. The provisioner's cache (CacheByObject)
	// and natgw-controller's RBAC must cover them (the chart's
	// gatewayNamespaces); a gateway naming another gets a Warning
	// (ReasonNamespaceNotAllowed) and no workload.
	GatewayNamespaces []string
	// Image is natgw's gateway image.
	Image string
	// ServiceClusterIPRange: see Inputs.
	ServiceClusterIPRange string
	// HA provisions a gateway that asks for two replicas (Replicas) as
	// two pods (Build's haPod; controller/config/ha must be applied for
	// their Lease). Off, such a gateway gets one pod and a Warning
	// (ReasonReplicasUnsupported). On, the pods run `natgw ha` (container
	// HAContainer) and the exec transport programs both (transport.Pair);
	// the lanIp follows the active through a Kube-OVN Vip the provisioner
	// creates (NewLanVip) named in both pods' AAPsAnnotation. On, the
	// provisioner also watches the namespace's Leases and shows a
	// two-replica gateway's Lease holder (ActiveAnnotation, Events); pass
	// the same value to CacheByObject.
	HA bool
	// HALease is Inputs.HALease for every two-replica gateway (0: natgw
	// ha's default, 250 ms). A fence kept in a slow API server needs more:
	// an active steps down when its renewals keep failing for the lease
	// minus two heartbeats (TestHAFailoverCluster's report).
	HALease time.Duration
	// StandbyLag, when set (with HA), says how long a two-replica
	// gateway's standby has been missing changes its active holds
	// (transport.Exec.StandbyLag); the provisioner shows it as the
	// StandbyAnnotation condition, read every StandbyPoll.
	StandbyLag func(gateway string) time.Duration
	// Workers is the number of parallel reconciles (default 1).
	Workers int
	// Log is the provisioner's logger.
	Log logr.Logger
	// SkipNameValidationForTest lets several managers register the same
	// controller in one process (tests; never set by natgw-controller).
	SkipNameValidationForTest bool
}

// CacheByObject restricts the manager's caches of the kinds the
// provisioner reads to what it reads: the gateway StatefulSets (upstream's
// gateway label) in namespace ns and in the extra gateway namespaces
// (Options.GatewayNamespaces), and Kube-OVN's FeatureConfigMap in ns; with
// ha (Options.HA), also the Leases of those namespaces (the two-replica
// gateways' fences; controller/config/ha grants natgw-controller their
// reading). Pass it as ctrl.Options.Cache.ByObject (merged with any other
// entries).
func CacheByObject(ns string, extra []string, ha bool) map[client.Object]cache.ByObject {
	gwNS := map[string]cache.Config{ns: {}}
	for _, e := range extra {
		gwNS[e] = cache.Config{}
	}
	m := map[client.Object]cache.ByObject{
		&appsv1.StatefulSet{}: {
			Namespaces: gwNS,
			Label:      labels.SelectorFromSet(labels.Set{transport.GatewayPodLabel: "true"}),
		},
		&corev1.ConfigMap{}: {
			Namespaces: map[string]cache.Config{ns: {}},
			Field:      fields.OneTermEqualSelector("metadata.name", FeatureConfigMap),
		},
	}
	if ha {
		m[&coordinationv1.Lease{}] = cache.ByObject{Namespaces: gwNS}
	}
	return m
}

// Reconciler keeps each VpcNatGateway's StatefulSet and status; see the
// package comment and Reconcile.
type Reconciler struct {
	client   client.Client
	reader   client.Reader // the cache, also for unstructured Subnets and Vpcs
	api      client.Reader // the API server: gateway pods and ControllerRevisions (not cached)
	recorder events.EventRecorder
	opts     Options
}

// Setup registers the provisioner's controller on mgr: VpcNatGateways
// (spec changes), their StatefulSets (a deleted or changed one is looked at
// again), Subnets (a gateway waiting for its subnet is built when it
// appears) and Kube-OVN's FeatureConfigMap (every gateway, when it
// changes).
func Setup(mgr ctrl.Manager, o Options) (*Reconciler, error) {
	if o.Namespace == "" || o.Image == "" {
		return nil, errors.New("provision: Namespace and Image are required")
	}
	if o.Workers <= 0 {
		o.Workers = 1
	}
	if o.HALease < 0 || (o.HALease > 0 && o.HALease <= MinHALease) {
		return nil, fmt.Errorf("provision: HALease %s: want 0 (natgw ha's default) or more than %s", o.HALease, MinHALease)
	}
	r := &Reconciler{client: mgr.GetClient(), reader: mgr.GetCache(), api: mgr.GetAPIReader(), recorder: mgr.GetEventRecorder(FieldManager), opts: o}
	subnet := kubeovn.NewSubnet()
	copts := controller.Options{MaxConcurrentReconciles: o.Workers}
	if o.SkipNameValidationForTest {
		t := true
		copts.SkipNameValidation = &t
	}
	b := ctrl.NewControllerManagedBy(mgr).Named("gateway-provisioner").WithOptions(copts).
		For(&v1.VpcNatGateway{}, builder.WithPredicates(predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, replicasAnnotationChanged))).
		Owns(&appsv1.StatefulSet{}).
		Watches(subnet, handler.EnqueueRequestsFromMapFunc(kubeovn.GatewaysOfSubnet(r.reader, o.Log))).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(r.allGateways))
	if o.HA {
		// A holder change only: the active renews every heartbeat.
		b = b.Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(r.gatewayOfLease), builder.WithPredicates(holderChanged))
	}
	err := b.Complete(r)
	if err != nil {
		return nil, fmt.Errorf("gateway-provisioner controller: %w", err)
	}
	return r, nil
}

// MinHALease is the shortest HALease minus one: the lease must outlast
// more than natgw ha's default 50 ms heartbeat (its --interval).
const MinHALease = 50 * time.Millisecond

// replicasAnnotationChanged passes updates that change a VpcNatGateway's
// ReplicasAnnotation (an annotation does not change the generation).
var replicasAnnotationChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld.GetAnnotations()[ReplicasAnnotation] != e.ObjectNew.GetAnnotations()[ReplicasAnnotation]
	},
	CreateFunc:  func(event.CreateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// allGateways maps Kube-OVN's FeatureConfigMap to every gateway.
func (r *Reconciler) allGateways(ctx context.Context, o client.Object) []reconcile.Request {
	if o.GetNamespace() != r.opts.Namespace || o.GetName() != FeatureConfigMap {
		return nil
	}
	list := &v1.VpcNatGatewayList{}
	if err := r.reader.List(ctx, list); err != nil {
		r.opts.Log.Error(err, "map ConfigMap to VpcNatGateways", "configMap", o.GetName())
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
	}
	return reqs
}

// kubeOVNFeatureOn reads Kube-OVN's FeatureConfigMap.
func (r *Reconciler) kubeOVNFeatureOn(ctx context.Context) (bool, error) {
	cm := &corev1.ConfigMap{}
	err := r.reader.Get(ctx, types.NamespacedName{Namespace: r.opts.Namespace, Name: FeatureConfigMap}, cm)
	switch {
	case apierrors.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("get ConfigMap %s/%s: %w", r.opts.Namespace, FeatureConfigMap, err)
	}
	return cm.Data[FeatureKey] == "true", nil
}

// Reconcile does nothing while Kube-OVN's own VPC NAT gateway feature is on
// (FeatureConfigMap; a Warning event, looked at again every 30 s and when
// the ConfigMap changes). Otherwise it applies the gateway's StatefulSet
// when it is missing, not
// controlled by this VpcNatGateway, on another image than natgw's
// configured one, or when the spec fields it was built from changed
// (Changed; upstream's update rule, vpc_nat_gateway.go:238, :262-272), then
// records them in the status (upstream: after the create or update,
// :248-259, :274-279). A terminating VpcNatGateway keeps its StatefulSet
// (natgw's VpcNatGateway reconciler still reaches the agent to delete its
// routes); once the object is gone the garbage collector deletes the
// StatefulSet through its owner reference.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, err error) {
	log := r.opts.Log.WithValues("vpcNatGateway", req.Name)
	g := &v1.VpcNatGateway{}
	if err := r.reader.Get(ctx, req.NamespacedName, g); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone: its StatefulSet goes too (owner reference).
			return ctrl.Result{}, r.release(ctx, log, req.Name)
		}
		return ctrl.Result{}, err
	}
	if !g.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	on, err := r.kubeOVNFeatureOn(ctx)
	if err != nil {
		return ctrl.Result{}, err
	}
	if on {
		// Kube-OVN's gateways from now on: hold nothing of natgw's.
		if err := r.release(ctx, log, g.Name); err != nil {
			return ctrl.Result{}, err
		}
		msg := fmt.Sprintf("Kube-OVN's VPC NAT gateway feature is on (ConfigMap %s/%s %s=true): natgw provisions nothing until it is off", r.opts.Namespace, FeatureConfigMap, FeatureKey)
		log.Info("gateway not provisioned", "reason", msg)
		r.recorder.Eventf(g, nil, corev1.EventTypeWarning, ReasonKubeOVNFeatureOn, "Provision", "%s", msg)
		return ctrl.Result{RequeueAfter: featureRetry}, nil
	}
	// Upstream requires the Vpc and the Subnet first (vpc_nat_gateway.go:200-209).
	vpc := &unstructured.Unstructured{}
	vpc.SetGroupVersionKind(kubeovn.VpcGVK)
	if err := r.reader.Get(ctx, types.NamespacedName{Name: g.Spec.Vpc}, vpc); err != nil {
		return r.failed(ctx, log, g, fmt.Errorf("vpc %q: %w", g.Spec.Vpc, err))
	}
	subnets, err := kubeovn.ListSubnets(ctx, r.reader)
	if err != nil {
		return ctrl.Result{}, err
	}
	replicas, ferr := Replicas(g)
	if ferr != nil {
		// Permanent until the object changes (which brings it back):
		// no retry.
		log.Info("gateway not provisioned", "reason", ferr.Error())
		r.recorder.Eventf(g, nil, corev1.EventTypeWarning, ReasonReplicasInvalid, "Provision", "%v; the gateway's StatefulSet is left as it is", ferr)
		return ctrl.Result{}, nil
	}
	if replicas > 1 && !r.opts.HA {
		r.recorder.Eventf(g, nil, corev1.EventTypeWarning, ReasonReplicasUnsupported, "Provision",
			"%d replicas asked for: natgw provisions one gateway pod (two-replica provisioning, --ha-gateways, is off)", replicas)
		replicas = 1
	}

	ns := GatewayNamespace(g, r.opts.Namespace)
	if !AllowedNamespace(ns, r.opts.Namespace, r.opts.GatewayNamespaces) {
		// Permanent until the object or natgw's configuration changes.
		msg := fmt.Sprintf("spec.namespace %q: natgw-controller provisions gateways in %q and in --gateway-namespaces %q only (its cache and RBAC cover those); the gateway is not provisioned", ns, r.opts.Namespace, r.opts.GatewayNamespaces)
		log.Info("gateway not provisioned", "reason", msg)
		r.recorder.Eventf(g, nil, corev1.EventTypeWarning, ReasonNamespaceNotAllowed, "Provision", "%s", msg)
		return ctrl.Result{}, nil
	}
	if moved, err := r.elsewhere(ctx, g, ns); err != nil {
		return ctrl.Result{}, err
	} else if moved != "" {
		ferr := NamespaceChange(moved, ns)
		log.Info("namespace not changed", "reason", ferr.Error())
		r.recorder.Eventf(g, nil, corev1.EventTypeWarning, ReasonNamespaceChangeRefused, "Provision", "%v; the gateway's StatefulSet is left as it is", ferr)
		return ctrl.Result{}, nil
	}

	name := StatefulSetName(g.Name)
	live := &appsv1.StatefulSet{}
	err = r.reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, live)
	getErr := err
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, fmt.Errorf("get StatefulSet %s/%s: %w", ns, name, err)
	}
	if err == nil && live.DeletionTimestamp.IsZero() {
		// The running gateway keeps the number it was provisioned with
		// (also one Kube-OVN made, adopted by this apply: a single one).
		if have := ProvisionedReplicas(live.Spec.Template.Annotations); have != replicas {
			ferr := ReplicasChange(have, replicas)
			log.Info("replicas not changed", "reason", ferr.Error())
			r.recorder.Eventf(g, nil, corev1.EventTypeWarning, ReasonReplicasChangeRefused, "Provision", "%v", ferr)
			replicas = have
		}
	}
	want, berr := Build(Inputs{Gateway: g, Subnets: subnets, Namespace: r.opts.Namespace, Image: r.opts.Image, ServiceClusterIPRange: r.opts.ServiceClusterIPRange, Replicas: replicas, HALease: r.opts.HALease})
	if berr != nil {
		return r.failed(ctx, log, g, berr)
	}
	if BGPUnsupported(g) {
		r.recorder.Eventf(g, nil, corev1.EventTypeWarning, ReasonBGPUnsupported, "Provision", "spec.bgpSpeaker.enabled: natgw provisions the gateway without upstream's BGP speaker sidecar")
	}
	if err == nil && !live.DeletionTimestamp.IsZero() {
		return r.rescue(ctx, log, g, live)
	}
	if apierrors.IsNotFound(err) {
		// A StatefulSet re-created while the old one's ControllerRevisions
		// are still there would get another revision name and roll the
		// pod it adopts.
		n, err := r.leftoverRevisions(ctx, ns, g.Name)
		if err != nil {
			return ctrl.Result{}, err
		}
		if n > 0 {
			log.Info("waiting for the garbage collector to delete the ControllerRevisions of the gateway's previous StatefulSet", "statefulSet", *want.Name, "revisions", n)
			return ctrl.Result{RequeueAfter: rescueRetry}, nil
		}
	}
	why := ""
	switch {
	case apierrors.IsNotFound(err):
		why = "missing"
	case !metav1.IsControlledBy(live, g):
		why = "not controlled by this VpcNatGateway"
	case imageOf(live) != r.opts.Image:
		why = "image " + imageOf(live)
	case Changed(g):
		why = "spec changed"
	}
	if r.opts.HA && ProvisionedReplicas(want.Spec.Template.Annotations) == MaxReplicas {
		// The lanIp's Vip first: Kube-OVN must reserve the lanIp before
		// a gateway pod exists, or its IPAM may give it to a pod as its
		// own eth0 address (seen in the Kube-OVN lab).
		reserved, err := r.lanVip(ctx, log, g)
		if err != nil {
			return r.failed(ctx, log, g, err)
		}
		if !reserved {
			if apierrors.IsNotFound(getErr) {
				log.Info("waiting for Kube-OVN to reserve the lanIp in the gateway's Vip before creating its pods", "vip", LanVipName(g.Name), "lanIp", g.Spec.LanIP)
				return ctrl.Result{RequeueAfter: rescueRetry}, nil
			}
			defer func() {
				if err == nil && res.IsZero() {
					res.RequeueAfter = rescueRetry
				}
			}()
		}
	}
	if why != "" {
		t0 := time.Now()
		if err := r.client.Apply(ctx, want, client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
			return r.failed(ctx, log, g, fmt.Errorf("apply StatefulSet %s/%s: %w", ns, *want.Name, err))
		}
		log.Info("gateway StatefulSet applied", "statefulSet", *want.Name, "namespace", ns, "why", why, "took", time.Since(t0))
	}
	if r.opts.HA && ProvisionedReplicas(want.Spec.Template.Annotations) == MaxReplicas {
		if err := r.active(ctx, log, g); err != nil {
			return ctrl.Result{}, err
		}
		if r.opts.StandbyLag != nil {
			if err := r.standby(ctx, log, g); err != nil {
				return ctrl.Result{}, err
			}
			defer func() {
				if err == nil && res.IsZero() {
					res.RequeueAfter = StandbyPoll
				}
			}()
		}
	}
	if Changed(g) {
		body, err := StatusPatch(g)
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("encode status: %w", err)
		}
		if err := r.client.Status().Patch(ctx, g, client.RawPatch(types.MergePatchType, body)); err != nil {
			if apierrors.IsNotFound(err) {
				return ctrl.Result{}, nil
			}
			return ctrl.Result{}, fmt.Errorf("patch VpcNatGateway %s status: %w", g.Name, err)
		}
		log.V(1).Info("status recorded", "externalSubnets", g.Spec.ExternalSubnets, "selector", g.Spec.Selector)
	}
	return ctrl.Result{}, nil
}

// failed reports err as a Warning event and returns it (retried with backoff).
func (r *Reconciler) failed(ctx context.Context, log logr.Logger, g *v1.VpcNatGateway, err error) (ctrl.Result, error) {
	if ctx.Err() != nil {
		return ctrl.Result{}, err
	}
	log.Info("gateway not provisioned", "reason", err.Error())
	r.recorder.Eventf(g, nil, corev1.EventTypeWarning, ReasonProvisionFailed, "Provision", "%v", err)
	return ctrl.Result{}, err
}

// imageOf returns the image of the StatefulSet's gateway container.
func imageOf(s *appsv1.StatefulSet) string {
	for _, c := range s.Spec.Template.Spec.Containers {
		if c.Name == transport.GatewayContainer {
			return c.Image
		}
	}
	return ""
}

// rescue handles a StatefulSet of gateway g being deleted while g is not:
// someone else deleted it (Kube-OVN's cleanup; see StatefulSetFinalizer).
// Held by natgw's finalizer, it orphans the StatefulSet's pods (they keep
// running) and then removes the finalizer; the StatefulSet is applied
// again once it and its ControllerRevisions are gone. Not held (made by an
// earlier natgw, or not g's), it waits for it to go.
func (r *Reconciler) rescue(ctx context.Context, log logr.Logger, g *v1.VpcNatGateway, live *appsv1.StatefulSet) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(live, StatefulSetFinalizer) {
		log.Info("gateway StatefulSet is being deleted; it is applied again once it is gone", "statefulSet", live.Name)
		return ctrl.Result{RequeueAfter: rescueRetry}, nil
	}
	var orphaned []string
	if metav1.IsControlledBy(live, g) {
		pods := &corev1.PodList{}
		if err := r.api.List(ctx, pods, client.InNamespace(live.Namespace), client.MatchingLabels(Labels(g.Name))); err != nil {
			return ctrl.Result{}, fmt.Errorf("list pods of StatefulSet %s/%s: %w", live.Namespace, live.Name, err)
		}
		for i := range pods.Items {
			ok, err := r.orphan(ctx, &pods.Items[i], live.UID)
			if err != nil {
				return ctrl.Result{}, err
			}
			if ok {
				orphaned = append(orphaned, pods.Items[i].Name)
			}
		}
	}
	if err := r.removeFinalizer(ctx, live); err != nil {
		return ctrl.Result{}, err
	}
	log.Info("gateway StatefulSet deleted by another controller (Kube-OVN's cleanup with its feature off?): its pods orphaned and kept running, the StatefulSet released; it is applied again and adopts them", "statefulSet", live.Name, "pods", orphaned)
	r.recorder.Eventf(g, nil, corev1.EventTypeNormal, ReasonGatewayHeld, "Provision",
		"StatefulSet %s/%s was deleted by another controller; pods %v kept running and are adopted by the StatefulSet natgw applies again", live.Namespace, live.Name, orphaned)
	return ctrl.Result{RequeueAfter: rescueRetry}, nil
}

// orphan removes pod's owner reference to the StatefulSet uid (a JSON
// patch that first tests the reference is still the one read). It says
// whether it removed one.
func (r *Reconciler) orphan(ctx context.Context, pod *corev1.Pod, uid types.UID) (bool, error) {
	for i, ref := range pod.OwnerReferences {
		if ref.UID != uid {
			continue
		}
		patch := fmt.Sprintf(`[{"op":"test","path":"/metadata/ownerReferences/%d/uid","value":%q},{"op":"remove","path":"/metadata/ownerReferences/%d"}]`, i, uid, i)
		if err := r.client.Patch(ctx, pod, client.RawPatch(types.JSONPatchType, []byte(patch))); err != nil {
			if apierrors.IsNotFound(err) {
				return false, nil
			}
			return false, fmt.Errorf("orphan pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
		return true, nil
	}
	return false, nil
}

// removeFinalizer removes StatefulSetFinalizer from s (a merge patch with
// s's resourceVersion: a conflict is retried by the caller's requeue).
func (r *Reconciler) removeFinalizer(ctx context.Context, s *appsv1.StatefulSet) error {
	before := s.DeepCopy()
	if !controllerutil.RemoveFinalizer(s, StatefulSetFinalizer) {
		return nil
	}
	if err := r.client.Patch(ctx, s, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{})); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer %s from StatefulSet %s/%s: %w", StatefulSetFinalizer, s.Namespace, s.Name, err)
	}
	return nil
}

// release removes natgw's finalizer from the StatefulSets of gateway name
// that have it, in every gateway namespace (a gone gateway's spec.namespace
// is no longer there to read): the gateway is gone, or no longer natgw's to
// provision.
func (r *Reconciler) release(ctx context.Context, log logr.Logger, name string) error {
	list, err := r.gatewayStatefulSets(ctx, name)
	if err != nil {
		return err
	}
	for i := range list {
		s := &list[i]
		if !controllerutil.ContainsFinalizer(s, StatefulSetFinalizer) {
			continue
		}
		if err := r.removeFinalizer(ctx, s); err != nil {
			return err
		}
		log.Info("gateway StatefulSet released", "statefulSet", s.Name, "namespace", s.Namespace)
	}
	return nil
}

// gatewayStatefulSets returns the StatefulSets named after gateway name
// (StatefulSetName, with its Labels) in the gateway namespaces the
// provisioner reads (AllowedNamespace).
func (r *Reconciler) gatewayStatefulSets(ctx context.Context, name string) ([]appsv1.StatefulSet, error) {
	list := &appsv1.StatefulSetList{}
	if err := r.reader.List(ctx, list, client.MatchingLabels(Labels(name))); err != nil {
		return nil, fmt.Errorf("list StatefulSets of gateway %s: %w", name, err)
	}
	var out []appsv1.StatefulSet
	for _, s := range list.Items {
		if s.Name == StatefulSetName(name) && AllowedNamespace(s.Namespace, r.opts.Namespace, r.opts.GatewayNamespaces) {
			out = append(out, s)
		}
	}
	return out, nil
}

// elsewhere returns the namespace of a StatefulSet that g controls in
// another gateway namespace than ns ("" when there is none): g's
// spec.namespace changed while its workload runs there.
func (r *Reconciler) elsewhere(ctx context.Context, g *v1.VpcNatGateway, ns string) (string, error) {
	list, err := r.gatewayStatefulSets(ctx, g.Name)
	if err != nil {
		return "", err
	}
	for i := range list {
		if list[i].Namespace != ns && metav1.IsControlledBy(&list[i], g) {
			return list[i].Namespace, nil
		}
	}
	return "", nil
}

// leftoverRevisions counts the ControllerRevisions in namespace ns of gateway name's
// StatefulSet that a StatefulSet still controls (while none of that name
// exists: the garbage collector has not deleted them yet).
func (r *Reconciler) leftoverRevisions(ctx context.Context, ns, name string) (int, error) {
	revs := &appsv1.ControllerRevisionList{}
	if err := r.api.List(ctx, revs, client.InNamespace(ns), client.MatchingLabels(Labels(name))); err != nil {
		return 0, fmt.Errorf("list ControllerRevisions of StatefulSet %s/%s: %w", ns, StatefulSetName(name), err)
	}
	n := 0
	for i := range revs.Items {
		if ref := metav1.GetControllerOf(&revs.Items[i]); ref != nil && ref.Kind == "StatefulSet" && ref.Name == StatefulSetName(name) {
			n++
		}
	}
	return n, nil
}
