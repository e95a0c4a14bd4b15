package transport

import (
	"context"
	"errors"
	"fmt"
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
// running replica, every change sent to each of them. A call succeeds when
// the active replica (Active) carried it out: that is when the object is
// programmed where the traffic goes; a standby that failed a call is
// behind, which StandbyLag reports, and the Pair ends (Done, Err says
// which replica) so that the caller reconnects: the transport's Open
// brings every standby in step with the active (Sync of the active's
// fresh list) before it returns the new Pair. While no replica is known to
// be active (none holds the Lease yet), every replica must carry a call
// out for it to succeed. Reads (List, Info's data plane, version and
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
	p := &Pair{gw: gw, members: ms, log: log, active: active, done: make(chan struct{}), stop: stop}
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
// replica the Pair reaches holds every change the active holds).
func (p *Pair) StandbyLag() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.behind.IsZero() {
		return 0
	}
	return time.Since(p.behind)
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

// change runs call on every member at once and returns the active's
// result (every member's while none is active); a standby's failure
// marks it behind and ends the Pair.
func (p *Pair) change(ctx context.Context, op string, call func(context.Context, Session) error) error {
	prim, known, ok := p.primary()
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
		err := errs[i]
		if err == nil {
			continue
		}
		err = fmt.Errorf("replica %s: %w", m.Pod, err)
		if !known || m.Pod == prim.Pod {
			out = append(out, err)
			continue
		}
		// A standby that missed a change: the active has it (the
		// object is programmed where the traffic goes); the standby
		// is brought in step by the next Open.
		p.markBehind()
		p.log.Info("standby replica missed a change; reconnecting to bring it in step", "pod", m.Pod, "op", op, "err", err.Error())
		p.end(fmt.Errorf("standby %w", err))
	}
	return errors.Join(out...)
}

// Apply implements agentapi.Agent on every replica.
func (p *Pair) Apply(ctx context.Context, objs ...nat.Object) error {
	return p.change(ctx, "apply", func(ctx context.Context, s Session) error { return s.Apply(ctx, objs...) })
}

// Delete implements agentapi.Agent on every replica.
func (p *Pair) Delete(ctx context.Context, uids ...string) error {
	return p.change(ctx, "delete", func(ctx context.Context, s Session) error { return s.Delete(ctx, uids...) })
}

// Sync implements agentapi.Agent on every replica.
func (p *Pair) Sync(ctx context.Context, desired []nat.Object) error {
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

func init() { crmetrics.Registry.MustRegister(pairStandbyLag) }
