package shape

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/golden"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
)

var update = flag.Bool("update", false, "rewrite testdata/plan.golden")

// plan renders what Set programs for eips on an empty gateway: the qdiscs,
// classes and leaves (as `tc` would be told) and the nftables transaction.
func plan(t *testing.T, cfg nat.Config, eips []EIP) string {
	t.Helper()
	cfg = cfg.WithDefaults()
	if err := ValidateAll(eips); err != nil {
		t.Fatal(err)
	}
	want, err := assign(nil, eips)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, d := range []direction{ingress, egress} {
		dev := device(cfg, d)
		first := true
		for _, c := range want {
			if c.dir != d {
				continue
			}
			if first {
				fmt.Fprintf(&b, "tc qdisc add dev %s root handle %x: htb default 0\n", dev, Major)
				first = false
			}
			fmt.Fprintf(&b, "tc class replace dev %s parent %x: classid %x:%x htb rate %dbit ceil %dbit burst %db cburst %db quantum %d  # %s %s\n",
				dev, Major, Major, c.minor, c.lim.rate()*8, c.lim.rate()*8, c.lim.burst(), c.lim.burst(), c.lim.quantum(), d, c.eip)
			if LeafDelay > 0 {
				fmt.Fprintf(&b, "tc qdisc replace dev %s parent %x:%x bfifo limit %db\n", dev, Major, c.minor, c.lim.leafLimit())
			}
		}
	}
	b.WriteString(tableTx(cfg, true, tablesThere{}, want).String())
	return b.String()
}

// TestPlanGolden pins what natgw programs for shaped EIPs: HTB classes in
// upstream's units (rate = ceil = Mbit/s, burst = cburst = MB × 2^20
// bytes, tc's default for 0), HTB's default leaves, the maps (ct mark and
// source address to classid) and the chain's rules.
func TestPlanGolden(t *testing.T) {
	eips := []EIP{
		{Address: netip.MustParseAddr("192.0.2.11"), Ingress: Limit{RateMbps: 10, BurstMB: 1}, Egress: Limit{RateMbps: 1.5, BurstMB: 0.5}},
		{Address: netip.MustParseAddr("192.0.2.10"), Ingress: Limit{RateMbps: 100}},
		{Address: netip.MustParseAddr("192.0.2.12"), Egress: Limit{RateMbps: 1, BurstMB: 25}},
	}
	golden.Check(t, "testdata/plan.golden", plan(t, nat.Config{}, eips), *update) // go test -update rewrites it
}

func TestValidate(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.10")
	for _, tc := range []struct {
		name  string
		eips  []EIP
		field string
	}{
		{"ok", []EIP{{Address: a, Ingress: Limit{RateMbps: 0.5, BurstMB: 0.1}}}, ""},
		{"no limit at all", []EIP{{Address: a}}, ""},
		{"ipv6", []EIP{{Address: netip.MustParseAddr("2001:db8::1"), Ingress: Limit{RateMbps: 1}}}, "eips[0].address"},
		{"unset address", []EIP{{Ingress: Limit{RateMbps: 1}}}, "eips[0].address"},
		{"twice", []EIP{{Address: a, Ingress: Limit{RateMbps: 1}}, {Address: a, Egress: Limit{RateMbps: 1}}}, "eips[1].address"},
		{"negative rate", []EIP{{Address: a, Egress: Limit{RateMbps: -1}}}, "eips[0].egress.rateMbps"},
		{"rate above HTB's 32 bits", []EIP{{Address: a, Egress: Limit{RateMbps: 40_000}}}, "eips[0].egress.rateMbps"},
		{"burst without rate", []EIP{{Address: a, Ingress: Limit{BurstMB: 1}}}, "eips[0].ingress.burstMB"},
		{"burst above 4095 MB", []EIP{{Address: a, Ingress: Limit{RateMbps: 10000, BurstMB: 5000}}}, "eips[0].ingress.burstMB"},
		{"burst longer than HTB holds", []EIP{{Address: a, Ingress: Limit{RateMbps: 1, BurstMB: 100}}}, "eips[0].ingress.burstMB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateAll(tc.eips)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("ValidateAll = %v, want nil", err)
				}
				return
			}
			var fe *nat.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("ValidateAll = %v, want a field error on %s", err, tc.field)
			}
		})
	}
}

