package nftables

import (
	"testing"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

// BenchmarkPlanEncode100k is the user-space share of a full Sync of
// 100,000 FIPs past the model: plan the transaction (flush every element
// set, add 200,000 elements, the generation stamp) and encode it into one
// netlink batch, as the transport does before it commits. No kernel
// needed; measure it by instruction counts (cachegrind) on a loaded host.
func BenchmarkPlanEncode100k(b *testing.B) {
	objs := manyFIPs(100_000, 36)
	r := &Backend{cfg: nat.Config{}.WithDefaults(), boot: "boot", gen: 7}
	ch, _, _, _, err := r.fullChange(objs, map[snatClass]bool{}, map[qosKey]qosState{}, false)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		tx := r.plan(ch)
		t := nftconn.NewBatch(1, tx.tx.SizeHint(), nil)
		if err := tx.tx.Encode(t); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFullChange100k is the rendering share of a full Sync of
// 100,000 FIPs into an empty table (Backend.commitFull before plan): the
// change fullChange computes, 200,000 elements rendered by set. With
// BenchmarkPlanEncode100k it is the Backend's user-space share of the
// Sync up to the socket. No kernel needed; measure it by instruction
// counts (cachegrind).
func BenchmarkFullChange100k(b *testing.B) {
	objs := manyFIPs(100_000, 36)
	r := &Backend{cfg: nat.Config{}.WithDefaults(), boot: "boot", gen: 7}
	b.ReportAllocs()
	for b.Loop() {
		ch, _, _, _, err := r.fullChange(objs, map[snatClass]bool{}, map[qosKey]qosState{}, false)
		if err != nil {
			b.Fatal(err)
		}
		if n := len(ch.add[setFIPDNAT]) + len(ch.add[setFIPSNAT]); n != 200_000 {
			b.Fatalf("%d FIP elements, want 200000", n)
		}
	}
}
