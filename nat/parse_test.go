package nat

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

func TestParseIPv4Prefix(t *testing.T) {
	for _, tt := range []struct {
		in, want, reason string
	}{
		{"198.51.100.0/24", "198.51.100.0/24", ""},
		{"198.51.100.7/24", "198.51.100.7/24", ""}, // host bits kept
		{"198.51.100.7", "198.51.100.7/32", ""},
		{"198.51.100.0/33", "", "not an IPv4 CIDR"},
		{"2001:db8::/64", "", "not an IPv4 CIDR"},
		{"2001:db8::1", "", "not an IPv4 address"},
		{"the-vpc", "", "not an IPv4 address"},
		{"", "", "not an IPv4 address"},
	} {
		p, err := ParseIPv4Prefix("spec.internalCIDR", tt.in)
		if tt.reason == "" {
			if err != nil || p != netip.MustParsePrefix(tt.want) {
				t.Errorf("ParseIPv4Prefix(%q) = %v, %v; want %s", tt.in, p, err, tt.want)
			}
			continue
		}
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != "spec.internalCIDR" || fe.Value != tt.in || fe.Reason != tt.reason || !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseIPv4Prefix(%q) error %v, want a *FieldError of spec.internalCIDR: %s", tt.in, err, tt.reason)
		}
	}
	if a, err := ParseIPv4("x", "192.0.2.1"); err != nil || a != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("ParseIPv4: %v, %v", a, err)
	}
	if _, err := ParseIPv4("x", "192.0.2.1/32"); err == nil {
		t.Error("ParseIPv4 took a prefix")
	}
}

// TestParseDataplaneName: the known names parse to their consts; a bad one
// is refused naming the field and the value, and a flag.Value Set keeps the
// old value.
func TestParseDataplaneName(t *testing.T) {
	for _, n := range DataplaneNames {
		got, err := ParseDataplaneName("--dataplane", string(n))
		if err != nil || got != n {
			t.Errorf("ParseDataplaneName(%q) = %q, %v", n, got, err)
		}
		var f DataplaneName
		if err := f.Set(string(n)); err != nil || f != n || f.String() != string(n) {
			t.Errorf("Set(%q): %q, %v", n, f, err)
		}
	}
	for _, v := range []string{"", "pf", "NFTABLES", "nftables "} {
		got, err := ParseDataplaneName("dataplane", v)
		if err == nil || got != "" {
			t.Errorf("ParseDataplaneName(%q) = %q, %v; want an error", v, got, err)
			continue
		}
		for _, want := range []string{"dataplane: ", fmt.Sprintf("%q", v), "unknown data plane", "nftables or iptables"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("ParseDataplaneName(%q): %v; want it to contain %s", v, err, want)
			}
		}
		f := DataplaneIptables
		if err := f.Set(v); err == nil || f != DataplaneIptables {
			t.Errorf("Set(%q) = %v, left %q", v, err, f)
		}
	}
}

