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

// BenchmarkNewStateOf100k: the bulk construction of a State of 100,000
// FIPs (NewStateOf) against its reference, Insert one by one into a
// presized State (what PlanSync and a reload from the index snapshot did
// before), in the same run.
func BenchmarkNewStateOf100k(b *testing.B) {
	objs := fips(100_000)
	for _, bc := range []struct {
		name string
		fn   func([]Object) (*State, error)
	}{
		{"Bulk", NewStateOf},
		{"InsertEach", func(objs []Object) (*State, error) {
			s := NewStateSize(len(objs))
			for _, o := range objs {
				if err := s.Insert(o); err != nil {
					return nil, err
				}
			}
			return s, nil
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if s, err := bc.fn(objs); err != nil || s.Len() != len(objs) {
					b.Fatalf("%d objects, %v", s.Len(), err)
				}
			}
		})
	}
}
