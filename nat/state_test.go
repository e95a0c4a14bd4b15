package nat

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
)

var (
	a  = netip.MustParseAddr
	pf = netip.MustParsePrefix
)

func fip(uid, eip, in string) Object {
	return Object{UID: uid, Kind: KindFIP, FIP: &FIP{EIP: a(eip), InternalIP: a(in)}}
}

func dnat(uid, eip string, proto Protocol, port uint16, in string, inPort uint16) Object {
	return Object{UID: uid, Kind: KindDNAT, DNAT: &DNAT{EIP: a(eip), Protocol: proto, ExternalPort: port, InternalIP: a(in), InternalPort: inPort}}
}

func share(uid, eip string, proto Protocol, port uint16, in string, inPort uint16) Object {
	o := dnat(uid, eip, proto, port, in, inPort)
	o.DNAT.Type = DNATShare
	return o
}

func snat(uid, eip, cidr string) Object {
	return Object{UID: uid, Kind: KindSNAT, SNAT: &SNAT{EIP: a(eip), InternalCIDR: pf(cidr)}}
}

func eip(uid, addr string, bits int) Object {
	return Object{UID: uid, Kind: KindEIP, EIP: &EIP{Address: a(addr), PrefixLen: bits}}
}

func route(uid, dst, via string, dev RouteDevice) Object {
	return Object{UID: uid, Kind: KindRoute, Route: &Route{Destination: pf(dst), NextHop: a(via), Device: dev}}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name      string
		obj       Object
		field     string // "" = valid
		valuePart string
	}{
		{"fip ok", fip("u1", "192.0.2.10", "10.0.0.5"), "", ""},
		{"dnat ok", dnat("u1", "192.0.2.10", TCP, 80, "10.0.0.5", 8080), "", ""},
		{"snat ok", snat("u1", "192.0.2.10", "10.0.0.0/24"), "", ""},
		{"eip ok", eip("u1", "192.0.2.10", 24), "", ""},
		{"route ok", route("u1", "0.0.0.0/0", "192.0.2.1", DeviceExternal), "", ""},
		{"empty uid", fip("", "192.0.2.10", "10.0.0.5"), "uid", ""},
		{"uid with space", fip("a b", "192.0.2.10", "10.0.0.5"), "uid", "a b"},
		{"uid too long", fip(strings.Repeat("x", 65), "192.0.2.10", "10.0.0.5"), "uid", "xxx"},
		{"fip v6 eip, v4 internal", Object{UID: "u", Kind: KindFIP, FIP: &FIP{EIP: a("2001:db8::1"), InternalIP: a("10.0.0.5")}}, "fip.internalIP", "10.0.0.5"},
		{"fip v4 eip, v6 internal", fip("u", "192.0.2.10", "fd00::5"), "fip.internalIP", "fd00::5"},
		{"fip v6 ok", fip("u", "2001:db8::10", "fd00::5"), "", ""},
		{"fip v6 link-local", fip("u", "2001:db8::10", "fe80::5"), "fip.internalIP", "fe80::5"},
		{"fip v6 multicast eip", fip("u", "ff02::1", "fd00::5"), "fip.eip", "ff02::1"},
		{"fip v6 loopback", fip("u", "2001:db8::10", "::1"), "fip.internalIP", "::1"},
		{"fip v6 unspecified", fip("u", "::", "fd00::5"), "fip.eip", "::"},
		{"fip v4-mapped", fip("u", "::ffff:192.0.2.10", "fd00::5"), "fip.eip", "::ffff:192.0.2.10"},
		{"dnat v6 ok", dnat("u", "2001:db8::10", TCP, 80, "fd00::5", 8080), "", ""},
		{"dnat mixed", dnat("u", "2001:db8::10", TCP, 80, "10.0.0.5", 8080), "dnat.internalIP", "10.0.0.5"},
		{"snat v6 ok", snat("u", "2001:db8::10", "fd00:1::/64"), "", ""},
		{"snat v6 cidr on v4 eip", snat("u", "192.0.2.10", "fd00:1::/64"), "snat.internalCIDR", "fd00:1::/64"},
		{"snat v6 host bits", snat("u", "2001:db8::10", "fd00:1::1/64"), "snat.internalCIDR", "fd00:1::1/64"},
		{"eip v6 only", Object{UID: "u", Kind: KindEIP, EIP: &EIP{V6Address: a("2001:db8::10"), V6PrefixLen: 64}}, "", ""},
		{"eip dual", Object{UID: "u", Kind: KindEIP, EIP: &EIP{Address: a("192.0.2.10"), PrefixLen: 24, V6Address: a("2001:db8::10"), V6PrefixLen: 64}}, "", ""},
		{"eip none", Object{UID: "u", Kind: KindEIP, EIP: &EIP{}}, "eip.address", ""},
		{"eip v6 in address", eip("u", "2001:db8::10", 64), "eip.address", "2001:db8::10"},
		{"eip v4 in v6Address", Object{UID: "u", Kind: KindEIP, EIP: &EIP{V6Address: a("192.0.2.10"), V6PrefixLen: 24}}, "eip.v6Address", "192.0.2.10"},
		{"eip v6 prefix 129", Object{UID: "u", Kind: KindEIP, EIP: &EIP{V6Address: a("2001:db8::10"), V6PrefixLen: 129}}, "eip.v6PrefixLen", "129"},
		{"eip v6 prefix without address", Object{UID: "u", Kind: KindEIP, EIP: &EIP{Address: a("192.0.2.10"), PrefixLen: 24, V6PrefixLen: 64}}, "eip.v6PrefixLen", "64"},
		{"eip v6 link-local", Object{UID: "u", Kind: KindEIP, EIP: &EIP{V6Address: a("fe80::10"), V6PrefixLen: 64}}, "eip.v6Address", "fe80::10"},
		{"route v6 ok", route("u", "::/0", "2001:db8::1", DeviceExternal), "", ""},
		{"route v6 via v4", route("u", "::/0", "192.0.2.1", DeviceExternal), "route.nextHop", "192.0.2.1"},
		{"route v4 via v6", route("u", "0.0.0.0/0", "2001:db8::1", DeviceExternal), "route.nextHop", "2001:db8::1"},
		{"route v6 via link-local", route("u", "::/0", "fe80::1", DeviceExternal), "route.nextHop", "fe80::1"},
		{"route v6 host bits", route("u", "2001:db8:5::1/64", "2001:db8::1", DeviceInternal), "route.destination", "2001:db8:5::1/64"},
		{"fip missing internal", Object{UID: "u", Kind: KindFIP, FIP: &FIP{EIP: a("192.0.2.10")}}, "fip.internalIP", ""},
		{"fip multicast", fip("u", "224.0.0.1", "10.0.0.5"), "fip.eip", "224.0.0.1"},
		{"fip same addrs", fip("u", "10.0.0.5", "10.0.0.5"), "fip.internalIP", "10.0.0.5"},
		{"dnat bad proto", dnat("u", "192.0.2.10", "icmp", 80, "10.0.0.5", 80), "dnat.protocol", "icmp"},
		{"dnat port 0", dnat("u", "192.0.2.10", UDP, 0, "10.0.0.5", 80), "dnat.externalPort", "0"},
		{"dnat internal port 0", dnat("u", "192.0.2.10", UDP, 53, "10.0.0.5", 0), "dnat.internalPort", "0"},
		{"dnat bad type", func() Object {
			o := dnat("u", "192.0.2.10", UDP, 53, "10.0.0.5", 53)
			o.DNAT.Type = "round-robin"
			return o
		}(), "dnat.type", "round-robin"},
		{"dnat share ok", share("u", "192.0.2.10", UDP, 53, "10.0.0.5", 53), "", ""},
		{"snat host bits", snat("u", "192.0.2.10", "10.0.0.1/24"), "snat.internalCIDR", "10.0.0.1/24"},
		{"eip prefix 0", eip("u", "192.0.2.10", 0), "eip.prefixLen", "0"},
		{"eip burst without rate", Object{UID: "u", Kind: KindEIP, EIP: &EIP{Address: a("192.0.2.10"), PrefixLen: 24, QoS: &QoS{IngressBurstMbit: 5}}}, "eip.qos.ingressBurstMbit", "5"},
		{"route bad device", route("u", "10.1.0.0/16", "10.0.0.1", "wlan0"), "route.device", "wlan0"},
		{"two payloads", Object{UID: "u", Kind: KindFIP, FIP: &FIP{EIP: a("192.0.2.10"), InternalIP: a("10.0.0.5")}, SNAT: &SNAT{}}, "kind", "fip"},
		{"kind mismatch", Object{UID: "u", Kind: KindDNAT, FIP: &FIP{EIP: a("192.0.2.10"), InternalIP: a("10.0.0.5")}}, "kind", "dnat"},
		{"unknown kind", Object{UID: "u", Kind: "lb", FIP: &FIP{}}, "kind", "lb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.obj.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate() = %v, want a *FieldError", err)
			}
			if fe.Field != tc.field || !strings.Contains(fe.Value, tc.valuePart) {
				t.Fatalf("error names %s=%q, want %s containing %q (%v)", fe.Field, fe.Value, tc.field, tc.valuePart, err)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("message %q does not name the field %s", err, tc.field)
			}
		})
	}
}

