package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/internal/testlog"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

// The manager's logic (what it syncs, deletes and keeps) is tested here
// against an in-memory agent; the real agent, kernel and API server are in
// controller/reconciler's tests and the e2e suite.

func fip(uid string, n byte) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindFIP, FIP: &nat.FIP{
		EIP: netip.AddrFrom4([4]byte{192, 0, 2, n}), InternalIP: netip.AddrFrom4([4]byte{10, 0, 0, n})}}
}

// agent is the kernel state of one data plane in one gateway: it survives
// sessions (like the kernel survives `natgw serve`), and loses everything
// with a new boot id when lost is called.
type agent struct {
	mu     sync.Mutex
	objs   map[string]nat.Object
	boot   string
	boots  int
	calls  []string
	failOp string // an op that fails while set
	// qos is the gateway-wide QoS held, qosCalls the gwqos requests (kept
	// apart from calls: the NAT tests count those exactly), qosWrites
	// those that changed what was held (the agent writes only then).
	qos       []gwqos.Rule
	qosCalls  int
	qosWrites int
}

func newAgent() *agent {
	a := &agent{objs: map[string]nat.Object{}}
	a.lost()
	return a
}

func (a *agent) lost() {
	a.boots++
	a.boot = fmt.Sprintf("boot-%d", a.boots)
	clear(a.objs)
	a.qos = nil
}

// qosState returns the gateway-wide QoS held and how many gwqos requests
// came.
func (a *agent) qosState() ([]gwqos.Rule, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.qos), a.qosCalls
}

// qosWritten returns how many gwqos requests changed what was held.
func (a *agent) qosWritten() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.qosWrites
}

func (a *agent) record(op string, detail ...string) error {
	a.calls = append(a.calls, strings.TrimSpace(op+" "+strings.Join(detail, ",")))
	if a.failOp == op {
		return fmt.Errorf("%s refused by the test", op)
	}
	return nil
}

func (a *agent) list() []nat.Object {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []nat.Object
	for _, o := range a.objs {
		out = append(out, o)
	}
	nat.SortObjects(out)
	return out
}

func (a *agent) uids() []string { return nat.UIDs(a.list()) }

func (a *agent) put(objs ...nat.Object) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, o := range objs {
		a.objs[o.UID] = o
	}
}

func (a *agent) callLog() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

// session is one open connection to an agent.
type session struct {
	a    *agent
	done chan struct{}
	once sync.Once
}

func (s *session) Apply(_ context.Context, objs ...nat.Object) error {
	s.a.mu.Lock()
	defer s.a.mu.Unlock()
	if err := s.a.record("apply", nat.UIDs(objs)...); err != nil {
		return err
	}
	for _, o := range objs {
		s.a.objs[o.UID] = o
	}
	return nil
}

func (s *session) Delete(_ context.Context, uids ...string) error {
	s.a.mu.Lock()
	defer s.a.mu.Unlock()
	if err := s.a.record("delete", uids...); err != nil {
		return err
	}
	for _, u := range uids {
		delete(s.a.objs, u)
	}
	return nil
}

func (s *session) List(context.Context, bool) ([]nat.Object, error) { return s.a.list(), nil }

func (s *session) Sync(_ context.Context, desired []nat.Object) error {
	s.a.mu.Lock()
	defer s.a.mu.Unlock()
	if err := s.a.record("sync", nat.UIDs(desired)...); err != nil {
		return err
	}
	clear(s.a.objs)
	for _, o := range desired {
		s.a.objs[o.UID] = o
	}
	return nil
}

func (s *session) SetGatewayQoS(_ context.Context, rules []gwqos.Rule) (bool, error) {
	s.a.mu.Lock()
	defer s.a.mu.Unlock()
	s.a.qosCalls++
	if s.a.failOp == "gwqos" {
		return false, errors.New("gwqos refused by the test")
	}
	if slices.Equal(s.a.qos, rules) {
		return false, nil
	}
	s.a.qos = slices.Clone(rules)
	s.a.qosWrites++
	return true, nil
}

func (s *session) Info(context.Context) (*agentapi.Info, error) {
	s.a.mu.Lock()
	defer s.a.mu.Unlock()
	return &agentapi.Info{Version: "test", BootID: s.a.boot}, nil
}

func (s *session) Done() <-chan struct{} { return s.done }
func (s *session) Err() error            { return nil }
func (s *session) Close() error {
	s.once.Do(func() { close(s.done) })
	return nil
}

