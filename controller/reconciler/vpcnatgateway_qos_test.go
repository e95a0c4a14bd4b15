package reconciler

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

func natgwPolicy(rules ...v1.QoSPolicyBandwidthLimitRule) *v1.QoSPolicy {
	return &v1.QoSPolicy{ObjectMeta: metav1.ObjectMeta{Name: "gwq"}, Status: v1.QoSPolicyStatus{
		Shared: true, BindingType: v1.QoSBindingTypeNatGw, BandwidthLimitRules: rules}}
}

// TestGatewayQoSRules: a NATGW policy's status rules as qos-add reads them
// (upstream's units, interface "" for the external one, the CIDR masked),
// and what is refused, naming the field and value. No API server.
func TestGatewayQoSRules(t *testing.T) {
	lan := withMatch(rule("lan", v1.QoSDirectionEgress, "12.5", "0.5"), "src 10.0.1.7/24")
	lan.Priority, lan.Interface = 2, "net2"
	all := rule("all", v1.QoSDirectionIngress, "100", "")
	all.Priority = 5
	wantLan := gwqos.Rule{Direction: gwqos.Egress, Iface: "net2", Priority: 2, Classifier: gwqos.U32, MatchDir: "src",
		CIDR: netip.MustParsePrefix("10.0.1.0/24"), RateMbps: 12.5, BurstMB: 0.5}
	wantAll := gwqos.Rule{Direction: gwqos.Ingress, Priority: 5, Classifier: gwqos.MatchAll, RateMbps: 100}
	mod := func(r v1.QoSPolicyBandwidthLimitRule, f func(*v1.QoSPolicyBandwidthLimitRule)) v1.QoSPolicyBandwidthLimitRule {
		f(&r)
		return r
	}
	for _, tc := range []struct {
		name  string
		p     *v1.QoSPolicy
		want  []gwqos.Rule
		field string // of the error; "" for none
		value string
	}{
		{"u32 and matchall", natgwPolicy(lan, all), []gwqos.Rule{wantLan, wantAll}, "", ""},
		{"no rules", natgwPolicy(), []gwqos.Rule{}, "", ""},
		{"no status yet", &v1.QoSPolicy{ObjectMeta: metav1.ObjectMeta{Name: "gwq"}}, nil, "QoSPolicy gwq status", ""},
		{"unshared", func() *v1.QoSPolicy { p := natgwPolicy(all); p.Status.Shared = false; return p }(), nil, "QoSPolicy gwq status.shared", "false"},
		{"EIP binding", func() *v1.QoSPolicy { p := natgwPolicy(all); p.Status.BindingType = v1.QoSBindingTypeEIP; return p }(), nil, "QoSPolicy gwq status.bindingType", "EIP"},
		{"no direction", natgwPolicy(mod(all, func(r *v1.QoSPolicyBandwidthLimitRule) { r.Direction = "" })), nil, "QoSPolicy gwq status.bandwidthLimitRules[0] (all).direction", ""},
		{"no rate", natgwPolicy(mod(all, func(r *v1.QoSPolicyBandwidthLimitRule) { r.RateMax = "" })), nil, "QoSPolicy gwq status.bandwidthLimitRules[0] (all).rateMax", ""},
		{"rate beyond range", natgwPolicy(lan, mod(all, func(r *v1.QoSPolicyBandwidthLimitRule) { r.RateMax = "200000" })), nil, "QoSPolicy gwq status.bandwidthLimitRules[1] (all).rateMax", "200000"},
		{"burst beyond range", natgwPolicy(mod(all, func(r *v1.QoSPolicyBandwidthLimitRule) { r.BurstMax = "5000" })), nil, "QoSPolicy gwq status.bandwidthLimitRules[0] (all).burstMax", "5000"},
		{"bad interface", natgwPolicy(mod(all, func(r *v1.QoSPolicyBandwidthLimitRule) { r.Interface = "a/b" })), nil, "QoSPolicy gwq status.bandwidthLimitRules[0] (all).interface", "a/b"},
		{"matchValue without direction", natgwPolicy(withMatch(all, "10.0.0.0/8")), nil, "QoSPolicy gwq status.bandwidthLimitRules[0] (all).matchValue", "10.0.0.0/8"},
		{"IPv6 CIDR", natgwPolicy(withMatch(all, "dst 2001:db8::/64")), nil, "QoSPolicy gwq status.bandwidthLimitRules[0] (all).matchValue", "dst 2001:db8::/64"},
		{"matchType other than ip", natgwPolicy(mod(all, func(r *v1.QoSPolicyBandwidthLimitRule) { r.MatchType = "mac" })), nil, "QoSPolicy gwq status.bandwidthLimitRules[0] (all).matchType", "mac"},
		{"priority beyond tc's", natgwPolicy(mod(all, func(r *v1.QoSPolicyBandwidthLimitRule) { r.Priority = 70000 })), nil, "QoSPolicy gwq status.bandwidthLimitRules[0] (all).priority", "70000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := gatewayQoSRules(tc.p)
			if tc.field == "" {
				if err != nil || !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("gatewayQoSRules = %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			var fe *nat.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || fe.Value != tc.value {
				t.Fatalf("gatewayQoSRules = %+v, %v (%#v); want an error naming %s = %q", got, err, fe, tc.field, tc.value)
			}
		})
	}
}

