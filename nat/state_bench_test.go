package nat

import (
	"fmt"
	"net/netip"
	"testing"
)

// fips returns n FIPs with distinct EIPs and internal IPs and 36-char UIDs.
func fips(n int) []Object {
	out := make([]Object, n)
	for i := range out {
		e := netip.AddrFrom4([4]byte{100, byte(i >> 16), byte(i >> 8), byte(i)})
		in := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		out[i] = Object{UID: fmt.Sprintf("%08x-0000-4000-8000-%012x", i, i), Kind: KindFIP, FIP: &FIP{EIP: e, InternalIP: in}}
	}
	return out
}

// BenchmarkPlanSync100k is the model's share of a 100k-FIP Sync or Reload:
// validation, conflict indexes, the diff and the canonical sort.
func BenchmarkPlanSync100k(b *testing.B) {
	objs := fips(100_000)
	b.ReportAllocs()
	for b.Loop() {
		s := NewState()
		c, err := s.PlanSync(objs)
		if err != nil || len(c.Added) != len(objs) {
			b.Fatalf("PlanSync: %d added, %v", len(c.Added), err)
		}
		if got := len(s.Objects()); got != len(objs) {
			b.Fatalf("Objects: %d", got)
		}
	}
}
