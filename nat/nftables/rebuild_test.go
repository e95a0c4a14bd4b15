package nftables

import (
	"reflect"
	"testing"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/engine"
)

// TestRebuiltIndexEqualsAdds: a Backend that made its table by adds and
// deletes (every golden object one at a time, 2,000 FIPs in batches of
// 500, a delete of some of each) and a Backend that rebuilds its index
// from that table at Load hold the same index: the same objects, the same
// nat.State as inserting them, and the same bookkeeping (SNAT maps,
// policers, share DNAT backends, IPv6 mark ids). Both ways of reading the
// table back: the whole table (natgw's last transaction not stored in
// natgw_meta), and the mirror read once it is (fip_snat not read).
func TestRebuiltIndexEqualsAdds(t *testing.T) {
	cfg := gateway(t)
	ctx := ctxT(t)
	a, err := NewBackend(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, _, err := a.Load(ctx); err != nil {
		t.Fatal(err)
	}
	want := nat.NewState()
	apply := func(removed, added []nat.Object) {
		t.Helper()
		for _, o := range removed {
			if _, ok := want.Get(o.UID); !ok {
				t.Fatalf("delete of %s: not present", o.UID)
			}
		}
		c := want.PlanDelete(uids(removed))
		c.Commit()
		for _, o := range added {
			if err := want.Insert(o); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Commit(ctx, engine.Commit{Removed: removed, Added: added}); err != nil {
			t.Fatal(err)
		}
	}
	golden := goldenObjects()
	for _, o := range golden {
		apply(nil, []nat.Object{o})
	}
	fips := manyFIPs(2000, 36)
	for i := range fips {
		fips[i].UID = "f" + fips[i].UID[1:] // the golden objects' UIDs are of the same scheme
	}
	for i := 0; i < len(fips); i += 500 {
		apply(nil, fips[i:i+500])
	}
	apply([]nat.Object{golden[len(golden)-1], fips[7], fips[1999]}, nil)

	for _, tc := range []struct {
		name   string
		settle bool
	}{{"whole table", false}, {"mirror", true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.settle {
				// The last Load may have committed (a's generation is
				// stale then): a Backend that loads and closes (Close
				// settles) stores the generation.
				c, err := NewBackend(cfg)
				if err != nil {
					t.Fatal(err)
				}
				if _, _, err := c.Load(ctx); err != nil {
					t.Fatal(err)
				}
				if err := c.Close(); err != nil {
					t.Fatal(err)
				}
			}
			b, err := NewBackend(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			k, err := b.readKernel(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if k.mirror != tc.settle {
				t.Fatalf("read as the mirror: %v, want %v", k.mirror, tc.settle)
			}
			objs, _, err := b.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rebuilt := nat.NewState()
			for _, o := range objs {
				if err := rebuilt.Insert(o); err != nil {
					t.Fatal(err)
				}
			}
			if got, w := rebuilt.Objects(), want.Objects(); !reflect.DeepEqual(got, w) {
				t.Errorf("rebuilt %d objects, the adds made %d (or they differ)", len(got), len(w))
			}
			if !reflect.DeepEqual(rebuilt, want) {
				t.Error("the rebuilt nat.State differs from the one the adds built")
			}
			for _, c := range []struct {
				what      string
				got, want any
			}{
				{"snat", b.snat, a.snat},
				{"qos", b.qos, a.qos},
				{"share", b.share, a.share},
				{"marks6", b.marks6, a.marks6},
				{"marksUsed", b.marksUsed, a.marksUsed},
			} {
				if !reflect.DeepEqual(c.got, c.want) {
					t.Errorf("%s: rebuilt %v, after the adds %v", c.what, c.got, c.want)
				}
			}
			if len(a.marks6) == 0 || len(a.share) == 0 || len(a.qos) == 0 {
				t.Errorf("the objects exercise too little: %d IPv6 marks, %d share identities, %d policers", len(a.marks6), len(a.share), len(a.qos))
			}
		})
	}
}

func uids(objs []nat.Object) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.UID)
	}
	return out
}