// TestParseRules: nat's shared parse rules, each bad value refused with a
// *FieldError naming the field and the value as given.
func TestParseRules(t *testing.T) {
	type parse func(field, s string) (any, error)
	port := func(f, s string) (any, error) { return ParsePort(f, s) }
	proto := func(f, s string) (any, error) { return ParseProtocol(f, s) }
	unicast := func(f, s string) (any, error) { return ParseUnicastIPv4(f, s) }
	network := func(f, s string) (any, error) { return ParseIPv4Network(f, s) }
	unicastAny := func(f, s string) (any, error) { return ParseUnicastIP(f, s) }
	prefix := func(f, s string) (any, error) { return ParsePrefix(f, s) }
	unicast6 := func(f, s string) (any, error) { return ParseUnicastIPv6(f, s) }
	match := func(f, s string) (any, error) {
		d, p, err := ParseQoSMatch(f, s)
		return d + " " + p.String(), err
	}
	for _, tt := range []struct {
		name   string
		fn     parse
		in     string
		want   any // nil: refused
		reason string
	}{
		{"port", port, "80", uint16(80), ""},
		{"port max", port, "65535", uint16(65535), ""},
		{"port leading zero", port, "080", nil, "no leading zero"},
		{"port octal-looking", port, "010", nil, "no leading zero"},
		{"port zero", port, "0", nil, "1 to 65535"},
		{"port too big", port, "65536", nil, "1 to 65535"},
		{"port huge", port, "999999", nil, "1 to 65535"},
		{"port sign", port, "+80", nil, "1 to 65535"},
		{"port empty", port, "", nil, "1 to 65535"},
		{"port name", port, "http", nil, "1 to 65535"},
		{"protocol", proto, "udp", UDP, ""},
		{"protocol upper", proto, "TCP", TCP, ""},
		{"protocol default", proto, "", TCP, ""},
		{"protocol icmp", proto, "icmp", nil, "tcp, udp or sctp"},
		{"unicast", unicast, "198.51.100.1", netip.MustParseAddr("198.51.100.1"), ""},
		{"loopback", unicast, "127.0.0.1", nil, "not a unicast address"},
		{"unspecified", unicast, "0.0.0.0", nil, "not a unicast address"},
		{"broadcast", unicast, "255.255.255.255", nil, "not a unicast address"},
		{"multicast", unicast, "224.0.0.1", nil, "not a unicast address"},
		{"ipv6", unicast, "2001:db8::1", nil, "not an IPv4 address"},
		{"empty address", unicast, "", nil, "not an IPv4 address"},
		{"network", network, "10.1.0.0/16", netip.MustParsePrefix("10.1.0.0/16"), ""},
		{"network host bits", network, "10.1.0.1/16", nil, "host bits set (want 10.1.0.0/16)"},
		{"network /33", network, "10.1.0.0/33", nil, "not an IPv4 CIDR"},
		{"network bare", network, "10.1.0.0", nil, "not an IPv4 CIDR"},
		{"network ipv6", network, "2001:db8::/64", nil, "not an IPv4 CIDR"},
		{"unicast v6", unicast6, "2001:db8::10", netip.MustParseAddr("2001:db8::10"), ""},
		{"unicast v6 given v4", unicast6, "198.51.100.1", nil, "not an IPv6 address"},
		{"unicast v6 upper case", unicast6, "2001:DB8::10", nil, "not in lower case"},
		{"unicast v6 link-local", unicast6, "fe80::1", nil, "link-local"},
		{"unicast any v4", unicastAny, "198.51.100.1", netip.MustParseAddr("198.51.100.1"), ""},
		{"unicast any v6", unicastAny, "2001:db8::1", netip.MustParseAddr("2001:db8::1"), ""},
		{"unicast any v4 loopback", unicastAny, "127.0.0.1", nil, "not a unicast address"},
		{"unicast any v6 loopback", unicastAny, "::1", nil, "not a unicast address"},
		{"unicast any v6 unspecified", unicastAny, "::", nil, "not a unicast address"},
		{"unicast any v6 multicast", unicastAny, "ff02::1", nil, "not a unicast address"},
		{"unicast any v6 link-local", unicastAny, "fe80::1", nil, "link-local"},
		{"unicast any v6 zone", unicastAny, "fe80::1%eth0", nil, "not an IP address"},
		{"unicast any v4-mapped", unicastAny, "::ffff:198.51.100.1", nil, "IPv4-mapped"},
		{"unicast any name", unicastAny, "gw", nil, "not an IP address"},
		{"prefix v6", prefix, "fd00:1::/64", netip.MustParsePrefix("fd00:1::/64"), ""},
		{"prefix v6 bare", prefix, "fd00:1::5", netip.MustParsePrefix("fd00:1::5/128"), ""},
		{"prefix v4 bare", prefix, "10.0.0.5", netip.MustParsePrefix("10.0.0.5/32"), ""},
		{"prefix v6 /129", prefix, "fd00:1::/129", nil, "not a CIDR"},
		{"match", match, "src 10.0.0.0/8", "src 10.0.0.0/8", ""},
		{"match ipv6", match, "dst 2001:db8::/64", "dst 2001:db8::/64", ""},
		{"match bare address", match, "src 10.0.0.1", nil, `"src CIDR"`},
		{"match direction", match, "from 10.0.0.0/8", nil, `"src CIDR"`},
		{"match two spaces", match, "src  10.0.0.0/8", nil, `"src CIDR"`},
		{"match empty", match, "", nil, `"src CIDR"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.fn("spec.x", tt.in)
			if tt.want != nil {
				if err != nil || got != tt.want {
					t.Fatalf("(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != "spec.x" || fe.Value != tt.in || !strings.Contains(fe.Reason, tt.reason) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("(%q) error %v, want a *FieldError of spec.x %q: ...%s...", tt.in, err, tt.in, tt.reason)
			}
		})
	}
	// The agent applies the same unicast rule as ParseUnicastIPv4.
	o := Object{UID: "u", Kind: KindFIP, FIP: &FIP{EIP: netip.MustParseAddr("127.0.0.1"), InternalIP: netip.MustParseAddr("10.0.0.1")}}
	var fe *FieldError
	if err := o.Validate(); !errors.As(err, &fe) || fe.UID != "u" || fe.Field != "fip.eip" || fe.Reason != "not a unicast address" {
		t.Errorf("Validate of a loopback EIP: %v", err)
	}
}

func TestEIPAddressFor(t *testing.T) {
	v4 := EIP{Address: netip.MustParseAddr("192.0.2.10"), PrefixLen: 24}
	v6 := EIP{V6Address: netip.MustParseAddr("2001:db8::10"), V6PrefixLen: 64}
	dual := EIP{Address: v4.Address, PrefixLen: 24, V6Address: v6.V6Address, V6PrefixLen: 64}
	for _, tt := range []struct {
		name     string
		e        EIP
		internal string
		want     string // "": refused
	}{
		{"v4 on v4", v4, "10.0.0.5", "192.0.2.10"},
		{"v6 on v4-only", v4, "fd00::5", ""},
		{"v4 on v6-only", v6, "10.0.0.5", ""},
		{"v6 on v6", v6, "fd00::5", "2001:db8::10"},
		{"v4 on dual", dual, "10.0.0.5", "192.0.2.10"},
		{"v6 on dual", dual, "fd00::5", "2001:db8::10"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.e.AddressFor("fip.internalIP", netip.MustParseAddr(tt.internal))
			if tt.want != "" {
				if err != nil || got.String() != tt.want {
					t.Fatalf("AddressFor(%s) = %v, %v; want %s", tt.internal, got, err, tt.want)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != "fip.internalIP" || fe.Value != tt.internal || !strings.Contains(fe.Reason, "no IPv") {
				t.Fatalf("AddressFor(%s) error %v, want a *FieldError of fip.internalIP", tt.internal, err)
			}
		})
	}
}

// TestCheckNetwork: one host-bits rule for a parsed network
// (ParseIPv4Network), an SNAT's internal CIDR and a route's destination
// (Object.Validate): the same reason, naming the masked form.
func TestCheckNetwork(t *testing.T) {
	for _, tc := range []struct {
		p    string
		want string // "" accepted
	}{
		{"10.1.0.0/16", ""}, {"2001:db8::/64", ""}, {"10.1.0.5/32", ""},
		{"10.1.0.5/16", "host bits set (want 10.1.0.0/16)"},
		{"2001:db8::1/64", "host bits set (want 2001:db8::/64)"},
	} {
		p := netip.MustParsePrefix(tc.p)
		err := CheckNetwork("f", p)
		var fe *FieldError
		if tc.want == "" {
			if err != nil {
				t.Errorf("CheckNetwork(%s): %v", tc.p, err)
			}
			continue
		}
		if !errors.As(err, &fe) || fe.Field != "f" || fe.Value != tc.p || fe.Reason != tc.want {
			t.Errorf("CheckNetwork(%s) = %v, want field f, reason %q", tc.p, err, tc.want)
		}
		route := Object{UID: "r", Kind: KindRoute, Route: &Route{Destination: p, NextHop: p.Addr(), Device: DeviceExternal}}
		if err := route.Validate(); !errors.As(err, &fe) || fe.Field != "route.destination" || fe.Reason != tc.want {
			t.Errorf("route to %s: %v, want route.destination refused: %s", tc.p, err, tc.want)
		}
		if p.Addr().Is4() {
			if _, err := ParseIPv4Network("f", tc.p); !errors.As(err, &fe) || fe.Reason != tc.want {
				t.Errorf("ParseIPv4Network(%s) = %v, want %s", tc.p, err, tc.want)
			}
		}
	}
}
