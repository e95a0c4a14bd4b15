package provision

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// TestGatewayNamespace: the one decision of the workload's namespace.
func TestGatewayNamespace(t *testing.T) {
	tests := []struct {
		name, spec, configured, want string
		nilGateway                   bool
	}{
		{name: "unset: the configured one", configured: "kube-system", want: "kube-system"},
		{name: "set: spec.namespace", spec: "team-a", configured: "kube-system", want: "team-a"},
		{name: "set to the configured one", spec: "kube-system", configured: "kube-system", want: "kube-system"},
		{name: "no gateway: the configured one", nilGateway: true, configured: "kube-system", want: "kube-system"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var g *v1.VpcNatGateway
			if !tc.nilGateway {
				g = &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: "gw1"}, Spec: v1.VpcNatGatewaySpec{Namespace: tc.spec}}
			}
			if got := GatewayNamespace(g, tc.configured); got != tc.want {
				t.Errorf("GatewayNamespace(spec %q, configured %q) = %q, want %q", tc.spec, tc.configured, got, tc.want)
			}
		})
	}
}

// TestNamespaceChange: a live gateway's namespace may not change; the
// refusal names the field and both values.
func TestNamespaceChange(t *testing.T) {
	tests := []struct {
		from, to string
		want     []string // substrings of the error; nil: allowed
	}{
		{from: "kube-system", to: "kube-system"},
		{from: "", to: ""},
		{from: "kube-system", to: "team-a", want: []string{"spec.namespace", "Forbidden", `"kube-system" cannot change to "team-a"`, "create a new VpcNatGateway"}},
		{from: "", to: "kube-system", want: []string{"spec.namespace", `"" cannot change to "kube-system"`}},
		{from: "team-a", to: "", want: []string{"spec.namespace", `"team-a" cannot change to ""`}},
	}
	for _, tc := range tests {
		t.Run(tc.from+"->"+tc.to, func(t *testing.T) {
			err := NamespaceChange(tc.from, tc.to)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("allowed, want refused")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestAllowedNamespace: the configured namespace and the listed ones only.
func TestAllowedNamespace(t *testing.T) {
	tests := []struct {
		ns    string
		extra []string
		want  bool
	}{
		{ns: "kube-system", want: true},
		{ns: "team-a", want: false},
		{ns: "team-a", extra: []string{"team-b", "team-a"}, want: true},
		{ns: "team-c", extra: []string{"team-b", "team-a"}, want: false},
		{ns: "", extra: []string{"team-a"}, want: false},
	}
	for _, tc := range tests {
		if got := AllowedNamespace(tc.ns, "kube-system", tc.extra); got != tc.want {
			t.Errorf("AllowedNamespace(%q, kube-system, %q) = %v, want %v", tc.ns, tc.extra, got, tc.want)
		}
	}
}