// fakeTransport opens sessions to one agent per data plane.
type fakeTransport struct {
	mu          sync.Mutex
	agents      map[nat.DataplaneName]*agent
	open        []*session
	refuse      bool
	unreachable map[nat.DataplaneName]bool // data planes whose agent cannot start
	opens       int                        // Open calls
	// onRefused, when set, runs (with mu held) after an Open is refused.
	onRefused func()
}

func (t *fakeTransport) Open(_ context.Context, gw transport.Endpoint) (transport.Session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.opens++
	if t.refuse {
		if t.onRefused != nil {
			t.onRefused()
		}
		return nil, errors.New("agent unreachable (test)")
	}
	a, ok := t.agents[gw.Dataplane]
	if !ok || t.unreachable[gw.Dataplane] {
		return nil, fmt.Errorf("no agent for data plane %q", gw.Dataplane)
	}
	// natgw serve empties every other data plane's state when it
	// starts (nat/planes).
	for dp, other := range t.agents {
		if dp != gw.Dataplane {
			other.mu.Lock()
			clear(other.objs)
			other.mu.Unlock()
		}
	}
	s := &session{a: a, done: make(chan struct{})}
	t.open = append(t.open, s)
	return s, nil
}

// breakSessions ends every open session, as a dead agent process does.
func (t *fakeTransport) breakSessions() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range t.open {
		s.Close()
	}
	t.open = nil
}

// source is the API as the manager sees it.
type source struct {
	mu        sync.Mutex
	desired   []nat.Object
	absent    map[string]bool
	dataplane nat.DataplaneName
	qos       []gwqos.Rule
	qosErr    error
	// desiredCalls and dataplaneCalls count Desired and Dataplane reads.
	desiredCalls, dataplaneCalls int
	// afterDesired, when set, runs (under mu) after each Desired read
	// took its copy: a change made there happens during that converge.
	afterDesired func(s *source)
}

func (s *source) GatewayQoS(context.Context, string) ([]gwqos.Rule, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.qos), s.qosErr
}

func (s *source) setQoS(rules []gwqos.Rule) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.qos = rules
}

func (s *source) Desired(context.Context, string) ([]nat.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.desiredCalls++
	out := slices.Clone(s.desired)
	if s.afterDesired != nil {
		s.afterDesired(s)
	}
	return out, nil
}

func (s *source) Absent(_ context.Context, objs []nat.Object) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, o := range objs {
		if s.absent[o.UID] {
			out = append(out, o.UID)
		}
	}
	return out, nil
}

func (s *source) Dataplane(context.Context, string) (nat.DataplaneName, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dataplaneCalls++
	return s.dataplane, nil
}

type fixture struct {
	tr  *fakeTransport
	src *source
	nft *agent
	ipt *agent
	reg *Registry
	gw  *Manager
}

// start runs a Registry with one gateway "gw1" until the test ends. Periods
// of 0 leave the periodic checks off.
func start(t *testing.T, src *source, nft *agent, drift time.Duration) *fixture {
	t.Helper()
	return startWith(t, src, nft, newAgent(), nil, drift)
}

// startWith is start with a given iptables agent, data planes whose
// agents cannot be reached, and changes to the Options.
func startWith(t *testing.T, src *source, nft, ipt *agent, unreachable map[nat.DataplaneName]bool, drift time.Duration, mods ...func(*Options)) *fixture {
	t.Helper()
	f := &fixture{src: src, nft: nft, ipt: ipt}
	f.tr = &fakeTransport{agents: map[nat.DataplaneName]*agent{nat.DataplaneNftables: nft, nat.DataplaneIptables: f.ipt}, unreachable: unreachable}
	opts := Options{
		Transport: f.tr, Source: src, DefaultDataplane: nat.DataplaneNftables,
		Config:      &gwconfig.Config{Gateways: []gwconfig.Entry{{Name: "gw1"}}},
		DriftPeriod: drift, SweepPeriod: drift, ConnectWait: time.Second,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		Log: testlog.New(t, 0),
	}
	for _, m := range mods {
		m(&opts)
	}
	f.reg = NewRegistry(opts)
	var err error
	if f.gw, err = f.reg.Get("gw1"); err != nil {
		t.Fatal(err)
	}
	runRegistry(t, f.reg)
	return f
}

// runRegistry runs reg until the test ends.
func runRegistry(t *testing.T, reg *Registry) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = reg.Start(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Error("Registry did not stop within 10s")
		}
	})
}

