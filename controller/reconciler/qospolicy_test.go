package reconciler

import (
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// rule is a bandwidth limit rule for tests.
func rule(name string, dir v1.QoSPolicyRuleDirection, rate, burst string) v1.QoSPolicyBandwidthLimitRule {
	return v1.QoSPolicyBandwidthLimitRule{Name: name, Direction: dir, RateMax: rate, BurstMax: burst}
}

func withMatch(r v1.QoSPolicyBandwidthLimitRule, value string) v1.QoSPolicyBandwidthLimitRule {
	r.MatchType, r.MatchValue = v1.QoSMatchTypeIP, value
	return r
}

// TestQoSPolicyChecks: upstream's validation (what it refuses, writing no
// status) and what natgw's data plane does not program, each naming the
// field and value. No API server.
func TestQoSPolicyChecks(t *testing.T) {
	in10 := rule("in", v1.QoSDirectionIngress, "10", "1")
	for _, tc := range []struct {
		name        string
		spec        v1.QoSPolicySpec
		gateways    []string
		invalid     []string // substrings, one per finding
		unsupported []string
	}{
		{name: "eip, one rule per direction", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{in10, rule("out", v1.QoSDirectionEgress, "0.5", "")}}},
		{name: "no binding type (upstream's EIP path does not check it)", spec: v1.QoSPolicySpec{
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{in10}}},
		{name: "rate not a number", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{rule("in", v1.QoSDirectionIngress, "1e3", "-1")}},
			invalid: []string{`(in).rateMax "1e3"`, `(in).burstMax "-1"`}},
		{name: "bad interface and direction", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{{Name: "x", Interface: "eth0;reboot", Direction: "both"}}},
			invalid: []string{`(x).interface "eth0;reboot"`, `(x).direction "both"`}},
		{name: "ip match without src/dst", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{withMatch(in10, "10.0.1.5")}},
			invalid: []string{`(in).matchValue "10.0.1.5"`}},
		{name: "NATGW not shared", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeNatGw},
			invalid: []string{"spec.shared false with spec.bindingType NATGW"}},
		{name: "NATGW shared, a match and a matchall", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeNatGw, Shared: true,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{withMatch(in10, "dst 10.0.1.0/24"), rule("all", v1.QoSDirectionEgress, "100", "")}},
			gateways: []string{"gw1"}},
		{name: "NATGW rule without rate", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeNatGw, Shared: true,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{rule("x", v1.QoSDirectionEgress, "", "1")}},
			unsupported: []string{`spec.bandwidthLimitRules[0] (x).rateMax ""`}},
		{name: "NATGW rule without direction", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeNatGw, Shared: true,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{rule("x", "", "1", "1")}},
			unsupported: []string{`spec.bandwidthLimitRules[0] (x).direction ""`}},
		{name: "EIP rule with a match", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{withMatch(in10, "src 10.0.1.0/24")}},
			unsupported: []string{`spec.bandwidthLimitRules[0] (in).matchValue "src 10.0.1.0/24"`}},
		{name: "EIP rule without direction", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{rule("any", "", "10", "")}},
			unsupported: []string{`spec.bandwidthLimitRules[0] (any).direction ""`}},
		{name: "two rules one direction", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{in10, rule("in2", v1.QoSDirectionIngress, "20", "")}},
			unsupported: []string{`spec.bandwidthLimitRules[1] (in2).direction "ingress": also the direction of spec.bandwidthLimitRules[0] (in)`}},
		{name: "rate beyond the EIP path's range", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{rule("in", v1.QoSDirectionIngress, "200000", "")}},
			unsupported: []string{`bandwidthLimitRules[0].rateMax`}},
		{name: "EIP policy named by a gateway", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{in10}},
			gateways:    []string{"gw1", "gw2"},
			unsupported: []string{`spec.bindingType "EIP" named in spec.qosPolicy of VpcNatGateway gw1, gw2`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &v1.QoSPolicy{ObjectMeta: metav1.ObjectMeta{Name: "q"}, Spec: tc.spec}
			check := func(what string, got, want []string) {
				t.Helper()
				if len(got) != len(want) {
					t.Fatalf("%s: got %d findings %q, want %d like %q", what, len(got), got, len(want), want)
				}
				for i := range want {
					if !strings.Contains(got[i], want[i]) {
						t.Errorf("%s[%d] = %q, want it to contain %q", what, i, got[i], want[i])
					}
				}
			}
			invalid := validateQoSPolicy(p)
			check("invalid", invalid, tc.invalid)
			if len(invalid) == 0 {
				check("unsupported", unsupportedQoS(p, qosUsers{gateways: tc.gateways}), tc.unsupported)
			}
		})
	}
	if got := (qosUsers{eips: []string{"a", "b"}, gateways: []string{"g"}}).String(); got != "IptablesEIP a, b; VpcNatGateway g" {
		t.Errorf("users: %q", got)
	}
	if got := joinNames([]string{"a", "b", "c"}, 2); got != "a, b and 1 more" {
		t.Errorf("joinNames: %q", got)
	}
}

