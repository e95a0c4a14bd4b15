// Package gateway keeps one connection manager per gateway: it opens the
// gateway's agent session through a transport.Transport and reopens it with
// backoff when it breaks; answers a new agent boot id (kernel state lost)
// with one sync of the desired set; sweeps orphans (objects on the gateway
// whose Kubernetes object is confirmed gone by a live read) on every
// (re)connect and periodically; repairs drift (a periodic fresh list
// compared to the desired set, repaired with sync); and switches a
// gateway's data plane when asked to.
//
// Reconcilers program through Gateway.Apply and Gateway.Delete, which run
// in parallel; syncs, sweeps and data plane switches exclude them for their
// duration, so that a sync never undoes an apply or delete it did not see.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/nat"
)

// Source tells a gateway manager what the API says.
type Source interface {
	// Desired returns the objects the gateway should hold according to
	// the (cached) API: every object with the controller's finalizer that
	// is not being deleted and resolves to this gateway, oldest first (on
	// conflicts the older object wins).
	Desired(ctx context.Context, gateway string) ([]nat.Object, error)
	// Absent returns the UIDs among objs whose Kubernetes object is
	// confirmed gone by a live read of the API server (not a cache).
	Absent(ctx context.Context, objs []nat.Object) ([]string, error)
	// Dataplane returns the data plane the gateway should run.
	Dataplane(ctx context.Context, gateway string) (string, error)
}

// Options configure every gateway manager of a Registry.
type Options struct {
	Transport transport.Transport
	Source    Source
	Config    *gwconfig.Config
	// DefaultDataplane is the controller's --dataplane.
	DefaultDataplane string
	// SweepPeriod is how often orphans are swept (besides every connect).
	SweepPeriod time.Duration
	// Resweep is how long after each connect a second sweep runs (default
	// 5s): the connect's sync took the desired set from the cache, which
	// may not yet have seen objects vanish.
	Resweep time.Duration
	// DriftPeriod is how often a fresh list is compared to the desired set.
	DriftPeriod time.Duration
	// ConnectWait bounds how long a call waits for a session before
	// failing with ErrNotReady (default 2s).
	ConnectWait time.Duration
	// BackoffMin and BackoffMax bound the reconnect backoff (100ms, 30s).
	BackoffMin, BackoffMax time.Duration
	// CallTimeout bounds sync, list and sweep calls of the manager (1m).
	CallTimeout time.Duration
	// OnConnection, when set, is called with the gateway's name each time
	// its session is published (connected) or withdrawn (the session
	// broke, the pod went away, a data plane switch began), so that the
	// objects reporting the gateway's state are reconciled: a gateway that
	// went away must not stay Ready in the API. It must not block (it runs
	// under the manager's lock).
	OnConnection func(gateway string, connected bool)
	Log          logr.Logger
}

// ErrNotReady is matched when a gateway has no working session.
var ErrNotReady = errors.New("gateway not connected")

// ErrUnknownGateway is matched for gateways that are not configured.
var ErrUnknownGateway = errors.New("gateway not configured")

// Registry holds the managers of all gateways, created on first use. It is
// a controller-runtime Runnable: managers run while it runs (only on the
// leader).
type Registry struct {
	opts     Options
	mu       sync.Mutex
	gateways map[string]*Gateway
	ctx      context.Context // set by Start
	started  chan struct{}
	wg       sync.WaitGroup
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
	return &Registry{opts: opts, gateways: map[string]*Gateway{}, started: make(chan struct{})}
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
	for _, g := range r.gateways {
		r.run(g)
	}
	r.mu.Unlock()
	<-ctx.Done()
	r.wg.Wait()
	return nil
}

func (r *Registry) run(g *Gateway) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		g.run(r.ctx)
	}()
}

