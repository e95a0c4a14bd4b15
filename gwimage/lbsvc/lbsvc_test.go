package lbsvc

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

// TestCheck: NewCall refuses an unknown subcommand; Check refuses a call
// with a bad rule, naming the rule and the field, before anything runs.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		op, rules string
		want      string // "" accepted; else a substring of the error
	}{
		{"init", "", ""},
		{"explode", "", "unknown subcommand \"explode\""},
		{"eip-add", "198.51.100.10/24,198.51.100.1", ""},
		{"eip-add", "198.51.100.10/24", "want EIP/LEN,GATEWAY"},
		{"eip-add", "198.51.100.10/33,198.51.100.1", "rule 1"},
		{"eip-add", "198.51.100.10/24,gw", "gateway"},
		{"dnat-add", "198.51.100.10,80,tcp,10.0.1.5,8080,10.0.1.1", ""},
		{"dnat-add", "198.51.100.10,80,tcp,10.0.1.5,8080", "want EIP,PORT,PROTOCOL,INTERNAL_IP,INTERNAL_PORT,GATEWAY"},
		{"dnat-add", "198.51.100.10,80,tcp,10.0.1.5,8080,10.0.1.1 198.51.100.10,80,,10.0.1.5,8080,10.0.1.1", "rule 2"},
		{"dnat-del", "198.51.100.10,80,udp,10.0.1.5,8080", ""},
		{"dnat-del", "198.51.100.10,80,udp,10.0.1.5", "want EIP,PORT,PROTOCOL,INTERNAL_IP,INTERNAL_PORT"},
	} {
		c, err := NewCall(tc.op, []string{tc.rules})
		if err == nil {
			err = c.Check()
		}
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s %q: %v, want %q", tc.op, tc.rules, err, tc.want)
		}
	}
	if _, err := NewCall("explode", nil); !errors.Is(err, ErrUnknownOp) {
		t.Errorf("unknown op: %v, want ErrUnknownOp", err)
	}
}
