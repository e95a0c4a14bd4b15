package nftables

import (
	"context"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	nft "github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
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
	cfg := gateway(b)
	dp := open(b, cfg, WithoutPlumbing())
	if err := dp.Sync(ctx, manyFIPs(n, 36)); err != nil {
		b.Fatal(err)
	}
	var last nat.Dataplane
	timeOps(b, func() error {
		if last != nil {
			return last.Close()
		}
		return nil
	}, func() error {
		var err error
		last, err = New(ctx, cfg, WithoutPlumbing())
		return err
	})
	if last != nil {
		if got, err := last.List(ctx); err != nil || len(got) != n {
			b.Fatalf("after the benchmark: %d objects (%v), want %d", len(got), err, n)
		}
		// The heap the open engine keeps (its index of n objects): live
		// heap with it, minus live heap once it is closed and dropped.
		with := liveHeap()
		last.Close()
		last = nil
		b.ReportMetric(float64(with-liveHeap())/(1<<20), "MiB-kept")
	}
}

// liveHeap returns the heap in use after a garbage collection.
func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// BenchmarkEncodeElements encodes the elements of 100,000 FIPs (200,000
// elements, as a full Sync does) with natgw's direct encoder (txn.elements)
// and, for comparison, with mdlayher/netlink's attribute encoder building
// the same messages (elemsWithEncoder): the measured gain of the fast path.
// No kernel needed.
func BenchmarkEncodeElements(b *testing.B) {
	es := setElems{}
	for _, o := range manyFIPs(100_000, 36) {
		if err := render(o, es); err != nil {
			b.Fatal(err)
		}
	}
	var tx Tx
	for _, set := range slices.Sorted(maps.Keys(es)) {
		tx.addElements(set, es[set], false)
	}
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			t := newTxn(1, tx.elemBytes(), nil)
			if err := t.encode(&tx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("attribute-encoder", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			t := newTxn(1, tx.elemBytes(), nil)
			for _, o := range tx.ops {
				if err := elemsWithEncoder(t, o.name, o.elems); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// elemsWithEncoder is txn.elements (adds, with userdata comments) written
// with mdlayher/netlink's attribute encoder, for BenchmarkEncodeElements.
func elemsWithEncoder(t *txn, set string, es []nft.SetElement) error {
	for _, part := range nftconn.Chunks(es) {
		err := t.msg(unix.NFT_MSG_NEWSETELEM, unix.NLM_F_CREATE, "add elements", func(ae *netlink.AttributeEncoder) {
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