// eventually polls cond for up to 5 s.
// applyConnected waits for the gateway's first session and applies objs.
func (f *fixture) applyConnected(t *testing.T, objs ...nat.Object) {
	t.Helper()
	eventually(t, "connected", func() error {
		if f.gw.Dataplane() == "" {
			return errors.New("no session")
		}
		return nil
	})
	if err := f.gw.Apply(context.Background(), objs...); err != nil {
		t.Fatal(err)
	}
}

func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func holds(a *agent, want ...string) func() error {
	return func() error {
		if got := a.uids(); !slices.Equal(got, want) {
			return fmt.Errorf("agent holds %v, want %v", got, want)
		}
		return nil
	}
}

// TestConnectWithNewBootID: the first connect (a boot id this process has
// not seen) syncs the desired set; leftovers whose objects are confirmed
// gone go, leftovers not confirmed gone stay (the cache may lag).
func TestConnectWithNewBootID(t *testing.T) {
	nft := newAgent()
	nft.put(fip("a", 1), fip("orphan", 9), fip("unconfirmed", 8))
	src := &source{desired: []nat.Object{fip("a", 1), fip("b", 2)}, absent: map[string]bool{"orphan": true}}
	f := start(t, src, nft, 0)
	eventually(t, "desired set synced", holds(nft, "a", "b", "unconfirmed"))
	if got := nft.callLog(); len(got) != 1 || !strings.HasPrefix(got[0], "sync ") {
		t.Errorf("calls %v, want exactly one sync", got)
	}
	if dp := f.gw.Dataplane(); dp != nat.DataplaneNftables {
		t.Errorf("Dataplane() = %q", dp)
	}
}

// TestReconnectSameBootID: an agent that restarts on an intact kernel (same
// boot id) gets no sync; a leftover confirmed gone is deleted by UID.
func TestReconnectSameBootID(t *testing.T) {
	nft := newAgent()
	src := &source{desired: []nat.Object{fip("a", 1)}, absent: map[string]bool{"orphan": true}}
	f := start(t, src, nft, 0)
	eventually(t, "first sync", holds(nft, "a"))
	before := len(nft.callLog())
	nft.put(fip("orphan", 9)) // left by a delete the agent never confirmed
	f.tr.breakSessions()
	eventually(t, "orphan swept on reconnect", holds(nft, "a"))
	if got := nft.callLog()[before:]; !slices.Equal(got, []string{"delete orphan"}) {
		t.Errorf("calls after the reconnect %v, want [delete orphan]", got)
	}
}

// TestLostKernelState: a new boot id after a reconnect (pod restarted,
// table lost) is answered with one sync of everything this process
// programmed and the API wants.
func TestLostKernelState(t *testing.T) {
	nft := newAgent()
	src := &source{desired: []nat.Object{fip("a", 1)}}
	f := start(t, src, nft, 0)
	eventually(t, "first sync", holds(nft, "a"))
	if err := f.gw.Apply(context.Background(), fip("b", 2)); err != nil {
		t.Fatal(err)
	}
	nft.mu.Lock()
	nft.lost()
	nft.mu.Unlock()
	f.tr.breakSessions()
	eventually(t, "resynced after the lost state", holds(nft, "a", "b"))
}

// TestDriftRepaired: an object removed behind the manager's back comes
// back within a drift period; an object the API does not know yet (its
// reconcile pending) is not synced by the drift check.
func TestDriftRepaired(t *testing.T) {
	nft := newAgent()
	src := &source{desired: []nat.Object{fip("a", 1), fip("b", 2)}}
	f := start(t, src, nft, 20*time.Millisecond)
	eventually(t, "first sync", holds(nft, "a", "b"))
	nft.mu.Lock()
	delete(nft.objs, "b")
	nft.mu.Unlock()
	eventually(t, "drift repaired", holds(nft, "a", "b"))

	src.mu.Lock()
	src.desired = append(src.desired, fip("pending", 3))
	src.mu.Unlock()
	time.Sleep(100 * time.Millisecond) // several drift periods
	if got := nft.uids(); slices.Contains(got, "pending") {
		t.Errorf("the drift check programmed an object whose reconcile is pending: %v", got)
	}
	if err := f.gw.Apply(context.Background(), fip("pending", 3)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "applied", holds(nft, "a", "b", "pending"))
}

// calls returns the Source's Desired and Dataplane read counts.
func (s *source) calls() (desired, dataplane int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.desiredCalls, s.dataplaneCalls
}

