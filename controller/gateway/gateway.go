// Package gateway keeps one connection manager per gateway: it opens the
// gateway's agent session through a transport.Transport and reopens it with
// backoff when it breaks; answers a new boot id of an agent it knew
// (kernel state lost) with one sync of the desired set, and converges a
// gateway whose agent it has not seen yet (a cold start) by writing only
// what differs from the desired set (see complete); sweeps orphans
// (objects on the gateway whose Kubernetes object is confirmed gone by a
// live read) on every (re)connect and periodically; repairs drift (a
// periodic fresh list compared to the desired set, repaired with sync);
// and switches a gateway's data plane when asked to.
//
// Reconcilers program through Manager.Apply and Manager.Delete, which run
// in parallel; syncs, sweeps and data plane switches exclude them for their
// duration, so that a sync never undoes an apply or delete it did not see.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

// Manager manages the session to one gateway's agent.
type Manager struct {
	cfg  gwconfig.Entry
	opts *Options
	log  logr.Logger

	// mu: calls (Apply, Delete) hold it shared; sync, sweep and switches
	// hold it exclusively. It guards sess and dataplane.
	mu        sync.RWMutex
	sess      transport.Session
	dataplane nat.DataplaneName
	bootID    string
	// deletesAt is Options.Deletes as read before the last converge of
	// the whole gateway (connect, data plane switch, periodic check).
	// Guarded by mu.
	deletesAt uint64

	readyMu sync.Mutex
	ready   chan struct{} // closed while a session is published
	// tried is closed once the first connect attempt ended (a session,
	// an error, or the manager stopping); until then a call that finds
	// no session fails with ErrConnecting.
	tried     chan struct{}
	triedOnce sync.Once
	// unsure: the session was withdrawn while the path to the agents was
	// down (publishAs); calls that find no session fail with
	// ErrConnecting, as before the first connect ended. Guarded by readyMu.
	unsure bool
	// reportedUp is what Options.OnConnection last said (false before
	// the first connect). Guarded by mu.
	reportedUp bool

	knownMu sync.Mutex
	known   map[string]knownObj // what this process programmed and has not deleted, by UID
	// held mirrors the UIDs the agent holds (guarded by knownMu): what the
	// last converge left on it (the fresh list's objects kept, unconfirmed
	// ones included), plus every UID an Apply sent, minus those a Delete
	// removed. A superset: an Apply that failed may have left nothing.
	held map[string]struct{}
	// holders is the Registry's index of every manager's held set
	// (updated with held; nil outside a Registry).
	holders *holderIndex

	// qosMu guards qosSent and qosKnown: the gateway-wide QoS last sent
	// to the agent, valid while qosKnown (false: unknown, the next
	// converge sends it whatever it is). Taken after mu.
	qosMu    sync.Mutex
	qosSent  []gwqos.Rule
	qosKnown bool

	// kick asks for a data plane check (Kick); check for a drift
	// check now (checkNow), as the drift ticker does.
	kick, check chan struct{}
	// slots bounds the connects of all gateways (Registry; nil: unbounded).
	slots chan struct{}
	// recovery wakes the reconnect backoff when the path to the agents
	// answers again (Registry; nil: none).
	recovery *recovery
}

func newManager(cfg gwconfig.Entry, opts *Options) *Manager {
	return &Manager{
		cfg:   cfg,
		opts:  opts,
		log:   opts.Log.WithValues("gateway", cfg.Name),
		ready: make(chan struct{}),
		tried: make(chan struct{}),
		known: map[string]knownObj{},
		held:  map[string]struct{}{},
		kick:  make(chan struct{}, 1),
		check: make(chan struct{}, 1),
	}
}

// Name returns the gateway's name.
func (g *Manager) Name() string { return g.cfg.Name }

// Config returns the gateway's configuration.
func (g *Manager) Config() gwconfig.Entry { return g.cfg }

// Kick asks the manager to compare the data plane the Source wants with
// the running one soon, and to switch when they differ. It is cheap (one
// Source.Dataplane read) and checks nothing else: drift and orphans are
// the periodic checks' job (Options.DriftPeriod, SweepPeriod, Resweep).
// Kicks while one is pending coalesce.
func (g *Manager) Kick() { signal(g.kick) }

