package companion

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/natgw/natgw/agentapi"
	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/internal/testlog"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/natfake"
)

// memTransport reaches one in-memory data plane per gateway (natfake: the
// engine's own validation over a map). The proof with a real gateway and
// Kube-OVN's controller is e2e/kubeovn's TestCompanion.
type memTransport struct {
	mu  sync.Mutex
	dps map[string]*natfake.Dataplane
	// beforeDelete runs before each Delete (a CR created in the window).
	beforeDelete func()
}

func (m *memTransport) dp(t *testing.T, gw string) *natfake.Dataplane {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dps == nil {
		m.dps = map[string]*natfake.Dataplane{}
	}
	if d, ok := m.dps[gw]; ok {
		return d
	}
	d, err := natfake.New("fake")
	if err != nil {
		t.Fatal(err)
	}
	m.dps[gw] = d
	return d
}

func (m *memTransport) Open(_ context.Context, gw transport.Endpoint) (transport.Session, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return &memSession{dp: m.dps[gw.Name], m: m, done: make(chan struct{})}, nil
}

type memSession struct {
	dp   *natfake.Dataplane
	m    *memTransport
	done chan struct{}
}

func (s *memSession) Apply(ctx context.Context, objs ...nat.Object) error {
	return s.dp.Apply(ctx, objs...)
}
func (s *memSession) Delete(ctx context.Context, uids ...string) error {
	if s.m.beforeDelete != nil {
		s.m.beforeDelete()
	}
	return s.dp.Delete(ctx, uids...)
}
func (s *memSession) List(ctx context.Context, _ bool) ([]nat.Object, error) { return s.dp.List(ctx) }
func (s *memSession) Sync(ctx context.Context, d []nat.Object) error         { return s.dp.Sync(ctx, d) }
func (s *memSession) Info(context.Context) (*agentapi.Info, error)           { return &agentapi.Info{}, nil }
func (s *memSession) Done() <-chan struct{}                                  { return s.done }
func (s *memSession) Err() error                                             { return nil }
func (s *memSession) Close() error                                           { return nil }

type harness struct {
	t     *testing.T
	ctx   context.Context
	tr    *memTransport
	cache client.Client // the sweep's view
	live  client.Client // the API server's
	rec   *events.FakeRecorder
	now   time.Time
	s     *Sweeper
}

const grace = 30 * time.Second

func newHarness(t *testing.T, gateways ...string) *harness {
	scheme := runtime.NewScheme()
	if err := v1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, ctx: context.Background(), tr: &memTransport{}, rec: events.NewFakeRecorder(100), now: time.Unix(1_000_000, 0)}
	var gws []client.Object
	for _, g := range gateways {
		gws = append(gws, &v1.VpcNatGateway{ObjectMeta: meta(g, nil)})
		h.tr.dp(t, g)
	}
	h.cache = fake.NewClientBuilder().WithScheme(scheme).WithObjects(gws...).Build()
	h.live = fake.NewClientBuilder().WithScheme(scheme).WithObjects(gws...).Build()
	h.s = New(h.cache, h.live, Options{Transport: h.tr, Grace: grace, Recorder: h.rec, Log: testlog.New(t, 0), Now: func() time.Time { return h.now }})
	return h
}

// create puts objs in both the cache and the API server.
func (h *harness) create(objs ...client.Object) {
	h.t.Helper()
	for _, o := range objs {
		for _, c := range []client.Client{h.cache, h.live} {
			if err := c.Create(h.ctx, o.DeepCopyObject().(client.Object)); err != nil {
				h.t.Fatal(err)
			}
		}
	}
}

