package gateway

import (
	"context"
	"fmt"
	"time"

	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/nat"
)

// publish makes s the current session (nil: none) and reports the change
// (Options.OnConnection). Caller holds mu.
func (g *Manager) publish(s transport.Session, dp nat.DataplaneName) {
	g.publishAs(s, dp, false)
}

// publishAs is publish; with unsure, a withdrawn session is not reported:
// the path to the agents is down (Options.Probe fails), so the gateway's
// state is unknown, not down. Calls that find no session then fail with
// ErrConnecting (status left alone) until a connect attempt made while
// the path answers ends: a session published again reports nothing, as
// nothing was reported gone, and a failed attempt reports the gateway
// down (reportDown). Caller holds mu.
func (g *Manager) publishAs(s transport.Session, dp nat.DataplaneName, unsure bool) {
	if g.dataplane != "" {
		metrics.GatewayConnected.WithLabelValues(g.cfg.Name, string(g.dataplane)).Set(0)
	}
	g.sess, g.dataplane = s, dp
	up := s != nil
	unsure = unsure && !up
	if !unsure && up != g.reportedUp {
		g.reportedUp = up
		if g.opts.OnConnection != nil {
			g.opts.OnConnection(g.cfg.Name, up)
		}
	}
	g.readyMu.Lock()
	defer g.readyMu.Unlock()
	g.unsure = unsure
	if s == nil {
		select {
		case <-g.ready:
			g.ready = make(chan struct{})
		default:
		}
		return
	}
	metrics.GatewayConnected.WithLabelValues(g.cfg.Name, string(dp)).Set(1)
	select {
	case <-g.ready:
	default:
		close(g.ready)
	}
}

// isUnsure reports whether the session was withdrawn unsure (publishAs).
func (g *Manager) isUnsure() bool {
	g.readyMu.Lock()
	defer g.readyMu.Unlock()
	return g.unsure
}

// reportDown ends an unsure withdrawal (publishAs): a connect attempt made
// while the path to the agents answers failed, so the gateway is down.
func (g *Manager) reportDown() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.readyMu.Lock()
	was := g.unsure
	g.unsure = false
	g.readyMu.Unlock()
	if was && g.sess == nil && g.reportedUp {
		g.reportedUp = false
		if g.opts.OnConnection != nil {
			g.opts.OnConnection(g.cfg.Name, false)
		}
	}
}

