package admission_test

import (
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/nat"
)

// TestLanIPNatRule: a VpcNatGateway's spec.lanIp is an address of either
// family by nat's rule (nat.ParseIP): the webhook's verdict is nat's, naming
// the same field, with nat's reason.
func TestLanIPNatRule(t *testing.T) {
	v := validator(t)
	for _, lan := range []string{"10.0.1.254", "2001:db8::254", "10.0.1", "10.0.1.254/24", "fe80::1%eth0", "", "x"} {
		g := &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: "gw1"}, Spec: v1.VpcNatGatewaySpec{Vpc: "vpc1", Subnet: "vpc1-net", LanIP: lan}}
		got := admitObject(t, v, g, "VpcNatGateway")
		want := verdictOf(func() error { _, err := nat.ParseIP("spec.lanIp", lan); return err }())
		if got.verdict != want.verdict || got.field != want.field {
			t.Errorf("lanIp %q: webhook %s naming %q (%s); nat %s naming %q (%s)", lan, got.verdict, got.field, got.err, want.verdict, want.field, want.err)
		}
		var fe *nat.FieldError
		if _, err := nat.ParseIP("spec.lanIp", lan); errors.As(err, &fe) && !strings.Contains(got.err, fe.Reason) {
			t.Errorf("lanIp %q: webhook says %q, want nat's reason %q", lan, got.err, fe.Reason)
		}
	}
}
