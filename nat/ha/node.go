package ha

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/ha/ctsync"
	"github.com/natgw/natgw/nat/link"
	"github.com/natgw/natgw/nat/netns"
)

// Role is a replica's role.
type Role uint8

// Roles.
const (
	RoleStandby Role = 1
	RoleActive  Role = 2
)

func (r Role) String() string {
	switch r {
	case RoleStandby:
		return "standby"
	case RoleActive:
		return "active"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Config configures one replica of a highly available gateway.
type Config struct {
	// ID names this replica (the fence holder); unique per gateway.
	ID string
	// NetNS is the gateway's namespace ("": the caller's), as nat.Config.
	NetNS string
	// ExternalInterface and InternalInterface default to Kube-OVN's net1
	// and eth0.
	ExternalInterface, InternalInterface string
	// Local is this replica's own (not floating) address and port on the
	// internal network: heartbeats (UDP) and the conntrack stream (TCP)
	// use it. Peer is the other replica's; the zero value means not known
	// yet (a replica whose peer has not started has no address for it):
	// the replica then behaves as with a silent peer until SetPeer gives
	// one.
	Local, Peer netip.AddrPort
	// EIPs go on the external interface, LanIPs on the internal one,
	// while this replica is active. EIPs is the initial set: SetEIPs
	// changes it at run time. Both families: an IPv4 address is added
	// and announced with a gratuitous ARP, an IPv6 one without duplicate
	// address detection and announced with an unsolicited neighbour
	// advertisement (link.Claim); a dual-stack EIP is its two prefixes.
	EIPs, LanIPs []netip.Prefix
	// Interval is the heartbeat period (default 50 ms, at most 1 s);
	// Misses is how many missing beats mean the peer is gone (default 3).
	Interval time.Duration
	Misses   int
	// LeaseTTL is the fence lease's duration (default DefaultLeaseTTL:
	// the detection interval plus the step-down margin; at least
	// MinLeaseIntervals × Interval). A standby takes over only when the
	// active's lease has run out, so LeaseTTL bounds the failover gap
	// from below; the active renews it every Interval and stops
	// answering (removes its addresses) when it could not renew it before
	// the lease's last margin, unless its standby is heard fresh saying
	// standby (see step and keptByPeer).
	LeaseTTL time.Duration
	// Fence decides who may lead.
	Fence Fence
	// RulesReady, if set, gates leadership on the gateway's rules: while
	// it returns an error this replica does not take the lead (its beats
	// say it is not healthy, so the peer does not count on it). A replica
	// that started or came back is then synced (by the controller, through
	// its agent) before it may become active; an active replica is not
	// made to step down by it. Nil: no gate. It is called every Interval
	// and must be cheap (natgw ha: RulesSyncedFile, a file's existence,
	// not looked at again once seen).
	RulesReady func() error
	// OnRole, if set, is called (on the replica's loop) at every role
	// change with the reason.
	OnRole func(r Role, reason string)
	Log    logr.Logger
}

func (c *Config) defaults() error {
	if c.ExternalInterface == "" {
		c.ExternalInterface = nat.DefaultExternalInterface
	}
	if c.InternalInterface == "" {
		c.InternalInterface = nat.DefaultInternalInterface
	}
	if c.Interval == 0 {
		c.Interval = 50 * time.Millisecond
	}
	if c.Misses == 0 {
		c.Misses = 3
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL(c.Interval, c.Misses)
	}
	if err := CheckTiming(c.Interval, c.Misses, c.LeaseTTL); err != nil {
		return fmt.Errorf("ha: config: %w", err)
	}
	switch {
	case c.ID == "":
		return errors.New("ha: config: id is empty")
	case !c.Local.IsValid() || !c.Local.Addr().Is4() || c.Local.Port() == 0:
		return fmt.Errorf("ha: config: local %q: want an IPv4 address and a port", c.Local)
	case c.Peer.IsValid() && (!c.Peer.Addr().Is4() || c.Peer.Port() == 0):
		return fmt.Errorf("ha: config: peer %q: want an IPv4 address and a port", c.Peer)
	case c.Fence == nil:
		return errors.New("ha: config: no fence")
	}
	for _, p := range append(append([]netip.Prefix{}, c.EIPs...), c.LanIPs...) {
		if err := checkFloating(p); err != nil {
			return fmt.Errorf("ha: config: %w", err)
		}
	}
	return nil
}

// MinLeaseIntervals is the shortest lease in heartbeat intervals: the
// active renews it every interval and, when a renewal fails, keeps
// answering only while the lease still runs for one more turn plus the
// step-down margin (half an interval for such a lease); a lease of three
// intervals survives one quick failed renewal.
const MinLeaseIntervals = 3

// DefaultLeaseTTL is the lease duration Config uses when LeaseTTL is
// zero: the detection interval (misses × interval, at least
// MinLeaseIntervals intervals) plus half an interval (the step-down
// margin of such a lease). An active that cannot renew keeps answering until its lease
// has only the margin left, so until about one detection interval after
// its last renewal, when its standby finds it silent; a dead active's
// lease runs out half an interval after its silence is detected (with 50
// ms × 3: 175 ms after its last renewal, before a TCP flow's first
// retransmission, ≥ 200 ms after the fault).
func DefaultLeaseTTL(interval time.Duration, misses int) time.Duration {
	return time.Duration(max(misses, MinLeaseIntervals))*interval + interval/2
}

// TimingError is a timing setting out of its range: Field is "interval",
// "misses" or "leaseTTL" (Config's Interval, Misses, LeaseTTL; natgw ha's
// --interval, --misses, --lease).
type TimingError struct {
	Field, Value, Want string
}

func (e *TimingError) Error() string { return fmt.Sprintf("%s %s: want %s", e.Field, e.Value, e.Want) }

// CheckTiming checks the heartbeat interval, the misses that mean the peer
// is gone and the lease duration against each other (a *TimingError).
// The lease must be at least MinLeaseIntervals intervals: shorter, an
// active could not survive one failed renewal, and below 1.5 intervals it
// could not renew at all without risking to answer after its lease ran
// out. The lease may be shorter than the detection interval (the standby
// waits for both) but that gains nothing.
func CheckTiming(interval time.Duration, misses int, lease time.Duration) error {
	switch {
	case interval < time.Millisecond || interval > time.Second:
		return &TimingError{"interval", interval.String(), "1ms..1s"}
	case misses < 1 || misses > 100:
		return &TimingError{"misses", strconv.Itoa(misses), "1..100"}
	case lease < MinLeaseIntervals*interval:
		return &TimingError{"leaseTTL", lease.String(), fmt.Sprintf("at least %d × the interval %s (%s): one renewal may fail, and the active stops answering half an interval before its lease runs out",
			MinLeaseIntervals, interval, MinLeaseIntervals*interval)}
	}
	return nil
}

// checkFloating checks a floating address/length: its address is one a
// gateway programs (nat.CheckUnicast, the agent's rule for an EIP).
func checkFloating(p netip.Prefix) error {
	if !p.IsValid() {
		return fmt.Errorf("floating address %q: want an IPv4 or IPv6 address/length", p)
	}
	if err := nat.CheckUnicast("address", p.Addr()); err != nil {
		return fmt.Errorf("floating address %q: %w", p, err)
	}
	return nil
}

// Replica runs one replica: heartbeats, the role state machine with its
// fence, the floating addresses and conntrack replication.
type Replica struct {
	cfg   Config
	plumb *link.Plumber
	ns    *netns.NS
	recv  *ctsync.Receiver

	role atomic.Uint32
	mu   sync.Mutex
	peer struct {
		seen time.Time
		beat beat
		// addr is the peer's address now (Config.Peer, then SetPeer);
		// zero while unknown.
		addr netip.AddrPort
	}
	sender *ctsync.Sender
	// senderCtx is the context the running sender was started from
	// (restarted on a new peer address); under mu.
	senderCtx context.Context
	// eips is the floating EIP set wanted now (Config.EIPs, then
	// SetEIPs); held is the set on the external interface while active
	// (nil while standby). Both under mu.
	eips, held []netip.Prefix
	stopTx     context.CancelFunc
	txDone     chan struct{}
	// stopAnn ends the role's announcements (and senderCtx); under mu.
	stopAnn context.CancelFunc
	// leaseUntil is when this replica's lease runs out as far as it
	// knows (from the start of its last successful renewal), unix ns.
	leaseUntil atomic.Int64
	// healthySince is when this standby's interfaces were last seen
	// coming up (zero while they are down); loop goroutine only.
	healthySince time.Time
	// rulesErr is the last error of Config.RulesReady as logged (nil when
	// ready); loop goroutine only.
	rulesErr error
	// rulesOK is the last answer of rulesReady (for Status).
	rulesOK atomic.Bool
	// heldUntil is when the peer's lease runs out, as the fence said when
	// it refused this standby (zero: not known); silentSince is when this
	// standby first found the peer silent (zero while it is not). Loop
	// goroutine only.
	heldUntil, silentSince time.Time
	// takeover is the timeline of the last takeover (Status); under mu.
	takeover Takeover
	// lastBeat is when this replica last sent a beat, irregularAt when
	// two of its beats were last further apart than stallGap (a starved or
	// stopped process), unix ns; sent the send times of its last beats
	// (recordBeat).
	lastBeat, irregularAt atomic.Int64
	sent                  struct {
		sync.Mutex
		at [16]int64
		n  int
	}
	// beatHealthy is what the beats say of this replica's health: the
	// loop's last healthy and rulesReady.
	beatHealthy atomic.Bool
	// liveTable: this standby stepped down from active by itself (its
	// lease lapsed, its interface went down) and no beat of the peer has
	// said active since, so its conntrack table is the live one: as
	// complete as a synced copy (synced).
	liveTable atomic.Bool
	// keptLog is when a kept turn was last logged; loop goroutine only.
	keptLog time.Time
	// nudge wakes an active's loop when a beat says the peer is active
	// too (readBeats): it steps down at once if its lease is not valid.
	nudge chan struct{}
	// beatNow makes sendBeats send at once (a role change: the peer
	// learns it without waiting for the next tick).
	beatNow chan struct{}
	// counters for Collector
	toActive, toStandby, fenceErrors, keptTurns atomic.Int64
	takeovers                                   [2]atomic.Int64 // peer silent, peer alive but not active
}

// SetPeer sets the peer's address (its IPv4 address and port), for a peer
// that started after this replica or came back with another address. Beats
// from the old address are ignored from now on; an active replica's
// conntrack stream moves to the new address on its next turn. Safe for
// concurrent use.
func (r *Replica) SetPeer(p netip.AddrPort) error {
	if !p.IsValid() || !p.Addr().Is4() || p.Port() == 0 {
		return fmt.Errorf("ha: peer %q: want an IPv4 address and a port", p)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.peer.addr != p {
		r.cfg.Log.Info("peer address", "peer", p.String(), "was", r.peer.addr.String())
		r.peer.addr = p
	}
	return nil
}

// Peer returns the peer's address (zero while unknown).
func (r *Replica) Peer() netip.AddrPort {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.peer.addr
}

// SetEIPs replaces the floating EIP set (the addresses of the external
// interface). An active replica applies the change on its next turn: it
// removes the EIPs no longer in the set and adds the new ones with a
// gratuitous ARP, as at a takeover; a standby only records it and claims
// the new set when it takes over. Every prefix must be a valid IPv4 or
// IPv6 address/length; on error nothing changes. Safe for concurrent use.
func (r *Replica) SetEIPs(eips []netip.Prefix) error {
	for _, p := range eips {
		if err := checkFloating(p); err != nil {
			return fmt.Errorf("ha: set EIPs: %w", err)
		}
	}
	r.mu.Lock()
	r.eips = slices.Clone(eips)
	r.mu.Unlock()
	return nil
}

// EIPs returns the floating EIP set wanted now (see SetEIPs).
func (r *Replica) EIPs() []netip.Prefix {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.eips)
}

// Role returns the replica's current role.
func (r *Replica) Role() Role { return Role(r.role.Load()) }

// SenderStats returns the replication counters of the current (or last)
// term as active; zero when it never was.
func (r *Replica) SenderStats() ctsync.SenderStats {
	r.mu.Lock()
	s := r.sender
	r.mu.Unlock()
	if s == nil {
		return ctsync.SenderStats{}
	}
	return s.Stats()
}

// ReceiverStats returns the standby side's replication counters.
func (r *Replica) ReceiverStats() ctsync.ReceiverStats { return r.recv.Stats() }

// New checks cfg and opens the replica's namespace and sockets to the
// kernel; Run runs it.
func New(cfg Config) (*Replica, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	ncfg := nat.Config{NetNS: cfg.NetNS, ExternalInterface: cfg.ExternalInterface, InternalInterface: cfg.InternalInterface}
	plumb, err := link.New(ncfg)
	if err != nil {
		return nil, fmt.Errorf("ha: %w", err)
	}
	ns, err := netns.Open(cfg.NetNS)
	if err != nil {
		plumb.Close()
		return nil, fmt.Errorf("ha: %w", err)
	}
	// Liberal TCP tracking in the whole namespace: entries this replica
	// made as an earlier active keep the window history of then, and
	// after the connections ran on the peer their packets are out of
	// window; strict tracking marks them invalid, they pass untranslated
	// to the now-local EIP and are answered with resets. natgw drops no
	// invalid packets, so liberal tracking loses nothing.
	if err := ns.Do(func() error {
		return os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_tcp_be_liberal", []byte("1\n"), 0o644)
	}); err != nil {
		plumb.Close()
		ns.Close()
		return nil, fmt.Errorf("ha: liberal TCP tracking in %q: %w", cfg.NetNS, err)
	}
	recv, err := ctsync.NewReceiver(ns, cfg.Log)
	if err != nil {
		plumb.Close()
		ns.Close()
		return nil, fmt.Errorf("ha: %w", err)
	}
	r := &Replica{cfg: cfg, plumb: plumb, ns: ns, recv: recv, eips: slices.Clone(cfg.EIPs), nudge: make(chan struct{}, 1), beatNow: make(chan struct{}, 1)}
	r.peer.addr = cfg.Peer
	r.role.Store(uint32(RoleStandby))
	return r, nil
}

func (r *Replica) close() {
	r.plumb.Close()
	r.ns.Close()
}

// listen opens the heartbeat and replication sockets inside the namespace.
func (r *Replica) listen(ctx context.Context) (*net.UDPConn, net.Listener, error) {
	var udp *net.UDPConn
	var ln net.Listener
	err := r.ns.Do(func() error {
		var lc net.ListenConfig
		pc, err := lc.ListenPacket(ctx, "udp4", r.cfg.Local.String())
		if err != nil {
			return fmt.Errorf("ha: heartbeat socket on %s: %w", r.cfg.Local, err)
		}
		udp = pc.(*net.UDPConn)
		ln, err = lc.Listen(ctx, "tcp4", r.cfg.Local.String())
		if err != nil {
			udp.Close()
			return fmt.Errorf("ha: replication socket on %s: %w", r.cfg.Local, err)
		}
		return nil
	})
	return udp, ln, err
}

// Run runs the replica until ctx ends; it then steps down (removes the
// floating addresses and releases the lease), releases its resources and
// returns. A replica starts as standby and first removes floating
// addresses a previous run may have left. Run is called once.
func (r *Replica) Run(ctx context.Context) error {
	defer r.close()
	cfg := r.cfg
	if err := r.release(); err != nil {
		return err
	}
	udp, ln, err := r.listen(ctx)
	if err != nil {
		return err
	}
	defer udp.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	loopCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.beatHealthy.Store(r.healthy() && r.rulesReady())
	wg.Add(3)
	go func() {
		defer wg.Done()
		r.sendBeats(loopCtx, udp)
	}()
	go func() {
		defer wg.Done()
		if err := r.recv.Serve(loopCtx, ln); err != nil {
			cfg.Log.Error(err, "replication receiver stopped")
		}
	}()
	go func() {
		defer wg.Done()
		r.readBeats(loopCtx, udp)
	}()
	// The peer counts as last seen now: a replica that starts alone
	// waits one detection interval before it leads.
	r.mu.Lock()
	r.peer.seen = time.Now()
	r.mu.Unlock()

	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	// A standby also turns between ticks, at the moment the peer falls
	// silent and at the moment the peer's lease runs out (nextWake): a
	// takeover that waited for the next tick would come up to an interval
	// late, after the first retransmission of the flows it carries.
	wake := time.NewTimer(time.Hour)
	wake.Stop()
	defer wake.Stop()
	for {
		healthy := r.healthy()
		rules := r.rulesReady()
		r.beatHealthy.Store(healthy && rules)
		r.step(ctx, healthy, rules)
		if d, ok := r.nextWake(); ok {
			wake.Reset(d)
		} else {
			wake.Stop()
		}
		select {
		case <-ctx.Done():
			cancel()
			udp.Close()
			if r.Role() == RoleActive {
				r.stepDown("stopped", false)
			}
			return nil
		case <-tick.C:
		case <-wake.C:
		case <-r.nudge:
		}
	}
}

// sendBeats sends a beat to the peer every interval, from its own
// goroutine: a fence call that takes long (up to what the lease leaves)
// must not make this replica look silent, and the beats' regularity is
// what keptByPeer relies on.
func (r *Replica) sendBeats(ctx context.Context, udp *net.UDPConn) {
	tick := time.NewTicker(r.cfg.Interval)
	defer tick.Stop()
	var seq uint64
	for {
		r.recordBeat(time.Now())
		seq++
		role := r.Role()
		b := beat{Role: role, Healthy: r.beatHealthy.Load(), Synced: r.synced() || role == RoleActive, Seq: seq}
		// A lost beat is what the peer's detector is for.
		if p := r.Peer(); p.IsValid() {
			_, _ = udp.WriteToUDP(b.marshal(), net.UDPAddrFromAddrPort(p))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-r.beatNow:
		}
	}
}

// beatSoon asks sendBeats for a beat now.
func (r *Replica) beatSoon() {
	select {
	case r.beatNow <- struct{}{}:
	default:
	}
}

// nextWake returns when a replica should turn before its next tick: a
// standby just after the peer would become silent, after the peer's lease
// runs out (as the fence said) and after its own listening period ends; an
// active whose lease is not valid just after its peer's last beat stops
// counting (keepUntil); false when none of these is ahead.
func (r *Replica) nextWake() (time.Duration, bool) {
	const after = time.Millisecond // past the instant, not at it
	now := time.Now()
	r.mu.Lock()
	seen := r.peer.seen
	r.mu.Unlock()
	instants := []time.Time{seen.Add(r.detection()), r.heldUntil, r.healthySince.Add(r.detection())}
	if r.Role() == RoleActive {
		instants = nil
		if !r.leaseValid(r.cfg.Interval + r.margin()) {
			instants = []time.Time{r.keepUntil(seen)}
		}
	}
	var next time.Time
	for _, t := range instants {
		if t.IsZero() || !t.After(now.Add(-after)) {
			continue
		}
		if t = t.Add(after); next.IsZero() || t.Before(next) {
			next = t
		}
	}
	if next.IsZero() {
		return 0, false
	}
	return next.Sub(now), true
}

// margin is how long before its lease runs out (by its own clock) an
// active that could not renew stops answering: half an interval, or a
// tenth of the lease when that is more (a longer lease is for a slower
// arbiter), for the time the step-down takes, a clock that differs from
// the fence's and a late wake-up (see README "Timing").
func (r *Replica) margin() time.Duration { return max(r.cfg.Interval/2, r.cfg.LeaseTTL/10) }

func (r *Replica) readBeats(ctx context.Context, udp *net.UDPConn) {
	buf := make([]byte, 64)
	for ctx.Err() == nil {
		n, from, err := udp.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if p := r.Peer(); !p.IsValid() || from.Addr().Unmap() != p.Addr() {
			continue
		}
		b, err := parseBeat(buf[:n])
		if err != nil {
			r.cfg.Log.V(1).Info("bad heartbeat", "from", from.String(), "err", err)
			continue
		}
		r.mu.Lock()
		fresh := b.Seq > r.peer.beat.Seq || b.Seq == 1 || time.Since(r.peer.seen) > r.detection()
		if fresh {
			r.peer.seen, r.peer.beat = time.Now(), b
		}
		r.mu.Unlock()
		if fresh && b.Role == RoleActive {
			r.liveTable.Store(false) // the peer leads: new flows are its
		}
		if fresh && b.Role == RoleActive && r.Role() == RoleActive {
			select {
			case r.nudge <- struct{}{}:
			default:
			}
		}
	}
}

func (r *Replica) detection() time.Duration { return time.Duration(r.cfg.Misses) * r.cfg.Interval }

// healthy reports whether both interfaces are up: a replica without them
// cannot carry the traffic, so it does not lead.
func (r *Replica) healthy() bool {
	for _, dev := range []string{r.cfg.ExternalInterface, r.cfg.InternalInterface} {
		up, err := r.plumb.Up(dev)
		if err != nil || !up {
			return false
		}
	}
	return true
}

// rulesReady calls Config.RulesReady and logs each change of its answer.
func (r *Replica) rulesReady() bool {
	if r.cfg.RulesReady == nil {
		r.rulesOK.Store(true)
		return true
	}
	err := r.cfg.RulesReady()
	r.rulesOK.Store(err == nil)
	switch {
	case err == nil && r.rulesErr != nil:
		r.cfg.Log.Info("rules ready: this replica may lead")
	case err != nil && (r.rulesErr == nil || err.Error() != r.rulesErr.Error()):
		r.cfg.Log.Info("rules not ready: this replica does not lead until they are", "reason", err.Error())
	}
	r.rulesErr = err
	return err == nil
}

// step is one turn of the role state machine; rules is what rulesReady
// answered.
func (r *Replica) step(ctx context.Context, healthy, rules bool) {
	cfg := r.cfg
	r.mu.Lock()
	seen := r.peer.seen
	silent := time.Since(seen) > r.detection()
	pb := r.peer.beat
	r.mu.Unlock()
	switch r.Role() {
	case RoleStandby:
		switch {
		case !silent:
			r.silentSince = time.Time{}
		case r.silentSince.IsZero():
			r.silentSince = time.Now()
		}
		if !healthy {
			r.healthySince = time.Time{}
			return
		}
		if r.healthySince.IsZero() {
			r.healthySince = time.Now()
		}
		if !rules {
			// Not synced yet: leading now would carry traffic
			// through an empty (or stale) table.
			return
		}
		if time.Since(r.healthySince) <= r.detection() && (silent || pb.Seq == 0) {
			// Interfaces just came up: listen for the peer for one
			// detection interval before asking for the lease.
			return
		}
		if !silent && (pb.Role == RoleActive || pb.Seq == 0) {
			// The peer leads, or this replica just started and has
			// not heard it yet: a live active renews its lease, but
			// a busy one may renew late, and taking over from a live
			// active is a needless failover.
			return
		}
		if !silent && pb.Healthy && pb.Synced && !r.synced() {
			return // the peer is the better leader; let it take the lease
		}
		// A fence call may take one interval.
		fctx, cancel := context.WithTimeout(ctx, cfg.Interval)
		defer cancel()
		start := time.Now()
		if err := cfg.Fence.Acquire(fctx, cfg.ID, cfg.LeaseTTL); err != nil {
			// Held: ask again when the peer's lease runs out
			// (nextWake), not at the next tick.
			r.heldUntil = heldUntil(err)
			if !errors.Is(err, ErrHeld) {
				r.fenceErrors.Add(1)
				cfg.Log.Info("fence not reachable; staying standby", "err", err)
			}
			return
		}
		acquired := time.Now()
		r.heldUntil = time.Time{}
		r.leaseUntil.Store(start.Add(cfg.LeaseTTL).UnixNano())
		reason, kind := "peer silent", 0
		tl := Takeover{PeerLastSeen: seen, Detected: r.silentSince, Acquired: acquired}
		if !silent {
			reason, kind = fmt.Sprintf("peer %s (healthy=%t)", pb.Role, pb.Healthy), 1
			tl.Detected = time.Time{}
		}
		if r.becomeActive(ctx, reason, tl) {
			r.takeovers[kind].Add(1)
		}
	case RoleActive:
		if !healthy {
			r.stepDown("own interface down", true)
			return
		}
		// Renew within what the lease leaves before the margin: a
		// call that fails or hangs (an API server that stopped
		// answering) still ends while the lease runs, and the
		// step-down that follows comes before the lease can run out.
		// A turn that came late (a starved node) still asks, briefly:
		// the fence's answer decides (held: the peer has it, step
		// down; granted: nobody took it, so nobody else answered), and
		// a call that hangs keeps this replica answering at most a
		// fifth of an interval longer.
		if !silent && pb.Role == RoleActive && !r.leaseValid(r.margin()) {
			// The peer leads: it acquired the lease this replica
			// could not renew (its beat woke this turn, readBeats).
			r.stepDown("lease not renewed; the peer is active", false)
			return
		}
		budget := max(time.Until(time.Unix(0, r.leaseUntil.Load()))-r.margin(), cfg.Interval/5)
		fctx, cancel := context.WithTimeout(ctx, budget)
		defer cancel()
		start := time.Now()
		err := cfg.Fence.Acquire(fctx, cfg.ID, cfg.LeaseTTL)
		switch {
		case err == nil:
			r.leaseUntil.Store(start.Add(cfg.LeaseTTL).UnixNano())
			r.followEIPs()
			r.followPeer()
		case errors.Is(err, ErrHeld):
			r.stepDown("lease taken by the peer", false)
		default:
			r.fenceErrors.Add(1)
			if r.leaseValid(cfg.Interval + r.margin()) {
				return // the next turn may try again
			}
			// The lease could run out (less the margin) before the
			// next turn. A standby heard fresh cannot take over
			// before it finds this replica silent and acquires the
			// lease (README "Timing"): keep answering while that
			// holds.
			// The peer's beat as of now (the call took time).
			r.mu.Lock()
			seen, pb = r.peer.seen, r.peer.beat
			r.mu.Unlock()
			if r.keptByPeer(time.Now(), seen, pb) {
				r.keptTurns.Add(1)
				if time.Since(r.keptLog) >= keptLogEvery {
					r.keptLog = time.Now()
					cfg.Log.Info("lease not renewed; still answering: the peer is heard and standby", "err", err.Error(), "keptTurns", r.keptTurns.Load())
				}
				return
			}
			// Otherwise stop answering now, before the peer may take
			// it.
			r.stepDown(fmt.Sprintf("lease not renewed (peer %s, last heard %s ago): %v", pb.Role, time.Since(seen).Round(time.Millisecond), err), true)
		}
	}
}

// keptLogEvery rate-limits the log line of kept turns (the counter
// KeptByPeer has them all).
const keptLogEvery = 5 * time.Second

// stallGap is the longest gap between two of its own beats that is not a
// stall: the detection interval less an interval (2 intervals at 3
// misses). After a longer one (SIGSTOP, a starved process) the standby
// may have found this replica silent, and beats read late from the
// socket's buffer look fresh: no keeping for a detection interval.
func (r *Replica) stallGap() time.Duration { return r.detection() - r.cfg.Interval }

// recordBeat notes that a beat went out at t (sendBeats).
func (r *Replica) recordBeat(t time.Time) {
	ns := t.UnixNano()
	if last := r.lastBeat.Load(); last != 0 && ns-last > int64(r.stallGap()) {
		r.irregularAt.Store(ns)
	}
	r.lastBeat.Store(ns)
	r.sent.Lock()
	r.sent.at[r.sent.n%len(r.sent.at)] = ns
	r.sent.n++
	r.sent.Unlock()
}

// beatBefore returns the send time of this replica's last beat at or
// before t (zero when none is remembered).
func (r *Replica) beatBefore(t time.Time) time.Time {
	ns := t.UnixNano()
	var best int64
	r.sent.Lock()
	for _, at := range r.sent.at {
		if at != 0 && at <= ns && at > best {
			best = at
		}
	}
	r.sent.Unlock()
	if best == 0 {
		return time.Time{}
	}
	return time.Unix(0, best)
}

// keepUntil is until when an active whose lease is not valid may keep
// answering on the strength of the peer's beat received at seen (zero:
// not at all). That beat proves the path from the peer worked then; were
// the heartbeat path then cut both ways, the standby has this replica's
// beats up to b, its last one sent before seen, so it cannot find it
// silent, and acquire, before b + the detection interval. keepUntil is
// that instant less the next turn's fence call (a fifth of an interval)
// and a quarter of an interval to spare (the wake-up, the deadline's
// overshoot, removing the addresses), so the turn after it has stopped
// answering before the standby may lead. At the defaults, with beats on
// time, it is 1.55 intervals after b: the peer's next beat may come up to
// ~27 ms late. Off below 3 misses (it would not survive one late beat).
func (r *Replica) keepUntil(seen time.Time) time.Time {
	i := r.cfg.Interval
	if r.cfg.Misses < 3 {
		return time.Time{}
	}
	b := r.beatBefore(seen)
	if b.IsZero() {
		return time.Time{}
	}
	return b.Add(r.detection() - i/5 - i/4)
}

// keptByPeer reports whether an active whose lease renewal failed and whose
// lease is about to run out may keep answering at now: the peer's last
// beat (received at seen) said standby, now is before keepUntil(seen), and
// this replica's own beats went out without a stall (stallGap) in the last
// detection interval and until now. The standby takes over only from an
// active it finds silent; unless the path to it is cut one way (then the
// standby takes over and its next beat, saying active, makes this replica
// step down: readBeats nudges the loop) or both ways (keepUntil), it
// cannot have. A stalled process (SIGSTOP, starved) gives no such
// assurance: it steps down as before.
func (r *Replica) keptByPeer(now, seen time.Time, pb beat) bool {
	until := r.keepUntil(seen)
	return !until.IsZero() && pb.Seq != 0 && pb.Role == RoleStandby && now.Before(until) &&
		now.UnixNano()-r.lastBeat.Load() <= int64(r.stallGap()) && now.UnixNano()-r.irregularAt.Load() > int64(r.detection())
}

// leaseValid reports whether this replica's lease still runs for more than
// margin.
func (r *Replica) leaseValid(margin time.Duration) bool {
	return time.Now().Add(margin).UnixNano() < r.leaseUntil.Load()
}

// becomeActive takes the floating addresses and starts streaming; false
// when the takeover failed (the replica stays standby).
func (r *Replica) becomeActive(ctx context.Context, reason string, tl Takeover) bool {
	cfg := r.cfg
	r.recv.Pause(true)
	if err := r.claim(); err != nil {
		cfg.Log.Error(err, "takeover failed; stepping back")
		_ = r.release()
		_ = cfg.Fence.Release(ctx, cfg.ID)
		r.recv.Pause(false)
		return false
	}
	tl.Claimed = time.Now()
	r.role.Store(uint32(RoleActive))
	r.beatSoon()
	r.toActive.Add(1)
	r.mu.Lock()
	r.takeover = tl
	r.mu.Unlock()
	// The announcements below end with the role (sctx), whether or not
	// a sender runs.
	sctx, stopAnn := context.WithCancel(ctx)
	r.mu.Lock()
	r.senderCtx = sctx
	r.stopAnn = stopAnn
	r.mu.Unlock()
	r.startSender()
	// Announce again shortly after: a neighbour that was busy (or a
	// bridge that flooded) gets a second chance.
	go func() {
		for _, d := range []time.Duration{3 * cfg.Interval, time.Second} {
			select {
			case <-sctx.Done():
				return
			case <-time.After(d):
			}
			// Not on a lease that may have run out: a replica that was
			// stopped and resumes would pull the addresses back from
			// the new active before its loop notices.
			if sctx.Err() != nil || !r.leaseValid(r.margin()) {
				return
			}
			_ = r.plumb.Announce(cfg.ExternalInterface, r.heldEIPs())
			_ = r.plumb.Announce(cfg.InternalInterface, cfg.LanIPs)
		}
	}()
	cfg.Log.Info("role change", "role", "active", "reason", reason, "timeline", tl.String())
	if cfg.OnRole != nil {
		cfg.OnRole(RoleActive, reason)
	}
	return true
}

// synced reports whether this replica's conntrack table is complete: its
// receiver completed a full dump of the current session, or it holds the
// live table (liveTable). A standby that is not lets a synced healthy peer
// lead first (step): without liveTable, an active that stepped down by
// itself while its peer was down (a lease renewal answered too late on a
// starved node) would count as unsynced, and the peer, restarted with an
// empty table, could take the lease from it.
func (r *Replica) synced() bool { return r.recv.Synced() || r.liveTable.Load() }

// stepDown makes this replica standby; live says its table stays the live
// one (it steps down by itself, not because the peer leads: liveTable).
func (r *Replica) stepDown(reason string, live bool) {
	cfg := r.cfg
	r.liveTable.Store(live)
	// Addresses first: from here on this replica answers for nothing.
	if err := r.release(); err != nil {
		cfg.Log.Error(err, "removing floating addresses")
	}
	r.role.Store(uint32(RoleStandby))
	r.beatSoon()
	r.toStandby.Add(1)
	r.stopSender()
	r.mu.Lock()
	if r.stopAnn != nil {
		r.stopAnn()
	}
	r.stopAnn, r.senderCtx = nil, nil
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Interval)
	defer cancel()
	if err := cfg.Fence.Release(ctx, cfg.ID); err != nil {
		cfg.Log.Info("lease not released (it runs out by itself)", "err", err)
	}
	r.recv.Pause(false)
	cfg.Log.Info("role change", "role", "standby", "reason", reason)
	if cfg.OnRole != nil {
		cfg.OnRole(RoleStandby, reason)
	}
}

// startSender starts the conntrack stream to the peer's current address
// (none while it is unknown); active replica only.
func (r *Replica) startSender() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.senderCtx == nil || !r.peer.addr.IsValid() || r.stopTx != nil {
		return
	}
	s := &ctsync.Sender{Peer: r.peer.addr.String(), NS: r.ns, Log: r.cfg.Log}
	sctx, stop := context.WithCancel(r.senderCtx)
	done := make(chan struct{})
	r.sender, r.stopTx, r.txDone = s, stop, done
	go func() {
		defer close(done)
		if err := s.Run(sctx); err != nil {
			r.cfg.Log.Error(err, "conntrack replication stopped")
		}
	}()
}

