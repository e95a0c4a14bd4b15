package nftables

import (
	"context"
	"slices"
	"testing"
	"time"
)

// timeOps runs op b.N times, timing each call, and reports the median in
// µs (the mean ns/op that testing prints is skewed by rare slow calls on a
// loaded machine). setup runs before each op, untimed.
func timeOps(b *testing.B, setup, op func() error) {
	b.Helper()
	d := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		if setup != nil {
			if err := setup(); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		start := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		d = append(d, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds())/1e3, "µs-median/op")
}

// BenchmarkLarge times, with 100,000 FIPs (200,000 elements): a Sync that
// rewrites them all in one transaction, and a Reload (reading the table
// back and rebuilding the engine's index, as at start).
func BenchmarkLarge(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	cfg := gateway(b)
	dp := open(b, cfg, WithoutPlumbing())
	objs := manyFIPs(n, 36)
	if err := dp.Sync(ctx, objs); err != nil {
		b.Fatal(err)
	}
	b.Run("Sync/N=100000", func(b *testing.B) {
		timeOps(b, nil, func() error { return dp.Sync(ctx, objs) })
	})
	b.Run("Reload/N=100000", func(b *testing.B) {
		timeOps(b, nil, func() error { return dp.Reload(ctx) })
	})
	if got, err := dp.List(ctx); err != nil || len(got) != n {
		b.Fatalf("after the benchmark: %d objects (%v), want %d", len(got), err, n)
	}
}