// conflictBase is the State TestPlanApplyConflicts applies its cases to.
func conflictBase() []Object {
	return []Object{
		fip("f1", "192.0.2.10", "10.0.0.5"),
		dnat("d1", "192.0.2.20", TCP, 80, "10.0.0.6", 80),
		snat("s1", "192.0.2.30", "10.0.0.0/24"),
		share("h1", "192.0.2.21", TCP, 443, "10.0.0.6", 443),
		eip("e1", "192.0.2.10", 24),
		route("r1", "0.0.0.0/0", "192.0.2.1", DeviceExternal),
		{UID: "e6", Kind: KindEIP, EIP: &EIP{Address: a("192.0.2.11"), PrefixLen: 24, V6Address: a("2001:db8::11"), V6PrefixLen: 64}},
		fip("f6", "2001:db8::10", "fd00::5"),
		snat("s6", "2001:db8::30", "fd00:1::/64"),
		share("h6", "2001:db8::21", TCP, 443, "fd00::6", 443),
	}
}

// conflictCase is a batch applied to conflictBase and the conflict it must
// meet (field "" = none).
type conflictCase struct {
	name  string
	objs  []Object
	field string // "" = no conflict
	with  string
}

func conflictCases() []conflictCase {
	return []conflictCase{
		{"second v6 fip on eip", []Object{fip("f7", "2001:db8::10", "fd00::9")}, "fip.eip", "f6"},
		{"second v6 fip on internal", []Object{fip("f7", "2001:db8::12", "fd00::5")}, "fip.internalIP", "f6"},
		{"v6 dnat on fip eip", []Object{dnat("d7", "2001:db8::10", TCP, 80, "fd00::9", 80)}, "dnat.eip", "f6"},
		{"second v6 share backend", []Object{share("h7", "2001:db8::21", TCP, 443, "fd00::9", 443)}, "", ""},
		{"same v6 backend twice on one identity", []Object{share("h7", "2001:db8::21", TCP, 443, "fd00::6", 443)}, "dnat.internalIP", "h6"},
		{"exclusive on a shared v6 identity", []Object{dnat("d7", "2001:db8::21", TCP, 443, "fd00::9", 443)}, "dnat.type", "h6"},
		{"v6 fip on a shared eip", []Object{fip("f7", "2001:db8::21", "fd00::9")}, "fip.eip", "h6"},
		{"v6 snat same cidr", []Object{snat("s7", "2001:db8::31", "fd00:1::/64")}, "snat.internalCIDR", "s6"},
		{"v6 snat other cidr", []Object{snat("s7", "2001:db8::31", "fd00:2::/64")}, "", ""},
		{"eip v6 address taken", []Object{{UID: "e7", Kind: KindEIP, EIP: &EIP{V6Address: a("2001:db8::11"), V6PrefixLen: 64}}}, "eip.v6Address", "e6"},
		{"eip v4 of a dual taken", []Object{eip("e7", "192.0.2.11", 24)}, "eip.address", "e6"},
		{"v4 and v6 fips on one internal suffix", []Object{fip("f7", "192.0.2.40", "10.0.0.9"), fip("f8", "2001:db8::40", "fd00::9")}, "", ""},
		{"second fip on eip", []Object{fip("f2", "192.0.2.10", "10.0.0.9")}, "fip.eip", "f1"},
		{"fip on dnat eip", []Object{fip("f2", "192.0.2.20", "10.0.0.9")}, "fip.eip", "d1"},
		{"dnat on fip eip", []Object{dnat("d2", "192.0.2.10", UDP, 53, "10.0.0.9", 53)}, "dnat.eip", "f1"},
		{"duplicate dnat", []Object{dnat("d2", "192.0.2.20", TCP, 80, "10.0.0.9", 8080)}, "dnat.externalPort", "d1"},
		{"same port other proto", []Object{dnat("d2", "192.0.2.20", UDP, 80, "10.0.0.9", 80)}, "", ""},
		{"share on an exclusive identity", []Object{share("h2", "192.0.2.20", TCP, 80, "10.0.0.9", 80)}, "dnat.type", "d1"},
		{"exclusive on a shared identity", []Object{dnat("d2", "192.0.2.21", TCP, 443, "10.0.0.9", 443)}, "dnat.type", "h1"},
		{"explicit exclusive on a shared identity", []Object{func() Object {
			o := dnat("d2", "192.0.2.21", TCP, 443, "10.0.0.9", 443)
			o.DNAT.Type = DNATExclusive
			return o
		}()}, "dnat.type", "h1"},
		{"second share backend", []Object{share("h2", "192.0.2.21", TCP, 443, "10.0.0.9", 443)}, "", ""},
		{"64 share backends in one batch", func() []Object {
			var out []Object
			for i := range 64 {
				out = append(out, share(fmt.Sprintf("h%02d", i+2), "192.0.2.21", TCP, 443, fmt.Sprintf("10.0.1.%d", i+1), 443))
			}
			return out
		}(), "", ""},
		{"same backend twice on one identity", []Object{share("h2", "192.0.2.21", TCP, 443, "10.0.0.6", 443)}, "dnat.internalIP", "h1"},
		{"fip on a shared eip", []Object{fip("f2", "192.0.2.21", "10.0.0.9")}, "fip.eip", "h1"},
		{"share moved to an exclusive identity", []Object{share("h1", "192.0.2.20", TCP, 80, "10.0.0.6", 443)}, "dnat.type", "d1"},
		{"share made exclusive when alone", []Object{dnat("h1", "192.0.2.21", TCP, 443, "10.0.0.6", 443)}, "", ""},
		{"internal ip with two fips", []Object{fip("f2", "192.0.2.11", "10.0.0.5")}, "fip.internalIP", "f1"},
		{"duplicate snat cidr", []Object{snat("s2", "192.0.2.31", "10.0.0.0/24")}, "snat.internalCIDR", "s1"},
		{"overlapping snat ok", []Object{snat("s2", "192.0.2.31", "10.0.0.0/25")}, "", ""},
		{"duplicate eip address", []Object{eip("e2", "192.0.2.10", 24)}, "eip.address", "e1"},
		{"duplicate route", []Object{route("r2", "0.0.0.0/0", "192.0.2.2", DeviceExternal)}, "route.destination", "r1"},
		{"conflict within one batch", []Object{fip("f2", "192.0.2.11", "10.0.0.7"), fip("f3", "192.0.2.11", "10.0.0.8")}, "fip.eip", "f2"},
		{"update frees eip for another in same batch", []Object{fip("f1", "192.0.2.12", "10.0.0.5"), fip("f2", "192.0.2.10", "10.0.0.9")}, "", ""},
	}
}