// Get returns the manager of gateway name, creating it (and starting it
// once the Registry runs) on first use.
func (r *Registry) Get(name string) (*Gateway, error) {
	cfg, ok := r.opts.Config.Lookup(name)
	if !ok {
		return nil, fmt.Errorf("gateway %q: %w", name, ErrUnknownGateway)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if g, ok := r.gateways[name]; ok {
		return g, nil
	}
	g := newGateway(cfg, &r.opts)
	r.gateways[name] = g
	if r.ctx != nil {
		r.run(g)
	}
	return g, nil
}

// Lookup returns the configuration of gateway name (false if unknown).
func (r *Registry) Lookup(name string) (gwconfig.Gateway, bool) {
	return r.opts.Config.Lookup(name)
}

// Kick asks gateway name's manager to re-check its data plane and the
// drift of its objects soon. Unknown gateways are ignored.
func (r *Registry) Kick(name string) {
	r.mu.Lock()
	g := r.gateways[name]
	r.mu.Unlock()
	if g != nil {
		g.Kick()
	}
}

// Gateway manages the session to one gateway's agent.
type Gateway struct {
	cfg  gwconfig.Gateway
	opts *Options
	log  logr.Logger

	// mu: calls (Apply, Delete) hold it shared; sync, sweep and switches
	// hold it exclusively. It guards sess and dataplane.
	mu        sync.RWMutex
	sess      transport.Session
	dataplane string
	bootID    string

	readyMu sync.Mutex
	ready   chan struct{} // closed while a session is published

	knownMu sync.Mutex
	known   map[string]nat.Object // what this process programmed and has not deleted
	// held mirrors the UIDs the agent holds (guarded by knownMu): what the
	// last converge left on it (the fresh list's objects kept, unconfirmed
	// ones included), plus every UID an Apply sent, minus those a Delete
	// removed. A superset: an Apply that failed may have left nothing.
	held map[string]struct{}

	kick chan struct{}
}

func newGateway(cfg gwconfig.Gateway, opts *Options) *Gateway {
	return &Gateway{
		cfg:   cfg,
		opts:  opts,
		log:   opts.Log.WithValues("gateway", cfg.Name),
		ready: make(chan struct{}),
		known: map[string]nat.Object{},
		held:  map[string]struct{}{},
		kick:  make(chan struct{}, 1),
	}
}

// Name returns the gateway's name.
func (g *Gateway) Name() string { return g.cfg.Name }

// Config returns the gateway's configuration.
func (g *Gateway) Config() gwconfig.Gateway { return g.cfg }

// Kick asks the manager to re-check the data plane and drift soon.
func (g *Gateway) Kick() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// Dataplane returns the data plane of the current session ("" when none).
func (g *Gateway) Dataplane() string {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.dataplane
}

// Apply programs objs in one transaction on the gateway.
func (g *Gateway) Apply(ctx context.Context, objs ...nat.Object) error {
	if len(objs) == 0 {
		return nil
	}
	// known changes while the call still holds mu shared, so that a sync
	// (which holds it exclusively) sees the gateway and known agree.
	err := g.call(ctx, "apply", string(objs[0].Kind), func(s transport.Session) error {
		g.knownMu.Lock()
		for _, o := range objs {
			g.held[o.UID] = struct{}{}
		}
		g.knownMu.Unlock()
		if err := s.Apply(ctx, objs...); err != nil {
			return err
		}
		g.knownMu.Lock()
		for _, o := range objs {
			g.known[o.UID] = o
		}
		g.knownMu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	g.updateGauge()
	return nil
}

// Delete removes the objects with these UIDs from the gateway in one
// transaction; a nil error is the agent's confirmation.
func (g *Gateway) Delete(ctx context.Context, kind nat.Kind, uids ...string) error {
	if len(uids) == 0 {
		return nil
	}
	// The objects leave the desired set of this process whatever the
	// outcome: a delete whose answer was lost (the agent died mid-request)
	// must not be kept on the gateway by the next connect's sync, which
	// starts from what this process programmed. Whether each object is
	// really gone is then the connect's orphan check (Source.Absent) or the
	// caller's retry.
	err := g.call(ctx, "delete", string(kind), func(s transport.Session) error {
		defer g.forget(uids)
		return s.Delete(ctx, uids...)
	})
	if err != nil {
		g.forget(uids)
		return err
	}
	g.knownMu.Lock()
	for _, u := range uids {
		delete(g.held, u)
	}
	g.knownMu.Unlock()
	g.updateGauge()
	return nil
}

// Holders returns the gateways whose agent holds uid as far as this process
// knows (each gateway's mirror of its agent, see Gateway.held). It waits
// for any sync, sweep or switch in progress (they hold a gateway's lock
// exclusively), so the answer includes what they left on a gateway. A
// gateway that has no session yet is not a holder: its next connect lists
// its objects and deletes those whose Kubernetes object is confirmed gone.
func (r *Registry) Holders(uid string) []string {
	r.mu.Lock()
	gws := make([]*Gateway, 0, len(r.gateways))
	for _, g := range r.gateways {
		gws = append(gws, g)
	}
	r.mu.Unlock()
	var out []string
	for _, g := range gws {
		g.mu.RLock()
		g.knownMu.Lock()
		_, ok := g.held[uid]
		g.knownMu.Unlock()
		g.mu.RUnlock()
		if ok {
			out = append(out, g.cfg.Name)
		}
	}
	sort.Strings(out)
	return out
}

// List returns the gateway's objects (from the agent's index).
func (g *Gateway) List(ctx context.Context) ([]nat.Object, error) {
	var objs []nat.Object
	err := g.call(ctx, "list", "", func(s transport.Session) error {
		var err error
		objs, err = s.List(ctx, false)
		return err
	})
	return objs, err
}

func (g *Gateway) forget(uids []string) {
	g.knownMu.Lock()
	for _, u := range uids {
		delete(g.known, u)
	}
	g.knownMu.Unlock()
}

// call runs fn on the current session, waiting up to ConnectWait for one.
func (g *Gateway) call(ctx context.Context, op, kind string, fn func(transport.Session) error) error {
	g.readyMu.Lock()
	ready := g.ready
	g.readyMu.Unlock()
	wait := time.NewTimer(g.opts.ConnectWait)
	defer wait.Stop()
	select {
	case <-ready:
	case <-wait.C:
		return fmt.Errorf("gateway %s: %w (no session within %v)", g.cfg.Name, ErrNotReady, g.opts.ConnectWait)
	case <-ctx.Done():
		return fmt.Errorf("gateway %s: waiting for session: %w", g.cfg.Name, ctx.Err())
	}
	g.mu.RLock()
	defer g.mu.RUnlock()
	s, dp := g.sess, g.dataplane
	if s == nil {
		return fmt.Errorf("gateway %s: %w", g.cfg.Name, ErrNotReady)
	}
	start := time.Now()
	err := fn(s)
	metrics.ObserveProgram(op, kind, dp, start)
	if err != nil {
		select {
		case <-s.Done():
			return fmt.Errorf("gateway %s: %s: %w: %w", g.cfg.Name, op, ErrNotReady, err)
		default:
		}
		return fmt.Errorf("gateway %s: %s: %w", g.cfg.Name, op, err)
	}
	return nil
}

func (g *Gateway) updateGauge() {
	counts := map[nat.Kind]int{}
	g.knownMu.Lock()
	for _, o := range g.known {
		counts[o.Kind]++
	}
	g.knownMu.Unlock()
	for _, k := range nat.Kinds {
		metrics.GatewayObjects.WithLabelValues(g.cfg.Name, string(k)).Set(float64(counts[k]))
	}
}

// publish makes s the current session (nil: none). Caller holds mu.
func (g *Gateway) publish(s transport.Session, dp string) {
	if g.dataplane != "" {
		metrics.GatewayConnected.WithLabelValues(g.cfg.Name, g.dataplane).Set(0)
	}
	was := g.sess != nil
	g.sess, g.dataplane = s, dp
	if now := s != nil; now != was && g.opts.OnConnection != nil {
		g.opts.OnConnection(g.cfg.Name, now)
	}
	g.readyMu.Lock()
	defer g.readyMu.Unlock()
	if s == nil {
		select {
		case <-g.ready:
			g.ready = make(chan struct{})
		default:
		}
		return
	}
	metrics.GatewayConnected.WithLabelValues(g.cfg.Name, dp).Set(1)
	select {
	case <-g.ready:
	default:
		close(g.ready)
	}
}

// wantDataplane asks the Source, falling back to the configuration and
// the controller's default.
func (g *Gateway) wantDataplane(ctx context.Context) string {
	dp, err := g.opts.Source.Dataplane(ctx, g.cfg.Name)
	if err != nil {
		g.log.Error(err, "reading the gateway's data plane; using the configured one")
	}
	if dp == "" {
		dp = g.cfg.Dataplane
	}
	if dp == "" {
		dp = g.opts.DefaultDataplane
	}
	return dp
}

func (g *Gateway) target(dp string) transport.Gateway {
	return transport.Gateway{
		Name: g.cfg.Name, Dataplane: dp, NetNS: g.cfg.NetNS,
		ExternalInterface: g.cfg.ExternalInterface, InternalInterface: g.cfg.InternalInterface,
	}
}

// run keeps a session open until ctx ends.
func (g *Gateway) run(ctx context.Context) {
	backoff := g.opts.BackoffMin
	first := true
	for ctx.Err() == nil {
		if !first {
			metrics.Reconnects.WithLabelValues(g.cfg.Name).Inc()
		}
		first = false
		dp := g.wantDataplane(ctx)
		s, err := g.connect(ctx, dp)
		if err != nil {
			g.log.Error(err, "connecting to the gateway agent failed; retrying", "dataplane", dp, "backoff", backoff)
			if !sleep(ctx, backoff) {
				break
			}
			backoff = min(backoff*2, g.opts.BackoffMax)
			continue
		}
		backoff = g.opts.BackoffMin
		g.serve(ctx, s)
	}
	g.mu.Lock()
	if g.sess != nil {
		_ = g.sess.Close()
		g.publish(nil, "")
	}
	g.mu.Unlock()
}

// connect opens a session and converges the gateway before publishing it.
func (g *Gateway) connect(ctx context.Context, dp string) (transport.Session, error) {
	octx, cancel := context.WithTimeout(ctx, g.opts.CallTimeout)
	defer cancel()
	s, err := g.opts.Transport.Open(octx, g.target(dp))
	if err != nil {
		return nil, fmt.Errorf("open session: %w", err)
	}
	info, err := s.Info(octx)
	if err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("info: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	reason := "connect"
	if info.BootID != g.bootID {
		reason = "bootid"
		g.log.Info("agent has a new boot id: syncing the desired set", "dataplane", dp, "bootID", info.BootID, "previousBootID", g.bootID)
	}
	if err := g.converge(octx, s, dp, reason, true, reason != "connect"); err != nil {
		_ = s.Close()
		return nil, err
	}
	g.bootID = info.BootID
	g.publish(s, dp)
	g.log.Info("gateway connected", "dataplane", dp, "bootID", info.BootID, "version", info.Version)
	return s, nil
}

// serve runs the periodic work on an open session until it breaks.
func (g *Gateway) serve(ctx context.Context, s transport.Session) {
	sweep := ticker(g.opts.SweepPeriod)
	defer sweep.Stop()
	drift := ticker(g.opts.DriftPeriod)
	defer drift.Stop()
	resweep := time.NewTimer(g.opts.Resweep)
	defer resweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-resweep.C:
			g.periodic(ctx, "sweep", true)
		case <-s.Done():
			g.log.Info("session to the gateway agent ended; reconnecting", "reason", fmt.Sprint(s.Err()))
			g.mu.Lock()
			if g.sess == s {
				g.publish(nil, "")
			}
			g.mu.Unlock()
			_ = s.Close()
			return
		case <-sweep.C:
			g.periodic(ctx, "sweep", true)
		case <-drift.C:
			g.periodic(ctx, "drift", true)
		case <-g.kick:
			if next := g.maybeSwitch(ctx); next != nil {
				s = next
			}
			g.periodic(ctx, "drift", true)
		}
	}
}

func (g *Gateway) periodic(ctx context.Context, reason string, fresh bool) {
	cctx, cancel := context.WithTimeout(ctx, g.opts.CallTimeout)
	defer cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sess == nil {
		return
	}
	if err := g.converge(cctx, g.sess, g.dataplane, reason, fresh, false); err != nil {
		g.log.Error(err, "converging the gateway failed", "reason", reason)
	}
}

// converge compares the gateway's objects with the desired set: objects
// that are not desired and whose Kubernetes object is confirmed gone are
// orphans; anything else that differs is repaired with one sync (which also
// removes the orphans); orphans alone are deleted by UID. force syncs even
// when nothing differs (a new boot id). Caller holds mu exclusively.
func (g *Gateway) converge(ctx context.Context, s transport.Session, dp, reason string, fresh, force bool) error {
	have, err := s.List(ctx, fresh)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	fromAPI, err := g.opts.Source.Desired(ctx, g.cfg.Name)
	if err != nil {
		return fmt.Errorf("desired set: %w", err)
	}
	g.knownMu.Lock()
	known := make([]nat.Object, 0, len(g.known))
	for _, o := range g.known {
		known = append(known, o)
	}
	g.knownMu.Unlock()
	sort.Slice(known, func(i, j int) bool { return known[i].UID < known[j].UID })
	// What this process holds but the cache no longer lists, and a live
	// read confirms gone, is no longer desired: e.g. an object a connect's
	// sync took from a cache that had not yet seen it vanish (deleted while
	// its finalizer was being added, so no reconcile deletes its UID).
	// Without this it would stay desired, and on the gateway, for the
	// life of the process.
	known, err = g.dropGone(ctx, known, fromAPI)
	if err != nil {
		return err
	}

	// The desired set, conflict-free: what this process programmed first,
	// then what the API says, oldest first. Unless forced (new boot id,
	// data plane switch), API objects that are not on the gateway yet are
	// left to their reconcile, which is pending: a drift check during
	// churn would otherwise sync the whole set for them.
	candidates := known
	if force {
		candidates = append(candidates, fromAPI...)
	} else {
		onGW := map[string]bool{}
		for _, o := range have {
			onGW[o.UID] = true
		}
		for _, o := range fromAPI {
			if onGW[o.UID] {
				candidates = append(candidates, o)
			}
		}
	}
	state := nat.NewState()
	skipped := 0
	for _, o := range candidates {
		if _, ok := state.Get(o.UID); ok {
			continue
		}
		if err := state.Insert(o); err != nil {
			skipped++
			g.log.V(1).Info("left out of the desired set", "uid", o.UID, "object", o.String(), "error", err.Error())
		}
	}
	desired := map[string]bool{}
	for _, o := range state.Objects() {
		desired[o.UID] = true
	}

	var extras []nat.Object
	for _, o := range have {
		if !desired[o.UID] {
			extras = append(extras, o)
		}
	}
	var orphans []string
	if len(extras) > 0 {
		orphans, err = g.opts.Source.Absent(ctx, extras)
		if err != nil {
			return fmt.Errorf("confirm orphans: %w", err)
		}
		gone := map[string]bool{}
		for _, u := range orphans {
			gone[u] = true
		}
		// Objects not confirmed gone stay (the cache may lag the API).
		for _, o := range extras {
			if !gone[o.UID] {
				if err := state.Insert(o); err != nil {
					g.log.Info("unconfirmed object on the gateway conflicts with the desired set; the sync removes it", "uid", o.UID, "object", o.String(), "error", err.Error())
				}
			}
		}
	}
	want := state.Objects()

	same := len(have) == len(want)
	if same {
		for i := range have {
			if !have[i].Equal(want[i]) {
				same = false
				break
			}
		}
	}
	// Remember exactly what is now desired and on the gateway.
	setKnown := func() {
		g.knownMu.Lock()
		g.known = map[string]nat.Object{}
		g.held = make(map[string]struct{}, len(want))
		for _, o := range want {
			g.held[o.UID] = struct{}{}
			if desired[o.UID] {
				g.known[o.UID] = o
			}
		}
		g.knownMu.Unlock()
		g.updateGauge()
	}
	switch {
	case same && !force:
	case !force && sameExcept(have, want, orphans):
		start := time.Now()
		if err := s.Delete(ctx, orphans...); err != nil {
			return fmt.Errorf("delete orphans: %w", err)
		}
		metrics.ObserveProgram("delete", "orphan", dp, start)
	default:
		start := time.Now()
		if err := s.Sync(ctx, want); err != nil {
			return fmt.Errorf("sync %d objects: %w", len(want), err)
		}
		metrics.ObserveProgram("sync", "all", dp, start)
		metrics.Resyncs.WithLabelValues(g.cfg.Name, reason).Inc()
		g.log.Info("synced the gateway", "reason", reason, "objects", len(want), "had", len(have), "orphans", len(orphans), "leftOut", skipped)
	}
	if len(orphans) > 0 {
		metrics.SweepDeletions.WithLabelValues(g.cfg.Name).Add(float64(len(orphans)))
		g.log.Info("swept orphans", "uids", orphans, "reason", reason)
	}
	setKnown()
	return nil
}

// dropGone returns known without the objects that fromAPI lacks and
// whose Kubernetes object a live read confirms gone.
func (g *Gateway) dropGone(ctx context.Context, known, fromAPI []nat.Object) ([]nat.Object, error) {
	listed := map[string]bool{}
	for _, o := range fromAPI {
		listed[o.UID] = true
	}
	var unlisted []nat.Object
	for _, o := range known {
		if !listed[o.UID] {
			unlisted = append(unlisted, o)
		}
	}
	if len(unlisted) == 0 {
		return known, nil
	}
	gone, err := g.opts.Source.Absent(ctx, unlisted)
	if err != nil {
		return nil, fmt.Errorf("confirm vanished objects: %w", err)
	}
	if len(gone) == 0 {
		return known, nil
	}
	g.log.Info("objects this process programmed are gone from the API; no longer desired", "uids", gone)
	return slices.DeleteFunc(known, func(o nat.Object) bool { return slices.Contains(gone, o.UID) }), nil
}

// sameExcept reports whether have minus the UIDs in drop equals want
// (both in canonical order).
func sameExcept(have, want []nat.Object, drop []string) bool {
	if len(drop) == 0 {
		return false
	}
	gone := map[string]bool{}
	for _, u := range drop {
		gone[u] = true
	}
	i := 0
	for _, o := range have {
		if gone[o.UID] {
			continue
		}
		if i >= len(want) || !o.Equal(want[i]) {
			return false
		}
		i++
	}
	return i == len(want)
}

// maybeSwitch moves the gateway to another data plane when the wanted one
// differs from the running one. The new agent, when it starts, empties
// every other data plane's natgw state in the namespace itself (package
// nat/planes: rules, EIP addresses, routes), so the switch is: stop calls
// (exclusive lock), open the new agent, close the old one, sync the desired
// set on the new one. When the new agent cannot be opened the gateway stays
// on the old one, untouched. When the sync fails the gateway is left
// without a session and the run loop reconnects (to the wanted data plane,
// forcing a sync on its new boot id). Traffic to the gateway's NAT rules
// stops for the duration of the switch. It returns the new session, or nil
// when it did not switch.
func (g *Gateway) maybeSwitch(ctx context.Context) transport.Session {
	want := g.wantDataplane(ctx)
	g.mu.RLock()
	cur := g.dataplane
	g.mu.RUnlock()
	if cur == "" || want == cur || want == "" {
		return nil
	}
	log := g.log.WithValues("from", cur, "to", want)
	log.Info("switching the gateway's data plane")
	cctx, cancel := context.WithTimeout(ctx, g.opts.CallTimeout)
	defer cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	old := g.sess
	if old == nil || g.dataplane != cur {
		return nil
	}
	next, err := g.opts.Transport.Open(cctx, g.target(want))
	if err != nil {
		log.Error(err, "data plane switch: opening the new agent failed; staying")
		return nil
	}
	info, err := next.Info(cctx)
	if err != nil {
		log.Error(err, "data plane switch: new agent info failed; staying")
		_ = next.Close()
		return nil
	}
	// The new agent emptied the old data plane when it started: the old
	// session must not program anything any more.
	_ = old.Close()
	g.publish(nil, "")
	if err := g.converge(cctx, next, want, "dataplane", true, true); err != nil {
		log.Error(err, "data plane switch: syncing the new data plane failed; reconnecting")
		_ = next.Close()
		return nil
	}
	g.bootID = info.BootID
	g.publish(next, want)
	log.Info("switched the gateway's data plane", "bootID", info.BootID)
	return next
}

func ticker(d time.Duration) *time.Ticker {
	if d <= 0 {
		t := time.NewTicker(time.Hour)
		t.Stop()
		return t
	}
	return time.NewTicker(d)
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
