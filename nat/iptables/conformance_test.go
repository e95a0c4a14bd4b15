package iptables

import (
	"context"
	"testing"

	"github.com/natgw/natgw/nat"

	"github.com/natgw/natgw/nat/nattest"
)

// TestConformance runs the suite every backend shares: round trips,
// conflicts, reopen, Sync, isolation and real packets (FIP, DNAT, SNAT
// longest prefix, hairpin, conntrack cleanup, share DNAT spread and
// pinning). IPv6 objects are refused (see doc.go, "IPv6"): the suite checks
// the refusal instead of IPv6 packets.
func TestConformance(t *testing.T) { nattest.RunWith(t, open, nattest.Options{NoIPv6: true}) }

// BenchmarkFIP measures Apply/Delete of one FIP at 0 and 10,000 FIPs:
//
//	go test -bench . -run '^$' ./nat/iptables/
func BenchmarkFIP(b *testing.B) { nattest.BenchFIP(b, open) }

// BenchmarkShareDNAT: one share backend add (the identity's rules rewritten)
// against one plain DNAT add, interleaved, at 10,000 of each installed
// (nattest's; NATGW_BENCH_SHARE_N sets the count):
//
//	go test -bench ShareDNAT -run '^$' -benchtime 20x ./nat/iptables/
func BenchmarkShareDNAT(b *testing.B) { nattest.BenchShareDNAT(b, open) }

// open is New with no options, as nattest opens a backend.
func open(ctx context.Context, cfg nat.Config) (nat.Dataplane, error) { return New(ctx, cfg) }
