package gateway

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"testing"

	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/nat"
)

// TestHolderIndex: the index's answer after each sequence of changes.
func TestHolderIndex(t *testing.T) {
	a, b, c := &Manager{}, &Manager{}, &Manager{}
	type op struct {
		g   *Manager
		add bool
		uid string
	}
	for _, tc := range []struct {
		name string
		ops  []op
		want map[string][]*Manager
	}{
		{"one holder", []op{{a, true, "x"}}, map[string][]*Manager{"x": {a}, "y": nil}},
		{"added twice", []op{{a, true, "x"}, {a, true, "x"}}, map[string][]*Manager{"x": {a}}},
		{"two holders, the first removed", []op{{a, true, "x"}, {b, true, "x"}, {a, false, "x"}}, map[string][]*Manager{"x": {b}}},
		{"three holders, the middle removed", []op{{a, true, "x"}, {b, true, "x"}, {c, true, "x"}, {b, false, "x"}}, map[string][]*Manager{"x": {a, c}}},
		{"removed by one that does not hold it", []op{{a, true, "x"}, {b, false, "x"}}, map[string][]*Manager{"x": {a}}},
		{"all removed", []op{{a, true, "x"}, {b, true, "x"}, {b, false, "x"}, {a, false, "x"}}, map[string][]*Manager{"x": nil}},
		{"removed, unknown", []op{{a, false, "x"}}, map[string][]*Manager{"x": nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newHolderIndex()
			for _, o := range tc.ops {
				if o.add {
					x.update(o.g, []string{o.uid}, nil)
				} else {
					x.update(o.g, nil, []string{o.uid})
				}
			}
			for uid, want := range tc.want {
				if got := x.get(uid); !slices.Equal(got, want) {
					t.Errorf("get(%s) = %v, want %v", uid, got, want)
				}
			}
			if slices.ContainsFunc(slices.Collect(maps.Values(x.more)), func(s []*Manager) bool { return len(s) == 0 }) {
				t.Errorf("an empty list of further holders is kept: %v", x.more)
			}
		})
	}
	x := newHolderIndex()
	set := func(uids ...string) map[string]struct{} {
		m := map[string]struct{}{}
		for _, u := range uids {
			m[u] = struct{}{}
		}
		return m
	}
	x.replace(a, nil, set("p", "q"))
	x.replace(b, nil, set("q"))
	x.replace(a, set("p", "q"), set("q", "r"))
	for uid, want := range map[string][]*Manager{"p": nil, "q": {a, b}, "r": {a}} {
		if got := x.get(uid); !slices.Equal(got, want) {
			t.Errorf("after replace: get(%s) = %v, want %v", uid, got, want)
		}
	}
}

// TestHoldersFollowHeld: with two gateways, Registry.Holders answers what
// the managers' held sets say, after the first syncs, applies on both, a
// delete and a resync of both, and nil for a UID nobody holds.
func TestHoldersFollowHeld(t *testing.T) {
	nft := newAgent()
	src := &source{desired: []nat.Object{fip("a", 1), fip("b", 2)}}
	f := startWith(t, src, nft, newAgent(), nil, 0, func(o *Options) {
		o.Config = &gwconfig.Config{Gateways: []gwconfig.Entry{{Name: "gw1"}, {Name: "gw2"}}}
	})
	gw2, err := f.reg.Get("gw2")
	if err != nil {
		t.Fatal(err)
	}
	gws := []*Manager{f.gw, gw2}
	connected := func() error {
		for _, g := range gws {
			if g.Dataplane() == "" {
				return fmt.Errorf("%s has no session", g.Name())
			}
		}
		return nil
	}
	// consistent compares Holders with every manager's held set.
	consistent := func() error {
		want := map[string][]string{}
		for _, g := range gws {
			g.knownMu.Lock()
			for u := range g.held {
				want[u] = append(want[u], g.Name())
			}
			g.knownMu.Unlock()
		}
		for u, names := range want {
			sort.Strings(names)
			if got := f.reg.Holders(u); !slices.Equal(got, names) {
				return fmt.Errorf("Holders(%s) = %v, held by %v", u, got, names)
			}
		}
		if got := f.reg.Holders("nobody"); got != nil {
			return fmt.Errorf("Holders(nobody) = %v", got)
		}
		if len(want) == 0 {
			return errors.New("no gateway holds anything")
		}
		return nil
	}
	eventually(t, "both connected", connected)
	eventually(t, "held and Holders agree after the first sync", consistent)
	ctx := context.Background()
	for _, g := range gws {
		if err := g.Apply(ctx, fip("p", 5)); err != nil {
			t.Fatal(err)
		}
	}
	if got := f.reg.Holders("p"); !slices.Equal(got, []string{"gw1", "gw2"}) {
		t.Errorf("Holders(p) after applies on both = %v", got)
	}
	if err := f.gw.Delete(ctx, nat.KindFIP, "p"); err != nil {
		t.Fatal(err)
	}
	if got := f.reg.Holders("p"); !slices.Equal(got, []string{"gw2"}) {
		t.Errorf("Holders(p) after the delete on gw1 = %v", got)
	}
	if err := consistent(); err != nil {
		t.Error(err)
	}
	f.tr.breakSessions()
	eventually(t, "both reconnected", connected)
	eventually(t, "held and Holders agree after the resync", consistent)
}

// BenchmarkHolders: one Holders call with 1,000 gateways of 100 held UIDs
// each (scenario 6's second part), no sync in progress.
func BenchmarkHolders(b *testing.B) {
	entries := make([]gwconfig.Entry, 1000)
	for i := range entries {
		entries[i].Name = fmt.Sprintf("gw-%03d", i)
	}
	reg := NewRegistry(Options{Config: &gwconfig.Config{Gateways: entries}})
	for i, e := range entries {
		g, err := reg.Get(e.Name)
		if err != nil {
			b.Fatal(err)
		}
		g.knownMu.Lock()
		for j := range 100 {
			g.held[fmt.Sprintf("uid-%d-%d", i, j)] = struct{}{}
		}
		g.holders.replace(g, nil, g.held)
		g.knownMu.Unlock()
	}
	b.ResetTimer()
	for i := range b.N {
		if got := reg.Holders(fmt.Sprintf("uid-%d-%d", i%1000, i%100)); len(got) != 1 {
			b.Fatalf("Holders = %v", got)
		}
	}
}
