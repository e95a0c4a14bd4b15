// Package leasefence is an ha.Fence kept in a Kubernetes Lease
// (coordination.k8s.io/v1): one Lease per gateway, the holder is the
// replica's id. Every write is an update conditioned on the resourceVersion
// that was read (or a create that fails when the Lease exists), so two
// replicas can never both hold it: of two writers racing from the same
// version, the API server accepts one and refuses the other with a
// conflict. A Lease is free when it has no holder or its holder's
// renewTime + duration has passed by the observer's clock.
//
// Lease durations in natgw are sub-second (175 ms by default) and
// spec.leaseDurationSeconds counts whole seconds, so the exact duration is
// also written to the annotation DurationAnnotation (milliseconds), which
// natgw replicas read; leaseDurationSeconds holds the duration rounded up
// for other readers (kubectl). An API server that cannot be reached or
// answers with an error makes Acquire return that error (not ha.ErrHeld):
// the replica cannot prove it may lead, and steps down before its lease
// runs out.
package leasefence

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/natgw/natgw/nat/ha"
	"github.com/natgw/natgw/nat/ha/kuberest"
)

// DurationAnnotation holds the holder's lease duration in milliseconds.
const DurationAnnotation = "natgw.io/lease-duration-ms"

// DefaultCallTimeout bounds one API call when the caller's context has no
// earlier deadline.
const DefaultCallTimeout = 2 * time.Second

// Leases is the API the fence uses: the Leases of one API server. Errors
// are client-go's (apierrors.IsNotFound, IsConflict and IsAlreadyExists
// hold for them). LeasesForConfig returns one.
type Leases interface {
	Get(ctx context.Context, namespace, name string) (*coordinationv1.Lease, error)
	// Create creates l in l.Namespace.
	Create(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
	// Update replaces l conditioned on l.ResourceVersion.
	Update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
}

// Fence is an ha.Fence backed by the Lease Namespace/Name. Create it with
// New; it is safe for concurrent use.
type Fence struct {
	leases      Leases
	ns, name    string
	callTimeout time.Duration
	now         func() time.Time

	mu   sync.Mutex
	last *coordinationv1.Lease // the Lease as this fence last wrote or read it
}

// New returns the fence of the Lease namespace/name through client (for
// example LeasesForConfig's). callTimeout bounds every API call (0:
// DefaultCallTimeout); the caller's context may bound it further.
func New(client Leases, namespace, name string, callTimeout time.Duration) (*Fence, error) {
	switch {
	case client == nil:
		return nil, errors.New("leasefence: no client")
	case namespace == "":
		return nil, errors.New("leasefence: namespace: empty")
	case name == "":
		return nil, errors.New("leasefence: name: empty")
	case callTimeout < 0:
		return nil, fmt.Errorf("leasefence: call timeout %s: want ≥ 0", callTimeout)
	}
	if callTimeout == 0 {
		callTimeout = DefaultCallTimeout
	}
	return &Fence{leases: client, ns: namespace, name: name, callTimeout: callTimeout, now: time.Now}, nil
}

// ForConfig returns the fence of the Lease namespace/name on the API server
// of rc (through LeasesForConfig), with DefaultCallTimeout.
func ForConfig(rc *rest.Config, namespace, name string) (*Fence, error) {
	leases, err := LeasesForConfig(rc)
	if err != nil {
		return nil, err
	}
	return New(leases, namespace, name, 0)
}

// LeasesForConfig returns the Leases of rc's API server, through a
// client-go RESTClient whose scheme holds coordination.k8s.io/v1 only (not
// the typed clientset, whose package initialisers cost every natgw start;
// see nat/ha/kuberest). The client's rate limit is raised (100 QPS,
// burst 200): the active renews every heartbeat interval and client-go's
// default (5/s) would delay renewals past the lease.
func LeasesForConfig(rc *rest.Config) (Leases, error) {
	if rc == nil {
		return nil, errors.New("leasefence: no rest.Config")
	}
	rc = rest.CopyConfig(rc)
	rc.QPS, rc.Burst = 100, 200
	c, err := kuberest.ForGroupVersion(rc, coordinationv1.SchemeGroupVersion, coordinationv1.AddToScheme)
	if err != nil {
		return nil, fmt.Errorf("leasefence: client for %s: %w", rc.Host, err)
	}
	return kuberest.Resource[coordinationv1.Lease, *coordinationv1.Lease]{Client: c, Name: "leases"}, nil
}

var _ ha.Fence = (*Fence)(nil)

func (f *Fence) String() string { return "Lease " + f.ns + "/" + f.name }

// duration is the holder's lease duration as recorded in l.
func duration(l *coordinationv1.Lease) time.Duration {
	if ms, err := strconv.ParseInt(l.Annotations[DurationAnnotation], 10, 64); err == nil && ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	if l.Spec.LeaseDurationSeconds != nil {
		return time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	}
	return 0
}

func holderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// expired reports whether l's holder no longer holds it at now.
func expired(l *coordinationv1.Lease, now time.Time) bool {
	if holderOf(l) == "" || l.Spec.RenewTime == nil {
		return true
	}
	return !now.Before(l.Spec.RenewTime.Add(duration(l)))
}

// stamp makes l held by holder for ttl from now.
func stamp(l *coordinationv1.Lease, holder string, ttl time.Duration, now time.Time) {
	secs := int32((ttl + time.Second - 1) / time.Second)
	t := metav1.NewMicroTime(now)
	if holderOf(l) != holder || l.Spec.AcquireTime == nil {
		l.Spec.AcquireTime = &t
		n := int32(0)
		if l.Spec.LeaseTransitions != nil {
			n = *l.Spec.LeaseTransitions + 1
		}
		l.Spec.LeaseTransitions = &n
	}
	l.Spec.HolderIdentity = &holder
	l.Spec.RenewTime = &t
	l.Spec.LeaseDurationSeconds = &secs
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[DurationAnnotation] = strconv.FormatInt(ttl.Milliseconds(), 10)
}

func (f *Fence) call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, f.callTimeout)
}

