package transport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

// ReplicasAnnotation is natgw's annotation for the number of a gateway's
// replicas (a two-replica HA gateway): on a VpcNatGateway the number asked for, on the pod
// template (and so on the pods) of a gateway provisioned with two replicas
// "2". The exec transport reads it on the pods: a pod carrying "2" belongs
// to an HA pair, whose agents run `serve --rules-only` (natgw ha floats the
// addresses) and are reached as a Pair.
const ReplicasAnnotation = "natgw.kubeovn.io/replicas"

// Member is one replica's agent session of a Pair.
type Member struct {
	// Pod names the replica (the pod; the Lease holder's identity).
	Pod string
	Session
}

// Pair is the session of a two-replica gateway: one agent session per
// running replica, every change sent to each of them. A call returns when
// the active replica (Active) carried it out: that is when the object is
// programmed where the traffic goes, so a two-replica object is Ready as
// soon as a one-replica one would be. The standbys get the same change
// from the Pair's own worker, in the order the calls were made (a later
// change of an object never overtakes an earlier one on a standby), at
// most StandbyQueue changes behind the active (a call waits for room
// beyond that); how long each took to reach them is the histogram
// natgw_gateway_standby_apply_delay_seconds. A standby that failed a call
// is behind, which StandbyLag reports, and the Pair ends (Done, Err says
// which replica) so that the caller reconnects: the transport's Open
// brings every standby in step with the active (Sync of the active's
// fresh list) before it returns the new Pair. While no replica is known to
// be active (none holds the Lease yet), every replica must carry a call
// out for it to return success. Reads (List, Info's data plane, version and
// counts) come from the active, or from the first replica by pod name
// when none is known; Info's boot id joins every replica's, so that a
// replica that restarted (a new boot id) makes the caller sync the whole
// desired set, to every replica.
type Pair struct {
	gw      Endpoint
	members []Member // by pod name
	log     logr.Logger

	mu     sync.Mutex
	active string    // pod holding the Lease ("" none)
	behind time.Time // since when a standby has missed a change (zero: in step)
	err    error
	done   chan struct{}
	stop   context.CancelFunc

	// queue holds the changes the standbys are still to get, in call
	// order; queued the enqueue times of the changes not yet carried out
	// on them, oldest first (under mu).
	queue  chan standbyJob
	queued []time.Time
	// drained is closed while queued is empty; a new one is made when
	// the first change is queued (under mu): Flush waits on it.
	drained chan struct{}
}

// StandbyQueue is how many changes a two-replica gateway's standbys may be
// behind the active before a call waits for them.
const StandbyQueue = 1024

// StandbyCallTimeout bounds one change's call on a standby (the caller's
// context is not the standby's: the call returned with the active's
// result).
const StandbyCallTimeout = 30 * time.Second

// StandbyBehindAfter is how long a change may wait for the standbys in
// the Pair's queue before StandbyLag counts them behind: under a burst of
// changes the standbys trail the active by design, which is not a
// failure to report.
const StandbyBehindAfter = time.Second

// standbyJob is one change for the standbys.
type standbyJob struct {
	op      string
	call    func(context.Context, Session) error
	members []Member
	at      time.Time
}

// NewPair returns the Pair of members (at least one). active is the pod
// that holds the gateway's Lease now ("" none); SetActive changes it.
// Closing the Pair closes the members; a member whose session ends ends
// the Pair.
func NewPair(gw Endpoint, members []Member, active string, log logr.Logger) (*Pair, error) {
	if len(members) == 0 {
		return nil, fmt.Errorf("gateway %s: a pair needs at least one replica", gw.Name)
	}
	ms := append([]Member(nil), members...)
	sort.Slice(ms, func(i, j int) bool { return ms[i].Pod < ms[j].Pod })
	ctx, stop := context.WithCancel(context.Background())
	p := &Pair{gw: gw, members: ms, log: log, active: active, done: make(chan struct{}), stop: stop, queue: make(chan standbyJob, StandbyQueue), drained: closedChan()}
	go p.standbyWorker(ctx)
	for _, m := range ms {
		go func() {
			select {
			case <-ctx.Done():
			case <-m.Done():
				p.end(fmt.Errorf("replica %s: %w", m.Pod, sessionErr(m.Session)))
			}
		}()
	}
	return p, nil
}