// policy returns the test's QoSPolicy name.
func (e *env) policy(name string, spec v1.QoSPolicySpec) *v1.QoSPolicy {
	return &v1.QoSPolicy{ObjectMeta: e.meta(name), Spec: spec}
}

// waitQoSCondition waits until p's condition typ has reason (for the
// policy's current generation) and returns it.
func (e *env) waitQoSCondition(p *v1.QoSPolicy, typ, reason string, timeout time.Duration) v1.Condition {
	e.t.Helper()
	var got v1.Condition
	e.eventually(timeout, fmt.Sprintf("QoSPolicy %s %s %s", p.Name, typ, reason), func() error {
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
		c := v1.FindCondition(p.Status.Conditions, typ)
		if c == nil {
			return fmt.Errorf("no %s condition (%+v)", typ, p.Status.Conditions)
		}
		if c.Reason != reason || c.ObservedGeneration != p.Generation {
			return fmt.Errorf("%s %s (generation %d of %d): %s", c.Status, c.Reason, c.ObservedGeneration, p.Generation, c.Message)
		}
		got = *c
		return nil
	})
	return got
}

// TestQoSPolicyStatus: natgw's finalizer; status as upstream writes it
// (shared, bindingType, bandwidthLimitRules sorted by name) for a policy
// upstream accepts, none for one it refuses (Ready Invalid naming the
// field); what natgw does not program reported (Ready Unsupported with a
// Warning Event naming field and value): an EIP rule with a match; a NATGW
// policy is Accepted, also once a VpcNatGateway names it. On natgw's CRDs
// and upstream's.
func TestQoSPolicyStatus(t *testing.T) {
	for _, set := range crdtest.Sets {
		t.Run(string(set), func(t *testing.T) { testQoSPolicyStatus(t, set) })
	}
}