// Acquire takes the Lease for holder, or renews it when holder has it, for
// ttl from now. It returns ha.ErrHeld (wrapped) when another holder's lease
// runs, or when another writer changed the Lease between this fence's read
// and write; any other error means the API server could not be used.
func (f *Fence) Acquire(ctx context.Context, holder string, ttl time.Duration) error {
	if holder == "" {
		return errors.New("leasefence: acquire: holder: empty")
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("leasefence: acquire: ttl %s: want ≥ 1ms", ttl)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// Renewal: write over the version this fence wrote last; a conflict
	// means somebody else wrote since, so read again below.
	if f.last != nil && holderOf(f.last) == holder {
		l := f.last.DeepCopy()
		stamp(l, holder, ttl, f.now())
		err := f.update(ctx, l)
		if !errors.Is(err, ha.ErrHeld) { // nil, or the API server failed
			return err
		}
	}
	cctx, cancel := f.call(ctx)
	l, err := f.leases.Get(cctx, f.ns, f.name)
	cancel()
	switch {
	case apierrors.IsNotFound(err):
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: f.name}}
		stamp(l, holder, ttl, f.now())
		cctx, cancel := f.call(ctx)
		created, err := f.leases.Create(cctx, l)
		cancel()
		if apierrors.IsAlreadyExists(err) {
			f.last = nil
			return fmt.Errorf("leasefence: %s created by another replica: %w", f, ha.ErrHeld)
		}
		if err != nil {
			return fmt.Errorf("leasefence: create %s: %w", f, err)
		}
		f.last = created
		return nil
	case err != nil:
		return fmt.Errorf("leasefence: get %s: %w", f, err)
	}
	f.last = l
	if h := holderOf(l); h != holder && !expired(l, f.now()) {
		// Until by this reader's clock, the one that decides when it
		// may take the Lease.
		return fmt.Errorf("leasefence: %s: %w", f, &ha.HeldError{Holder: h, Until: l.Spec.RenewTime.Add(duration(l))})
	}
	l = l.DeepCopy()
	stamp(l, holder, ttl, f.now())
	return f.update(ctx, l)
}

// update writes l conditioned on its resourceVersion; f.mu is held.
func (f *Fence) update(ctx context.Context, l *coordinationv1.Lease) error {
	cctx, cancel := f.call(ctx)
	defer cancel()
	out, err := f.leases.Update(cctx, l)
	if apierrors.IsConflict(err) {
		f.last = nil
		return fmt.Errorf("leasefence: %s changed by another writer: %w", f, errors.Join(err, ha.ErrHeld))
	}
	if err != nil {
		return fmt.Errorf("leasefence: update %s: %w", f, err)
	}
	f.last = out
	return nil
}

// Release ends holder's lease now (the Lease stays, without a holder);
// nothing when holder does not hold it.
func (f *Fence) Release(ctx context.Context, holder string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cctx, cancel := f.call(ctx)
	l, err := f.leases.Get(cctx, f.ns, f.name)
	cancel()
	switch {
	case apierrors.IsNotFound(err):
		f.last = nil
		return nil
	case err != nil:
		return fmt.Errorf("leasefence: release: get %s: %w", f, err)
	case holderOf(l) != holder:
		f.last = l
		return nil
	}
	l = l.DeepCopy()
	empty := ""
	l.Spec.HolderIdentity = &empty
	l.Spec.AcquireTime = nil
	l.Spec.RenewTime = nil
	cctx, cancel = f.call(ctx)
	defer cancel()
	out, err := f.leases.Update(cctx, l)
	if apierrors.IsConflict(err) {
		f.last = nil
		return nil // somebody else wrote: holder no longer holds it
	}
	if err != nil {
		return fmt.Errorf("leasefence: release %s: %w", f, err)
	}
	f.last = out
	return nil
}