func sessionErr(s Session) error {
	if err := s.Err(); err != nil {
		return err
	}
	return errors.New("session ended")
}

// Members returns the replicas' pod names, sorted.
func (p *Pair) Members() []string {
	out := make([]string, len(p.members))
	for i, m := range p.members {
		out[i] = m.Pod
	}
	return out
}

// SetActive records which pod holds the gateway's Lease ("" none).
func (p *Pair) SetActive(pod string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.active = pod
}

// Active returns the pod that holds the gateway's Lease ("" none).
func (p *Pair) Active() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.active
}

// StandbyLag is how long a standby has been missing a change (0: every
// replica the Pair reaches holds every change the active holds, or got
// the changes it has still to get less than StandbyBehindAfter ago).
func (p *Pair) StandbyLag() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.behind.IsZero() {
		return time.Since(p.behind)
	}
	if len(p.queued) > 0 {
		if lag := time.Since(p.queued[0]); lag >= StandbyBehindAfter {
			return lag
		}
	}
	return 0
}

// markBehind records that a standby misses changes from now on (unless it
// already did).
func (p *Pair) markBehind() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.behind.IsZero() {
		p.behind = time.Now()
	}
}

// end ends the Pair with err (the first reason wins).
func (p *Pair) end(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return
	}
	p.err = err
	close(p.done)
}

// Done is closed when a replica's session ended, a standby fell behind or
// the Pair was closed.
func (p *Pair) Done() <-chan struct{} { return p.done }

// Err says why the Pair ended (nil while it works).
func (p *Pair) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Close closes every replica's session; the kernel state stays.
func (p *Pair) Close() error {
	p.end(errors.New("closed"))
	p.stop()
	var errs []error
	for _, m := range p.members {
		if err := m.Close(); err != nil {
			errs = append(errs, fmt.Errorf("replica %s: %w", m.Pod, err))
		}
	}
	return errors.Join(errs...)
}

// primary is the member reads go to and whose result a change returns:
// the active one; the first one while none is known to be active. ok is
// false when the active pod is not a member (the Pair cannot tell whether
// the active carried a change out).
func (p *Pair) primary() (m Member, known, ok bool) {
	act := p.Active()
	if act == "" {
		return p.members[0], false, true
	}
	for _, m := range p.members {
		if m.Pod == act {
			return m, true, true
		}
	}
	return Member{}, true, false
}

// change runs call on the active and returns its result, the standbys
// getting it from the Pair's worker (standbyWorker); while none is active
// (or the active is not a member), on every member at once, returning
// every member's result.
func (p *Pair) change(ctx context.Context, op string, call func(context.Context, Session) error) error {
	prim, known, ok := p.primary()
	if known && ok {
		var standbys []Member
		for _, m := range p.members {
			if m.Pod != prim.Pod {
				standbys = append(standbys, m)
			}
		}
		if err := p.enqueue(ctx, standbyJob{op: op, call: call, members: standbys}); err != nil {
			return fmt.Errorf("gateway %s: %s: wait for the standbys' queue: %w", p.gw.Name, op, err)
		}
		if err := call(ctx, prim.Session); err != nil {
			return fmt.Errorf("replica %s: %w", prim.Pod, err)
		}
		return nil
	}
	errs := make([]error, len(p.members))
	var wg sync.WaitGroup
	for i, m := range p.members {
		wg.Go(func() { errs[i] = call(ctx, m.Session) })
	}
	wg.Wait()
	if !ok {
		return fmt.Errorf("gateway %s: %s: the active replica %s is not reached (replicas %s)", p.gw.Name, op, p.Active(), strings.Join(p.Members(), ", "))
	}
	var out []error
	for i, m := range p.members {
		if errs[i] != nil {
			out = append(out, fmt.Errorf("replica %s: %w", m.Pod, errs[i]))
		}
	}
	return errors.Join(out...)
}

// enqueue adds j to the standbys' queue (nothing when there are none or
// the Pair ended: the reopened Pair catches them up), waiting for room.
// Calls made one after the other reach the standbys in that order (the
// first is queued before it returns); concurrent calls in either.
func (p *Pair) enqueue(ctx context.Context, j standbyJob) error {
	if len(j.members) == 0 {
		return nil
	}
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return nil
	}
	j.at = time.Now()
	if len(p.queued) == 0 {
		p.drained = make(chan struct{})
	}
	p.queued = append(p.queued, j.at)
	p.mu.Unlock()
	select {
	case p.queue <- j:
		return nil
	case <-p.done:
		p.unqueue(j.at)
		return nil
	case <-ctx.Done():
		p.unqueue(j.at)
		return ctx.Err()
	}
}

