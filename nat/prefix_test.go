package nat

import (
	"errors"
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

func TestCheckDataplaneName(t *testing.T) {
	for _, n := range DataplaneNames {
		if err := CheckDataplaneName(n); err != nil {
			t.Errorf("CheckDataplaneName(%q): %v", n, err)
		}
	}
	for _, n := range []string{"", "pf", "NFTABLES", "nftables "} {
		err := CheckDataplaneName(n)
		if err == nil || !strings.Contains(err.Error(), "unknown data plane") || !strings.Contains(err.Error(), "nftables or iptables") {
			t.Errorf("CheckDataplaneName(%q) = %v", n, err)
		}
	}
}
