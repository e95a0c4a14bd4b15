package reconciler

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/gateway"
	"github.com/natgw/natgw/nat"
)

// owned is a gateway object with its owner's creation time.
type owned struct {
	obj     nat.Object
	created time.Time
}

func hasFinalizer(o client.Object) bool { return controllerutil.ContainsFinalizer(o, Finalizer) }

// isLive: the object carries natgw's finalizer and is not terminating, so
// it may be programmed.
func isLive(o client.Object) bool {
	return hasFinalizer(o) && o.GetDeletionTimestamp().IsZero()
}

// liveCount counts the list's objects that are not terminating.
func liveCount(list client.ObjectList) (int, error) {
	objs, err := meta.ExtractList(list)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, o := range objs {
		if m, err := meta.Accessor(o); err == nil && m.GetDeletionTimestamp().IsZero() {
			n++
		}
	}
	return n, nil
}

// Source implements gateway.Source over the cache (desired sets) and the
// API server (orphan confirmation).
type Source struct {
	deps  *Deps
	rules []interface {
		desired(ctx context.Context, eips []*v1.IptablesEIP) ([]owned, error)
	}
	eips *eipReconciler
}

var _ gateway.Source = (*Source)(nil)

// NewSource returns the Source for deps.
func NewSource(deps *Deps) *Source {
	return &Source{
		deps: deps,
		rules: []interface {
			desired(ctx context.Context, eips []*v1.IptablesEIP) ([]owned, error)
		}{
			&ruleReconciler[*v1.IptablesFIPRule]{Deps: deps, k: fipKind},
			&ruleReconciler[*v1.IptablesDnatRule]{Deps: deps, k: dnatKind},
			&ruleReconciler[*v1.IptablesSnatRule]{Deps: deps, k: snatKind},
		},
		eips: &eipReconciler{Deps: deps},
	}
}

// Desired returns what gateway gw should hold per the cache, oldest owner
// first: live EIPs on gw, live rules whose EIP is on gw, and the routes of
// the live VpcNatGateway gw.
func (s *Source) Desired(ctx context.Context, gw string) ([]nat.Object, error) {
	var all []owned
	eips := &v1.IptablesEIPList{}
	// Read-only: the cache's objects, not deep copies (nothing below
	// writes to an EIP; build copies one before it sets an address).
	if err := s.deps.Client.List(ctx, eips, client.MatchingFields{GatewayIndex: gw}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("list IptablesEIPs: %w", err)
	}
	onGW := make([]*v1.IptablesEIP, 0, len(eips.Items))
	for i := range eips.Items {
		e := &eips.Items[i]
		if e.DeletionTimestamp.IsZero() {
			onGW = append(onGW, e) // rules of an EIP being deleted are not desired
		}
		if !isLive(e) {
			continue
		}
		if s.deps.Alloc != nil && e.Status.IP == "" {
			// Not programmed since its address was reserved.
			continue
		}
		if o, f := s.eips.build(ctx, e, netip.Addr{}); f == nil {
			all = append(all, owned{obj: o, created: e.CreationTimestamp.Time})
		}
	}
	for _, r := range s.rules {
		objs, err := r.desired(ctx, onGW)
		if err != nil {
			return nil, fmt.Errorf("desired rules: %w", err)
		}
		all = append(all, objs...)
	}
	g := &v1.VpcNatGateway{}
	switch err := s.deps.Client.Get(ctx, types.NamespacedName{Name: gw}, g); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("get VpcNatGateway %s: %w", gw, err)
	case isLive(g):
		if cfg, ok := s.deps.Registry.Lookup(gw); ok {
			net, f := s.deps.gatewayNetwork(ctx, g, cfg)
			if f != nil && f.err != nil {
				// A failed read, not a missing Subnet: no sync without routes.
				return nil, fmt.Errorf("gateway %s network: %w", gw, f.err)
			}
			if f == nil {
				if routes, err := routeObjects(g, net); err == nil {
					for _, o := range routes {
						all = append(all, owned{obj: o, created: g.CreationTimestamp.Time})
					}
				}
			}
		}
	}
	sort.SliceStable(all, func(i, j int) bool {
		if !all[i].created.Equal(all[j].created) {
			return all[i].created.Before(all[j].created)
		}
		return all[i].obj.UID < all[j].obj.UID
	})
	out := make([]nat.Object, len(all))
	for i, o := range all {
		out[i] = o.obj
	}
	return out, nil
}

// ownerKinds maps gateway object kinds to the API kind that owns them.
var ownerKinds = map[nat.Kind]string{
	nat.KindEIP:   "IptablesEIP",
	nat.KindFIP:   "IptablesFIPRule",
	nat.KindDNAT:  "IptablesDnatRule",
	nat.KindSNAT:  "IptablesSnatRule",
	nat.KindRoute: "VpcNatGateway",
}

// Absent returns the UIDs among objs whose owner is confirmed gone: one
// live metadata-only list per owner kind, straight from the API server.
// Objects of unknown kinds are never reported absent.
func (s *Source) Absent(ctx context.Context, objs []nat.Object) ([]string, error) {
	live := map[string]map[string]bool{} // owner kind → UIDs
	var out []string
	for _, o := range objs {
		kind, ok := ownerKinds[o.Kind]
		if !ok {
			continue
		}
		uids, ok := live[kind]
		if !ok {
			list := &metav1.PartialObjectMetadataList{}
			list.SetGroupVersionKind(v1.GroupVersion.WithKind(kind + "List"))
			if err := s.deps.APIReader.List(ctx, list); err != nil {
				return nil, fmt.Errorf("live list of %s: %w", kind, err)
			}
			uids = map[string]bool{}
			for _, m := range list.Items {
				uids[string(m.UID)] = true
			}
			live[kind] = uids
		}
		owner := o.UID
		if o.Kind == nat.KindRoute {
			var isRoute bool
			if owner, isRoute = routeOwner(o.UID); !isRoute {
				continue
			}
		}
		if !uids[owner] {
			out = append(out, o.UID)
		}
	}
	return out, nil
}

// Dataplane returns the VpcNatGateway's annotated data plane ("" when the
// gateway object or the annotation is absent).
func (s *Source) Dataplane(ctx context.Context, gw string) (nat.DataplaneName, error) {
	g := &v1.VpcNatGateway{}
	if err := s.deps.Client.Get(ctx, types.NamespacedName{Name: gw}, g); err != nil {
		if apierrors.IsNotFound(err) {
			return "", nil
		}
		return "", err
	}
	return dataplaneOf(g)
}