func testQoSPolicyStatus(t *testing.T, set crdtest.Set) {
	e := newEnv(t, envOptions{crds: set})
	in10 := rule("a-in", v1.QoSDirectionIngress, "10", "1")
	out20 := rule("z-out", v1.QoSDirectionEgress, "20", "2")
	for _, tc := range []struct {
		name      string
		spec      v1.QoSPolicySpec
		reason    string // of Ready
		msg       []string
		written   bool // status records the spec
		wantRules []string
	}{
		{name: "eip", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{out20, in10}},
			reason: v1.ReasonAccepted, written: true, wantRules: []string{"a-in", "z-out"}},
		{name: "natgw", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeNatGw, Shared: true,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{withMatch(rule("lan", v1.QoSDirectionEgress, "5", "1"), "dst 10.0.1.0/24")}},
			reason: v1.ReasonAccepted, msg: []string{"VpcNatGateways"}, written: true, wantRules: []string{"lan"}},
		{name: "eip-match", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{withMatch(in10, "src 10.0.1.0/24")}},
			reason: v1.ReasonUnsupported, msg: []string{`matchValue "src 10.0.1.0/24"`}, written: true, wantRules: []string{"a-in"}},
		{name: "natgw-unshared", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeNatGw},
			reason: v1.ReasonInvalid, msg: []string{"spec.shared false"}},
		{name: "bad-match", spec: v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
			BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{withMatch(in10, "10.0.1.5")}},
			reason: v1.ReasonInvalid, msg: []string{`matchValue "10.0.1.5"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := e.policy(tc.name, tc.spec)
			e.create(p)
			ready := e.waitQoSCondition(p, v1.ConditionReady, tc.reason, 30*time.Second)
			for _, m := range tc.msg {
				if !strings.Contains(ready.Message, m) {
					t.Errorf("Ready message %q does not name %q", ready.Message, m)
				}
			}
			if !containsString(p.Finalizers, Finalizer) {
				t.Errorf("finalizers = %v, want %s", p.Finalizers, Finalizer)
			}
			if c := v1.FindCondition(p.Status.Conditions, v1.ConditionInUse); c == nil || c.Reason != v1.ReasonNotInUse {
				t.Errorf("InUse = %+v, want NotInUse", c)
			}
			s := p.Status
			if tc.written {
				var names []string
				for _, r := range s.BandwidthLimitRules {
					names = append(names, r.Name)
				}
				if s.Shared != tc.spec.Shared || s.BindingType != tc.spec.BindingType || strings.Join(names, ",") != strings.Join(tc.wantRules, ",") {
					t.Errorf("status shared %v bindingType %q rules %v; want %v %q %v", s.Shared, s.BindingType, names, tc.spec.Shared, tc.spec.BindingType, tc.wantRules)
				}
			} else if s.Shared || s.BindingType != "" || len(s.BandwidthLimitRules) != 0 {
				t.Errorf("status of a policy upstream refuses: %+v, want none written", s)
			}
			if tc.reason != v1.ReasonAccepted {
				e.eventually(10*time.Second, tc.reason+" event", func() error { return e.hasEvent(p, tc.reason) })
			}
		})
	}

	// A VpcNatGateway naming the NATGW policy: a user, still Accepted
	// (TestGatewayQoSProgrammed checks what reaches the gateway).
	p := &v1.QoSPolicy{}
	p.Name = e.case_ + "-natgw"
	g := e.gatewayObj()
	g.Spec.QoSPolicy = p.Name
	e.create(g)
	e.waitQoSCondition(p, v1.ConditionInUse, v1.ReasonInUse, 30*time.Second)
	if c := v1.FindCondition(p.Status.Conditions, v1.ConditionReady); c == nil || c.Reason != v1.ReasonAccepted {
		t.Errorf("Ready of a NATGW policy named by a gateway: %+v, want Accepted", c)
	}
}

// TestQoSPolicyDeletionHeld: a policy named by an IptablesEIP and a
// VpcNatGateway keeps natgw's finalizer when deleted (InUse
// DeletionBlocked naming both, a Warning Event) until the last reference
// goes; the EIP keeps its limit until it drops the policy.
func TestQoSPolicyDeletionHeld(t *testing.T) {
	e := newEnv(t, envOptions{})
	p := e.policy("held", v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
		BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{rule("in", v1.QoSDirectionIngress, "10", "1")}})
	e.create(p)
	e.waitQoSCondition(p, v1.ConditionReady, v1.ReasonAccepted, 30*time.Second)
	g := e.gatewayObj()
	g.Spec.QoSPolicy = p.Name
	e.create(g)
	eip := e.eip("eip", netlab.EIP(5))
	eip.Spec.QoSPolicy = p.Name
	e.create(eip)
	e.waitReady(eip)
	e.waitQoSCondition(p, v1.ConditionInUse, v1.ReasonInUse, 30*time.Second)

	if err := e.c.Delete(e.ctx, p); err != nil {
		t.Fatal(err)
	}
	c := e.waitQoSCondition(p, v1.ConditionInUse, v1.ReasonDeletionBlocked, 30*time.Second)
	for _, n := range []string{"IptablesEIP " + eip.Name, "VpcNatGateway " + g.Name} {
		if !strings.Contains(c.Message, n) {
			t.Errorf("DeletionBlocked message %q does not name %s", c.Message, n)
		}
	}
	if !containsString(p.Finalizers, Finalizer) || p.DeletionTimestamp.IsZero() {
		t.Fatalf("policy: finalizers %v, deleting %v", p.Finalizers, !p.DeletionTimestamp.IsZero())
	}
	e.eventually(10*time.Second, "DeletionBlocked event", func() error { return e.hasEvent(p, v1.ReasonDeletionBlocked) })
	if o, ok := hasUID(e.kernelObjects(e.dataplane), eip.UID); !ok || o.EIP.QoS == nil || o.EIP.QoS.IngressRateMbps != 10 {
		t.Errorf("EIP while its policy is held: %v", o)
	}

	// The EIP drops the policy: its limit goes, the gateway still holds
	// the policy.
	e.update(eip, func() { eip.Spec.QoSPolicy = "" })
	e.waitReady(eip)
	e.eventually(30*time.Second, "EIP limit removed", func() error {
		if o, ok := hasUID(e.kernelObjects(e.dataplane), eip.UID); !ok || o.EIP.QoS != nil {
			return fmt.Errorf("kernel: %v", o)
		}
		return nil
	})
	e.eventually(30*time.Second, "only the gateway named", func() error {
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(p), p); err != nil {
			return err
		}
		c := v1.FindCondition(p.Status.Conditions, v1.ConditionInUse)
		if c == nil || c.Reason != v1.ReasonDeletionBlocked || strings.Contains(c.Message, "IptablesEIP") || !strings.Contains(c.Message, g.Name) {
			return fmt.Errorf("InUse %+v", c)
		}
		return nil
	})

	// The last reference goes: the policy with it.
	e.update(g, func() { g.Spec.QoSPolicy = "" })
	e.waitGone(p, 30*time.Second)
}

// TestQoSPolicyRulesChangeEIPLimits: the existing path still works with
// the policy's own reconcile: a rule change reaches the EIP's limits in
// the kernel, and the policy's status records the new rules.
func TestQoSPolicyRulesChangeEIPLimits(t *testing.T) {
	e := newEnv(t, envOptions{})
	p := e.policy("limits", v1.QoSPolicySpec{BindingType: v1.QoSBindingTypeEIP,
		BandwidthLimitRules: v1.QoSPolicyBandwidthLimitRules{
			rule("in", v1.QoSDirectionIngress, "10", "1"), rule("out", v1.QoSDirectionEgress, "20", "2")}})
	e.create(p)
	eip := e.eip("eip", netlab.EIP(6))
	eip.Spec.QoSPolicy = p.Name
	e.create(eip)
	e.waitReady(eip)
	qosIs := func(want nat.QoS) func() error {
		return func() error {
			o, ok := hasUID(e.kernelObjects(e.dataplane), eip.UID)
			if !ok || o.EIP.QoS == nil || *o.EIP.QoS != want {
				return fmt.Errorf("kernel: %v, want qos %+v", o, want)
			}
			return nil
		}
	}
	e.eventually(30*time.Second, "limits programmed", qosIs(nat.QoS{IngressRateMbps: 10, IngressBurstMbit: 9, EgressRateMbps: 20, EgressBurstMbit: 17}))

	e.update(p, func() { p.Spec.BandwidthLimitRules[0].RateMax = "30" })
	e.eventually(30*time.Second, "limits changed", qosIs(nat.QoS{IngressRateMbps: 30, IngressBurstMbit: 9, EgressRateMbps: 20, EgressBurstMbit: 17}))
	e.waitQoSCondition(p, v1.ConditionReady, v1.ReasonAccepted, 30*time.Second)
	if len(p.Status.BandwidthLimitRules) != 2 || p.Status.BandwidthLimitRules[0].RateMax != "30" {
		t.Errorf("status rules %+v, want the new rateMax", p.Status.BandwidthLimitRules)
	}
	if c := v1.FindCondition(p.Status.Conditions, v1.ConditionInUse); c == nil || c.Reason != v1.ReasonInUse {
		t.Errorf("InUse %+v, want InUse", c)
	}

	// A match on an EIP rule is not used, as Kube-OVN's EIP path: the EIP
	// stays programmed with the rule's limit on all of its traffic, and
	// the policy says the match is unused.
	e.update(p, func() {
		p.Spec.BandwidthLimitRules[0].MatchType, p.Spec.BandwidthLimitRules[0].MatchValue = v1.QoSMatchTypeIP, "src 10.0.1.0/24"
		p.Spec.BandwidthLimitRules[0].RateMax = "40"
	})
	e.eventually(30*time.Second, "limits with a match", qosIs(nat.QoS{IngressRateMbps: 40, IngressBurstMbit: 9, EgressRateMbps: 20, EgressBurstMbit: 17}))
	ready := e.waitQoSCondition(p, v1.ConditionReady, v1.ReasonUnsupported, 30*time.Second)
	if !strings.Contains(ready.Message, `matchValue "src 10.0.1.0/24"`) || !strings.Contains(ready.Message, "not used") {
		t.Errorf("Ready message %q, want the unused match named", ready.Message)
	}
	e.waitReady(eip)
}