// checkNow asks for a drift check (fresh list compared with the desired
// set, orphan sweep, gateway QoS check) soon, as DriftPeriod's ticker
// does.
func (g *Manager) checkNow() { signal(g.check) }

// signal sends on a buffered channel of one without blocking: a signal
// already pending covers this one.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Dataplane returns the data plane of the current session ("" when none).
func (g *Manager) Dataplane() nat.DataplaneName {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.dataplane
}

// Apply programs objs in one transaction on the gateway. Objects the
// current session is known to hold exactly as given (Manager.known: what
// the session's converge left on the agent, or an Apply over it put there,
// equal to the object) are not sent: the agent would plan no change for
// them (nat.State.PlanApply skips an equal object), so a call of only such
// objects is answered here, without a round trip, once a session is
// published. A reconcile that runs again for an object it programmed (a
// cold start's first reconcile of every object after the gateway's
// converge, the status update's own event, a resync) then costs the agent
// nothing. natgw_gateway_unchanged_applies_total counts them.
func (g *Manager) Apply(ctx context.Context, objs ...nat.Object) error {
	if len(objs) == 0 {
		return nil
	}
	// known changes while the call still holds mu shared, so that a sync
	// (which holds it exclusively) sees the gateway and known agree.
	err := g.call(ctx, "apply", string(objs[0].Kind), func(s transport.Session) error {
		g.knownMu.Lock()
		send := g.unheld(objs)
		var added []string
		for _, o := range send {
			if _, ok := g.held[o.UID]; !ok {
				g.held[o.UID] = struct{}{}
				added = append(added, o.UID)
			}
		}
		g.holders.update(g, added, nil)
		g.knownMu.Unlock()
		if len(send) == 0 {
			metrics.UnchangedApplies.WithLabelValues(g.cfg.Name).Add(float64(len(objs)))
			return errSentNothing
		}
		if err := s.Apply(ctx, send...); err != nil {
			return err
		}
		if n := len(objs) - len(send); n > 0 {
			metrics.UnchangedApplies.WithLabelValues(g.cfg.Name).Add(float64(n))
		}
		g.knownMu.Lock()
		for _, o := range send {
			g.known[o.UID] = newKnown(o)
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

// unheld returns the objects of objs the agent is not known to hold
// exactly (objs itself when that is all of them). Caller holds knownMu
// and mu (shared or exclusive), so that known is the current session's.
func (g *Manager) unheld(objs []nat.Object) []nat.Object {
	held := func(o nat.Object) bool {
		k, ok := g.known[o.UID]
		return ok && k.object(o.UID).Equal(o)
	}
	n := 0
	for _, o := range objs {
		if !held(o) {
			n++
		}
	}
	if n == len(objs) {
		return objs
	}
	out := make([]nat.Object, 0, n)
	for _, o := range objs {
		if !held(o) {
			out = append(out, o)
		}
	}
	return out
}

// errSentNothing is what a call's fn returns when it had nothing to send:
// the call succeeds and records no programming latency.
var errSentNothing = errors.New("nothing to send")

// Delete removes the objects with these UIDs from the gateway in one
// transaction; a nil error is the agent's confirmation.
func (g *Manager) Delete(ctx context.Context, kind nat.Kind, uids ...string) error {
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
	var removed []string
	for _, u := range uids {
		if _, ok := g.held[u]; ok {
			delete(g.held, u)
			removed = append(removed, u)
		}
	}
	g.holders.update(g, nil, removed)
	g.knownMu.Unlock()
	g.updateGauge()
	return nil
}

// SetQoS makes the gateway's gateway-wide QoS exactly rules (none: no
// gateway-wide QoS), in one transaction; nothing is sent when the agent
// already holds them. Every converge that syncs for a new boot id, a
// reconnect or a data plane switch sends the gateway's rules again (from
// Source.GatewayQoS), and so does every drift check: the agent compares
// them with what its kernel holds and writes only when that differs.
func (g *Manager) SetQoS(ctx context.Context, rules []gwqos.Rule) error {
	return g.call(ctx, "gwqos", "", func(s transport.Session) error {
		_, _, err := g.sendQoS(ctx, s, rules, false)
		return err
	})
}

// sendQoS sends rules unless the agent is known to hold them (always when
// force); sent says whether it sent them, changed whether the agent wrote
// its kernel. Caller holds mu (shared or exclusive).
func (g *Manager) sendQoS(ctx context.Context, s transport.Session, rules []gwqos.Rule, force bool) (sent, changed bool, err error) {
	g.qosMu.Lock()
	defer g.qosMu.Unlock()
	if !force && g.qosKnown && slices.Equal(g.qosSent, rules) {
		return false, false, nil
	}
	g.qosKnown = false
	changed, err = setQoS(ctx, s, rules)
	if err != nil {
		return true, false, err
	}
	g.qosSent, g.qosKnown = slices.Clone(rules), true
	return true, changed, nil
}

// qosSession is a session that programs gateway-wide QoS (the agent's
// gwqos request: *agentapi.Client, which transport's sessions embed).
type qosSession interface {
	SetGatewayQoS(ctx context.Context, rules []gwqos.Rule) (changed bool, err error)
}

var _ qosSession = (*agentapi.Client)(nil)

// setQoS sends rules on s; changed says the agent wrote its kernel. A
// session without gwqos, or an agent that does not know the request (an
// older natgw image), holds no gateway-wide QoS: no rules is then no
// error.
func setQoS(ctx context.Context, s transport.Session, rules []gwqos.Rule) (bool, error) {
	q, ok := s.(qosSession)
	if !ok {
		if len(rules) == 0 {
			return false, nil
		}
		return false, fmt.Errorf("gateway-wide QoS: the session (%T) cannot program it", s)
	}
	changed, err := q.SetGatewayQoS(ctx, rules)
	var pe *agentapi.Error
	if err != nil && len(rules) == 0 && errors.As(err, &pe) && pe.Code == agentapi.CodeBadRequest && pe.Field == "op" {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("gateway-wide QoS (%d rules): %w", len(rules), err)
	}
	return changed, nil
}

// List returns the gateway's objects (from the agent's index).
func (g *Manager) List(ctx context.Context) ([]nat.Object, error) {
	var objs []nat.Object
	err := g.call(ctx, "list", "", func(s transport.Session) error {
		var err error
		objs, err = s.List(ctx, false)
		return err
	})
	return objs, err
}

func (g *Manager) forget(uids []string) {
	g.knownMu.Lock()
	for _, u := range uids {
		delete(g.known, u)
	}
	g.knownMu.Unlock()
}

// call runs fn on the current session, waiting up to ConnectWait for one.
func (g *Manager) call(ctx context.Context, op, kind string, fn func(transport.Session) error) error {
	g.readyMu.Lock()
	ready := g.ready
	g.readyMu.Unlock()
	wait := time.NewTimer(g.opts.ConnectWait)
	defer wait.Stop()
	select {
	case <-ready:
	case <-wait.C:
		g.readyMu.Lock()
		unsure := g.unsure
		g.readyMu.Unlock()
		if unsure {
			return fmt.Errorf("gateway %s: %w: %w (reconnecting while the path to the agents is down, no session within %v)", g.cfg.Name, ErrNotReady, ErrConnecting, g.opts.ConnectWait)
		}
		select {
		case <-g.tried:
		default:
			return fmt.Errorf("gateway %s: %w: %w (no session within %v)", g.cfg.Name, ErrNotReady, ErrConnecting, g.opts.ConnectWait)
		}
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
	if err == errSentNothing {
		return nil
	}
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

func (g *Manager) updateGauge() {
	counts := map[nat.Kind]int{}
	g.knownMu.Lock()
	for _, o := range g.known {
		counts[o.Kind()]++
	}
	g.knownMu.Unlock()
	for _, k := range nat.Kinds {
		metrics.GatewayObjects.WithLabelValues(g.cfg.Name, string(k)).Set(float64(counts[k]))
	}
}