// wantDataplane asks the Source, falling back to the configuration and
// the controller's default.
func (g *Manager) wantDataplane(ctx context.Context) nat.DataplaneName {
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

func (g *Manager) target(dp nat.DataplaneName) transport.Endpoint {
	return transport.Endpoint{
		Name: g.cfg.Name, Dataplane: dp, NetNS: g.cfg.NetNS,
		ExternalInterface: g.cfg.ExternalInterface, InternalInterface: g.cfg.InternalInterface,
	}
}

// run keeps a session open until ctx ends.
func (g *Manager) run(ctx context.Context) {
	defer g.triedFirst()
	backoff := g.opts.BackoffMin
	first := true
	for ctx.Err() == nil {
		if !first {
			metrics.Reconnects.WithLabelValues(g.cfg.Name).Inc()
		}
		first = false
		// After an unsure withdrawal, only an attempt made while the path
		// answered, before it and after it, tells the gateway is down: an
		// attempt that failed while the path was down and a probe that
		// saw it back a moment later tell nothing.
		pathUp := g.isUnsure() && !g.recovery.down(ctx)
		if !g.acquire(ctx) {
			break
		}
		dp := g.wantDataplane(ctx)
		s, err := g.connect(ctx, dp)
		g.release()
		g.triedFirst()
		if err != nil {
			if pathUp && !g.recovery.down(ctx) {
				g.reportDown()
			}
			g.log.Error(err, "connecting to the gateway agent failed; retrying", "dataplane", dp, "backoff", backoff)
			ok, recovered := g.recovery.wait(ctx, backoff)
			if !ok {
				break
			}
			if recovered {
				g.log.Info("the path to the gateway agents answers again: reconnecting now")
				backoff = g.opts.BackoffMin
			} else {
				backoff = min(backoff*2, g.opts.BackoffMax)
			}
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

// triedFirst records that the first connect attempt ended.
func (g *Manager) triedFirst() { g.triedOnce.Do(func() { close(g.tried) }) }

// acquire waits for a connect slot (Options.SyncParallel); false when
// ctx ended first.
func (g *Manager) acquire(ctx context.Context) bool {
	if g.slots == nil {
		return ctx.Err() == nil
	}
	select {
	case g.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// release returns the slot acquire took.
func (g *Manager) release() {
	if g.slots != nil {
		<-g.slots
	}
}

// connect opens a session and converges the gateway before publishing it.
func (g *Manager) connect(ctx context.Context, dp nat.DataplaneName) (transport.Session, error) {
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
	// A new session: what the agent holds of gateway-wide QoS is sent
	// again by the converge below.
	g.qosMu.Lock()
	g.qosKnown = false
	g.qosMu.Unlock()
	reason := "connect"
	mode := check
	if info.BootID != g.bootID {
		reason, mode = "bootid", forced
		if g.bootID == "" && !transport.ColdStartSync(s) {
			// This process has not seen the agent before (a cold start):
			// nothing says its kernel state was lost, and a fresh list
			// that equals the desired set needs no sync (see complete;
			// a session that answers otherwise, a two-replica gateway's
			// Pair, is synced: transport.ColdStartSyncer).
			mode = complete
		}
		g.log.Info("agent has a new boot id: converging the whole desired set", "dataplane", dp, "bootID", info.BootID, "previousBootID", g.bootID)
	}
	mark := g.deletes()
	if err := g.converge(octx, s, dp, reason, true, mode); err != nil {
		_ = s.Close()
		return nil, err
	}
	g.deletesAt = mark
	g.bootID = info.BootID
	g.publish(s, dp)
	g.log.Info("gateway connected", "dataplane", dp, "bootID", info.BootID, "version", info.Version)
	return s, nil
}

// serve runs the periodic work on an open session until it breaks.
func (g *Manager) serve(ctx context.Context, s transport.Session) {
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
			// Cheap when it cannot find anything: no delete observed
			// since the connect (or the last periodic check) read the
			// cache. Checked again later, until it ran once.
			if g.deletedSince() {
				g.periodic(ctx, "sweep", true)
			} else {
				resweep.Reset(g.opts.Resweep)
			}
		case <-s.Done():
			// Broken by the path to the agent (kube-apiserver restarting
			// breaks every exec session): the gateway is not known to be
			// down, so it is not reported down until a reconnect made
			// while the path answers fails.
			unsure := g.recovery.down(ctx)
			g.log.Info("session to the gateway agent ended; reconnecting", "reason", fmt.Sprint(s.Err()), "pathDown", unsure)
			g.mu.Lock()
			if g.sess == s {
				g.publishAs(nil, "", unsure)
			}
			g.mu.Unlock()
			_ = s.Close()
			return
		case <-sweep.C:
			// Does all the sweep after the connect would.
			resweep.Stop()
			g.periodic(ctx, "sweep", true)
		case <-drift.C:
			g.periodic(ctx, "drift", true)
		case <-g.check:
			g.periodic(ctx, "drift", true)
		case <-g.kick:
			// Only the data plane: a switch converges the new agent
			// itself, and a kick comes with every reconcile of the
			// gateway's VpcNatGateway (a drift check here made each one
			// a fresh list and a desired set of the whole gateway).
			if next := g.maybeSwitch(ctx); next != nil {
				s = next
			}
		}
	}
}

func (g *Manager) periodic(ctx context.Context, reason string, fresh bool) {
	cctx, cancel := context.WithTimeout(ctx, g.opts.CallTimeout)
	defer cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sess == nil {
		return
	}
	mark := g.deletes()
	if err := g.converge(cctx, g.sess, g.dataplane, reason, fresh, check); err != nil {
		g.log.Error(err, "converging the gateway failed", "reason", reason)
		return
	}
	g.deletesAt = mark
}

// deletes reads Options.Deletes (0 when unset).
func (g *Manager) deletes() uint64 {
	if g.opts.Deletes == nil {
		return 0
	}
	return g.opts.Deletes()
}

// deletedSince reports whether the sweep after a connect may find
// something: Options.Deletes is unset, or its count moved since the last
// converge of the whole gateway read the cache.
func (g *Manager) deletedSince() bool {
	if g.opts.Deletes == nil {
		return true
	}
	g.mu.RLock()
	at := g.deletesAt
	g.mu.RUnlock()
	if n := g.opts.Deletes(); n != at {
		return true
	}
	g.log.V(1).Info("no delete observed since the gateway's last converge: the sweep after the connect waits")
	return false
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
func (g *Manager) maybeSwitch(ctx context.Context) transport.Session {
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
	if err := g.converge(cctx, next, want, "dataplane", true, forced); err != nil {
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