// TestAssignKeepsClasses: an EIP keeps its class across changes, a new one
// takes the lowest free minor, one removed frees its minor.
func TestAssignKeepsClasses(t *testing.T) {
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	l := Limit{RateMbps: 1}
	cur := []class{
		{dir: ingress, eip: ip("192.0.2.30"), minor: 1, lim: l},
		{dir: ingress, eip: ip("192.0.2.20"), minor: 2, lim: l},
		{dir: ingress, eip: ip("192.0.2.10"), minor: 3, lim: l},
	}
	got, err := assign(cur, []EIP{{Address: ip("192.0.2.10"), Ingress: l}, {Address: ip("192.0.2.5"), Ingress: l}, {Address: ip("192.0.2.30"), Ingress: l}, {Address: ip("192.0.2.40"), Ingress: l}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint16{"192.0.2.10": 3, "192.0.2.30": 1, "192.0.2.5": 2, "192.0.2.40": 4}
	if len(got) != len(want) {
		t.Fatalf("assign = %+v", got)
	}
	for _, c := range got {
		if want[c.eip.String()] != c.minor {
			t.Errorf("%s: minor %d, want %d (all: %+v)", c.eip, c.minor, want[c.eip.String()], got)
		}
	}
}

func TestQoSUnits(t *testing.T) {
	q := &nat.QoS{IngressRateMbps: 10, IngressBurstMbit: 9, EgressRateMbps: 20}
	in, out := QoSToLimits(q)
	if in.RateMbps != 10 || in.BurstMB != 9*125_000.0/BytesPerMB || out.RateMbps != 20 || out.BurstMB != 0 {
		t.Fatalf("QoSToLimits(%+v) = %+v, %+v", q, in, out)
	}
	if back := limitsToQoS(in, out); *back != *q {
		t.Fatalf("round trip: %+v, want %+v", back, q)
	}
	if limitsToQoS(Limit{}, Limit{}) != nil {
		t.Fatal("no limit: want nil QoS")
	}
}

// TestStripIPv6EIPs: with mark ids from the wrapped data plane (ipv6),
// every EIP's QoS is taken out of the NAT table's objects and shaped, the
// IPv6-only and dual-stack ones included (one shaping entry each, with its
// IPv6 address); without them (an inner data plane that gives IPv6 EIPs no
// mark ids) an EIP with an IPv6 address keeps its QoS there (policed for
// both families), and is not in the shaping.
func TestStripIPv6EIPs(t *testing.T) {
	q := &nat.QoS{IngressRateMbps: 10, EgressRateMbps: 5}
	a := netip.MustParseAddr
	objs := []nat.Object{
		{UID: "v4", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.10"), PrefixLen: 24, QoS: q}},
		{UID: "dual", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.11"), PrefixLen: 24, V6Address: a("2001:db8::11"), V6PrefixLen: 64, QoS: q}},
		{UID: "v6", Kind: nat.KindEIP, EIP: &nat.EIP{V6Address: a("2001:db8::12"), V6PrefixLen: 64, QoS: q}},
		{UID: "noqos", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.13"), PrefixLen: 24}},
	}
	for _, tc := range []struct {
		ipv6     bool
		stripped []bool
		shaped   []string
	}{
		{true, []bool{true, true, true, true}, []string{"dual", "v4", "v6"}},
		{false, []bool{true, false, false, true}, []string{"v4"}},
	} {
		out, err := strip(objs, tc.ipv6)
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range tc.stripped { // QoS stripped?
			if got := out[i].EIP.QoS == nil; got != want {
				t.Errorf("ipv6 %v: %s: QoS stripped %v, want %v", tc.ipv6, out[i].UID, got, want)
			}
		}
		if objs[0].EIP.QoS == nil {
			t.Error("strip changed its input")
		}
		sh := shapingOf(objs, tc.ipv6)
		if got := slices.Sorted(maps.Keys(sh)); !slices.Equal(got, tc.shaped) {
			t.Errorf("ipv6 %v: shaping %v, want %v", tc.ipv6, sh, tc.shaped)
		}
		if e, ok := sh["v6"]; tc.ipv6 && (!ok || e.V6Address != a("2001:db8::12") || e.Address.IsValid()) {
			t.Errorf("shaping of the IPv6-only EIP %+v, want its IPv6 address alone", e)
		}
	}
}

// TestApplyUpdates: Change's updates set or remove one direction of one
// EIP, leave the other direction and the other EIPs alone, and an EIP left
// with no limit is dropped.
func TestApplyUpdates(t *testing.T) {
	a := netip.MustParseAddr
	ten, one := Limit{RateMbps: 10, BurstMB: 1}, Limit{RateMbps: 1.5}
	base := []EIP{{Address: a("192.0.2.10"), Ingress: ten, Egress: ten}, {Address: a("192.0.2.11"), Egress: one}}
	for _, c := range []struct {
		name    string
		updates []Update
		want    []EIP
	}{
		{"none", nil, base},
		{"add a new EIP's ingress", []Update{{Address: a("192.0.2.9"), Limit: one}},
			[]EIP{{Address: a("192.0.2.9"), Ingress: one}, base[0], base[1]}},
		{"replace one direction", []Update{{Address: a("192.0.2.10"), Egress: true, Limit: one}},
			[]EIP{{Address: a("192.0.2.10"), Ingress: ten, Egress: one}, base[1]}},
		{"remove one direction", []Update{{Address: a("192.0.2.10"), Limit: Limit{}}},
			[]EIP{{Address: a("192.0.2.10"), Egress: ten}, base[1]}},
		{"remove the last direction drops the EIP", []Update{{Address: a("192.0.2.11"), Egress: true}}, base[:1]},
		{"remove what is not there", []Update{{Address: a("192.0.2.99"), Egress: true}}, base},
		{"in order: add then remove", []Update{{Address: a("192.0.2.9"), Limit: one}, {Address: a("192.0.2.9")}}, base},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := applyUpdates(slices.Clone(base), c.updates)
			if !slices.Equal(got, c.want) {
				t.Fatalf("got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// TestChangeRefusesBadInput: a bad update is refused before the kernel is
// touched, naming the field and the value.
func TestChangeRefusesBadInput(t *testing.T) {
	cfg := nat.Config{NetNS: "/nonexistent/natgw-test-netns"} // never opened: validation comes first
	for _, c := range []struct {
		u     Update
		field string
	}{
		{Update{Address: netip.MustParseAddr("2001:db8::1"), Limit: Limit{RateMbps: 1}}, "updates[0].address"},
		{Update{Address: netip.MustParseAddr("192.0.2.1"), Limit: Limit{RateMbps: -1}}, "updates[0].limit.rateMbps"},
		{Update{Address: netip.MustParseAddr("192.0.2.1"), Limit: Limit{RateMbps: 40_000}}, "updates[0].limit.rateMbps"},
		{Update{Address: netip.MustParseAddr("192.0.2.1"), Limit: Limit{BurstMB: 1}}, "updates[0].limit.burstMB"},
	} {
		var fe *nat.FieldError
		if err := Change(t.Context(), cfg, []Update{c.u}); !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("Change(%+v) = %v, want a field error on %s", c.u, err, c.field)
		}
	}
}

// TestLeafKind: the leaf a class gets: a bfifo when LeafDelay is set,
// else fq_codel unless the kernel is known to lack it.
func TestLeafKind(t *testing.T) {
	for _, c := range []struct {
		delay time.Duration
		state int32
		want  string
	}{
		{0, 0, leafFqCodel}, // not probed yet: the first class probes
		{0, 1, leafFqCodel}, // the kernel has it
		{0, 2, leafDefault}, // it does not: HTB's default leaf
		{100 * time.Millisecond, 0, leafBfifo},
		{100 * time.Millisecond, 1, leafBfifo},
		{100 * time.Millisecond, 2, leafBfifo},
	} {
		if got := leafKind(c.delay, c.state); got != c.want {
			t.Errorf("leafKind(%v, %d) = %q, want %q", c.delay, c.state, got, c.want)
		}
	}
}

// TestCanceledContext: every call that reaches netlink takes the caller's
// context, and an ended one is refused before any socket is opened (no
// root needed).
func TestCanceledContext(t *testing.T) {
	nattest.Canceled(t, map[string]func(context.Context, nat.Config) error{
		"Set":    func(ctx context.Context, cfg nat.Config) error { return Set(ctx, cfg, nil) },
		"Get":    func(ctx context.Context, cfg nat.Config) error { _, err := Get(ctx, cfg); return err },
		"Change": func(ctx context.Context, cfg nat.Config) error { return Change(ctx, cfg, nil) },
		"SetGateway": func(ctx context.Context, cfg nat.Config) error {
			return SetGateway(ctx, cfg, nil, nil, func() error { return nil })
		},
		"HoldsGateway": func(ctx context.Context, cfg nat.Config) error { _, err := HoldsGateway(ctx, cfg, nil); return err },
	})
}
