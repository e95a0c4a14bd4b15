package gateway

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/nat"
)

// convergeMode says what a converge takes as desired and when it syncs.
type convergeMode int

const (
	// check (drift and sweep checks, a reconnect to an agent of the same
	// boot id): only API objects already on the gateway are desired (the
	// others' reconciles are pending); a difference is repaired.
	check convergeMode = iota
	// complete (the first session of this process with an agent whose
	// boot id it has not seen: a cold start): every API object is
	// desired, and only a difference is written. Nothing says the agent
	// lost anything, and a sync of what it already holds changes nothing
	// an agent's list does not show: the agent's fresh list re-reads the
	// kernel, which its load repairs (nftables rewrites every rule and
	// policer and any element that does not match its object; iptables
	// rewrites every chain that differs), a sync plans against that same
	// state (an empty change: no address, route or conntrack work), and
	// the gateway-wide QoS is sent as when forced. Not for a session that
	// asks for a sync (transport.ColdStartSync: a two-replica gateway's
	// Pair, whose list reads one replica and whose agents leave the sync
	// mark `natgw ha` waits for only after a sync).
	complete
	// forced (a new boot id of an agent this process knew, a data plane
	// switch): every API object is desired and the whole set is synced
	// even when nothing differs.
	forced
)

// converge compares the gateway's objects with the desired set: objects
// that are not desired and whose Kubernetes object is confirmed gone are
// orphans; anything else that differs is repaired with one sync (which also
// removes the orphans); orphans alone are deleted by UID. mode says what is
// desired and whether the set is synced even when nothing differs. Caller
// holds mu exclusively.
func (g *Manager) converge(ctx context.Context, s transport.Session, dp nat.DataplaneName, reason string, fresh bool, mode convergeMode) error {
	force := mode != check // every API object desired, QoS sent
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
	for uid, o := range g.known {
		known = append(known, o.object(uid))
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
	// then what the API says, oldest first. In a check, API objects that
	// are not on the gateway yet are left to their reconcile, which is
	// pending: a drift check during churn would otherwise sync the whole
	// set for them.
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
		g.known = map[string]knownObj{}
		before := g.held
		g.held = make(map[string]struct{}, len(want))
		for _, o := range want {
			g.held[o.UID] = struct{}{}
			if desired[o.UID] {
				g.known[o.UID] = newKnown(o)
			}
		}
		g.holders.replace(g, before, g.held)
		g.knownMu.Unlock()
		g.updateGauge()
	}
	switch {
	case same && mode != forced:
		if mode == complete {
			g.log.V(1).Info("the gateway holds the desired set: no sync", "reason", reason, "objects", len(want))
		}
	case mode != forced && sameExcept(have, want, orphans):
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
	g.convergeQoS(ctx, s, dp, reason, force, fresh)
	return nil
}

// convergeQoS sends the gateway-wide QoS the API asks for when the agent
// may not hold it: always when force (a new boot id, a data plane switch)
// or check (a converge that re-read the kernel: connect, sweep and drift
// checks; the agent compares the rules with its kernel and writes only a
// difference, counted as a qos-drift resync), else when it differs from
// what was last sent or that is unknown (a new session). A failure is
// logged and leaves the state unknown, so the next converge sends it
// again; it does not fail the NAT objects' converge. Caller holds mu
// exclusively.
func (g *Manager) convergeQoS(ctx context.Context, s transport.Session, dp nat.DataplaneName, reason string, force, check bool) {
	rules, err := g.opts.Source.GatewayQoS(ctx, g.cfg.Name)
	if err != nil {
		g.log.Error(err, "reading the gateway's QoS failed; not sent", "reason", reason)
		g.qosMu.Lock()
		g.qosKnown = false
		g.qosMu.Unlock()
		return
	}
	start := time.Now()
	sent, changed, err := g.sendQoS(ctx, s, rules, force || check)
	if err != nil {
		g.log.Error(err, "programming the gateway's QoS failed; retried at the next check", "reason", reason, "rules", len(rules))
		return
	}
	if sent {
		metrics.ObserveProgram("gwqos", "all", dp, start)
		g.log.V(1).Info("gateway QoS sent", "reason", reason, "rules", len(rules), "written", changed)
	}
	if changed && check && !force {
		metrics.Resyncs.WithLabelValues(g.cfg.Name, "qos-drift").Inc()
		g.log.Info("the gateway's QoS differed from the API's in its kernel; restored", "rules", len(rules))
	}
}

// dropGone returns known without the objects that fromAPI lacks and
// whose Kubernetes object a live read confirms gone.
func (g *Manager) dropGone(ctx context.Context, known, fromAPI []nat.Object) ([]nat.Object, error) {
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
