// Package companion is natgw-controller's companion mode (--mode=companion):
// Kube-OVN's own controller keeps programming its VPC NAT gateways (through
// the natgw image's nat-gateway.sh compat path) and natgw-controller
// programs nothing. It only removes what Kube-OVN ≤ v1.13.8 leaks: objects
// its controller programmed through the compat path for a CR that was then
// deleted before the controller added its finalizer (it adds it after
// programming), so nothing ever deletes them.
//
// Safety rules, each enforced here:
//   - Only compat objects of the kinds the NAT CRs make (UIDs compat-eip-,
//     compat-fip-, compat-dnat-, compat-snat-) are candidates; objects with
//     any other UID, and routes, are never touched.
//   - A candidate is an orphan only if no CR claims it (Claims: the UID
//     Kube-OVN's call for the CR makes, computed by gwimage/compat's parser;
//     for FIPs and DNATs also the content), and no CR of its kind is
//     unresolved (an EIP without an address yet, a CR whose EIP is unknown).
//   - It is removed only after it was seen orphaned, unchanged, in two
//     sweeps at least Grace apart (Kube-OVN's controller programs before it
//     writes status; a just-programmed object may briefly look unclaimed).
//   - Right before the removal a live LIST from the API server (not the
//     informer cache) must confirm that nothing claims it, and a fresh read
//     of the gateway that it is still the object seen.
//   - Right after, another live LIST: if a CR that claims the removed object
//     appeared in between, the object is put back at once (restored).
package companion

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/nat"
)

// Defaults of Options.
const (
	DefaultPeriod      = 30 * time.Second
	DefaultGrace       = 30 * time.Second
	DefaultCallTimeout = 30 * time.Second
)

// Options configure a Sweeper.
type Options struct {
	// Transport reaches the gateways' agents (pod exec in a cluster).
	Transport transport.Transport
	// Config maps gateway names to where their agents run (netns for the
	// local transport, interface names); nil: defaults for every gateway.
	Config *gwconfig.Config
	// Period between sweeps (default DefaultPeriod).
	Period time.Duration
	// Grace is the least time between the first and the confirming
	// sighting of an orphan (default DefaultGrace).
	Grace time.Duration
	// CallTimeout bounds each gateway session and each API read.
	CallTimeout time.Duration
	// Recorder gets a Normal event on the VpcNatGateway per removal
	// (optional).
	Recorder events.EventRecorder
	Log      logr.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
	// OnSweep, when set, gets every periodic sweep's result (tests,
	// figures).
	OnSweep func(Result, error)
}

// Sweeper finds and removes leaked compat objects on every gateway.
type Sweeper struct {
	opts  Options
	cache client.Reader // informer-backed: the sweep's view
	live  client.Reader // the API server: the confirmation before a removal

	mu       sync.Mutex
	suspects map[string]map[string]suspect // gateway → UID → first sighting
	held     int                           // CRs with natgw's finalizer at the last sweep
	blocked  map[nat.Kind]int              // unresolved CRs per kind at the last sweep
}

type suspect struct {
	obj   nat.Object
	first time.Time
}

// New returns a Sweeper reading CRs through cache for sweeps and through
// live (the API server, not a cache) right before and after a removal.
func New(cache, live client.Reader, opts Options) *Sweeper {
	if opts.Period <= 0 {
		opts.Period = DefaultPeriod
	}
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = DefaultCallTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Config == nil {
		opts.Config = &gwconfig.Config{Unlisted: true}
	}
	return &Sweeper{opts: opts, cache: cache, live: live, suspects: map[string]map[string]suspect{}}
}

