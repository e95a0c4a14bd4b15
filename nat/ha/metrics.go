package ha

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/natgw/natgw/nat/ha/ctsync"
)

// Status is a replica's role and counters since it started.
type Status struct {
	Role Role
	// RulesReady is the last answer of Config.RulesReady (true without
	// one): false while the replica may not lead for want of rules.
	RulesReady bool
	// ToActive and ToStandby count role changes (a takeover, a step-down).
	ToActive, ToStandby int64
	// TakeoversPeerSilent counts takeovers after the peer fell silent
	// (failovers); TakeoversPeerNotActive those from a live peer that was
	// not active (it stepped down, was unhealthy, or both had just
	// started).
	TakeoversPeerSilent, TakeoversPeerNotActive int64
	// FenceErrors counts Acquire calls that failed with an error other
	// than ErrHeld (the arbiter or API server could not be used).
	FenceErrors int64
	// KeptByPeer counts an active's turns that found its lease unrenewed
	// and about to run out but kept answering because its peer, heard
	// fresh, said it is standby (see README "Timing"): renew failures
	// that did not become role changes.
	KeptByPeer int64
	// Sender are the counters of the current (or last) term as active,
	// without lag samples; Receiver the standby side's.
	Sender   ctsync.SenderStats
	Receiver ctsync.ReceiverStats
	// LastTakeover is the timeline of this replica's last takeover (zero
	// before the first).
	LastTakeover Takeover
}

// Takeover is the timeline of one takeover, for measuring where its time
// goes: the peer's last beat arrived (PeerLastSeen), this standby found
// the peer silent (Detected: one detection interval later; zero when it
// took over from a live peer that was not active), the fence granted the
// lease (Acquired: when the peer's lease ran out) and the floating
// addresses were on the interfaces and announced, gratuitous ARPs and
// neighbour advertisements sent (Claimed, just before the role change is
// reported).
type Takeover struct {
	PeerLastSeen, Detected, Acquired, Claimed time.Time
}

// String gives each phase's time from the peer's last beat.
func (t Takeover) String() string {
	if t.Claimed.IsZero() {
		return "none"
	}
	ms := func(at time.Time) string {
		if at.IsZero() {
			return "-"
		}
		return at.Sub(t.PeerLastSeen).Round(100 * time.Microsecond).String()
	}
	return fmt.Sprintf("from the last beat: detected +%s, lease +%s, claimed and announced +%s", ms(t.Detected), ms(t.Acquired), ms(t.Claimed))
}

// Status returns the replica's role and counters.
func (r *Replica) Status() Status {
	st := Status{Role: r.Role(), RulesReady: r.rulesOK.Load(), ToActive: r.toActive.Load(), ToStandby: r.toStandby.Load(),
		TakeoversPeerSilent: r.takeovers[0].Load(), TakeoversPeerNotActive: r.takeovers[1].Load(),
		FenceErrors: r.fenceErrors.Load(), KeptByPeer: r.keptTurns.Load(), Receiver: r.recv.Stats()}
	r.mu.Lock()
	s := r.sender
	r.mu.Unlock()
	if s != nil {
		st.Sender = s.Counters()
	}
	r.mu.Lock()
	st.LastTakeover = r.takeover
	r.mu.Unlock()
	return st
}

// Collector exports a replica's Status as Prometheus metrics (natgw_ha_*),
// read at every scrape. Register it with NewCollector(r.Status).
type Collector struct {
	status func() Status

	active, rulesReady, roleChanges, takeovers, fenceErrors, kept, lag *prometheus.Desc
	sent, dumps, overruns, applied, failed                             *prometheus.Desc
}

// NewCollector returns the collector of the replica whose Status status
// returns.
func NewCollector(status func() Status) *Collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("natgw_ha_"+name, help, labels, nil)
	}
	return &Collector{status: status,
		active:      d("active", "1 while this replica is active (holds the floating addresses), 0 while standby."),
		rulesReady:  d("rules_ready", "1 when this replica's rules are ready (synced since it started) or it has no such gate, 0 while it may not lead for want of them."),
		roleChanges: d("role_changes_total", "Role changes of this replica, by the role it changed to.", "role"),
		takeovers:   d("takeovers_total", "Takeovers by this replica, by the peer's state: silent (a failover) or alive but not active.", "peer"),
		kept:        d("lease_kept_by_peer_total", "Turns of the active whose lease renewal failed with the lease about to run out, kept answering because its standby peer, heard fresh, cannot take over (no role change)."),
		fenceErrors: d("fence_errors_total", "Fence (lease) calls that failed for a reason other than the lease being held by the peer (arbiter or API server unusable)."),
		lag:         d("replication_lag_seconds", "Active only: time from the kernel's conntrack event to the standby's acknowledged write, of the last acknowledged frame (0 before the first)."),
		sent:        d("replication_sent_entries_total", "Conntrack entries sent to the standby in this replica's current or last term as active."),
		dumps:       d("replication_received_dumps_total", "Full conntrack dumps received and applied as standby."),
		overruns:    d("replication_overruns_total", "Conntrack event socket overruns in this replica's current or last term as active (each forces a full dump)."),
		applied:     d("replication_applied_entries_total", "Replicated entries written into this replica's conntrack table as standby."),
		failed:      d("replication_failed_entries_total", "Replicated entries the kernel refused to write as standby."),
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.active, c.rulesReady, c.roleChanges, c.takeovers, c.fenceErrors, c.kept, c.lag, c.sent, c.dumps, c.overruns, c.applied, c.failed} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	active := 0.0
	if st.Role == RoleActive {
		active = 1
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge(c.active, active)
	ready := 0.0
	if st.RulesReady {
		ready = 1
	}
	gauge(c.rulesReady, ready)
	counter(c.roleChanges, st.ToActive, "active")
	counter(c.roleChanges, st.ToStandby, "standby")
	counter(c.takeovers, st.TakeoversPeerSilent, "silent")
	counter(c.takeovers, st.TakeoversPeerNotActive, "not_active")
	counter(c.fenceErrors, st.FenceErrors)
	counter(c.kept, st.KeptByPeer)
	lag := 0.0
	if st.Role == RoleActive {
		lag = st.Sender.LastLag.Seconds()
	}
	gauge(c.lag, lag)
	counter(c.sent, st.Sender.Sent)
	counter(c.overruns, st.Sender.Overruns)
	counter(c.dumps, st.Receiver.Dumps)
	counter(c.applied, st.Receiver.Applied)
	counter(c.failed, st.Receiver.Failed)
}
