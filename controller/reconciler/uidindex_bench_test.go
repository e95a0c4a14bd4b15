package reconciler

import (
	"fmt"
	"runtime"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// BenchmarkUIDIndexCost weighs a UID field index for Absent's cache reads
// (a memory lever not taken) at scenario 6's full size: the heap an
// informer's indexer of 100k IptablesDnatRules holds with and without a
// metadata.uid index built as controller-runtime's IndexField builds one,
// and a walk of the whole store (what confirmAbsent does per owner kind it
// is asked about) against index lookups of 100 UIDs. Measured
// (2026-12-05, load ~14): the index costs 355 B an object, 34 MiB at 100k
// on top of a 71 MiB store, held for the process's life; the walk it
// would replace costs ~0.1 s and one 1.6 MB slice, once per kind per
// converge that finds objects the desired set lacks (none in scenario 6).
// bench/README.md, "Scale levers, measured".
func BenchmarkUIDIndexCost(b *testing.B) {
	const n = 100_000
	build := func(withUID bool) (toolscache.Indexer, []string) {
		ix := toolscache.Indexers{}
		fieldIdx := func(name string, f func(*v1.IptablesDnatRule) string) {
			idx, _ := indexKey(name, "")
			ix[idx] = func(o any) ([]string, error) {
				_, key := indexKey(name, f(o.(*v1.IptablesDnatRule)))
				return []string{key}, nil
			}
		}
		fieldIdx(EIPIndex, func(d *v1.IptablesDnatRule) string { return d.Spec.EIP })
		if withUID {
			fieldIdx("metadata.uid", func(d *v1.IptablesDnatRule) string { return string(d.UID) })
		}
		s := toolscache.NewIndexer(toolscache.MetaNamespaceKeyFunc, ix)
		uids := make([]string, 0, n)
		for i := range n {
			uid := fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i)
			d := &v1.IptablesDnatRule{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("dnat-%06d", i), UID: types.UID(uid)},
				Spec:       v1.IptablesDnatRuleSpec{EIP: fmt.Sprintf("eip-%04d", i/50), ExternalPort: "80", InternalIP: "10.0.0.5", InternalPort: "80", Protocol: "tcp"},
			}
			if err := s.Add(d); err != nil {
				b.Fatal(err)
			}
			uids = append(uids, uid)
		}
		return s, uids
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	b.Run("memory", func(b *testing.B) {
		for b.Loop() {
			h0 := heap()
			s, _ := build(false)
			h1 := heap()
			runtime.KeepAlive(s)
			s = nil
			h2 := heap()
			s2, _ := build(true)
			h3 := heap()
			runtime.KeepAlive(s2)
			b.ReportMetric(float64(h1-h0)/(1<<20), "MiB-store")
			b.ReportMetric(float64(h3-h2)/(1<<20), "MiB-store+uid")
			b.ReportMetric(float64(h3-h2-(h1-h0))/n, "B-uid/obj")
		}
	})
	s, uids := build(true)
	want := map[string]bool{}
	for _, u := range uids[:100] {
		want[u] = true
	}
	b.Run("walk", func(b *testing.B) {
		for b.Loop() {
			left := len(want)
			for _, it := range s.List() {
				if want[string(it.(client.Object).GetUID())] {
					left--
				}
			}
			if left != 0 {
				b.Fatal(left)
			}
		}
	})
	b.Run("lookup100", func(b *testing.B) {
		name, _ := indexKey("metadata.uid", "")
		for b.Loop() {
			for u := range want {
				_, key := indexKey("metadata.uid", u)
				items, err := s.ByIndex(name, key)
				if err != nil || len(items) != 1 {
					b.Fatal(err, len(items))
				}
			}
		}
	})
}
