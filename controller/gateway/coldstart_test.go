package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/internal/testlog"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

// connected waits for the gateway's first session.
func (f *fixture) connected(t *testing.T) {
	t.Helper()
	eventually(t, "connected", func() error {
		if f.gw.Dataplane() == "" {
			return errors.New("no session")
		}
		return nil
	})
}

// syncs returns the sync calls in calls.
func syncs(calls []string) []string {
	var out []string
	for _, c := range calls {
		if strings.HasPrefix(c, "sync") {
			out = append(out, c)
		}
	}
	return out
}

// TestColdConnectHoldingTheDesiredSet: the first session of a process with
// an agent (a cold start: its boot id unknown here) whose fresh list is the
// desired set sends no sync, and still sends the gateway-wide QoS as a
// forced converge does. Until 2026-12-06 every such connect synced the
// whole set.
func TestColdConnectHoldingTheDesiredSet(t *testing.T) {
	nft := newAgent()
	nft.put(fip("a", 1), fip("b", 2))
	rules := []gwqos.Rule{qosRule(10)}
	src := &source{desired: []nat.Object{fip("a", 1), fip("b", 2)}, qos: rules}
	f := start(t, src, nft, 0)
	f.connected(t)
	if got := nft.callLog(); len(got) != 0 {
		t.Errorf("calls %v at a connect to an agent holding the desired set, want none", got)
	}
	if err := holds(nft, "a", "b")(); err != nil {
		t.Error(err)
	}
	if held, calls := nft.qosState(); calls != 1 || !slices.Equal(held, rules) {
		t.Errorf("gateway QoS %v after %d requests, want %v after 1", held, calls, rules)
	}
	// The manager goes on from there: what it now holds as programmed
	// is what the agent holds.
	if err := f.gw.Apply(context.Background(), fip("c", 3)); err != nil {
		t.Fatal(err)
	}
	if err := holds(nft, "a", "b", "c")(); err != nil {
		t.Error(err)
	}
}

// TestColdConnectDiffering: a cold start's connect still writes whatever
// differs from the desired set, every API object counting (not only those
// already on the gateway, as in a drift check): one sync for a missing or
// changed object, a delete by UID for an orphan alone, nothing for an
// object whose owner is not confirmed gone (the cache may lag).
func TestColdConnectDiffering(t *testing.T) {
	changed := fip("b", 2)
	changed.FIP.InternalIP = netip.MustParseAddr("10.0.0.99")
	for _, tc := range []struct {
		name  string
		held  []nat.Object
		calls []string
		holds []string
	}{
		{"missing", []nat.Object{fip("a", 1)}, []string{"sync a,b"}, []string{"a", "b"}},
		{"changed", []nat.Object{fip("a", 1), changed}, []string{"sync a,b"}, []string{"a", "b"}},
		{"empty", nil, []string{"sync a,b"}, []string{"a", "b"}},
		{"orphan", []nat.Object{fip("a", 1), fip("b", 2), fip("orphan", 9)}, []string{"delete orphan"}, []string{"a", "b"}},
		{"unconfirmed", []nat.Object{fip("a", 1), fip("b", 2), fip("unconfirmed", 8)}, nil, []string{"a", "b", "unconfirmed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nft := newAgent()
			nft.put(tc.held...)
			src := &source{desired: []nat.Object{fip("a", 1), fip("b", 2)}, absent: map[string]bool{"orphan": true}}
			f := start(t, src, nft, 0)
			f.connected(t)
			if got := nft.callLog(); !slices.Equal(got, tc.calls) {
				t.Errorf("calls %v, want %v", got, tc.calls)
			}
			if err := holds(nft, tc.holds...)(); err != nil {
				t.Error(err)
			}
			if got := nft.list(); tc.name == "changed" && !got[1].Equal(fip("b", 2)) {
				t.Errorf("b on the gateway is %v, want the API's %v", got[1], fip("b", 2))
			}
		})
	}
}

