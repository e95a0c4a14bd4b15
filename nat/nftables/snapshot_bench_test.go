package nftables

import "testing"

// BenchmarkSnapshotState100k: a start's work on the index snapshot of
// 100,000 FIPs once the file is read: decode, check, build the nat.State.
// No kernel needed.
func BenchmarkSnapshotState100k(b *testing.B) {
	f := encodeSnapshot("boot", 7, manyFIPs(100_000, 36))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := snapshotRebuild(f, "boot", 7); err != nil {
			b.Fatal(err)
		}
	}
}
