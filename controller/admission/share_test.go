package admission

import (
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/kubeovn"
)

// TestWebhookShareDNAT: share DNATs (Kube-OVN master's
// IptablesDnatRule.spec.type) through a real API server with natgw's CRDs
// (upstream v1.16.2's prune spec.type) and the webhook as shipped: backends
// of one EIP·protocol·port are admitted and keep their type, an exclusive
// rule is refused on a shared identity and a share rule on an exclusive one
// (spec.type and the holder named), a backend twice is refused
// (spec.internalIp named), and the identity is free again once its
// backends are gone.
func TestWebhookShareDNAT(t *testing.T) {
	w := newWorldWith(t, true)
	for _, o := range []client.Object{
		kubeOVN("Vpc", "vpc1", map[string]any{}),
		kubeOVN("Subnet", "vpc1-net", map[string]any{"cidrBlock": "10.0.1.0/24", "gateway": "10.0.1.1", "vpc": "vpc1", "protocol": "IPv4"}),
		kubeOVN("Subnet", kubeovn.DefaultExternalNetwork, map[string]any{"cidrBlock": "192.0.2.0/24", "gateway": "192.0.2.1", "protocol": "IPv4", "provider": "ovn-vpc-external-network.kube-system"}),
		gw("gw1", nil),
		eip("eip1", "192.0.2.10", nil),
	} {
		if err := w.c.Create(w.ctx, o); err != nil {
			t.Fatalf("create %s: %v", o.GetName(), err)
		}
		w.cached(o)
	}
	rule := func(name, proto, port, typ, in string) *v1.IptablesDnatRule {
		return &v1.IptablesDnatRule{ObjectMeta: om(name), Spec: v1.IptablesDnatRuleSpec{EIP: "eip1", Protocol: proto, ExternalPort: port, InternalIP: in, InternalPort: "8080", Type: typ}}
	}
	objs := map[string]*v1.IptablesDnatRule{}
	// A refusal on the shared identity names one of its backends (any:
	// which one the webhook's cache lists first is not fixed).
	for _, tc := range []struct {
		name string
		obj  *v1.IptablesDnatRule
		want []string // empty: admitted
	}{
		{"exclusive", rule("excl", "tcp", "80", "", "10.0.1.5"), nil},
		{"share backend 1", rule("sh1", "tcp", "443", v1.DnatTypeShare, "10.0.1.5"), nil},
		{"share backend 2, no protocol (tcp)", rule("sh2", "", "443", v1.DnatTypeShare, "10.0.1.6"), nil},
		{"share backend 3", rule("sh3", "tcp", "443", v1.DnatTypeShare, "10.0.1.7"), nil},
		// natgw's CRDs take the protocol in lower case only.
		{"share backend, protocol in capitals", rule("x0", "TCP", "443", v1.DnatTypeShare, "10.0.1.9"), []string{"spec.protocol", "TCP"}},
		{"exclusive on a shared identity", rule("x1", "tcp", "443", v1.DnatTypeExclusive, "10.0.1.8"), []string{"spec.type", "exclusive", `IptablesDnatRule "sh`}},
		{"no type (exclusive) on a shared identity", rule("x2", "tcp", "443", "", "10.0.1.8"), []string{"spec.type", "443", `IptablesDnatRule "sh`}},
		{"share on an exclusive identity", rule("x3", "tcp", "80", v1.DnatTypeShare, "10.0.1.8"), []string{"spec.type", "share", `"excl"`}},
		{"share backend twice", rule("x4", "tcp", "443", v1.DnatTypeShare, "10.0.1.6"), []string{"spec.internalIp", "10.0.1.6:8080", `"sh2"`}},
		{"share on the same port, udp", rule("shu", "udp", "443", v1.DnatTypeShare, "10.0.1.6"), nil},
	} {
		err := w.c.Create(w.ctx, tc.obj)
		check(t, tc.name, err, tc.want...)
		if err == nil {
			objs[tc.obj.Name] = tc.obj
			w.cached(tc.obj)
		}
	}
	// Stored as sent: the type is kept (natgw's CRDs carry master's field).
	for _, name := range []string{"sh1", "sh2", "sh3", "shu"} {
		got := &v1.IptablesDnatRule{}
		if err := w.c.Get(w.ctx, client.ObjectKey{Name: name}, got); err != nil {
			t.Fatal(err)
		}
		if got.Spec.Type != v1.DnatTypeShare {
			t.Errorf("%s: stored spec.type %q, want %q", name, got.Spec.Type, v1.DnatTypeShare)
		}
	}
	// The identity's backends gone: an exclusive rule may take it.
	for _, name := range []string{"sh1", "sh2", "sh3"} {
		if err := w.c.Delete(w.ctx, objs[name]); err != nil {
			t.Fatal(err)
		}
		w.gone(objs[name])
	}
	check(t, "exclusive after the share backends went", w.c.Create(w.ctx, rule("x5", "tcp", "443", "", "10.0.1.8")))
}
