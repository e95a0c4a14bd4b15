package gateway

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

// Source tells a gateway manager what the API says.
type Source interface {
	// Desired returns the objects the gateway should hold according to
	// the (cached) API: every object with the controller's finalizer that
	// is not being deleted and resolves to this gateway, oldest first (on
	// conflicts the older object wins).
	Desired(ctx context.Context, gateway string) ([]nat.Object, error)
	// Absent returns the UIDs among objs whose Kubernetes object is
	// confirmed gone by a live read of the API server (a cache may only
	// say that an object exists, never that it is gone).
	Absent(ctx context.Context, objs []nat.Object) ([]string, error)
	// Dataplane returns the data plane the gateway should run.
	Dataplane(ctx context.Context, gateway string) (nat.DataplaneName, error)
	// GatewayQoS returns the gateway-wide QoS rules the gateway should
	// hold (its VpcNatGateway's spec.qosPolicy; none when unset or not
	// programmable). An error is a failed read, not a refused policy.
	GatewayQoS(ctx context.Context, gateway string) ([]gwqos.Rule, error)
}

// Options configure every gateway manager of a Registry.
type Options struct {
	Transport transport.Transport
	Source    Source
	Config    *gwconfig.Config
	// DefaultDataplane is the controller's --dataplane.
	DefaultDataplane nat.DataplaneName
	// SweepPeriod is how often orphans are swept (besides every connect).
	SweepPeriod time.Duration
	// Resweep is how long after each connect a second sweep runs (default
	// 5s): the connect's sync took the desired set from the cache, which
	// may not yet have seen objects vanish.
	Resweep time.Duration
	// Deletes, when set, returns how many deletes of the objects the
	// desired sets are made of (the owners Source.Absent confirms) the
	// controller's caches have observed so far. The sweep after a connect
	// then runs only once the count differs from its value when the
	// connect began (what it could find is an object that vanished from
	// the cache after the connect read it, and that is a delete the cache
	// observes); until then it is checked again every Resweep, until it
	// ran or a periodic sweep did its work. nil: it always runs.
	Deletes func() uint64
	// DriftPeriod is how often a fresh list is compared to the desired set.
	DriftPeriod time.Duration
	// ConnectWait bounds how long a call waits for a session before
	// failing with ErrNotReady (default 2s).
	ConnectWait time.Duration
	// BackoffMin and BackoffMax bound the reconnect backoff (100ms, 30s).
	BackoffMin, BackoffMax time.Duration
	// Probe, when set, checks that the path to the agents answers (for
	// the exec transport: the API server's /readyz). While any manager
	// waits in its reconnect backoff, one probe runs every ProbeInterval
	// (default 500ms); when it succeeds after failing, every waiting
	// manager retries at once with its backoff reset to BackoffMin
	// instead of waiting out a backoff that doubled while the API server
	// was down. nil: the backoff alone.
	Probe         func(ctx context.Context) error
	ProbeInterval time.Duration
	// CallTimeout bounds sync, list and sweep calls of the manager (1m).
	CallTimeout time.Duration
	// SyncParallel bounds how many gateways connect at once: open their
	// agent session and converge it (a full sync on a new boot id of a
	// known agent; at a cold start, a sync of what differs). The others
	// wait for a slot before their own CallTimeout
	// starts. 0: DefaultSyncParallel.
	SyncParallel int
	// Initial, when set, names the gateways whose managers start with the
	// Registry (besides those a Get created before), so that a cold start
	// syncs every gateway at once instead of one by one as reconciles
	// first reach each gateway. Names that are not configured are
	// skipped; an error is logged and only delays those gateways until a
	// reconcile asks for them.
	Initial func(ctx context.Context) ([]string, error)
	// OnConnection, when set, is called with the gateway's name each time
	// its session is published (connected) or withdrawn (the session
	// broke, the pod went away, a data plane switch began), so that the
	// objects reporting the gateway's state are reconciled: a gateway that
	// went away must not stay Ready in the API. It must not block (it runs
	// under the manager's lock).
	OnConnection func(gateway string, connected bool)
	Log          logr.Logger
}

// DefaultSyncParallel is Options.SyncParallel's default: min(8, 4 ×
// GOMAXPROCS). A sync is mostly the agent's work and the desired set's
// computation, so a few at a time keep the CPU busy while each finishes
// early (one at a time would leave it idle on round trips; all at once
// finish together, last).
func DefaultSyncParallel() int { return min(8, 4*runtime.GOMAXPROCS(0)) }

// ErrNotReady is matched when a gateway has no working session.
var ErrNotReady = errors.New("gateway not connected")

// ErrConnecting is matched, with ErrNotReady, when a gateway has no session
// yet because its first connect since this process started has not ended
// (it waits for a connect slot, or is connecting and syncing): what the
// gateway holds is unknown, not known to be gone, so callers should retry
// without reporting the gateway down (a controller restart must not turn
// every object of the gateways that connect last NotReady). The same holds
// after a session broke while the path to the agents was down (an API
// server restart), until a reconnect made while the path answers ended.
var ErrConnecting = errors.New("connect not finished: the gateway's state is unknown")

// ErrUnknownGateway is matched for gateways that are not configured.
var ErrUnknownGateway = errors.New("gateway not configured")