// unqueue removes a job's enqueue time from queued (which stays oldest
// first: times are appended in order).
func (p *Pair) unqueue(at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := slices.Index(p.queued, at); i >= 0 {
		p.queued = slices.Delete(p.queued, i, i+1)
		if len(p.queued) == 0 {
			close(p.drained)
		}
	}
}

// closedChan returns a closed channel.
func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// standbyWorker gives the standbys the queued changes, one at a time in
// order, until the Pair is closed. A standby's failure marks it behind
// and ends the Pair; after the end the rest of the queue is dropped (the
// reopened Pair syncs the standbys from the active).
func (p *Pair) standbyWorker(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-p.queue:
			p.runStandby(ctx, j)
			p.unqueue(j.at)
		}
	}
}

func (p *Pair) runStandby(ctx context.Context, j standbyJob) {
	if p.Err() != nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, StandbyCallTimeout)
	defer cancel()
	errs := make([]error, len(j.members))
	var wg sync.WaitGroup
	for i, m := range j.members {
		wg.Go(func() { errs[i] = j.call(cctx, m.Session) })
	}
	wg.Wait()
	if ctx.Err() != nil {
		return // closed: the failures are the close's
	}
	failed := false
	for i, m := range j.members {
		if errs[i] == nil {
			continue
		}
		failed = true
		// A standby that missed a change: the active has it (the
		// object is programmed where the traffic goes); the standby
		// is brought in step by the next Open.
		err := fmt.Errorf("replica %s: %w", m.Pod, errs[i])
		p.markBehind()
		p.log.Info("standby replica missed a change; reconnecting to bring it in step", "pod", m.Pod, "op", j.op, "err", err.Error())
		p.end(fmt.Errorf("standby %w", err))
	}
	if !failed {
		standbyApplyDelay.WithLabelValues(p.gw.Name).Observe(time.Since(j.at).Seconds())
	}
}

// Flush waits until the standbys got every change made before it (or
// the Pair ended: Err says why).
func (p *Pair) Flush(ctx context.Context) error {
	p.mu.Lock()
	err, drained := p.err, p.drained
	p.mu.Unlock()
	if err != nil {
		return err
	}
	select {
	case <-drained:
		return nil
	case <-p.done:
		return p.Err()
	case <-ctx.Done():
		p.mu.Lock()
		n := len(p.queued)
		p.mu.Unlock()
		return fmt.Errorf("gateway %s: %d changes still to reach the standbys: %w", p.gw.Name, n, ctx.Err())
	}
}

// Apply implements agentapi.Agent on every replica.
func (p *Pair) Apply(ctx context.Context, objs ...nat.Object) error {
	objs = slices.Clone(objs) // the standbys use it after Apply returned
	return p.change(ctx, "apply", func(ctx context.Context, s Session) error { return s.Apply(ctx, objs...) })
}

// Delete implements agentapi.Agent on every replica.
func (p *Pair) Delete(ctx context.Context, uids ...string) error {
	uids = slices.Clone(uids)
	return p.change(ctx, "delete", func(ctx context.Context, s Session) error { return s.Delete(ctx, uids...) })
}

// Sync implements agentapi.Agent on every replica.
func (p *Pair) Sync(ctx context.Context, desired []nat.Object) error {
	desired = slices.Clone(desired)
	return p.change(ctx, "sync", func(ctx context.Context, s Session) error { return s.Sync(ctx, desired) })
}

// List reads the primary replica's objects.
func (p *Pair) List(ctx context.Context, fresh bool) ([]nat.Object, error) {
	prim, _, ok := p.primary()
	if !ok {
		return nil, fmt.Errorf("gateway %s: list: the active replica %s is not reached", p.gw.Name, p.Active())
	}
	objs, err := prim.List(ctx, fresh)
	if err != nil {
		return nil, fmt.Errorf("replica %s: %w", prim.Pod, err)
	}
	return objs, nil
}

