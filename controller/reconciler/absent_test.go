package reconciler

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/nat"
)

// countingReader counts the live lists per kind (and their pages).
type countingReader struct {
	client.Reader
	mu    sync.Mutex
	lists map[string]int
}

func (c *countingReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if m, ok := list.(*metav1.PartialObjectMetadataList); ok {
		c.mu.Lock()
		c.lists[m.GroupVersionKind().Kind]++
		c.mu.Unlock()
	}
	return c.Reader.List(ctx, list, opts...)
}

// TestAbsentLaggingCache: Absent reads the cache first and confirms only
// the owners the cache lacks with a live read. A cache that lags a
// creation (the owner exists, the cache has not seen it) must not make an
// existing object's gateway state an orphan; a cache that lags a deletion
// keeps it for the next sweep; only owners gone from the API server are
// reported, found on whatever page of the live list they would be on.
func TestAbsentLaggingCache(t *testing.T) {
	cfg := apiServer(t)
	ctx := t.Context()
	api, err := client.New(cfg, client.Options{Scheme: testScheme})
	if err != nil {
		t.Fatal(err)
	}
	defer func(p int64) { absentPage = p }(absentPage)
	absentPage = 2 // several pages: the candidates are on later ones

	const p = "absent-"
	var created []client.Object
	mk := func(o client.Object) client.Object {
		t.Helper()
		if err := api.Create(ctx, o); err != nil {
			t.Fatalf("create %T %s: %v", o, o.GetName(), err)
		}
		created = append(created, o)
		return o
	}
	t.Cleanup(func() {
		for _, o := range created {
			_ = api.Delete(context.Background(), o)
		}
	})
	fipObj := func(name string, n byte) *v1.IptablesFIPRule {
		return &v1.IptablesFIPRule{ObjectMeta: metav1.ObjectMeta{Name: p + name},
			Spec: v1.IptablesFIPRuleSpec{EIP: p + "eip", InternalIP: netip.AddrFrom4([4]byte{10, 7, 0, n}).String()}}
	}
	gwObj := mk(&v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: p + "gw"}, Spec: v1.VpcNatGatewaySpec{Vpc: "vpc1", Subnet: "net1"}})
	eip := mk(&v1.IptablesEIP{ObjectMeta: metav1.ObjectMeta{Name: p + "eip"}, Spec: v1.IptablesEIPSpec{V4ip: "192.0.2.70", NatGwDp: p + "gw"}})
	// Filler FIPs the cache and the API both hold (pages before the rest).
	var cachedFIPs []client.Object
	for i := range 5 {
		cachedFIPs = append(cachedFIPs, mk(fipObj(fmt.Sprintf("a%d", i), byte(10+i))))
	}
	inBoth := mk(fipObj("both", 1))
	apiOnly := mk(fipObj("z-new", 2)) // created after the cache's view: last in the list
	cacheOnly := mk(fipObj("deleted", 3))
	gone := mk(fipObj("gone", 4))
	for _, o := range []client.Object{cacheOnly, gone} {
		if err := api.Delete(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	// The cache's view: what it had seen before apiOnly was created and
	// before cacheOnly was deleted.
	view := append([]client.Object{gwObj, eip, inBoth, cacheOnly}, cachedFIPs...)
	for i, o := range view {
		view[i] = o.DeepCopyObject().(client.Object)
		view[i].SetResourceVersion("")
	}
	cached := fake.NewClientBuilder().WithScheme(testScheme).WithObjects(view...).Build()

	obj := func(uid string, k nat.Kind) nat.Object { return nat.Object{UID: uid, Kind: k} }
	routeOf := func(owner string) string { return routeUID(owner, netip.MustParsePrefix("0.0.0.0/0")) }
	cases := []struct {
		name      string
		cache     client.Client
		objs      []nat.Object
		want      []string
		wantLists map[string]int // live metadata lists (pages) per list kind
	}{
		{
			name:  "accurate cache: no API request",
			cache: cached,
			objs:  []nat.Object{obj(string(eip.GetUID()), nat.KindEIP), obj(string(inBoth.GetUID()), nat.KindFIP), obj(routeOf(string(gwObj.GetUID())), nat.KindRoute)},
			want:  nil, wantLists: map[string]int{},
		},
		{
			name:  "cache lags a creation: the object exists, not an orphan",
			cache: cached,
			objs:  []nat.Object{obj(string(apiOnly.GetUID()), nat.KindFIP), obj(string(inBoth.GetUID()), nat.KindFIP)},
			want:  nil, wantLists: map[string]int{"IptablesFIPRuleList": 4}, // 7 FIPs at 2 a page: found on the last
		},
		{
			name:  "cache lags a deletion: kept until the cache sees it",
			cache: cached,
			objs:  []nat.Object{obj(string(cacheOnly.GetUID()), nat.KindFIP)},
			want:  nil, wantLists: map[string]int{},
		},
		{
			name:  "gone from the API server: reported, objs' order",
			cache: cached,
			objs: []nat.Object{
				obj(string(gone.GetUID()), nat.KindFIP), obj(string(inBoth.GetUID()), nat.KindFIP),
				obj(routeOf("no-such-gateway"), nat.KindRoute), obj(routeOf(string(gwObj.GetUID())), nat.KindRoute),
				obj("no-such-dnat", nat.KindDNAT), obj("not-a-route", nat.KindRoute), obj("x", nat.Kind("unknown")),
				obj(string(apiOnly.GetUID()), nat.KindFIP),
			},
			want:      []string{string(gone.GetUID()), routeOf("no-such-gateway"), "no-such-dnat"},
			wantLists: map[string]int{"IptablesFIPRuleList": 4, "VpcNatGatewayList": 1, "IptablesDnatRuleList": 1},
		},
		{
			name:  "empty cache (not synced yet): every candidate confirmed live",
			cache: fake.NewClientBuilder().WithScheme(testScheme).Build(),
			objs:  []nat.Object{obj(string(eip.GetUID()), nat.KindEIP), obj(string(inBoth.GetUID()), nat.KindFIP), obj(string(gone.GetUID()), nat.KindFIP)},
			want:  []string{string(gone.GetUID())}, wantLists: map[string]int{"IptablesEIPList": 1, "IptablesFIPRuleList": 4},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			live := &countingReader{Reader: api, lists: map[string]int{}}
			src := NewSource(&Deps{Client: tc.cache, APIReader: live, Log: testLog(t)})
			got, err := src.Absent(ctx, tc.objs)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("absent %v, want %v", got, tc.want)
			}
			// Other tests' objects of these kinds may share the API
			// server: count pages only when it holds just this test's.
			for kind, n := range tc.wantLists {
				if live.lists[kind] < 1 || (onlyOurs(ctx, t, api, kind, p) && live.lists[kind] != n) {
					t.Errorf("live %s pages %d, want %d", kind, live.lists[kind], n)
				}
			}
			for kind, n := range live.lists {
				if _, ok := tc.wantLists[kind]; !ok {
					t.Errorf("live %s listed %d times; the cache answered for it", kind, n)
				}
			}
		})
	}
}

// onlyOurs reports whether every object of list kind kind is named with
// prefix p.
func onlyOurs(ctx context.Context, t *testing.T, api client.Client, kind, p string) bool {
	t.Helper()
	l := &metav1.PartialObjectMetadataList{}
	l.SetGroupVersionKind(v1.GroupVersion.WithKind(kind))
	if err := api.List(ctx, l); err != nil {
		t.Fatal(err)
	}
	for _, m := range l.Items {
		if len(m.Name) < len(p) || m.Name[:len(p)] != p {
			return false
		}
	}
	return true
}
