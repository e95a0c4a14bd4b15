package reconciler

import (
	"fmt"
	"runtime"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/natgw/natgw/internal/heapstat"
)

// BenchmarkQueueHeap weighs controller-runtime's priority queue (the
// controllers' work queue) per item, as at a cold start that queues every
// object at once: the live heap with n requests queued (B-queued/item) and
// after every one was taken and done (B-drained/item: what the drained
// queue keeps, its maps at their peak size, as Go maps do not shrink),
// with the queue metrics natgw-controller serves (a named queue) and
// without (an unnamed one: no workqueue_* series; not an option, the
// baseline). Heap after runtime.GC over n, load-independent.
func BenchmarkQueueHeap(b *testing.B) {
	const n = 100_000
	reqs := make([]reconcile.Request, n)
	for i := range reqs {
		reqs[i] = reconcile.Request{NamespacedName: types.NamespacedName{Name: fmt.Sprintf("dnat-g%03d-%05d", i%1000, i)}}
	}
	for _, named := range []bool{true, false} {
		label := "metrics"
		if !named {
			label = "no-metrics"
		}
		b.Run(label, func(b *testing.B) {
			run := 0
			for b.Loop() {
				run++
				h0 := heapstat.Live()
				name := ""
				if named {
					name = fmt.Sprintf("bench-queue-heap-%d", run)
				}
				q := priorityqueue.New[reconcile.Request](name)
				for _, r := range reqs {
					q.Add(r)
				}
				for q.Len() < n {
					runtime.Gosched()
				}
				h1 := heapstat.Live()
				for range n {
					r, shutdown := q.Get()
					if shutdown {
						b.Fatal("queue shut down")
					}
					q.Done(r)
				}
				h2 := heapstat.Live()
				q.ShutDown()
				b.ReportMetric(float64(h1-h0)/n, "B-queued/item")
				b.ReportMetric(float64(h2-h0)/n, "B-drained/item")
			}
		})
	}
}
