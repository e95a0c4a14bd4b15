package nat

import (
	"context"
	"errors"
	"net/netip"

	"github.com/go-logr/logr"
)

// Dataplane programs one gateway. Every method that changes state is one
// kernel transaction: it either takes effect whole or not at all, and on
// error nothing that was programmed before is lost. Methods are safe for
// concurrent use; calls are applied one at a time in the order they take the
// backend's lock.
type Dataplane interface {
	// Name is the data plane's name: DataplaneNftables or DataplaneIptables.
	Name() DataplaneName
	// Apply adds or updates objects. An object already present with the
	// same spec is a no-op; one present with another spec is replaced in the
	// same transaction. Conflicts (*ConflictError) and invalid objects
	// (*FieldError) change nothing.
	Apply(ctx context.Context, objs ...Object) error
	// Delete removes the objects with these UIDs; unknown UIDs are ignored.
	Delete(ctx context.Context, uids ...string) error
	// List returns every object, in canonical order (SortObjects). It reads
	// the backend's index, which mirrors the kernel.
	List(ctx context.Context) ([]Object, error)
	// Sync makes the gateway hold exactly desired, in one transaction.
	Sync(ctx context.Context, desired []Object) error
	// Reload rebuilds the index from the kernel (after the kernel state
	// may have changed behind the backend's back, e.g. a flushed table).
	Reload(ctx context.Context) error
	// BootID identifies the kernel state the backend manages: it is made
	// and stored in the kernel (with the table or chains) when the backend
	// has to create them, and stays the same while they live. A new BootID
	// means the kernel state was lost and must be resynced.
	BootID() string
	// Close releases sockets. Kernel state stays.
	Close() error
}

// MarkIDs is the optional interface of a data plane whose rules give an
// IPv6 EIP's connections a ct mark id (in nat/conntrack's
// MarkID6Min..MarkID6Max): nat/nftables' Backend, forwarded by nat/engine's
// Engine; nat/shape finds an IPv6 EIP's ingress class by it.
type MarkIDs interface {
	// MarkID6 returns the mark id of IPv6 EIP address a; false when a has
	// none.
	MarkID6(a netip.Addr) (uint32, bool)
}

// Config says which gateway a backend programs.
type Config struct {
	// NetNS is the network namespace: "" for the caller's, a name under
	// /run/netns, or a path (e.g. /proc/PID/ns/net).
	NetNS string
	// ExternalInterface faces the external network (Kube-OVN: net1).
	ExternalInterface string
	// InternalInterface faces the VPC (Kube-OVN: eth0). Traffic entering
	// from it is marked for hairpin SNAT.
	InternalInterface string
	// Log receives structured logs; the zero Logger discards them.
	Log logr.Logger
	// StateDir is a directory of the data plane's own where it may keep
	// a verified snapshot of its index, to start without reading all of
	// the kernel's table (the nftables data plane: nat/README.md, "The
	// index snapshot"); "" keeps none. The kernel stays the source of
	// truth: a snapshot is only used when the kernel proves it current.
	StateDir string
}

// Defaults for Config.
const (
	DefaultExternalInterface = "net1"
	DefaultInternalInterface = "eth0"
)

// WithDefaults returns c with empty interface names set to Kube-OVN's.
func (c Config) WithDefaults() Config {
	if c.ExternalInterface == "" {
		c.ExternalInterface = DefaultExternalInterface
	}
	if c.InternalInterface == "" {
		c.InternalInterface = DefaultInternalInterface
	}
	return c
}

// ErrUnknownState is matched by errors after which the kernel may or may not
// hold the change (e.g. ENOBUFS on reading the kernel's acks, or a failure
// after commit). The backend has already re-read the kernel into its index
// when it returns such an error, so List tells the truth; callers retry.
var ErrUnknownState = errors.New("kernel state unknown after error; index re-read from kernel")