// TestKickChecksOnlyTheDataplane: a kick (every reconcile of the
// gateway's VpcNatGateway sends one) reads the wanted data plane and
// nothing else: no desired set, no fresh list, so drift made behind the
// controller's back stays until a periodic check (off here); the drift
// check that follows repairs it. A kick still switches the data plane
// when the wanted one changed (TestSwitchDataplane).
func TestKickChecksOnlyTheDataplane(t *testing.T) {
	nft := newAgent()
	src := &source{desired: []nat.Object{fip("a", 1), fip("b", 2)}}
	f := startWith(t, src, nft, newAgent(), nil, 0, func(o *Options) { o.Resweep = time.Hour })
	eventually(t, "first sync", holds(nft, "a", "b"))
	nft.mu.Lock()
	delete(nft.objs, "b")
	nft.mu.Unlock()
	desired0, dp0 := src.calls()
	for i := 0; i < 20; i++ {
		f.reg.Kick("gw1")
		// Each kick is taken before the next is sent, so none coalesce.
		eventually(t, "kick taken", func() error {
			if _, dp := src.calls(); dp < dp0+i+1 {
				return fmt.Errorf("%d data plane reads after %d kicks", dp-dp0, i+1)
			}
			return nil
		})
	}
	if desired, _ := src.calls(); desired != desired0 {
		t.Errorf("20 kicks computed the desired set %d times, want 0", desired-desired0)
	}
	if err := holds(nft, "a")(); err != nil {
		t.Errorf("a kick ran a drift check: %v", err)
	}
	f.gw.checkNow()
	eventually(t, "drift repaired by the drift check", holds(nft, "a", "b"))
}

// TestDriftRepairedUnderKicks: with kicks arriving all the time (a
// VpcNatGateway reconciled over and over), drift made behind the
// controller's back is still repaired by the next periodic drift check,
// counted as a drift resync.
func TestDriftRepairedUnderKicks(t *testing.T) {
	nft := newAgent()
	src := &source{desired: []nat.Object{fip("a", 1), fip("b", 2)}}
	const period = 200 * time.Millisecond
	f := startWith(t, src, nft, newAgent(), nil, period, func(o *Options) { o.SweepPeriod, o.Resweep = 0, time.Hour })
	eventually(t, "first sync", holds(nft, "a", "b"))
	stop := make(chan struct{})
	kicked := make(chan struct{})
	go func() {
		defer close(kicked)
		for {
			select {
			case <-stop:
				return
			default:
				f.reg.Kick("gw1")
				time.Sleep(time.Millisecond)
			}
		}
	}()
	defer func() { close(stop); <-kicked }()
	drifts := metrics.CounterValue(metrics.Resyncs.WithLabelValues("gw1", "drift"))
	nft.mu.Lock()
	delete(nft.objs, "b")
	nft.mu.Unlock()
	eventually(t, "drift repaired", holds(nft, "a", "b"))
	if n := metrics.CounterValue(metrics.Resyncs.WithLabelValues("gw1", "drift")) - drifts; n < 1 {
		t.Errorf("drift resyncs grew by %v, want ≥1", n)
	}
}

// TestDeleteForgets: a confirmed delete leaves the desired set of the
// process, so a later resync does not bring the object back while the
// (lagging) API still lists it without a confirmation that it is gone.
func TestDeleteForgets(t *testing.T) {
	nft := newAgent()
	src := &source{}
	f := start(t, src, nft, 0)
	ctx := context.Background()
	f.applyConnected(t, fip("a", 1), fip("b", 2))
	if err := f.gw.Delete(ctx, nat.KindFIP, "a"); err != nil {
		t.Fatal(err)
	}
	nft.mu.Lock()
	nft.lost()
	nft.mu.Unlock()
	f.tr.breakSessions()
	eventually(t, "resynced", holds(nft, "b"))
}

// TestFailedDeleteForgets: a delete that fails (the agent died before it
// answered) still takes the object out of the process's desired set, so
// the reconnect deletes it as an orphan once its object is confirmed gone
// instead of keeping it until the caller's retry.
func TestFailedDeleteForgets(t *testing.T) {
	nft := newAgent()
	src := &source{absent: map[string]bool{}}
	f := start(t, src, nft, 0)
	ctx := context.Background()
	f.applyConnected(t, fip("a", 1), fip("b", 2))
	nft.mu.Lock()
	nft.failOp = "delete"
	nft.mu.Unlock()
	if err := f.gw.Delete(ctx, nat.KindFIP, "a"); err == nil {
		t.Fatal("delete succeeded while the agent refuses deletes")
	}
	nft.mu.Lock()
	nft.failOp = ""
	nft.mu.Unlock()
	src.mu.Lock()
	src.absent["a"] = true
	src.mu.Unlock()
	f.tr.breakSessions()
	eventually(t, "orphan of the failed delete swept on reconnect", holds(nft, "b"))
}

