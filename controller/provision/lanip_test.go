package provision

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/natgw/natgw/nat"
)

// TestLanPrefixNatRule: a two-replica gateway's spec.lanIp is an IPv4
// address by nat's rule (nat.ParseIPv4): lanPrefix refuses what nat
// refuses, with nat's error naming the same field, and gives an accepted
// one its subnet's prefix length.
func TestLanPrefixNatRule(t *testing.T) {
	sub := subnets()["net1"]
	for _, lan := range []string{"10.0.1.254", "fd00::5", "10.0.1", "10.0.1.254/24", "", "x"} {
		got, err := lanPrefix(lan, sub)
		_, want := nat.ParseIPv4("spec.lanIp", lan)
		var fe, wantFE *nat.FieldError
		switch {
		case want == nil && err == nil:
			if got != netip.MustParsePrefix(lan+"/24") {
				t.Errorf("lanIp %q: %s, want %s/24", lan, got, lan)
			}
		case want == nil || err == nil:
			t.Errorf("lanIp %q: %v, nat says %v", lan, err, want)
		case !errors.As(err, &fe) || !errors.As(want, &wantFE) || *fe != *wantFE:
			t.Errorf("lanIp %q: %v, want nat's %v", lan, err, want)
		}
	}
}
