package nattest

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// BenchSizes are the numbers of FIPs installed before BenchFIP measures.
var BenchSizes = []int{0, 10_000}

// benchFIP returns FIP number i of a benchmark: EIPs from 100.64.0.0/10,
// internal addresses from 10.0.0.0/8, so 10,000s of them fit.
func benchFIP(i int) nat.Object {
	n := uint32(i + 1)
	eip := netip.AddrFrom4([4]byte{100, byte(64 + n>>16), byte(n >> 8), byte(n)})
	in := netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)})
	return FIP(UID(nat.KindFIP, i), eip, in)
}

// BenchFIP measures Apply and Delete of one FIP with N FIPs already
// installed, for each N in BenchSizes, each in a fresh namespace (stand-alone
// net1/eth0, no topology). Sub-benchmarks are named "Apply/N=10000" etc.
// Apply measures the Apply of a new FIP (its Delete is not timed); Delete
// measures the Delete of one (its Apply is not timed). Besides the mean
// (ns/op, skewed by rare slow calls on a loaded machine) each reports the
// median and 90th percentile of single calls (µs-median/op, µs-p90/op).
func BenchFIP(b *testing.B, open Opener) {
	if reason := netlab.Unavailable(); reason != "" {
		b.Skipf("nattest: %s", reason)
	}
	for _, op := range []string{"Apply", "Delete"} {
		for _, n := range BenchSizes {
			b.Run(fmt.Sprintf("%s/N=%d", op, n), func(b *testing.B) {
				benchOne(b, open, op == "Apply", n)
			})
		}
	}
}

func benchOne(b *testing.B, open Opener, applyOp bool, n int) {
	ctx := context.Background()
	dp := benchGateway(ctx, b, open)
	defer dp.Close()
	if n > 0 {
		pre := make([]nat.Object, n)
		for i := range pre {
			pre[i] = benchFIP(i)
		}
		if err := dp.Sync(ctx, pre); err != nil {
			b.Fatalf("preload %d FIPs: %v", n, err)
		}
	}
	o := benchFIP(n)
	apply := func() error { return dp.Apply(ctx, o) }
	del := func() error { return dp.Delete(ctx, o.UID) }
	setup, op := del, apply
	if !applyOp {
		setup, op = apply, del
	}
	// One untimed round first, so that the first timed call does not pay
	// for cold caches (b.N starts at 1 and a slow first call ends the run).
	if err := apply(); err != nil {
		b.Fatalf("warm-up apply %s: %v", o, err)
	}
	if err := del(); err != nil {
		b.Fatalf("warm-up delete %s: %v", o.UID, err)
	}
	took := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if err := setup(); err != nil {
			b.Fatalf("untimed half (FIP %s): %v", o, err)
		}
		b.StartTimer()
		start := time.Now()
		if err := op(); err != nil {
			b.Fatalf("timed half (FIP %s): %v", o, err)
		}
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	if applyOp { // back to the preloaded state
		if err := del(); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds())/1e3, "µs-median/op")
	b.ReportMetric(float64(took[len(took)*9/10].Nanoseconds())/1e3, "µs-p90/op")
	objs, err := dp.List(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if len(objs) != n {
		b.Fatalf("after the benchmark: %d objects, want %d", len(objs), n)
	}
}

// benchAddr returns address i of 100.64.0.0/10 (base 64) or 10.0.0.0/8
// (base 0 with first octet 10).
func benchAddr(first, second byte, i int) netip.Addr {
	n := uint32(i + 1)
	return netip.AddrFrom4([4]byte{first, second + byte(n>>16), byte(n >> 8), byte(n)})
}

// BenchShareDNAT measures, interleaved in one run, the Apply of one plain
// (exclusive) DNAT with n exclusive DNATs installed, and the Apply of one
// more backend to a share DNAT identity with n share identities of two
// backends each installed (n = the largest of BenchSizes, or
// $NATGW_BENCH_SHARE_N), in one
// namespace. It reports the median of each (µs-plain/op, µs-share/op)
// and their ratio (share/plain): the bound is 2.
func BenchShareDNAT(b *testing.B, open Opener) {
	if reason := netlab.Unavailable(); reason != "" {
		b.Skipf("nattest: %s", reason)
	}
	ctx := context.Background()
	dp := benchGateway(ctx, b, open)
	defer dp.Close()
	n := slices.Max(BenchSizes)
	if v := os.Getenv("NATGW_BENCH_SHARE_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > 100_000 {
			b.Fatalf("NATGW_BENCH_SHARE_N=%q: want 1..100000", v)
		}
	}
	pre := make([]nat.Object, 0, 3*n)
	for i := range n {
		pre = append(pre, DNAT(UID(nat.KindDNAT, i), benchAddr(100, 64, i), nat.TCP, 80, benchAddr(10, 0, i), 80))
		eip := benchAddr(100, 96, i)
		pre = append(pre,
			ShareDNAT(UID(nat.KindDNAT, n+2*i), eip, nat.TCP, 443, benchAddr(10, 64, i), 8443),
			ShareDNAT(UID(nat.KindDNAT, n+2*i+1), eip, nat.TCP, 443, benchAddr(10, 128, i), 8443))
	}
	if err := dp.Sync(ctx, pre); err != nil {
		b.Fatalf("preload %d DNATs and %d share identities: %v", n, n, err)
	}
	plain := DNAT(UID(nat.KindDNAT, 3*n), benchAddr(100, 64, n), nat.TCP, 80, benchAddr(10, 0, n), 80)
	share := ShareDNAT(UID(nat.KindDNAT, 3*n+1), benchAddr(100, 96, n/2), nat.TCP, 443, benchAddr(10, 192, 0), 8443)
	var tPlain, tShare []time.Duration
	timed := func(o nat.Object, into *[]time.Duration) {
		start := time.Now()
		if err := dp.Apply(ctx, o); err != nil {
			b.Fatalf("apply %s: %v", o, err)
		}
		*into = append(*into, time.Since(start))
		b.StopTimer()
		if err := dp.Delete(ctx, o.UID); err != nil {
			b.Fatalf("delete %s: %v", o.UID, err)
		}
		b.StartTimer()
	}
	timed(plain, new([]time.Duration)) // warm-up
	timed(share, new([]time.Duration))
	b.ResetTimer()
	for range b.N {
		timed(plain, &tPlain)
		timed(share, &tShare)
	}
	b.StopTimer()
	med := func(ts []time.Duration) float64 {
		slices.Sort(ts)
		return float64(ts[len(ts)/2].Nanoseconds()) / 1e3
	}
	p, s := med(tPlain), med(tShare)
	b.ReportMetric(p, "µs-plain/op")
	b.ReportMetric(s, "µs-share/op")
	b.ReportMetric(s/p, "share/plain")
	if objs, err := dp.List(ctx); err != nil || len(objs) != 3*n {
		b.Fatalf("after the benchmark: %d objects (%v), want %d", len(objs), err, 3*n)
	}
}

// benchGateway opens the backend in a new gateway namespace of the
// benchmark's own lab.
func benchGateway(ctx context.Context, b *testing.B, open Opener) nat.Dataplane {
	lab := netlab.ForTest(b)
	ns, err := GatewayNS(lab, "bench")
	if err != nil {
		b.Fatal(err)
	}
	dp, err := open(ctx, nat.Config{NetNS: ns, ExternalInterface: nat.DefaultExternalInterface, InternalInterface: nat.DefaultInternalInterface})
	if err != nil {
		b.Fatalf("open backend: %v", err)
	}
	return dp
}