// TestSwitchDataplane: when the wanted data plane changes, the new agent
// is opened (it empties the old data plane as it starts), the old session
// closed and the new one gets the desired set.
func TestSwitchDataplane(t *testing.T) {
	nft := newAgent()
	src := &source{desired: []nat.Object{fip("a", 1)}, dataplane: nat.DataplaneNftables}
	f := start(t, src, nft, 0)
	eventually(t, "first sync", holds(nft, "a"))
	src.mu.Lock()
	src.dataplane = nat.DataplaneIptables
	src.mu.Unlock()
	f.reg.Kick("gw1")
	eventually(t, "moved to iptables", holds(f.ipt, "a"))
	eventually(t, "nftables emptied", holds(nft))
	if dp := f.gw.Dataplane(); dp != nat.DataplaneIptables {
		t.Errorf("Dataplane() = %q after the switch", dp)
	}
	if err := f.gw.Apply(context.Background(), fip("b", 2)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "new objects go to iptables", holds(f.ipt, "a", "b"))
}

// TestSwitchFailsStays: when the new data plane's agent cannot be opened,
// the gateway stays on the old one with its objects and keeps programming
// there.
func TestSwitchFailsStays(t *testing.T) {
	nft, ipt := newAgent(), newAgent()
	src := &source{desired: []nat.Object{fip("a", 1)}, dataplane: nat.DataplaneNftables}
	f := startWith(t, src, nft, ipt, map[nat.DataplaneName]bool{nat.DataplaneIptables: true}, 0)
	eventually(t, "first sync", holds(nft, "a"))
	src.mu.Lock()
	src.dataplane = nat.DataplaneIptables
	src.mu.Unlock()
	f.reg.Kick("gw1")
	time.Sleep(100 * time.Millisecond)
	if dp := f.gw.Dataplane(); dp != nat.DataplaneNftables {
		t.Errorf("Dataplane() = %q, want to stay on nftables", dp)
	}
	if err := f.gw.Apply(context.Background(), fip("b", 2)); err != nil {
		t.Fatalf("apply after the failed switch: %v", err)
	}
	if err := holds(nft, "a", "b")(); err != nil {
		t.Error(err)
	}
	if got := ipt.uids(); len(got) != 0 {
		t.Errorf("iptables got %v", got)
	}
}

// TestNotReady: calls without a session fail with ErrNotReady after
// ConnectWait, and unknown gateways with ErrUnknownGateway.
func TestNotReady(t *testing.T) {
	nft := newAgent()
	f := start(t, &source{}, nft, 0)
	f.tr.mu.Lock()
	f.tr.refuse = true
	f.tr.mu.Unlock()
	f.tr.breakSessions()
	eventually(t, "session gone", func() error {
		if dp := f.gw.Dataplane(); dp != "" {
			return fmt.Errorf("still connected on %s", dp)
		}
		return nil
	})
	if err := f.gw.Apply(context.Background(), fip("a", 1)); !errors.Is(err, ErrNotReady) || errors.Is(err, ErrConnecting) {
		t.Errorf("Apply without a session after the first connect: %v, want ErrNotReady and not ErrConnecting", err)
	}
	if _, err := f.reg.Get("nope"); !errors.Is(err, ErrUnknownGateway) {
		t.Errorf("Get(unknown): %v, want ErrUnknownGateway", err)
	}
	f.tr.mu.Lock()
	f.tr.refuse = false
	f.tr.mu.Unlock()
	eventually(t, "reconnected", func() error {
		return f.gw.Apply(context.Background(), fip("a", 1))
	})
}

// heldOpenTransport holds every Open until gate is closed.
type heldOpenTransport struct {
	transport.Transport
	gate chan struct{}
}

func (g *heldOpenTransport) Open(ctx context.Context, gw transport.Endpoint) (transport.Session, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Transport.Open(ctx, gw)
}