// Start sweeps every gateway each Period until ctx ends (manager.Runnable).
func (s *Sweeper) Start(ctx context.Context) error {
	s.opts.Log.Info("companion mode: sweeping gateways for leaked compat objects", "period", s.opts.Period, "grace", s.opts.Grace)
	t := time.NewTicker(s.opts.Period)
	defer t.Stop()
	for {
		res, err := s.Sweep(ctx)
		if err != nil && ctx.Err() == nil {
			s.opts.Log.Error(err, "sweep")
		}
		if s.opts.OnSweep != nil {
			s.opts.OnSweep(res, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// NeedLeaderElection makes the sweeper run on the leader only.
func (s *Sweeper) NeedLeaderElection() bool { return true }

// Result is what one Sweep did.
type Result struct {
	Gateways  int
	Suspected int          // unclaimed compat objects seen
	Removed   []nat.Object // removed (and not restored)
	Restored  []nat.Object // removed, then put back
}

// Sweep looks at every gateway once: records unclaimed compat objects, and
// removes those seen unclaimed and unchanged at least Grace ago once a live
// read confirms it. A gateway that cannot be reached is skipped (its
// suspects are kept); the error joins every gateway's.
func (s *Sweeper) Sweep(ctx context.Context) (Result, error) {
	var res Result
	rctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	defer cancel()
	var gws v1.VpcNatGatewayList
	if err := s.cache.List(rctx, &gws); err != nil {
		return res, fmt.Errorf("list VpcNatGateways: %w", err)
	}
	claims, err := ListClaims(rctx, s.cache)
	if err != nil {
		return res, err
	}
	s.forgetGone(gws.Items)
	s.warnHeld(claims.Held())
	s.reportUnresolved(claims.Unresolved())
	var errs []error
	for i := range gws.Items {
		gw := &gws.Items[i]
		res.Gateways++
		if err := s.sweepGateway(ctx, gw, claims, &res); err != nil {
			Sweeps.WithLabelValues(gw.Name, "error").Inc()
			errs = append(errs, fmt.Errorf("gateway %s: %w", gw.Name, err))
			continue
		}
		Sweeps.WithLabelValues(gw.Name, "ok").Inc()
	}
	return res, errors.Join(errs...)
}

// warnHeld logs, when their number changes, the CRs that carry
// natgw-controller's replace-mode finalizer: nothing removes it in
// companion mode, so their deletion would hang (the admission policy of
// controller/config/admission must not be installed in companion mode).
func (s *Sweeper) warnHeld(held []string) {
	s.mu.Lock()
	changed := len(held) != s.held
	s.held = len(held)
	s.mu.Unlock()
	if changed && len(held) > 0 {
		s.opts.Log.Info("WARNING: NAT CRs carry natgw-controller's finalizer, which nothing removes in companion mode (remove the admission policy and the finalizer)",
			"count", len(held), "first", held[:min(len(held), 5)])
	}
}

// reportUnresolved sets the unresolved gauge and logs, when a kind's count
// changes, which CRs block removals of that kind.
func (s *Sweeper) reportUnresolved(u map[nat.Kind][]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blocked == nil {
		s.blocked = map[nat.Kind]int{}
	}
	for _, k := range sweptKinds {
		n := len(u[k])
		Unresolved.WithLabelValues(string(k)).Set(float64(n))
		if n != s.blocked[k] && n > 0 {
			s.opts.Log.Info("NAT CRs cannot be resolved to a compat UID: no object of their kind is removed until they are", "kind", k, "count", n, "first", u[k][:min(n, 5)])
		}
		s.blocked[k] = n
	}
}

// forgetGone drops the suspects and gauge of gateways that no longer exist.
func (s *Sweeper) forgetGone(gws []v1.VpcNatGateway) {
	s.mu.Lock()
	defer s.mu.Unlock()
	live := map[string]bool{}
	for _, g := range gws {
		live[g.Name] = true
	}
	for name := range s.suspects {
		if !live[name] {
			delete(s.suspects, name)
			Suspected.DeleteLabelValues(name)
		}
	}
}

func (s *Sweeper) sweepGateway(ctx context.Context, gw *v1.VpcNatGateway, claims *Claims, res *Result) error {
	log := s.opts.Log.WithValues("gateway", gw.Name)
	ctx, cancel := context.WithTimeout(ctx, s.opts.CallTimeout)
	defer cancel()
	entry, ok := s.opts.Config.Lookup(gw.Name)
	if !ok {
		log.V(1).Info("gateway not in the gateway config, skipped")
		return nil
	}
	sess, err := s.opts.Transport.Open(ctx, transport.Endpoint{
		Name: gw.Name,
		// The compat path programs the nftables data plane (the image
		// holds no other); an agent on another data plane would empty it.
		Dataplane:         nat.DataplaneNftables,
		NetNS:             entry.NetNS,
		ExternalInterface: entry.ExternalInterface,
		InternalInterface: entry.InternalInterface,
	})
	if err != nil {
		return fmt.Errorf("open session: %w", err)
	}
	defer func() {
		if cerr := sess.Close(); cerr != nil {
			log.V(1).Info("closing the session", "error", cerr.Error())
		}
	}()
	// Fresh: the compat calls change the kernel behind any agent's back.
	objs, err := sess.List(ctx, true)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	now := s.opts.Now()
	due := s.track(gw.Name, objs, claims, now, log, res)
	if len(due) == 0 {
		return nil
	}
	return s.remove(ctx, sess, gw, due, log, res)
}

// track updates gateway gw's suspects from its objects and returns those
// due for removal: unclaimed now, and unclaimed with the same content at a
// sweep at least Grace ago.
func (s *Sweeper) track(gw string, objs []nat.Object, claims *Claims, now time.Time, log logr.Logger, res *Result) []nat.Object {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.suspects[gw]
	next := map[string]suspect{}
	on := byUID(objs)
	var due []nat.Object
	for _, o := range objs {
		if !Candidate(o) {
			continue
		}
		if why := claims.Keep(gw, o, on); why != "" {
			if _, was := prev[o.UID]; was {
				// Its grace starts over if it is ever unclaimed again.
				log.Info("suspected orphan is claimed again, kept", "uid", o.UID, "reason", why)
			}
			continue
		}
		sp, was := prev[o.UID]
		if !was || !sp.obj.Equal(o) {
			sp = suspect{obj: o, first: now}
			log.Info("compat object claimed by no NAT CR: suspected orphan", "uid", o.UID, "object", o.String(), "grace", s.opts.Grace)
		}
		next[o.UID] = sp
		if now.Sub(sp.first) >= s.opts.Grace {
			due = append(due, o)
		}
	}
	s.suspects[gw] = next
	Suspected.WithLabelValues(gw).Set(float64(len(next)))
	res.Suspected += len(next)
	sort.Slice(due, func(i, j int) bool { return due[i].UID < due[j].UID })
	return due
}

// remove confirms due against the API server, removes what is confirmed in
// one transaction, then reads the API server again and puts back anything
// a CR claims by now.
func (s *Sweeper) remove(ctx context.Context, sess transport.Session, gw *v1.VpcNatGateway, due []nat.Object, log logr.Logger, res *Result) error {
	live, err := ListClaims(ctx, s.live)
	if err != nil {
		return fmt.Errorf("confirm orphans with a live list: %w", err)
	}
	due = s.stillDue(gw.Name, due, func(o nat.Object) bool {
		why := live.Protects(gw.Name, o)
		if why != "" {
			log.Info("suspected orphan claimed per the API server, kept", "uid", o.UID, "reason", why)
		}
		return why == ""
	})
	if len(due) == 0 {
		return nil
	}
	// The gateway again, fresh: each must still be the object seen (the
	// agent's index is then the kernel's, and a compat call that changed
	// it meanwhile restarts its grace).
	objs, err := sess.List(ctx, true)
	if err != nil {
		return fmt.Errorf("re-read before removal: %w", err)
	}
	now := byUID(objs)
	gone := s.stillDue(gw.Name, due, func(o nat.Object) bool {
		if why := live.Keep(gw.Name, o, now); why != "" {
			log.Info("suspected orphan kept per the API server", "uid", o.UID, "reason", why)
			return false
		}
		cur, ok := now[o.UID]
		switch {
		case !ok:
			return false // removed by someone else meanwhile
		case !cur.Equal(o):
			log.Info("suspected orphan changed on the gateway, its grace starts over", "uid", o.UID, "was", o.String(), "now", cur.String())
			return false
		}
		return true
	})
	if len(gone) == 0 {
		return nil
	}
	uids := make([]string, len(gone))
	for i, o := range gone {
		uids[i] = o.UID
	}
	if err := sess.Delete(ctx, uids...); err != nil {
		return fmt.Errorf("remove %v: %w", uids, err)
	}
	after, err := ListClaims(ctx, s.live)
	if err != nil {
		// The removal happened; whether a CR appeared meanwhile is unknown.
		// Count it, and say so.
		log.Error(err, "could not re-read the NAT CRs after a removal; removed objects are not checked for a CR created meanwhile", "uids", uids)
		after = &Claims{}
	}
	for _, o := range gone {
		s.drop(gw.Name, o.UID)
		if why := after.Keep(gw.Name, o, now); why != "" {
			if rerr := sess.Apply(ctx, o); rerr != nil {
				log.Error(rerr, "a NAT CR claiming a removed object appeared during the removal, and putting it back failed", "uid", o.UID, "reason", why)
				res.Removed = append(res.Removed, o)
				Removed.WithLabelValues(string(o.Kind)).Inc()
				continue
			}
			log.Info("a NAT CR claiming a removed object appeared during the removal: put back", "uid", o.UID, "reason", why)
			Restored.WithLabelValues(string(o.Kind)).Inc()
			res.Restored = append(res.Restored, o)
			continue
		}
		Removed.WithLabelValues(string(o.Kind)).Inc()
		res.Removed = append(res.Removed, o)
		log.Info("removed leaked compat object (no NAT CR claims it)", "uid", o.UID, "object", o.String())
		if s.opts.Recorder != nil {
			s.opts.Recorder.Eventf(gw, nil, corev1.EventTypeNormal, "LeakedObjectRemoved", "CompanionSweep",
				"removed %s %s (%s) from the gateway: programmed through nat-gateway.sh, and no NAT CR claims it (seen unclaimed for at least %v, confirmed by a live read)",
				o.Kind, o.UID, o.String(), s.opts.Grace)
		}
	}
	return nil
}

func byUID(objs []nat.Object) map[string]nat.Object {
	m := make(map[string]nat.Object, len(objs))
	for _, o := range objs {
		m[o.UID] = o
	}
	return m
}

// stillDue returns the objects of due that still holds true of, in their
// order; every other one leaves gw's suspects (seen again, it starts its
// grace over).
func (s *Sweeper) stillDue(gw string, due []nat.Object, still func(nat.Object) bool) []nat.Object {
	var out []nat.Object
	for _, o := range due {
		if !still(o) {
			s.drop(gw, o.UID)
			continue
		}
		out = append(out, o)
	}
	return out
}

func (s *Sweeper) drop(gw, uid string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.suspects[gw], uid)
}

// Setup adds a Sweeper to mgr: CRs read through the manager's cache for the
// sweeps and through its API reader (the API server) to confirm, events on
// the VpcNatGateway as "natgw-companion".
func Setup(mgr ctrl.Manager, opts Options) (*Sweeper, error) {
	if opts.Recorder == nil {
		opts.Recorder = mgr.GetEventRecorder("natgw-companion")
	}
	s := New(mgr.GetClient(), mgr.GetAPIReader(), opts)
	if err := mgr.Add(s); err != nil {
		return nil, fmt.Errorf("add companion sweeper: %w", err)
	}
	return s, nil
}
