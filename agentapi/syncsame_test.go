package agentapi

import (
	"context"
	"fmt"
	"io"
	"testing"
)

// BenchmarkConnectCalls: the calls a controller's connect makes to an
// agent that already holds the gateway's set, one per iteration, through
// the protocol (Client and Serve in this process over in-memory pipes, the
// engine over natfake's in-memory backend: validation, planning and
// encoding are real, the kernel is not there): "list" is the connect's
// fresh List, "sync" the Sync of the unchanged set a cold start's connect
// sent until 2026-12-06. Sizes: scenario 6's small gateways (10 FIPs, 103
// DNATs) and ten times that. Instructions per call by cachegrind (no
// goroutine blocks in a system call here):
// GOGC=off GOMAXPROCS=1 valgrind --tool=cachegrind --cache-sim=no T
// -test.run '^$' -test.bench 'ConnectCalls/sync/113' -test.benchtime {2,12}x
func BenchmarkConnectCalls(b *testing.B) {
	for _, size := range []struct{ fips, dnats int }{{10, 103}, {100, 1017}} {
		objs := smallGateway(size.fips, size.dnats)
		for _, call := range []string{"list", "sync"} {
			b.Run(fmt.Sprintf("%s/%d", call, len(objs)), func(b *testing.B) {
				dp := newFakeDP()
				if err := dp.Dataplane.Apply(context.Background(), objs...); err != nil {
					b.Fatal(err)
				}
				reqR, reqW := io.Pipe()
				respR, respW := io.Pipe()
				done := make(chan error, 1)
				go func() {
					done <- Serve(context.Background(), dp, reqR, respW, Info{Version: "bench"})
					respW.Close()
				}()
				c := NewClient(respR, reqW)
				defer func() {
					c.Close()
					if err := <-done; err != nil {
						b.Error(err)
					}
				}()
				ctx := context.Background()
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					switch call {
					case "list":
						got, err := c.List(ctx, true)
						if err != nil || len(got) != len(objs) {
							b.Fatalf("list = %d objects, %v", len(got), err)
						}
					case "sync":
						if err := c.Sync(ctx, objs); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}
