package nftables

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	nft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/conntrack"
	"github.com/natgw/natgw/nat/engine"
	"github.com/natgw/natgw/nat/nattest"
	"github.com/natgw/natgw/nat/nftconn"
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

// fipsVariant returns manyFIPs(n, 36) with every step-th FIP changed (new
// UID and internal IP); step 1 changes all of them (and their EIPs too).
func fipsVariant(n, step int) []nat.Object {
	objs := manyFIPs(n, 36)
	for i := 0; i < n; i += step {
		o := objs[i]
		f := *o.FIP
		o.UID = "c" + o.UID[1:]
		f.InternalIP = netip.AddrFrom4([4]byte{11, f.InternalIP.As4()[1], f.InternalIP.As4()[2], f.InternalIP.As4()[3]})
		if step == 1 {
			f.EIP = netip.AddrFrom4([4]byte{101, f.EIP.As4()[1], f.EIP.As4()[2], f.EIP.As4()[3]})
		}
		o.FIP = &f
		objs[i] = o
	}
	return objs
}

// BenchmarkSync100k times a Sync of 100,000 FIPs through the engine (the
// whole path of a gateway resync: planning, rendering, one transaction):
// into an empty table, replacing a 100k set of which 1% differs, and
// replacing a 100k set entirely (other UIDs, EIPs and internal IPs).
func BenchmarkSync100k(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	cfg := gateway(b)
	dp := open(b, cfg, WithoutPlumbing())
	base := manyFIPs(n, 36)
	for _, bc := range []struct {
		name  string
		other []nat.Object // nil: start from an empty table
	}{
		{"Empty", nil},
		{"Changed1pct", fipsVariant(n, 100)},
		{"ChangedAll", fipsVariant(n, 1)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			next := base
			setup := func() error {
				if bc.other == nil {
					return dp.Sync(ctx, nil)
				}
				return nil
			}
			if bc.other != nil {
				if err := dp.Sync(ctx, bc.other); err != nil {
					b.Fatal(err)
				}
			}
			timeOps(b, setup, func() error {
				err := dp.Sync(ctx, next)
				if bc.other != nil {
					if &next[0] == &base[0] {
						next = bc.other
					} else {
						next = base
					}
				}
				return err
			})
		})
	}
}

// BenchmarkLoad100k times the start of an agent on a table of 100,000 FIPs:
// opening the engine (reading the table back, checking it, rebuilding the
// index).
func BenchmarkLoad100k(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	cfg, _ := synced(b, n)
	setup, op, opened := reopen(ctx, cfg)
	timeOps(b, setup, op)
	if last := *opened; last != nil {
		if got, err := last.List(ctx); err != nil || len(got) != n {
			b.Fatalf("after the benchmark: %d objects (%v), want %d", len(got), err, n)
		}
		// The heap the open engine keeps (its index of n objects): live
		// heap with it, minus live heap once it is closed and dropped.
		with := liveHeap()
		last.Close()
		*opened, last = nil, nil
		b.ReportMetric(float64(with-liveHeap())/(1<<20), "MiB-kept")
	}
}

// BenchmarkLoadSmall times the start of an agent on a table of 10 FIPs
// (New: the read and the repair transaction), where the reads of the
// table's small objects (tables, sets, chains, limit objects, natgw_meta)
// are most of the work.
func BenchmarkLoadSmall(b *testing.B) {
	const n = 10
	cfg, dp := synced(b, n)
	if err := dp.Close(); err != nil {
		b.Fatal(err)
	}
	setup, op, opened := reopen(context.Background(), cfg)
	cpuOps(b, setup, op)
	closeLast(b, *opened, n)
}

// synced returns the config of a new gateway whose table holds n FIPs,
// and the engine that synced them (open).
func synced(b *testing.B, n int) (nat.Config, nat.Dataplane) {
	b.Helper()
	cfg := gateway(b)
	dp := open(b, cfg, WithoutPlumbing())
	if err := dp.Sync(context.Background(), manyFIPs(n, 36)); err != nil {
		b.Fatal(err)
	}
	return cfg, dp
}

// closeLast checks that last, the engine a benchmark opened last (nil if
// none), holds n FIPs, and closes it. Counts, not List: List sorts the
// objects, which would not cancel out of the instruction counts of two
// runs.
func closeLast(b *testing.B, last nat.Dataplane, n int) {
	b.Helper()
	if last == nil {
		return
	}
	if got := last.(*engine.Engine).Counts()[nat.KindFIP]; got != n {
		b.Fatalf("after the benchmark: %d FIPs, want %d", got, n)
	}
	last.Close()
}

// reopen returns the setup and op of a benchmark that opens the engine on
// cfg once per op (New; setup closes the one opened before), and where the
// last one opened is.
func reopen(ctx context.Context, cfg nat.Config) (setup, op func() error, last *nat.Dataplane) {
	last = new(nat.Dataplane)
	setup = func() error {
		if *last != nil {
			return (*last).Close()
		}
		return nil
	}
	op = func() error {
		var err error
		*last, err = New(ctx, cfg, WithoutPlumbing())
		return err
	}
	return setup, op, last
}

