package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/natgw/natgw/nat"
)

// TestParseDNATSpec: the lb-svc DNAT arguments go through nat's parse
// rules, so a bad value is refused as on every other path, naming the
// field and the value.
func TestParseDNATSpec(t *testing.T) {
	for _, tc := range []struct {
		rule, field string // field "": accepted
	}{
		{"198.51.100.10,80,tcp,10.0.1.5,8080", ""},
		{"198.51.100.10/24,80,TCP,10.0.1.5,8080", ""},
		{"198.51.100.10,080,tcp,10.0.1.5,8080", "port"},
		{"198.51.100.10,0,tcp,10.0.1.5,8080", "port"},
		{"198.51.100.10,80,tcp,10.0.1.5,65536", "internalPort"},
		{"198.51.100.10,80,icmp,10.0.1.5,8080", "protocol"},
		{"198.51.100.10,80,tcp,2001:db8::1,8080", "internalIP"},
		{"2001:db8::1,80,tcp,10.0.1.5,8080", "eip"},
	} {
		d, err := parseDNATSpec(strings.Split(tc.rule, ","))
		if tc.field == "" {
			if err != nil || d.proto != "tcp" || d.port != 80 || d.inPrt != 8080 {
				t.Errorf("%s: %+v, %v", tc.rule, d, err)
			}
			continue
		}
		var fe *nat.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%s: error %v, want a *nat.FieldError of %s", tc.rule, err, tc.field)
		}
	}
}