func TestPlanApplyConflicts(t *testing.T) {
	base := conflictBase()
	for _, tc := range conflictCases() {
		t.Run(tc.name, func(t *testing.T) {
			s := NewState()
			for _, o := range base {
				if err := s.Insert(o); err != nil {
					t.Fatal(err)
				}
			}
			before := s.Objects()
			c, err := s.PlanApply(tc.objs)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("PlanApply = %v, want ok", err)
				}
				return
			}
			var ce *ConflictError
			if !errors.As(err, &ce) || !errors.Is(err, ErrConflict) {
				t.Fatalf("PlanApply = %v, %v; want a *ConflictError", c, err)
			}
			if ce.Field != tc.field || ce.With != tc.with {
				t.Fatalf("conflict on %s with %s, want %s with %s (%v)", ce.Field, ce.With, tc.field, tc.with, err)
			}
			if after := s.Objects(); !reflect.DeepEqual(before, after) {
				t.Fatalf("state changed by a refused apply:\nbefore %v\nafter  %v", UIDs(before), UIDs(after))
			}
			// The indexes are intact too: the refused objects can't have
			// left traces that block a valid apply.
			if _, err := s.PlanApply([]Object{fip("fx", "192.0.2.99", "10.0.0.99")}); err != nil {
				t.Fatalf("state broken after rollback: %v", err)
			}
		})
	}
}