// liveHeap returns the heap in use after a garbage collection.
func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// BenchmarkEncodeElements encodes the elements of 100,000 FIPs (200,000
// elements, as a full Sync does) with natgw's direct encoder (nftconn's
// Batch.Elements, through Tx.Encode) and, for comparison, with
// mdlayher/netlink's attribute encoder building the same messages
// (elemsWithEncoder): the measured gain of the fast path. No kernel
// needed.
func BenchmarkEncodeElements(b *testing.B) {
	es := setElems{}
	for _, o := range manyFIPs(100_000, 36) {
		if err := render(o, es); err != nil {
			b.Fatal(err)
		}
	}
	var tx txPlan
	sets := slices.Sorted(maps.Keys(es))
	for _, set := range sets {
		tx.addElements(set, es[set], false)
	}
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			t := nftconn.NewBatch(1, tx.tx.SizeHint(), nil)
			if err := tx.tx.Encode(t); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("attribute-encoder", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			t := nftconn.NewBatch(1, tx.tx.SizeHint(), nil)
			for _, set := range sets {
				if err := elemsWithEncoder(t, set, es[set]); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// elemsWithEncoder is Batch.Elements (adds, with userdata comments)
// written with mdlayher/netlink's attribute encoder, for
// BenchmarkEncodeElements.
func elemsWithEncoder(t *nftconn.Batch, set string, es []nft.SetElement) error {
	for _, part := range nftconn.Chunks(es) {
		err := t.Msg(nfFamily, unix.NFT_MSG_NEWSETELEM, unix.NLM_F_CREATE, "add elements", func(ae *netlink.AttributeEncoder) {
			ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, tableName)
			ae.String(unix.NFTA_SET_ELEM_LIST_SET, set)
			ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(list *netlink.AttributeEncoder) error {
				for _, e := range part {
					list.Nested(unix.NFTA_LIST_ELEM, func(el *netlink.AttributeEncoder) error {
						el.Nested(unix.NFTA_SET_ELEM_KEY, func(k *netlink.AttributeEncoder) error {
							k.Bytes(unix.NFTA_DATA_VALUE, e.Key)
							return nil
						})
						el.Nested(unix.NFTA_SET_ELEM_DATA, func(d *netlink.AttributeEncoder) error {
							d.Bytes(unix.NFTA_DATA_VALUE, e.Val)
							return nil
						})
						el.Bytes(unix.NFTA_SET_ELEM_USERDATA, append([]byte{0, byte(len(e.Comment) + 1)}, append([]byte(e.Comment), 0)...))
						return nil
					})
				}
				return nil
			})
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// BenchmarkFIPAddDelete times what scenario 1's (d) and (d6) rows time, in
// each family: on a table of 10,000 FIPs of that family plus the probe's
// EIP object, adding the probe FIP and deleting it again, the delete
// including the conntrack cleanup of 8 entries of the probe's EIP (created
// with the ct mark its rules give: the IPv4 EIP, or the IPv6 EIP's mark
// id). It reports the median add and delete (µs) per family and fails if a
// delete leaves one of the entries. Run the two families in one sitting
// and compare them: `go test -run '^$' -bench FIPAddDelete ./nat/nftables`.
func BenchmarkFIPAddDelete(b *testing.B) {
	const n, flows = 10_000, 8
	for _, fam := range []struct {
		name          string
		eip, internal netip.Addr
		fillers       func(i int) (eip, internal netip.Addr)
		eipObject     func(uid string, a netip.Addr) nat.Object
	}{
		{"IPv4", addr("192.0.2.10"), addr("198.51.100.10"), func(i int) (netip.Addr, netip.Addr) {
			v := uint32(i + 1)
			return netip.AddrFrom4([4]byte{100, byte(64 + v>>16), byte(v >> 8), byte(v)}), netip.AddrFrom4([4]byte{10, byte(v >> 16), byte(v >> 8), byte(v)})
		}, nattest.EIP},
		{"IPv6", addr("2001:db8:2::100"), addr("2001:db8:100::a"), func(i int) (netip.Addr, netip.Addr) {
			v := uint32(i + 1)
			e := [16]byte{0x20, 0x01, 0x0d, 0xb8, 0x64, 12: byte(v >> 24), 13: byte(v >> 16), 14: byte(v >> 8), 15: byte(v)}
			in := [16]byte{0xfd, 0x00, 0x00, 0x0a, 12: byte(v >> 24), 13: byte(v >> 16), 14: byte(v >> 8), 15: byte(v)}
			return netip.AddrFrom16(e), netip.AddrFrom16(in)
		}, nattest.EIP6},
	} {
		b.Run(fmt.Sprintf("%s/N=%d", fam.name, n), func(b *testing.B) {
			ctx := context.Background()
			cfg := gateway(b)
			r, dp := openEngine(b, cfg)
			objs := make([]nat.Object, 0, n+1)
			for i := range n {
				e, in := fam.fillers(i)
				objs = append(objs, nattest.FIP(nattest.UID(nat.KindFIP, i), e, in))
			}
			objs = append(objs, fam.eipObject("probe-eip", fam.eip))
			if err := dp.Sync(ctx, objs); err != nil {
				b.Fatal(err)
			}
			var mark uint32
			if fam.eip.Is4() {
				mark = conntrack.MarkOf(fam.eip)
			} else if m, ok := r.marks6[fam.eip]; ok {
				mark = m.id
			} else {
				b.Fatalf("no mark id for %s", fam.eip)
			}
			ext := addr("203.0.113.7")
			if fam.eip.Is6() {
				ext = addr("2001:db8:ffff::7")
			}
			probe := nattest.FIP("probe-fip", fam.eip, fam.internal)
			var adds, dels []time.Duration
			sport := uint16(20000)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				if err := dp.Apply(ctx, probe); err != nil {
					b.Fatal(err)
				}
				adds = append(adds, time.Since(start))
				b.StopTimer()
				for range flows {
					sport++
					if sport < 20000 {
						sport = 20000
					}
					if err := insertFlow(ctx, cfg.NetNS, ext, fam.eip, sport, mark); err != nil {
						b.Fatal(err)
					}
				}
				b.StartTimer()
				start = time.Now()
				if err := dp.Delete(ctx, probe.UID); err != nil {
					b.Fatal(err)
				}
				dels = append(dels, time.Since(start))
				b.StopTimer()
				all, err := netlab.ConntrackEntries(ctx, cfg.NetNS)
				if err != nil {
					b.Fatal(err)
				}
				if left := netlab.FlowsWith(all, fam.eip); len(left) != 0 {
					b.Fatalf("%d conntrack entries of %s left after the delete: %v", len(left), fam.eip, left)
				}
				b.StartTimer()
			}
			b.StopTimer()
			med := func(d []time.Duration) float64 {
				slices.Sort(d)
				return float64(d[len(d)/2].Nanoseconds()) / 1e3
			}
			b.ReportMetric(med(adds), "µs-add-median")
			b.ReportMetric(med(dels), "µs-delete-median")
		})
	}
}

// BenchmarkLoad100kSnapshot times the start of an agent that has a state
// directory (natgw serve in the gateway image) on a table of 100,000 FIPs
// after a clean stop: the FIPs come from the index snapshot, the other
// sets are dumped. New is the whole start (nftables.New: the read, the
// State, the repair transaction); Read is its read alone (NewBackend and
// readObjects: the kernel's small objects, the dumps, the snapshot and its
// State, the consistency check), so New − Read is the repair transaction.
// Besides the median each reports the process's CPU time per op split
// into user and kernel (getrusage: CPU time, not wall time, so less
// sensitive to the machine's load than the median).
func BenchmarkLoad100kSnapshot(b *testing.B) {
	const n = 100_000
	ctx := context.Background()
	cfg := gateway(b)
	cfg.StateDir = b.TempDir()
	dp, err := New(ctx, cfg, WithoutPlumbing())
	if err != nil {
		b.Fatal(err)
	}
	if err := dp.Sync(ctx, manyFIPs(n, 36)); err != nil {
		b.Fatal(err)
	}
	if err := dp.Close(); err != nil { // writes the snapshot
		b.Fatal(err)
	}
	if k := kernelOf(b, cfg); !k.fromSnap {
		b.Fatal("a start would not take the FIPs from the index snapshot")
	}
	b.Run("New", func(b *testing.B) {
		setup, op, opened := reopen(ctx, cfg)
		cpuOps(b, setup, op)
		closeLast(b, *opened, n)
	})
	b.Run("Read", func(b *testing.B) {
		var r *Backend
		cpuOps(b, func() error {
			if r != nil {
				return r.Close()
			}
			return nil
		}, func() error {
			var err error
			if r, err = NewBackend(cfg, WithoutPlumbing()); err != nil {
				return err
			}
			k, st, _, ok, err := r.readObjects(ctx)
			switch {
			case err != nil:
				return err
			case !k.fromSnap || !ok || st.Len() != n:
				return fmt.Errorf("read %d objects, from the snapshot %v, consistent %v", st.Len(), k.fromSnap, ok)
			}
			return nil
		})
		if r != nil {
			r.Close()
		}
	})
}

// cpuOps is timeOps that also reports the process's user and system CPU
// time per op (getrusage around each op).
func cpuOps(b *testing.B, setup, op func() error) {
	b.Helper()
	var user, sys time.Duration
	timeOps(b, setup, func() error {
		u0, s0 := cpuTimes()
		err := op()
		u1, s1 := cpuTimes()
		user, sys = user+u1-u0, sys+s1-s0
		return err
	})
	b.ReportMetric(float64(user.Microseconds())/float64(b.N), "µs-user/op")
	b.ReportMetric(float64(sys.Microseconds())/float64(b.N), "µs-sys/op")
}

// cpuTimes returns the process's user and system CPU time so far.
func cpuTimes() (user, sys time.Duration) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}