// Info is the primary replica's, with a boot id joining every replica's
// ("pod=bootid,...").
func (p *Pair) Info(ctx context.Context) (*agentapi.Info, error) {
	prim, _, ok := p.primary()
	if !ok {
		return nil, fmt.Errorf("gateway %s: info: the active replica %s is not reached", p.gw.Name, p.Active())
	}
	var ids []string
	var out *agentapi.Info
	for _, m := range p.members {
		info, err := m.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("replica %s: info: %w", m.Pod, err)
		}
		ids = append(ids, m.Pod+"="+info.BootID)
		if m.Pod == prim.Pod {
			out = info
		}
	}
	cp := *out
	cp.BootID = strings.Join(ids, ",")
	return &cp, nil
}

// CatchUp makes every replica but the active hold exactly what the
// active holds (its fresh list, one Sync each): a replica that started or
// came back is in step before the Pair is used. While no replica holds the
// Lease it does nothing: no replica's table is then known to be the
// gateway's (both pods may be new, their tables empty), and a Sync from
// one of them would give the other its sync mark (natgw ha's rules gate)
// for an empty list; the caller's own sync of the desired set, which
// every replica must carry out while none is active, brings them in step
// instead (controller/gateway: new pods are new boot ids, a full sync).
func (p *Pair) CatchUp(ctx context.Context) error {
	prim, known, ok := p.primary()
	if !ok {
		return fmt.Errorf("gateway %s: catch-up: the active replica %s is not reached", p.gw.Name, p.Active())
	}
	if len(p.members) == 1 {
		return nil
	}
	if !known {
		p.log.V(1).Info("no replica holds the Lease: no catch-up; the desired set is synced to every replica", "replicas", p.Members())
		return nil
	}
	objs, err := prim.List(ctx, true)
	if err != nil {
		return fmt.Errorf("replica %s: list: %w", prim.Pod, err)
	}
	for _, m := range p.members {
		if m.Pod == prim.Pod {
			continue
		}
		if err := m.Sync(ctx, objs); err != nil {
			return fmt.Errorf("replica %s: catch-up from %s (%d objects): %w", m.Pod, prim.Pod, len(objs), err)
		}
	}
	return nil
}

var _ Session = (*Pair)(nil)

var _ ColdStartSyncer = (*Pair)(nil)

// SyncAtColdStart is true: a Pair's List reads one replica (the active, or
// the first by pod name), and each replica's agent (`serve --rules-only`)
// leaves the sync mark its `natgw ha` waits for before it may lead
// (agentapi.RulesSyncedFile) only after a Sync, of an empty set too.
func (p *Pair) SyncAtColdStart() bool { return true }

// qosSetter is a session that programs gateway-wide QoS (agentapi.Client).
type qosSetter interface {
	SetGatewayQoS(ctx context.Context, rules []gwqos.Rule) (changed bool, err error)
}

// SetGatewayQoS programs the gateway-wide QoS rules on every replica, as
// the other changes; changed is the primary replica's answer.
func (p *Pair) SetGatewayQoS(ctx context.Context, rules []gwqos.Rule) (bool, error) {
	prim, _, _ := p.primary()
	var changed bool
	err := p.change(ctx, "gateway-qos", func(ctx context.Context, s Session) error {
		q, ok := s.(qosSetter)
		if !ok {
			return errors.New("the session does not program gateway QoS")
		}
		c, err := q.SetGatewayQoS(ctx, rules)
		if s == prim.Session {
			changed = c
		}
		return err
	})
	return changed, err
}

// pairStandbyLag is natgw_gateway_standby_lag_seconds: how long a
// two-replica gateway's standby has been missing a change the active holds
// (0: in step), per gateway. Registered with controller-runtime's registry.
var pairStandbyLag = prometheus.NewGaugeVec(prometheus.GaugeOpts{
	Name: "natgw_gateway_standby_lag_seconds",
	Help: "How long a two-replica gateway's standby has been missing a change that its active replica holds (0: in step).",
}, []string{"gateway"})

// standbyApplyDelay is natgw_gateway_standby_apply_delay_seconds: per
// change of a two-replica gateway, from the call (when the active got it)
// until every standby carried it out.
var standbyApplyDelay = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "natgw_gateway_standby_apply_delay_seconds",
	Help:    "Per change of a two-replica gateway: from the call until every standby replica carried it out (the active's result returns first).",
	Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
}, []string{"gateway"})

func init() { crmetrics.Registry.MustRegister(pairStandbyLag, standbyApplyDelay) }