func TestPlanApplyUpdateIdempotencyAndRollback(t *testing.T) {
	s := NewState()
	f := fip("f1", "192.0.2.10", "10.0.0.5")
	c, err := s.PlanApply([]Object{f})
	if err != nil || len(c.Added) != 1 || len(c.Removed) != 0 {
		t.Fatalf("first apply: %+v %v", c, err)
	}
	c.Commit()
	c, err = s.PlanApply([]Object{f})
	if err != nil || !c.Empty() {
		t.Fatalf("re-apply of the same spec must be a no-op: %+v %v", c, err)
	}
	moved := fip("f1", "192.0.2.10", "10.0.0.6")
	c, err = s.PlanApply([]Object{moved})
	if err != nil || len(c.Removed) != 1 || len(c.Added) != 1 || !c.Removed[0].Equal(f) || !c.Added[0].Equal(moved) {
		t.Fatalf("update must be old out + new in: %+v %v", c, err)
	}
	c.Rollback()
	if got, _ := s.Get("f1"); !got.Equal(f) {
		t.Fatalf("rollback left %v, want %v", got, f)
	}
	// After the rollback the old internal IP is still indexed.
	if _, err := s.PlanApply([]Object{fip("f2", "192.0.2.11", "10.0.0.5")}); !errors.Is(err, ErrConflict) {
		t.Fatalf("index lost by rollback: %v", err)
	}
	if _, err := s.PlanApply([]Object{f, f}); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Fatalf("duplicate uid in one batch: %v", err)
	}
	if _, err := s.PlanApply([]Object{fip("ok", "192.0.2.12", "10.0.0.7"), fip("bad", "192.0.2.13", "::1")}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("invalid object in batch: %v", err)
	}
	if _, ok := s.Get("ok"); ok {
		t.Fatal("valid half of an invalid batch was applied")
	}
}

