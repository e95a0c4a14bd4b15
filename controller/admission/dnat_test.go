package admission

import (
	"strings"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/nat"
)

// TestDNATConflict: a DNAT is checked against the live DNATs of its EIP
// with nat.State's rules (exclusive and share), without an API server.
func TestDNATConflict(t *testing.T) {
	mk := func(name, proto, port, typ, in string) v1.IptablesDnatRule {
		return v1.IptablesDnatRule{ObjectMeta: om(name), Spec: v1.IptablesDnatRuleSpec{EIP: "e", Protocol: proto, ExternalPort: port, InternalIP: in, InternalPort: "8080", Type: typ}}
	}
	others := []v1.IptablesDnatRule{
		mk("excl", "tcp", "80", "", "10.0.1.5"),
		mk("sh1", "tcp", "443", v1.DnatTypeShare, "10.0.1.5"),
		mk("sh2", "", "443", v1.DnatTypeShare, "10.0.1.6"),
	}
	for _, tc := range []struct {
		name string
		obj  v1.IptablesDnatRule
		want []string // empty: allowed
	}{
		{"other port", mk("new", "tcp", "81", "", "10.0.1.7"), nil},
		{"exclusive on an exclusive port", mk("new", "TCP", "80", "", "10.0.1.7"), []string{"spec.externalPort", "80", `"excl"`}},
		{"explicit exclusive on a shared port", mk("new", "tcp", "443", v1.DnatTypeExclusive, "10.0.1.7"), []string{"spec.type", "exclusive", `"sh1"`}},
		{"share on an exclusive port", mk("new", "tcp", "80", v1.DnatTypeShare, "10.0.1.7"), []string{"spec.type", "share", `"excl"`}},
		{"third share backend", mk("new", "tcp", "443", v1.DnatTypeShare, "10.0.1.7"), nil},
		{"share backend twice", mk("new", "tcp", "443", v1.DnatTypeShare, "10.0.1.6"), []string{"spec.internalIp", "10.0.1.6:8080", `"sh2"`}},
		{"same port, udp", mk("new", "udp", "443", "", "10.0.1.7"), nil},
		{"itself (an update)", mk("sh1", "tcp", "443", v1.DnatTypeShare, "10.0.1.5"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := func(o client.Object) bool { return o.GetName() != tc.obj.Name }
			errs := dnatConflict(&tc.obj, "e", nat.EIP{}, others, live)
			if len(tc.want) == 0 {
				if len(errs) > 0 {
					t.Fatalf("refused: %v", errs)
				}
				return
			}
			if len(errs) != 1 {
				t.Fatalf("errors %v, want one naming %v", errs, tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(errs[0].Error(), w) {
					t.Errorf("%q does not mention %q", errs[0].Error(), w)
				}
			}
		})
	}
}