// Registry holds the managers of all gateways, created on first use. It is
// a controller-runtime Runnable: managers run while it runs (only on the
// leader).
type Registry struct {
	opts     Options
	mu       sync.Mutex
	gateways map[string]*Manager
	ctx      context.Context // set by Start
	started  chan struct{}
	wg       sync.WaitGroup
	// slots holds a token per gateway connecting (Options.SyncParallel).
	slots chan struct{}
	// recovery is nil without Options.Probe.
	recovery *recovery
	// holders indexes every manager's held set (Holders).
	holders *holderIndex
}

// NewRegistry returns a Registry; call Start to run it.
func NewRegistry(opts Options) *Registry {
	if opts.ConnectWait <= 0 {
		opts.ConnectWait = 2 * time.Second
	}
	if opts.BackoffMin <= 0 {
		opts.BackoffMin = 100 * time.Millisecond
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = 30 * time.Second
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = time.Minute
	}
	if opts.Resweep <= 0 {
		opts.Resweep = 5 * time.Second
	}
	if opts.Config == nil {
		opts.Config = &gwconfig.Config{}
	}
	if opts.SyncParallel <= 0 {
		opts.SyncParallel = DefaultSyncParallel()
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = 500 * time.Millisecond
	}
	r := &Registry{
		opts: opts, gateways: map[string]*Manager{}, started: make(chan struct{}),
		slots: make(chan struct{}, opts.SyncParallel), holders: newHolderIndex(),
	}
	if opts.Probe != nil {
		r.recovery = newRecovery(opts.Probe, opts.ProbeInterval)
	}
	return r
}

// NeedLeaderElection makes the Registry run only on the leader.
func (r *Registry) NeedLeaderElection() bool { return true }

// Start runs gateway managers until ctx ends. Callers must start it after
// the caches synced (the manager does so for Runnables that need leader
// election... and the controller's Source waits for the cache itself).
func (r *Registry) Start(ctx context.Context) error {
	r.mu.Lock()
	r.ctx = ctx
	close(r.started)
	if r.recovery != nil {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.recovery.run(ctx)
		}()
	}
	for _, g := range r.gateways {
		r.run(g)
	}
	r.mu.Unlock()
	if r.opts.Initial != nil {
		names, err := r.opts.Initial(ctx)
		if err != nil {
			r.opts.Log.Error(err, "listing the gateways to start; each starts when a reconcile first asks for it")
		}
		r.opts.Log.Info("starting every gateway's manager", "gateways", len(names), "syncParallel", r.opts.SyncParallel)
		for _, n := range names {
			// Get starts the manager (the Registry runs); an unknown
			// gateway is left to its VpcNatGateway's reconcile to report.
			_, _ = r.Get(n)
		}
	}
	<-ctx.Done()
	r.wg.Wait()
	return nil
}

func (r *Registry) run(g *Manager) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		g.run(r.ctx)
	}()
}

// Get returns the manager of gateway name, creating it (and starting it
// once the Registry runs) on first use.
func (r *Registry) Get(name string) (*Manager, error) {
	cfg, ok := r.opts.Config.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("gateway %q: %w", name, ErrUnknownGateway)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if g, ok := r.gateways[name]; ok {
		return g, nil
	}
	g := newManager(cfg, &r.opts)
	g.slots, g.recovery, g.holders = r.slots, r.recovery, r.holders
	r.gateways[name] = g
	if r.ctx != nil {
		r.run(g)
	}
	return g, nil
}

// Lookup returns the configuration of gateway name (false if unknown).
func (r *Registry) Lookup(name string) (gwconfig.Entry, bool) {
	return r.opts.Config.Lookup(name)
}

// Kick asks gateway name's manager to re-check its data plane soon
// (Manager.Kick: cheap, no drift check). Unknown gateways and gateways
// whose manager has not been created yet (it reads the data plane when it
// connects) are ignored.
func (r *Registry) Kick(name string) {
	r.mu.Lock()
	g := r.gateways[name]
	r.mu.Unlock()
	if g != nil {
		g.Kick()
	}
}

// Holders returns the gateways whose agent holds uid as far as this process
// knows (each gateway's mirror of its agent, see Manager.held). It waits
// for any sync, sweep or switch in progress (they hold a gateway's lock
// exclusively), so the answer includes what they left on a gateway. A
// gateway that has no session yet is not a holder: its next connect lists
// its objects and deletes those whose Kubernetes object is confirmed gone.
//
// The answer is read from the Registry's index of every manager's held set
// (holderIndex) after waiting for the gateways whose lock was taken
// exclusively, or wanted, when this call passed them: the index then holds
// what those left, and every other gateway's entries are as current as its
// lock allowed. Per gateway only a TryRLock is left (≈ 17 µs a call at
// 1,000 gateways, BenchmarkHolders), instead of a lock, a mutex and a map
// lookup each.
func (r *Registry) Holders(uid string) []string {
	r.mu.Lock()
	var busy []*Manager
	for _, g := range r.gateways {
		if g.mu.TryRLock() {
			g.mu.RUnlock()
		} else {
			busy = append(busy, g)
		}
	}
	r.mu.Unlock()
	// Taking and releasing the lock waits for the sync in progress.
	for _, g := range busy {
		g.mu.RLock()
		g.mu.RUnlock()
	}
	hs := r.holders.get(uid)
	if len(hs) == 0 {
		return nil
	}
	out := make([]string, 0, len(hs))
	for _, g := range hs {
		out = append(out, g.cfg.Name)
	}
	sort.Strings(out)
	return out
}
