package reconciler

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
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

// ownerKind is the API kind that owns gateway objects of one kind.
type ownerKind struct {
	name    string
	newObj  func() client.Object
	newList func() client.ObjectList
}

// ownerKinds maps gateway object kinds to the API kind that owns them.
var ownerKinds = map[nat.Kind]ownerKind{
	nat.KindEIP:   {"IptablesEIP", func() client.Object { return &v1.IptablesEIP{} }, func() client.ObjectList { return &v1.IptablesEIPList{} }},
	nat.KindFIP:   {"IptablesFIPRule", func() client.Object { return &v1.IptablesFIPRule{} }, func() client.ObjectList { return &v1.IptablesFIPRuleList{} }},
	nat.KindDNAT:  {"IptablesDnatRule", func() client.Object { return &v1.IptablesDnatRule{} }, func() client.ObjectList { return &v1.IptablesDnatRuleList{} }},
	nat.KindSNAT:  {"IptablesSnatRule", func() client.Object { return &v1.IptablesSnatRule{} }, func() client.ObjectList { return &v1.IptablesSnatRuleList{} }},
	nat.KindRoute: {"VpcNatGateway", func() client.Object { return &v1.VpcNatGateway{} }, func() client.ObjectList { return &v1.VpcNatGatewayList{} }},
}

// countDeletes registers, on the informers of every owner kind Absent
// confirms, a handler that counts their deletes (a relist's vanished
// objects included), and returns the count (gateway.Options.Deletes).
// The informer drops an object from its cache before its handlers hear
// of the delete, so a count read before a read of the cache, and equal
// after it, means the read saw every delete counted so far.
func countDeletes(ctx context.Context, infs cache.Informers) (func() uint64, error) {
	n := &atomic.Uint64{}
	h := toolscache.ResourceEventHandlerFuncs{DeleteFunc: func(any) { n.Add(1) }}
	kinds := make([]nat.Kind, 0, len(ownerKinds))
	for k := range ownerKinds {
		kinds = append(kinds, k)
	}
	sort.Slice(kinds, func(i, j int) bool { return kinds[i] < kinds[j] })
	for _, k := range kinds {
		inf, err := infs.GetInformer(ctx, ownerKinds[k].newObj())
		if err != nil {
			return nil, fmt.Errorf("informer of %s: %w", ownerKinds[k].name, err)
		}
		if _, err := inf.AddEventHandler(h); err != nil {
			return nil, fmt.Errorf("delete counter on %s: %w", ownerKinds[k].name, err)
		}
	}
	return n.Load, nil
}

// absentPage is the page size of Absent's live metadata lists.
var absentPage int64 = 500

// Absent returns the UIDs among objs whose owner is confirmed gone.
// Objects of unknown kinds are never reported absent. The cache is read
// first: an owner it holds is not gone (or went a moment ago: the next
// sweep finds it), with no API request. Only the owners the cache lacks,
// which may be gone or may be new objects the cache has not seen yet, are
// confirmed by a live metadata-only list of their kind from the API
// server, page by page, stopping once every one of them was seen; those
// it does not list are gone (a UID never comes back).
func (s *Source) Absent(ctx context.Context, objs []nat.Object) ([]string, error) {
	owners := map[nat.Kind]map[string]bool{} // owner kind → owner UIDs not seen yet
	ownerOf := make([]string, len(objs))
	for i, o := range objs {
		if _, ok := ownerKinds[o.Kind]; !ok {
			continue
		}
		owner := o.UID
		if o.Kind == nat.KindRoute {
			var isRoute bool
			if owner, isRoute = routeOwner(o.UID); !isRoute {
				continue
			}
		}
		if owners[o.Kind] == nil {
			owners[o.Kind] = map[string]bool{}
		}
		owners[o.Kind][owner] = true
		ownerOf[i] = owner
	}
	for k, uids := range owners {
		if err := s.confirmAbsent(ctx, ownerKinds[k], uids); err != nil {
			return nil, err
		}
	}
	var out []string
	for i, o := range objs {
		if ownerOf[i] != "" && owners[o.Kind][ownerOf[i]] {
			out = append(out, o.UID)
		}
	}
	return out, nil
}

// confirmAbsent removes from uids the owners of kind k that exist: those
// in the cache, then those a live list shows.
func (s *Source) confirmAbsent(ctx context.Context, k ownerKind, uids map[string]bool) error {
	// Read-only: UIDs of the cache's own objects.
	if err := s.deps.eachCached(ctx, k.newObj(), k.newList(), func(o client.Object) {
		delete(uids, string(o.GetUID()))
	}); err != nil {
		return fmt.Errorf("cached %s: %w", k.name, err)
	}
	cont := ""
	for len(uids) > 0 {
		list := &metav1.PartialObjectMetadataList{}
		list.SetGroupVersionKind(v1.GroupVersion.WithKind(k.name + "List"))
		if err := s.deps.APIReader.List(ctx, list, client.Limit(absentPage), client.Continue(cont)); err != nil {
			return fmt.Errorf("live list of %s: %w", k.name, err)
		}
		for _, m := range list.Items {
			delete(uids, string(m.UID))
		}
		if cont = list.Continue; cont == "" {
			break
		}
	}
	return nil
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
