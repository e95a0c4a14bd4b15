package agentapi

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"runtime/debug"
	"syscall"
	"testing"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/nat"
)

// BenchmarkServeSync100k splits what a sync of 100,000 FIPs costs on its
// way through the protocol, without the kernel's data plane: scenario 2's
// "one Sync of 100k through natgw serve" less the in-process Sync. One
// stage per sub-benchmark, each as the real path runs it:
//
//   - encode: the Client's encoding of the request (Do's buffer sizing);
//   - frame: the server's lineReader reading the line at most 64 KiB a
//     read (a kernel pipe's default capacity), then release;
//   - decode: DecodeRequest of the line into a Request (the fast path);
//   - handle: the server from the read line to the response line
//     (handleLine, handle with a data plane that takes the objects and
//     does nothing, write), without the framing;
//   - response: the Client's side of the answer (dispatch's decoding);
//   - roundtrip: Client.Sync against Serve over two os.Pipe
//     (pipeAgentMode), the data plane doing nothing; "release" with natgw
//     serve's
//     WithReleaseMemory(1 MiB), which returns the request's memory to the
//     system once input stops for releaseIdle, "release-at-once" as it
//     did until 2026-12-06: right after each answer (the next sync
//     faults it all in again);
//   - engine: scenario 2's loop, a sync of none then the sync of 100k,
//     through the real engine over natfake's in-memory backend, in the
//     same three modes.
//
// Besides time, bytes and allocations it reports minor page faults per
// op (getrusage: the first touches of memory the process got from the
// system). Instructions by cachegrind, as bench/README says:
// GOGC=off GODEBUG=cpu.rdtscp=off GOMAXPROCS=1 valgrind --tool=cachegrind
// --cache-sim=no T -test.run '^$' -test.bench 'ServeSync100k/decode'
// -test.benchtime {2,5}x; per op = (I(5x) − I(2x)) / 3.
func BenchmarkServeSync100k(b *testing.B) {
	req, line := syncRequest100k()
	ctx := context.Background()
	b.Run("encode", func(b *testing.B) {
		faults := faultMeter(b)
		for b.Loop() {
			out := appendRequest(make([]byte, 0, 64+len(req.Objects)*128), req)
			if len(out) != len(line) {
				b.Fatalf("encoded %d bytes, want %d", len(out), len(line))
			}
		}
		faults()
	})
	b.Run("frame", func(b *testing.B) {
		nl := append(append([]byte(nil), line...), '\n')
		r := &pipeLike{}
		lr := newLineReader(r, MaxLineBytes)
		faults := faultMeter(b)
		for b.Loop() {
			r.rest = nl
			l, err := lr.next()
			if err != nil || len(l.data) != len(line) {
				b.Fatalf("read %d bytes (%v), want %d", len(l.data), err, len(line))
			}
			lr.release()
		}
		faults()
	})
	b.Run("decode", func(b *testing.B) {
		faults := faultMeter(b)
		for b.Loop() {
			got, err := DecodeRequest(line)
			if err != nil || len(got.Objects) != len(req.Objects) {
				b.Fatalf("decoded %d objects (%v), want %d", len(got.Objects), err, len(req.Objects))
			}
		}
		faults()
	})
	b.Run("handle", func(b *testing.B) {
		dp := &nullDP{}
		s := &server{dp: dp, w: io.Discard, log: logr.Discard()}
		faults := faultMeter(b)
		for b.Loop() {
			resp, _ := s.handleLine(ctx, line0(line), MaxLineBytes)
			if _, err := s.write(resp); err != nil || !resp.OK || dp.synced != len(req.Objects) {
				b.Fatalf("response %+v (%v), synced %d", resp, err, dp.synced)
			}
		}
		faults()
	})
	b.Run("response", func(b *testing.B) {
		c := &Client{pending: map[uint64]chan Response{}, done: make(chan struct{})}
		ans, _ := marshalResponse(Response{ID: 7, OK: true})
		faults := faultMeter(b)
		for b.Loop() {
			ch := make(chan Response, 1)
			c.pending[7] = ch
			c.dispatch(line0(ans))
			if r := <-ch; !r.OK {
				b.Fatalf("response %+v", r)
			}
		}
		faults()
	})
	modes := []struct {
		name string
		opts []Option
	}{{"keep", nil}, {"release", []Option{WithReleaseMemory(1 << 20)}},
		{"release-at-once", []Option{WithReleaseMemory(1 << 20), withFree(0, debug.FreeOSMemory)}}}
	for _, mode := range modes {
		// Scenario 2's loop over the real engine (natfake's in-memory
		// backend: no kernel): a sync of none, then the sync of 100k.
		b.Run("engine/"+mode.name, func(b *testing.B) {
			objs := distinctFIPs(100_000)
			c, stop := pipeAgentMode(b, newFakeDP(), true, mode.opts...)
			defer stop()
			faults := faultMeter(b)
			for b.Loop() {
				if err := c.Sync(ctx, nil); err != nil {
					b.Fatal(err)
				}
				if err := c.Sync(ctx, objs); err != nil {
					b.Fatal(err)
				}
			}
			faults()
		})
	}
	for _, mode := range modes {
		b.Run("roundtrip/"+mode.name, func(b *testing.B) {
			dp := &nullDP{}
			c, stop := pipeAgentMode(b, dp, true, mode.opts...)
			defer stop()
			faults := faultMeter(b)
			for b.Loop() {
				if err := c.Sync(ctx, req.Objects); err != nil || dp.synced != len(req.Objects) {
					b.Fatalf("sync: %v (synced %d)", err, dp.synced)
				}
			}
			faults()
		})
	}
}

// distinctFIPs are n FIPs the engine takes together (syncRequest100k's
// repeat UIDs and EIPs: it measures the codec only).
func distinctFIPs(n int) []nat.Object {
	objs := make([]nat.Object, n)
	for i := range objs {
		j := i + 1
		objs[i] = nat.Object{UID: fmt.Sprintf("00000001-f111-4000-8000-%012d", j), Kind: nat.KindFIP,
			FIP: &nat.FIP{EIP: netip.AddrFrom4([4]byte{100, byte(64 + j>>16), byte(j >> 8), byte(j)}), InternalIP: netip.AddrFrom4([4]byte{10, byte(j >> 16), byte(j >> 8), byte(j)})}}
	}
	return objs
}

// line0 is data as lineReader returns a complete line.
func line0(data []byte) line { return line{data: data} }

// faultMeter reports allocations, and returns a func that reports the
// process's minor page faults per op since faultMeter was called.
func faultMeter(b *testing.B) func() {
	b.ReportAllocs()
	start := minorFaults()
	return func() {
		b.ReportMetric(float64(minorFaults()-start)/float64(b.N), "minflt/op")
	}
}

func minorFaults() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Minflt
}

// nullDP is a data plane whose Sync takes the objects and does nothing
// with them: what a request costs before the engine.
type nullDP struct{ synced int }

func (d *nullDP) Name() nat.DataplaneName                    { return nat.DataplaneNftables }
func (d *nullDP) Apply(context.Context, ...nat.Object) error { return nil }
func (d *nullDP) Delete(context.Context, ...string) error    { return nil }
func (d *nullDP) List(context.Context) ([]nat.Object, error) { return nil, nil }
func (d *nullDP) Reload(context.Context) error               { return nil }
func (d *nullDP) BootID() string                             { return "null" }
func (d *nullDP) Close() error                               { return nil }
func (d *nullDP) Sync(_ context.Context, desired []nat.Object) error {
	d.synced = len(desired)
	return nil
}
