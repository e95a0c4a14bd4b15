package nftables

import (
	"testing"

	nft "github.com/google/nftables"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
	"github.com/natgw/natgw/nat/nftconn"
)

// BenchmarkPlanEncodeFIP is the user-space share, past the model and
// before the socket, of scenario 1's add and delete of one FIP: the
// change commitDiff builds for adding one IPv4 FIP and for deleting it,
// each planned and encoded into one batch on a reused buffer (as the
// Socket reuses a small batch's), its operations kept for the next
// transaction as exec keeps them. One op is the add and the delete. No
// kernel needed; measure it by instruction counts (cachegrind).
func BenchmarkPlanEncodeFIP(b *testing.B) {
	r := &Backend{cfg: nat.Config{}.WithDefaults(), boot: "boot", gen: 7}
	probe := nattest.FIP("probe-fip", addr("192.0.2.10"), addr("198.51.100.10"))
	fipChange := func(removed, added []nat.Object) *change {
		ch := &change{del: setElems{}, add: setElems{}, qosBefore: map[qosKey]qosState{}, qosAfter: map[qosKey]qosVal{},
			snatBefore: map[snatClass]bool{}, snatAfter: map[snatClass]bool{}}
		for _, o := range removed {
			if err := render(o, ch.del); err != nil {
				b.Fatal(err)
			}
		}
		for _, es := range ch.del {
			for i := range es {
				es[i] = nft.SetElement{Key: es[i].Key}
			}
		}
		for _, o := range added {
			if err := render(o, ch.add); err != nil {
				b.Fatal(err)
			}
		}
		r.shareChange(ch, removed, added)
		return ch
	}
	changes := []*change{fipChange(nil, []nat.Object{probe}), fipChange([]nat.Object{probe}, nil)}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		for _, ch := range changes {
			tx := r.plan(ch)
			t := nftconn.NewBatch(1, tx.tx.SizeHint(), buf)
			if err := tx.tx.Encode(t); err != nil {
				b.Fatal(err)
			}
			buf = t.Bytes()[:0]
			r.recycle(tx)
		}
	}
}