// gatewayQoSIs polls until the test gateway's kernel holds want (read from
// table natgw_gwqos; nil: no table).
func (e *env) gatewayQoSIs(what string, want ...gwqos.Rule) {
	e.t.Helper()
	e.eventually(30*time.Second, what, func() error {
		got, err := gwqos.List(e.ctx, nat.Config{NetNS: e.gw.GW})
		if err != nil {
			return err
		}
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("gateway holds %+v, want %+v", got, want)
		}
		return nil
	})
}

// waitGatewayReady waits until the test gateway's Ready condition has
// reason and its message contains msg, and returns the gateway.
func (e *env) waitGatewayReady(g *v1.VpcNatGateway, reason, msg string) *v1.VpcNatGateway {
	e.t.Helper()
	e.eventually(30*time.Second, "gateway Ready "+reason, func() error {
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(g), g); err != nil {
			return err
		}
		c := v1.GatewayReady(g)
		if c == nil || c.Reason != reason || !strings.Contains(c.Message, msg) || c.ObservedGeneration != g.Generation {
			return fmt.Errorf("Ready %+v", c)
		}
		return nil
	})
	return g
}

// TestGatewayQoSProgrammed: a VpcNatGateway naming a shared NATGW QoSPolicy
// gets the policy's rules on its gateway (the real agent, table
// natgw_gwqos in the gateway's namespace: a rule without interface on
// net1), and status.qosPolicy; a rule change of the policy reaches the
// kernel; a new gateway pod (namespace recreated: new boot id) gets them
// again with its one sync; a policy upstream refuses for a gateway (EIP
// binding) leaves no gateway-wide QoS and says so in the gateway's Ready
// condition naming the field; unsetting spec.qosPolicy removes the table;
// deleting the gateway removes it too.
func TestGatewayQoSProgrammed(t *testing.T) {
	e := newEnv(t, envOptions{})
	lan := withMatch(rule("a-lan", v1.QoSDirectionEgress, "10", "1"), "src 10.0.1.0/24")
	lan.Priority = 1
	all := rule("b-all", v1.QoSDirectionIngress, "100", "2")
	all.Priority, all.Interface = 3, "eth0"
	p := e.policy("gw", v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeNatGw, Shared: true,
		BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{all, lan}})
	e.create(p)
	e.waitQoSCondition(p, v1.ConditionReady, v1.ReasonAccepted, 30*time.Second)
	g := e.gatewayObj()
	g.Spec.QoSPolicy = p.Name
	e.create(g)

	ext := e.gw.ExternalInterface
	wantLan := gwqos.Rule{Direction: gwqos.Egress, Iface: ext, Priority: 1, Classifier: gwqos.U32, MatchDir: "src",
		CIDR: netip.MustParsePrefix("10.0.1.0/24"), RateMbps: 10, BurstMB: 1}
	wantAll := gwqos.Rule{Direction: gwqos.Ingress, Iface: "eth0", Priority: 3, Classifier: gwqos.MatchAll, RateMbps: 100, BurstMB: 2}
	start := time.Now()
	e.gatewayQoSIs("the policy's rules on the gateway", wantLan, wantAll)
	t.Logf("gateway QoS programmed %v after the gateway's creation", time.Since(start).Round(time.Millisecond))
	g = e.waitGatewayReady(g, v1.ReasonProgrammed, "")
	if g.Status.QoSPolicy != p.Name {
		t.Errorf("status.qosPolicy = %q, want %q", g.Status.QoSPolicy, p.Name)
	}

	// A rule change of the policy.
	e.update(p, func() { p.Spec.BandwidthLimitRules[1].RateMax = "20" })
	wantLan.RateMbps = 20
	e.gatewayQoSIs("the changed rate on the gateway", wantLan, wantAll)

	// A new gateway pod: the namespace comes back empty, the agent with a
	// new boot id.
	errc := make(chan error, 1)
	go func() { errc <- e.gw.RecreateGW(e.ctx) }()
	e.eventually(10*time.Second, "old namespace removed", func() error {
		if _, err := os.Stat("/run/netns/" + e.gw.GW); err == nil {
			return fmt.Errorf("%s still mounted", e.gw.GW)
		}
		return nil
	})
	e.tr.breakAll()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	e.gatewayQoSIs("the rules again on the new pod", wantLan, wantAll)

	// A policy upstream refuses for a gateway: bindingType EIP.
	eipPolicy := e.policy("eip", v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP, Shared: true,
		BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{rule("in", v1.QoSDirectionIngress, "10", "1")}})
	e.create(eipPolicy)
	e.waitQoSCondition(eipPolicy, v1.ConditionReady, v1.ReasonAccepted, 30*time.Second)
	e.update(g, func() { g.Spec.QoSPolicy = eipPolicy.Name })
	e.waitGatewayReady(g, v1.ReasonInvalid, "status.bindingType")
	e.gatewayQoSIs("no gateway QoS for a refused policy")
	if g.Status.QoSPolicy != p.Name {
		t.Errorf("status.qosPolicy = %q after a refused policy, want the last programmed one %q", g.Status.QoSPolicy, p.Name)
	}
	e.waitQoSCondition(eipPolicy, v1.ConditionReady, v1.ReasonUnsupported, 30*time.Second)

	// Back to the NATGW policy, then unset.
	e.update(g, func() { g.Spec.QoSPolicy = p.Name })
	e.gatewayQoSIs("the rules back", wantLan, wantAll)
	e.update(g, func() { g.Spec.QoSPolicy = "" })
	e.gatewayQoSIs("no gateway QoS once unset")
	g = e.waitGatewayReady(g, v1.ReasonProgrammed, "")
	if g.Status.QoSPolicy != "" {
		t.Errorf("status.qosPolicy = %q once unset, want none", g.Status.QoSPolicy)
	}

	// Deleting the gateway takes its QoS with it.
	e.update(g, func() { g.Spec.QoSPolicy = p.Name })
	e.gatewayQoSIs("the rules before the delete", wantLan, wantAll)
	if err := e.c.Delete(e.ctx, g); err != nil {
		t.Fatal(err)
	}
	e.waitGone(g, 30*time.Second)
	e.gatewayQoSIs("no gateway QoS after the gateway's delete")
}