func (h *harness) program(gw string, objs ...nat.Object) {
	h.t.Helper()
	if err := h.tr.dp(h.t, gw).Apply(h.ctx, objs...); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) has(gw, uid string) bool {
	h.t.Helper()
	objs, err := h.tr.dp(h.t, gw).List(h.ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, o := range objs {
		if o.UID == uid {
			return true
		}
	}
	return false
}

func (h *harness) sweep(after time.Duration) Result {
	h.t.Helper()
	h.now = h.now.Add(after)
	r, err := h.s.Sweep(h.ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

// newSuspectingHarness is gateway gw1 holding EIP eipA, which CR e claims,
// and a FIP on it that no CR claims, after the sweep that first suspects
// the FIP.
func newSuspectingHarness(t *testing.T) *harness {
	h := newHarness(t, "gw1")
	e := eipCR("e", eipA.String(), "", "gw1")
	h.create(&e)
	h.program("gw1", eipObj(eipA), fipObj(eipA, inA))
	if r := h.sweep(0); r.Suspected != 1 || len(r.Removed) != 0 {
		t.Fatalf("first sweep: %+v, want the FIP suspected, nothing removed", r)
	}
	return h
}

// TestOrphanRemovedAfterGrace: an unclaimed compat FIP is suspected at the
// first sweep, kept at a second sweep inside the grace, removed at the first
// sweep at least the grace after the first sighting, with metrics and an
// event; the claimed EIP, a route and a Kubernetes-UID object stay.
func TestOrphanRemovedAfterGrace(t *testing.T) {
	h := newHarness(t, "gw1")
	e := eipCR("e", eipA.String(), "", "gw1")
	h.create(&e)
	k8sFIP := fipObj(eipB, inB)
	k8sFIP.UID = "7c1a4d7e-1d8a-4b7e-9d0e-2a0f3b1c9e55"
	h.program("gw1", eipObj(eipA), fipObj(eipA, inA), eipObj(eipB), k8sFIP)
	before := value(Removed.WithLabelValues("fip"))

	if r := h.sweep(0); r.Suspected != 2 || len(r.Removed) != 0 { // the FIP, and eipB (no CR)
		t.Fatalf("first sweep: %+v, want 2 suspected, none removed", r)
	}
	if got := value(Suspected.WithLabelValues("gw1")); got != 2 {
		t.Errorf("suspected gauge %v, want 2", got)
	}
	if r := h.sweep(grace - time.Second); len(r.Removed) != 0 {
		t.Fatalf("inside the grace: removed %v", r.Removed)
	}
	r := h.sweep(time.Second)
	if len(r.Removed) != 2 || !h.has("gw1", eipObj(eipA).UID) || h.has("gw1", fipObj(eipA, inA).UID) || h.has("gw1", eipObj(eipB).UID) {
		t.Fatalf("after the grace: %+v", r)
	}
	if !h.has("gw1", k8sFIP.UID) {
		t.Error("the object with a Kubernetes UID was removed")
	}
	if got := value(Removed.WithLabelValues("fip")) - before; got != 1 {
		t.Errorf("removed counter for fip grew by %v, want 1", got)
	}
	var evs []string
	for len(h.rec.Events) > 0 {
		evs = append(evs, <-h.rec.Events)
	}
	if len(evs) != 2 || !strings.Contains(strings.Join(evs, "\n"), "LeakedObjectRemoved") {
		t.Errorf("events %q, want 2 LeakedObjectRemoved", evs)
	}
	if r := h.sweep(grace); r.Suspected != 0 || len(r.Removed) != 0 {
		t.Errorf("after the removal: %+v", r)
	}
}

// TestClaimedNeverRemoved: objects every CR kind claims stay however long
// they are watched.
func TestClaimedNeverRemoved(t *testing.T) {
	h := newHarness(t, "gw1")
	e := eipCR("e", eipA.String(), "", "gw1")
	e2 := eipCR("e2", "", eipB.String(), "gw1")
	f := fipCR("f", "e", inA.String())
	d := dnatCR("d", "e2", "80", "tcp", inB.String(), "8080")
	s := snatCR("s", "e2", "10.0.0.0/24")
	h.create(&e, &e2, &f, &d, &s)
	h.program("gw1", eipObj(eipA), eipObj(eipB), fipObj(eipA, inA), dnatObj(eipB, nat.TCP, 80, inB, 8080), snatObj(eipB, "10.0.0.0/24"))
	for i := 0; i < 4; i++ {
		if r := h.sweep(grace); r.Suspected != 0 || len(r.Removed) != 0 {
			t.Fatalf("sweep %d: %+v", i, r)
		}
	}
}

// TestCacheLagsLiveListKeeps: the cache has no CR (it lags), the API
// server has one: the live list before the removal keeps the object.
func TestCacheLagsLiveListKeeps(t *testing.T) {
	h := newHarness(t, "gw1")
	h.program("gw1", eipObj(eipA), fipObj(eipA, inA))
	h.sweep(0)
	e := eipCR("e", eipA.String(), "", "gw1")
	f := fipCR("f", "e", inA.String())
	for _, o := range []client.Object{&e, &f} {
		if err := h.live.Create(h.ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	if r := h.sweep(grace); len(r.Removed) != 0 || !h.has("gw1", fipObj(eipA, inA).UID) {
		t.Fatalf("removed %v although the API server has its CR", r.Removed)
	}
}

// TestCRCreatedDuringRemovalRestored: a CR claiming the object appears
// between the confirming live list and the removal: the object is put back.
func TestCRCreatedDuringRemovalRestored(t *testing.T) {
	h := newSuspectingHarness(t)
	h.tr.beforeDelete = func() {
		f := fipCR("f", "e", inA.String())
		if err := h.live.Create(h.ctx, &f); err != nil {
			t.Error(err)
		}
	}
	before := value(Restored.WithLabelValues("fip"))
	r := h.sweep(grace)
	if len(r.Restored) != 1 || len(r.Removed) != 0 || !h.has("gw1", fipObj(eipA, inA).UID) {
		t.Fatalf("%+v; FIP on the gateway: %v", r, h.has("gw1", fipObj(eipA, inA).UID))
	}
	if got := value(Restored.WithLabelValues("fip")) - before; got != 1 {
		t.Errorf("restored counter grew by %v, want 1", got)
	}
}

// TestChangedRestartsGrace: an object whose content changed between sweeps
// (the compat path replaced it) starts its grace over.
func TestChangedRestartsGrace(t *testing.T) {
	h := newSuspectingHarness(t)
	h.program("gw1", fipObj(eipA, inB))
	if r := h.sweep(grace); len(r.Removed) != 0 {
		t.Fatalf("changed object removed at once: %v", r.Removed)
	}
	if r := h.sweep(grace); len(r.Removed) != 1 {
		t.Fatalf("after its own grace: %+v", r)
	}
}

// TestUnresolvedBlocks: an EIP CR without an address yet may be the one
// an unclaimed EIP object belongs to (Kube-OVN programs before it writes
// status): no EIP is removed while it is unresolved.
func TestUnresolvedBlocks(t *testing.T) {
	h := newHarness(t, "gw1")
	pending := eipCR("pending", "", "", "gw1")
	h.create(&pending)
	h.program("gw1", eipObj(eipA))
	for i := 0; i < 3; i++ {
		if r := h.sweep(grace); len(r.Removed) != 0 {
			t.Fatalf("removed %v while an EIP CR has no address", r.Removed)
		}
	}
	if got := value(Unresolved.WithLabelValues("eip")); got != 1 {
		t.Errorf("unresolved gauge for eip %v, want 1", got)
	}
	// Resolved to another address: the object is unclaimed, removed after
	// a grace of its own.
	var cur v1.IptablesEIP
	for _, c := range []client.Client{h.cache, h.live} {
		if err := c.Get(h.ctx, client.ObjectKey{Name: "pending"}, &cur); err != nil {
			t.Fatal(err)
		}
		cur.Status.IP = eipB.String()
		if err := c.Update(h.ctx, &cur); err != nil {
			t.Fatal(err)
		}
	}
	if r := h.sweep(0); len(r.Removed) != 0 {
		t.Fatalf("removed at the first unblocked sweep: %v", r.Removed)
	}
	if r := h.sweep(grace); len(r.Removed) != 1 {
		t.Fatalf("after the grace: %+v", r)
	}
}

// TestGatewayScoped: a CR on gw1 does not keep the same UID leaked on gw2;
// a CR whose gateway is unknown keeps it everywhere.
func TestGatewayScoped(t *testing.T) {
	h := newHarness(t, "gw1", "gw2")
	e := eipCR("e", eipA.String(), "", "gw1")
	h.create(&e)
	h.program("gw1", eipObj(eipA))
	h.program("gw2", eipObj(eipA))
	h.sweep(0)
	h.sweep(grace)
	if !h.has("gw1", eipObj(eipA).UID) || h.has("gw2", eipObj(eipA).UID) {
		t.Fatalf("gw1 has it: %v (want true), gw2: %v (want false)", h.has("gw1", eipObj(eipA).UID), h.has("gw2", eipObj(eipA).UID))
	}
}

// value reads a counter or gauge.
func value(m prometheus.Metric) float64 {
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		return -1
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// TestSNATQueuedBehindKept: a leaked SNAT of a CIDR that a live SNAT CR
// (another EIP) also names stays: the compat layer queues the CR's SNAT
// behind it, and only its own snat-del would promote it.
func TestSNATQueuedBehindKept(t *testing.T) {
	h := newHarness(t, "gw1")
	e := eipCR("e", eipA.String(), "", "gw1")
	e2 := eipCR("e2", eipB.String(), "", "gw1")
	s := snatCR("s", "e2", "10.0.0.0/24")
	h.create(&e, &e2, &s)
	h.program("gw1", eipObj(eipA), eipObj(eipB), snatObj(eipA, "10.0.0.0/24"))
	for i := 0; i < 3; i++ {
		if r := h.sweep(grace); len(r.Removed) != 0 {
			t.Fatalf("removed %v: the live CR's SNAT is queued behind it", r.Removed)
		}
	}
	// Without the CR of the same CIDR it is an orphan like any other.
	for _, c := range []client.Client{h.cache, h.live} {
		if err := c.Delete(h.ctx, &v1.IptablesSnatRule{ObjectMeta: meta("s", nil)}); err != nil {
			t.Fatal(err)
		}
	}
	h.sweep(0)
	if r := h.sweep(grace); len(r.Removed) != 1 {
		t.Fatalf("%+v", r)
	}
}

// TestStillDue: both confirmations of a removal (the live list, then the
// gateway read again) keep, in order, the objects still due, and take
// every other one out of its gateway's suspects only.
func TestStillDue(t *testing.T) {
	h := newHarness(t, "gw1", "gw2")
	due := []nat.Object{eipObj(eipA), fipObj(eipA, inA), snatObj(eipA, "10.0.0.0/24")}
	for _, gw := range []string{"gw1", "gw2"} {
		h.s.suspects[gw] = map[string]suspect{}
		for _, o := range due {
			h.s.suspects[gw][o.UID] = suspect{obj: o, first: h.now}
		}
	}
	dropped := due[1].UID
	got := h.s.stillDue("gw1", due, func(o nat.Object) bool { return o.UID != dropped })
	if len(got) != 2 || got[0].UID != due[0].UID || got[1].UID != due[2].UID {
		t.Fatalf("stillDue = %v, want %s and %s", got, due[0].UID, due[2].UID)
	}
	for gw, want := range map[string]int{"gw1": 2, "gw2": 3} {
		if n := len(h.s.suspects[gw]); n != want {
			t.Errorf("%s: %d suspects, want %d", gw, n, want)
		}
	}
	if _, ok := h.s.suspects["gw1"][dropped]; ok {
		t.Errorf("gw1: %s still suspected", dropped)
	}
	if got := h.s.stillDue("gw1", due, func(nat.Object) bool { return false }); len(got) != 0 || len(h.s.suspects["gw1"]) != 0 {
		t.Errorf("none still due: got %v, %d suspects left", got, len(h.s.suspects["gw1"]))
	}
}