func TestPlanDeleteAndSync(t *testing.T) {
	s := NewState()
	for _, o := range []Object{fip("f1", "192.0.2.10", "10.0.0.5"), fip("f2", "192.0.2.11", "10.0.0.6"), snat("s1", "192.0.2.30", "10.0.0.0/24")} {
		if err := s.Insert(o); err != nil {
			t.Fatal(err)
		}
	}
	c := s.PlanDelete([]string{"f1", "nope", "f1"})
	if got := UIDs(c.Removed); !reflect.DeepEqual(got, []string{"f1"}) {
		t.Fatalf("delete removed %v", got)
	}
	c.Rollback()
	if s.Len() != 3 {
		t.Fatalf("rollback of delete: len %d", s.Len())
	}
	desired := []Object{fip("f2", "192.0.2.11", "10.0.0.7"), fip("f3", "192.0.2.12", "10.0.0.8"), snat("s1", "192.0.2.30", "10.0.0.0/24")}
	c, err := s.PlanSync(desired)
	if err != nil {
		t.Fatal(err)
	}
	SortObjects(c.Removed)
	SortObjects(c.Added)
	if got := UIDs(c.Removed); !reflect.DeepEqual(got, []string{"f1", "f2"}) {
		t.Fatalf("sync removed %v, want [f1 f2]", got)
	}
	if got := UIDs(c.Added); !reflect.DeepEqual(got, []string{"f2", "f3"}) {
		t.Fatalf("sync added %v, want [f2 f3]", got)
	}
	if got := UIDs(s.Objects()); !reflect.DeepEqual(got, []string{"f2", "f3", "s1"}) {
		t.Fatalf("state after sync %v", got)
	}
	c.Rollback()
	if got := UIDs(s.Objects()); !reflect.DeepEqual(got, []string{"f1", "f2", "s1"}) {
		t.Fatalf("state after sync rollback %v", got)
	}
	if _, err := s.PlanSync([]Object{fip("a", "192.0.2.11", "10.0.0.7"), fip("b", "192.0.2.11", "10.0.0.8")}); !errors.Is(err, ErrConflict) {
		t.Fatalf("conflicting desired set: %v", err)
	}
	if got := UIDs(s.Objects()); !reflect.DeepEqual(got, []string{"f1", "f2", "s1"}) {
		t.Fatalf("refused sync changed the state: %v", got)
	}
}