// TestConnecting: until the first connect since the manager started has
// ended, a call without a session fails with ErrConnecting (and
// ErrNotReady): the gateway's state is unknown, not down. A first connect
// that failed ends that: the calls then fail with ErrNotReady alone.
func TestConnecting(t *testing.T) {
	gate := make(chan struct{})
	f := startWith(t, &source{}, newAgent(), newAgent(), nil, 0, func(o *Options) {
		o.Transport = &heldOpenTransport{Transport: o.Transport, gate: gate}
		o.ConnectWait = 20 * time.Millisecond
	})
	err := f.gw.Apply(context.Background(), fip("a", 1))
	if !errors.Is(err, ErrConnecting) || !errors.Is(err, ErrNotReady) {
		t.Fatalf("Apply while the first connect waits: %v, want ErrConnecting and ErrNotReady", err)
	}
	close(gate)
	eventually(t, "connected", func() error { return f.gw.Apply(context.Background(), fip("a", 1)) })

	// A first connect refused by the agent: not connecting any more.
	f2 := startWith(t, &source{}, newAgent(), newAgent(), map[nat.DataplaneName]bool{nat.DataplaneNftables: true}, 0, func(o *Options) {
		o.ConnectWait = 20 * time.Millisecond
	})
	eventually(t, "first connect failed", func() error {
		err := f2.gw.Apply(context.Background(), fip("b", 2))
		if !errors.Is(err, ErrNotReady) || errors.Is(err, ErrConnecting) {
			return fmt.Errorf("Apply: %v, want ErrNotReady alone", err)
		}
		return nil
	})
}

// TestDataplaneChangedWhileAway: iptables holds objects (the controller's
// --dataplane changed while no controller ran); the controller connects on
// nftables, whose agent empties iptables as it starts, and syncs the
// desired set there. Nothing in the API says which data plane held them.
func TestDataplaneChangedWhileAway(t *testing.T) {
	nft, ipt := newAgent(), newAgent()
	ipt.put(fip("a", 1), fip("gone", 9))
	src := &source{desired: []nat.Object{fip("a", 1)}, absent: map[string]bool{"gone": true}}
	f := startWith(t, src, nft, ipt, nil, 0)
	eventually(t, "nftables programmed", holds(nft, "a"))
	if err := holds(ipt)(); err != nil {
		t.Error(err)
	}
	if dp := f.gw.Dataplane(); dp != nat.DataplaneNftables {
		t.Errorf("Dataplane() = %q", dp)
	}
}

// connLog records Options.OnConnection's reports as "gateway:connected".
type connLog struct {
	mu  sync.Mutex
	got []string
}

func (c *connLog) record(gw string, connected bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, fmt.Sprintf("%s:%v", gw, connected))
}

// seen returns a check that the reports so far are exactly want.
func (c *connLog) seen(want ...string) func() error {
	return func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if !slices.Equal(c.got, want) {
			return fmt.Errorf("notified %v, want %v", c.got, want)
		}
		return nil
	}
}

// TestOnConnection: the manager reports each change of its gateway's
// connection (connected, session broke, reconnected), once per change, so
// that the API's Ready state follows the gateway.
func TestOnConnection(t *testing.T) {
	conns := &connLog{}
	f := startWith(t, &source{}, newAgent(), newAgent(), nil, 0, func(o *Options) {
		o.OnConnection = conns.record
	})
	seen := conns.seen
	eventually(t, "connected", seen("gw1:true"))
	f.tr.mu.Lock()
	f.tr.refuse = true
	f.tr.mu.Unlock()
	f.tr.breakSessions()
	eventually(t, "disconnected", seen("gw1:true", "gw1:false"))
	time.Sleep(100 * time.Millisecond) // failed reconnects change nothing
	if err := seen("gw1:true", "gw1:false")(); err != nil {
		t.Error(err)
	}
	f.tr.mu.Lock()
	f.tr.refuse = false
	f.tr.mu.Unlock()
	eventually(t, "reconnected", seen("gw1:true", "gw1:false", "gw1:true"))
}

// TestVanishedAfterSync: the connect's sync took an object from a cache
// that had not yet seen it vanish (deleted while its finalizer was being
// added: no reconcile will delete its UID). Once the cache drops it and a
// live read confirms it gone, the next check (here the sweep shortly after
// the connect) deletes it from the gateway.
func TestVanishedAfterSync(t *testing.T) {
	nft := newAgent()
	src := &source{desired: []nat.Object{fip("a", 1), fip("x", 2)}, absent: map[string]bool{}}
	startWith(t, src, nft, newAgent(), nil, 0, func(o *Options) { o.Resweep = 200 * time.Millisecond })
	eventually(t, "synced", holds(nft, "a", "x"))
	src.mu.Lock()
	src.desired = []nat.Object{fip("a", 1)}
	src.absent["x"] = true
	src.mu.Unlock()
	eventually(t, "vanished object deleted", holds(nft, "a"))
}

