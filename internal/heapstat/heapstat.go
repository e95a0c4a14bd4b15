// Package heapstat measures the live heap for memory benchmarks: what is
// reachable after garbage collection, independent of the machine's load.
package heapstat

import "runtime"

// Live returns the heap in use (runtime.MemStats.HeapAlloc) after two
// garbage collections (the second frees what the first's finalizers and
// cleanups released).
func Live() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