// TestPlanSyncFromAndToNothing: a Sync into an empty State adds every
// desired object (in the order given) and removes none; a Sync to nothing
// removes every object and adds none; each rolls back to the State before.
func TestPlanSyncFromAndToNothing(t *testing.T) {
	objs := []Object{fip("f2", "192.0.2.11", "10.0.0.6"), fip("f1", "192.0.2.10", "10.0.0.5"), snat("s1", "192.0.2.30", "10.0.0.0/24")}
	for _, tc := range []struct {
		name                 string
		before, desired      []Object
		removed, added, left []string
	}{
		{"from nothing", nil, objs, nil, []string{"f2", "f1", "s1"}, []string{"f1", "f2", "s1"}},
		{"to nothing", objs, nil, []string{"f1", "f2", "s1"}, nil, nil},
		{"to nothing (empty, not nil)", objs, []Object{}, []string{"f1", "f2", "s1"}, nil, nil},
		{"nothing to nothing", nil, nil, nil, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewState()
			for _, o := range tc.before {
				if err := s.Insert(o); err != nil {
					t.Fatal(err)
				}
			}
			c, err := s.PlanSync(tc.desired)
			if err != nil {
				t.Fatal(err)
			}
			SortObjects(c.Removed)
			if got := UIDs(c.Removed); !slices.Equal(got, tc.removed) {
				t.Errorf("removed %v, want %v", got, tc.removed)
			}
			if got := UIDs(c.Added); !slices.Equal(got, tc.added) {
				t.Errorf("added %v, want %v (the order of desired)", got, tc.added)
			}
			if got := UIDs(s.Objects()); !slices.Equal(got, tc.left) {
				t.Errorf("state after sync %v, want %v", got, tc.left)
			}
			c.Rollback()
			want := append([]Object(nil), tc.before...)
			SortObjects(want)
			if got := UIDs(s.Objects()); !slices.Equal(got, UIDs(want)) {
				t.Errorf("state after rollback %v, want %v", got, UIDs(want))
			}
		})
	}
}

// TestPlanChange: deletes and applies in one Change (a share identity's
// backend set replaced), and a refused change leaves the State as it was.
func TestPlanChange(t *testing.T) {
	s := NewState()
	for _, o := range []Object{share("h1", "192.0.2.21", TCP, 443, "10.0.0.6", 443), share("h2", "192.0.2.21", TCP, 443, "10.0.0.7", 443), dnat("d1", "192.0.2.22", TCP, 80, "10.0.0.8", 80)} {
		if err := s.Insert(o); err != nil {
			t.Fatal(err)
		}
	}
	before := s.Objects()
	c, err := s.PlanChange([]Object{share("h3", "192.0.2.21", TCP, 443, "10.0.0.6", 443)}, []string{"h1", "h2", "unknown"})
	if err != nil {
		t.Fatal(err)
	}
	if got := UIDs(c.Removed); !reflect.DeepEqual(got, []string{"h1", "h2"}) {
		t.Errorf("removed %v", got)
	}
	if got := UIDs(s.ShareBackends(a("192.0.2.21"), TCP, 443)); !reflect.DeepEqual(got, []string{"h3"}) {
		t.Errorf("backends after the change %v", got)
	}
	c.Rollback()
	if after := s.Objects(); !reflect.DeepEqual(before, after) {
		t.Fatalf("rollback: %v, want %v", UIDs(after), UIDs(before))
	}
	// h1 deleted, but the exclusive DNAT d1 holds the identity h4 wants.
	if _, err := s.PlanChange([]Object{share("h4", "192.0.2.22", TCP, 80, "10.0.0.9", 80)}, []string{"h1"}); !errors.Is(err, ErrConflict) {
		t.Fatalf("share on an exclusive identity: %v, want a conflict", err)
	}
	if after := s.Objects(); !reflect.DeepEqual(before, after) {
		t.Fatalf("refused change left %v, want %v", UIDs(after), UIDs(before))
	}
}