// TestResweepNeedsADelete: with Options.Deletes set, the sweep after a
// connect reads nothing (no second desired set) while no delete was
// observed since the connect read the cache; without it, it runs as
// before. The period checks are off, so any Desired read after the
// connect's is the resweep's.
func TestResweepNeedsADelete(t *testing.T) {
	for _, tc := range []struct {
		name    string
		deletes func() uint64
		want    int // Desired reads after the connect's
	}{
		{"no delete observed", func() uint64 { return 7 }, 0},
		{"no delete counter", nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nft := newAgent()
			src := &source{desired: []nat.Object{fip("a", 1)}, absent: map[string]bool{}}
			startWith(t, src, nft, newAgent(), nil, 0, func(o *Options) { o.Resweep, o.Deletes = 50*time.Millisecond, tc.deletes })
			eventually(t, "synced", holds(nft, "a"))
			time.Sleep(400 * time.Millisecond) // eight resweep periods
			src.mu.Lock()
			got := src.desiredCalls - 1
			src.mu.Unlock()
			if got != tc.want {
				t.Errorf("%d desired-set reads after the connect's, want %d", got, tc.want)
			}
		})
	}
}

// TestResweepAfterDelete: with Options.Deletes set, an object deleted
// during the connect's sync (after its desired set was read), or just
// after it, and counted at once or only after the first resweep period
// (a slow informer handler), still leaves the gateway by the resweep,
// with the periodic sweep off.
func TestResweepAfterDelete(t *testing.T) {
	for _, tc := range []struct {
		name         string
		duringSync   bool
		countedAfter time.Duration
	}{
		{"during the connect's sync", true, 0},
		{"just after the connect", false, 0},
		{"just after the connect, counted late", false, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nft := newAgent()
			var deletes atomic.Uint64
			src := &source{desired: []nat.Object{fip("a", 1), fip("x", 2)}, absent: map[string]bool{}}
			vanish := func(s *source) {
				s.desired = []nat.Object{fip("a", 1)}
				s.absent["x"] = true
				if tc.countedAfter == 0 {
					deletes.Add(1)
				} else {
					time.AfterFunc(tc.countedAfter, func() { deletes.Add(1) })
				}
			}
			if tc.duringSync {
				src.afterDesired = func(s *source) {
					if s.desiredCalls == 1 {
						vanish(s)
					}
				}
			}
			startWith(t, src, nft, newAgent(), nil, 0, func(o *Options) { o.Resweep, o.Deletes = 100*time.Millisecond, deletes.Load })
			if !tc.duringSync {
				eventually(t, "synced", holds(nft, "a", "x"))
				src.mu.Lock()
				vanish(src)
				src.mu.Unlock()
			}
			eventually(t, "deleted object removed from the gateway", holds(nft, "a"))
		})
	}
}

// TestUnlistedButLiveKept: an object this process programmed that the
// cache does not list yet (or any more) but that still exists stays.
func TestUnlistedButLiveKept(t *testing.T) {
	nft := newAgent()
	src := &source{absent: map[string]bool{}}
	f := startWith(t, src, nft, newAgent(), nil, 0, func(o *Options) { o.Resweep = 100 * time.Millisecond })
	f.applyConnected(t, fip("new", 3))
	time.Sleep(300 * time.Millisecond)
	f.gw.checkNow()
	time.Sleep(200 * time.Millisecond)
	if err := holds(nft, "new")(); err != nil {
		t.Error(err)
	}
}

func qosRule(rate float64) gwqos.Rule {
	return gwqos.Rule{Direction: gwqos.Egress, Priority: 1, Classifier: gwqos.U32, MatchDir: "src",
		CIDR: netip.MustParsePrefix("10.0.1.0/24"), RateMbps: rate, BurstMB: 1}
}

func holdsQoS(a *agent, want ...gwqos.Rule) func() error {
	return func() error {
		if got, _ := a.qosState(); !slices.Equal(got, want) {
			return fmt.Errorf("agent holds QoS %+v, want %+v", got, want)
		}
		return nil
	}
}

