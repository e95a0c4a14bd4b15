package nftables

import (
	"context"
	"testing"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
)

func opener(ctx context.Context, cfg nat.Config) (nat.Dataplane, error) { return New(ctx, cfg) }

// TestConformance runs the suite every backend passes.
// Every connection it NATs carries its EIP's ct mark (IPv4: the address,
// IPv6: the EIP's mark id).
func TestConformance(t *testing.T) { nattest.RunWith(t, opener, nattest.Options{CtMark: true}) }

// BenchmarkFIP measures Apply and Delete of one FIP at 0 and 10,000
// existing FIPs.
func BenchmarkFIP(b *testing.B) { nattest.BenchFIP(b, opener) }

// BenchmarkShareDNAT: one share backend add at 10,000 share identities
// against one plain DNAT add at 10,000 DNATs, interleaved (nattest's):
//
//	go test -bench ShareDNAT -run '^$' -benchtime 200x ./nat/nftables/
func BenchmarkShareDNAT(b *testing.B) { nattest.BenchShareDNAT(b, opener) }