// TestNewBootIDStillSyncs: a new boot id of an agent this process knew
// (its kernel state may have been lost) and a data plane switch sync the
// whole set even when the agent's list already equals it.
func TestNewBootIDStillSyncs(t *testing.T) {
	t.Run("new boot id", func(t *testing.T) {
		nft := newAgent()
		nft.put(fip("a", 1))
		src := &source{desired: []nat.Object{fip("a", 1)}}
		f := start(t, src, nft, 0)
		f.connected(t)
		if got := syncs(nft.callLog()); len(got) != 0 {
			t.Fatalf("syncs %v at the cold connect, want none", got)
		}
		nft.mu.Lock()
		nft.lost()
		nft.objs["a"] = fip("a", 1) // the new table holds the set anyway
		nft.mu.Unlock()
		f.tr.breakSessions()
		eventually(t, "one sync after the new boot id", func() error {
			if got := syncs(nft.callLog()); !slices.Equal(got, []string{"sync a"}) {
				return fmt.Errorf("syncs %v, want [sync a]", got)
			}
			return nil
		})
	})
	t.Run("data plane switch", func(t *testing.T) {
		nft, ipt := newAgent(), newAgent()
		nft.put(fip("a", 1))
		ipt.put(fip("a", 1))
		src := &source{desired: []nat.Object{fip("a", 1)}, dataplane: nat.DataplaneNftables}
		f := startWith(t, src, nft, ipt, nil, 0)
		f.connected(t)
		ipt.put(fip("a", 1)) // the nftables agent's start emptied it
		src.mu.Lock()
		src.dataplane = nat.DataplaneIptables
		src.mu.Unlock()
		f.reg.Kick("gw1")
		eventually(t, "switched with a sync", func() error {
			if got := syncs(ipt.callLog()); !slices.Equal(got, []string{"sync a"}) {
				return fmt.Errorf("syncs on iptables %v, want [sync a]", got)
			}
			return nil
		})
	})
}

// pairTransport opens every session as a two-replica gateway's Pair of
// one replica (a pod whose sibling has not started yet, no Lease holder).
type pairTransport struct {
	*fakeTransport
	t *testing.T
}

func (p pairTransport) Open(ctx context.Context, gw transport.Endpoint) (transport.Session, error) {
	s, err := p.fakeTransport.Open(ctx, gw)
	if err != nil {
		return nil, err
	}
	return transport.NewPair(gw, []transport.Member{{Pod: "vpc-nat-gw-gw1-0", Session: s}}, "", testlog.New(p.t, 0))
}

// TestColdConnectPairSyncs: a two-replica gateway is synced at a cold
// start even when its list equals the desired set: the list reads one
// replica, and each replica's agent leaves the sync mark its `natgw ha`
// waits for (to lead) only after a sync, of an empty set too.
func TestColdConnectPairSyncs(t *testing.T) {
	for _, desired := range [][]nat.Object{{fip("a", 1)}, nil} {
		t.Run(fmt.Sprintf("%d objects", len(desired)), func(t *testing.T) {
			nft := newAgent()
			nft.put(desired...)
			src := &source{desired: desired}
			f := startWith(t, src, nft, newAgent(), nil, 0, func(o *Options) {
				o.Transport = pairTransport{fakeTransport: o.Transport.(*fakeTransport), t: t}
			})
			f.connected(t)
			want := strings.TrimSpace("sync " + strings.Join(nat.UIDs(desired), ","))
			eventually(t, "synced", func() error {
				if got := syncs(nft.callLog()); !slices.Equal(got, []string{want}) {
					return fmt.Errorf("syncs %v, want [%s]", got, want)
				}
				return nil
			})
		})
	}
}

// wrappedSession wraps another session (as a metrics or tracing layer
// would) and forwards its answer to transport.ColdStartSyncer.
type wrappedSession struct{ transport.Session }

func (w wrappedSession) SyncAtColdStart() bool { return transport.ColdStartSync(w.Session) }

// wrapTransport opens inner's sessions wrapped in wrappedSession.
type wrapTransport struct{ inner transport.Transport }

func (w wrapTransport) Open(ctx context.Context, gw transport.Endpoint) (transport.Session, error) {
	s, err := w.inner.Open(ctx, gw)
	if err != nil {
		return nil, err
	}
	return wrappedSession{s}, nil
}

// TestColdConnectWrappedSession: the cold start's sync is decided by the
// session's answer (transport.ColdStartSync), not by its type: a wrapper
// of a two-replica gateway's Pair that forwards the answer is synced
// although its list equals the desired set; a wrapper of a single agent's
// session is not (the default).
func TestColdConnectWrappedSession(t *testing.T) {
	for _, pair := range []bool{true, false} {
		t.Run(fmt.Sprintf("pair=%v", pair), func(t *testing.T) {
			nft := newAgent()
			nft.put(fip("a", 1))
			src := &source{desired: []nat.Object{fip("a", 1)}}
			f := startWith(t, src, nft, newAgent(), nil, 0, func(o *Options) {
				var inner transport.Transport = o.Transport
				if pair {
					inner = pairTransport{fakeTransport: o.Transport.(*fakeTransport), t: t}
				}
				o.Transport = wrapTransport{inner: inner}
			})
			f.connected(t)
			if !pair {
				if got := nft.callLog(); len(got) != 0 {
					t.Errorf("calls %v at a cold connect of a wrapped single-agent session holding the desired set, want none", got)
				}
				return
			}
			eventually(t, "synced", func() error {
				if got := syncs(nft.callLog()); !slices.Equal(got, []string{"sync a"}) {
					return fmt.Errorf("syncs %v, want [sync a]", got)
				}
				return nil
			})
		})
	}
}