// TestGatewayQoS: the gateway-wide QoS the Source names is sent on the
// first connect; SetQoS sends a change once (the same rules again send
// nothing); a new boot id (kernel state lost) gets the Source's rules again
// with its sync, and so does a reconnect with the same boot id; a drift
// check sends what differs from what was sent; a refused gwqos request
// does not stop the NAT objects' sync and is retried.
func TestGatewayQoS(t *testing.T) {
	nft := newAgent()
	r10, r20, r30 := qosRule(10), qosRule(20), qosRule(30)
	src := &source{desired: []nat.Object{fip("a", 1)}, qos: []gwqos.Rule{r10}}
	f := start(t, src, nft, 0)
	eventually(t, "QoS sent on connect", holdsQoS(nft, r10))
	ctx := context.Background()

	src.setQoS([]gwqos.Rule{r20})
	if err := f.gw.SetQoS(ctx, []gwqos.Rule{r20}); err != nil {
		t.Fatal(err)
	}
	_, n := nft.qosState()
	if err := f.gw.SetQoS(ctx, []gwqos.Rule{r20}); err != nil {
		t.Fatal(err)
	}
	if got, again := nft.qosState(); !slices.Equal(got, []gwqos.Rule{r20}) || again != n {
		t.Fatalf("after SetQoS twice: %+v, %d requests (was %d), want r20 sent once", got, again, n)
	}

	// The pod restarts: new boot id, empty kernel.
	nft.mu.Lock()
	nft.lost()
	nft.mu.Unlock()
	f.tr.breakSessions()
	eventually(t, "resynced after the lost state", holds(nft, "a"))
	eventually(t, "QoS sent again with the sync", holdsQoS(nft, r20))

	// The agent restarts on an intact kernel that lost the QoS table
	// behind natgw's back: a new session sends it anyway.
	nft.mu.Lock()
	nft.qos = nil
	nft.mu.Unlock()
	f.tr.breakSessions()
	eventually(t, "QoS sent on reconnect", holdsQoS(nft, r20))

	// Unset: nothing held.
	src.setQoS(nil)
	if err := f.gw.SetQoS(ctx, nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, "QoS removed", holdsQoS(nft))

	// A refused request fails SetQoS, not the sync of a new boot id.
	nft.mu.Lock()
	nft.failOp = "gwqos"
	nft.lost()
	nft.mu.Unlock()
	src.setQoS([]gwqos.Rule{r30})
	if err := f.gw.SetQoS(ctx, []gwqos.Rule{r30}); err == nil {
		t.Fatal("SetQoS on an agent refusing gwqos succeeded")
	}
	f.tr.breakSessions()
	eventually(t, "NAT synced although gwqos is refused", holds(nft, "a"))
	nft.mu.Lock()
	nft.failOp = ""
	nft.mu.Unlock()
	f.periodicNow(t)
	eventually(t, "QoS sent by the next check", holdsQoS(nft, r30))
}

// periodicNow runs a drift check of the fixture's gateway now.
func (f *fixture) periodicNow(t *testing.T) {
	t.Helper()
	f.gw.checkNow()
}

// TestGatewayQoSDrift: every drift check sends the Source's rules and the
// agent compares them with its kernel: unchanged rules are written once;
// a change in the API is written by the next check; rules changed in the
// kernel behind natgw's back are restored by the next check, counted as a
// qos-drift resync.
func TestGatewayQoSDrift(t *testing.T) {
	nft := newAgent()
	r10, r20, r99 := qosRule(10), qosRule(20), qosRule(99)
	src := &source{qos: []gwqos.Rule{r10}}
	start(t, src, nft, 20*time.Millisecond)
	eventually(t, "QoS sent on connect", holdsQoS(nft, r10))
	time.Sleep(100 * time.Millisecond) // several drift periods
	if _, n := nft.qosState(); n < 3 {
		t.Errorf("%d gwqos requests over several drift checks, want one per check", n)
	}
	if n := nft.qosWritten(); n != 1 {
		t.Errorf("%d gwqos writes over several unchanged drift checks, want 1", n)
	}
	src.setQoS([]gwqos.Rule{r20})
	eventually(t, "drift check sent the change", holdsQoS(nft, r20))

	drifts := metrics.CounterValue(metrics.Resyncs.WithLabelValues("gw1", "qos-drift"))
	nft.mu.Lock()
	nft.qos = []gwqos.Rule{r99} // a hand edit in the gateway
	nft.mu.Unlock()
	eventually(t, "drift check restored the rules", holdsQoS(nft, r20))
	if n := metrics.CounterValue(metrics.Resyncs.WithLabelValues("gw1", "qos-drift")) - drifts; n != 1 {
		t.Errorf("qos-drift resyncs %v, want 1", n)
	}
}