// stopSender stops the conntrack stream, if one runs, and waits for it.
func (r *Replica) stopSender() {
	r.mu.Lock()
	stop, done := r.stopTx, r.txDone
	r.stopTx, r.txDone = nil, nil
	r.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

// followPeer restarts an active replica's conntrack stream when the peer's
// address changed (SetPeer), or starts it when the peer became known.
func (r *Replica) followPeer() {
	r.mu.Lock()
	running := r.stopTx != nil
	moved := running && r.sender != nil && r.sender.Peer != r.peer.addr.String()
	r.mu.Unlock()
	if moved {
		r.stopSender()
	}
	if moved || !running {
		r.startSender()
	}
}

// heldEIPs returns the EIPs this replica holds (none while standby).
func (r *Replica) heldEIPs() []netip.Prefix {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.held)
}

// followEIPs makes an active replica's EIPs the wanted set: the dropped
// ones go first, then the new ones are added and announced. What failed is
// tried again on the next turn (held keeps what is known to be there).
func (r *Replica) followEIPs() {
	r.mu.Lock()
	want, held := slices.Clone(r.eips), slices.Clone(r.held)
	r.mu.Unlock()
	var gone, added []netip.Prefix
	for _, p := range held {
		if !slices.Contains(want, p) {
			gone = append(gone, p)
		}
	}
	for _, p := range want {
		if !slices.Contains(held, p) {
			added = append(added, p)
		}
	}
	if len(gone) == 0 && len(added) == 0 {
		return
	}
	if err := r.plumb.Unclaim(r.cfg.ExternalInterface, gone); err != nil {
		r.cfg.Log.Error(err, "removing dropped EIPs", "eips", gone)
		return
	}
	r.mu.Lock()
	r.held = slices.DeleteFunc(r.held, func(p netip.Prefix) bool { return slices.Contains(gone, p) })
	r.mu.Unlock()
	if err := r.plumb.Claim(r.cfg.ExternalInterface, added); err != nil {
		// Some may be on the interface: remove them so that held stays
		// exact; the next turn tries again.
		_ = r.plumb.Unclaim(r.cfg.ExternalInterface, added)
		r.cfg.Log.Error(err, "adding new EIPs", "eips", added)
		return
	}
	r.mu.Lock()
	r.held = append(r.held, added...)
	r.mu.Unlock()
	r.cfg.Log.Info("floating EIPs changed", "added", added, "removed", gone)
}

func (r *Replica) claim() error {
	r.mu.Lock()
	eips := slices.Clone(r.eips)
	r.mu.Unlock()
	if err := r.plumb.Claim(r.cfg.ExternalInterface, eips); err != nil {
		return fmt.Errorf("ha: takeover: %w", err)
	}
	r.mu.Lock()
	r.held = eips
	r.mu.Unlock()
	if err := r.plumb.Claim(r.cfg.InternalInterface, r.cfg.LanIPs); err != nil {
		return fmt.Errorf("ha: takeover: %w", err)
	}
	return nil
}

// release removes every floating address this replica holds or wants.
func (r *Replica) release() error {
	r.mu.Lock()
	eips := append(slices.Clone(r.held), r.eips...)
	r.held = nil
	r.mu.Unlock()
	return errors.Join(r.plumb.Unclaim(r.cfg.ExternalInterface, eips), r.plumb.Unclaim(r.cfg.InternalInterface, r.cfg.LanIPs))
}
