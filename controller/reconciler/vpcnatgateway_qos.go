package reconciler

// Gateway-wide QoS in replace mode: a VpcNatGateway's spec.qosPolicy names
// a shared QoSPolicy of bindingType NATGW, whose bandwidth limit rules
// (status.bandwidthLimitRules, as upstream's execNatGwQoS reads them; Kube-OVN
// v1.16.2 pkg/controller/vpc_nat_gateway.go) become the gateway's
// gateway-wide QoS (package nat/gwqos, the agent's gwqos request). The
// gateway reconciler (vpcnatgateway.go) sends the list on every change of the
// gateway or its policy and records status.qosPolicy; the Source sends it
// with every sync of the gateway (a new boot id, a reconnect, a data plane
// switch) and a drift check sends it when it differs.

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

// gatewayQoSRules is what upstream programs on a gateway for policy p, read
// as upstream reads it: its status (shared, bindingType, rules sorted by
// name, written by the QoSPolicy reconcile once upstream's validation
// accepts the spec). Each rule is qos-add's: direction, interface ("": the
// gateway's external interface, net1), priority, matchType "ip" with
// matchValue "src|dst CIDR" (u32; the CIDR masked, as tc does) or no
// matchType (matchall), rateMax in Mbit/s, burstMax in MB of 2^20 bytes
// ("": 0, the kernel's bucket then holds one second of rate). Refused, as
// upstream refuses them, naming the field and value: a policy that is not
// shared or not of bindingType NATGW; and what upstream's script cannot
// program: no direction, no rateMax, an IPv6 CIDR, values out of range.
func gatewayQoSRules(p *v1.QoSPolicy) ([]gwqos.Rule, error) {
	return natgwRules(p.Name, "status", p.Status.Shared, p.Status.BindingType, p.Status.BandwidthLimitRules)
}

// natgwRules translates rules of policy name; from ("spec" or "status")
// prefixes the fields named in errors.
func natgwRules(name, from string, shared bool, binding v1.QoSPolicyBindingType, rules v1.QoSPolicyBandwidthLimitRules) ([]gwqos.Rule, error) {
	where := "QoSPolicy " + name + " " + from
	if !shared && binding == "" && len(rules) == 0 && from == "status" {
		return nil, invalid(where, "", "none written yet: natgw writes it once upstream's validation accepts the policy (see its Ready condition)")
	}
	if !shared {
		return nil, invalid(where+".shared", "false", "a VpcNatGateway's policy must be shared, as upstream requires")
	}
	if binding != v1.QoSBindingTypeNatGw {
		return nil, invalid(where+".bindingType", string(binding), "a VpcNatGateway's policy must have bindingType NATGW, as upstream requires")
	}
	out := make([]gwqos.Rule, 0, len(rules))
	for i, r := range rules {
		field := func(f string) string { return fmt.Sprintf("%s.bandwidthLimitRules[%d] (%s).%s", where, i, r.Name, f) }
		q, err := natgwRule(r, field)
		if err != nil {
			return nil, err
		}
		out = append(out, q)
	}
	return out, nil
}

// apiFields maps gwqos's field names to the rule's API fields.
var apiFields = map[string]string{
	"direction": "direction", "interface": "interface", "classifier": "matchType",
	"matchDirection": "matchValue", "cidr": "matchValue", "rateMbps": "rateMax", "burstMB": "burstMax",
}

func natgwRule(r v1.QoSPolicyBandwidthLimitRule, field func(string) string) (gwqos.Rule, error) {
	q := gwqos.Rule{Direction: gwqos.Direction(r.Direction), Iface: r.Interface}
	if r.Priority < 0 || r.Priority > 1<<16-1 {
		return q, invalid(field("priority"), strconv.Itoa(r.Priority), "want 0 to 65535 (tc's priority)")
	}
	q.Priority = uint16(r.Priority)
	switch r.MatchType {
	case "":
		q.Classifier = gwqos.MatchAll
	case v1.QoSMatchTypeIP:
		q.Classifier = gwqos.U32
		dir, p, err := nat.ParseQoSMatch(field("matchValue"), r.MatchValue)
		if err != nil {
			return q, err
		}
		q.MatchDir, q.CIDR = dir, p.Masked()
	default:
		return q, invalid(field("matchType"), string(r.MatchType), `want "ip" or none (all traffic)`)
	}
	if r.RateMax == "" {
		return q, invalid(field("rateMax"), "", "a gateway rule needs a rate (Mbit/s)")
	}
	var err error
	if q.RateMbps, err = strconv.ParseFloat(r.RateMax, 64); err != nil {
		return q, invalid(field("rateMax"), r.RateMax, "not a number of Mbit/s")
	}
	if r.BurstMax != "" {
		if q.BurstMB, err = strconv.ParseFloat(r.BurstMax, 64); err != nil {
			return q, invalid(field("burstMax"), r.BurstMax, "not a number of MB")
		}
	}
	// gwqos's own checks (ranges, an IPv4 CIDR), with the API's field
	// names; "" is the agent's external interface.
	check := q
	if check.Iface == "" {
		check.Iface = nat.DefaultExternalInterface
	}
	if err := check.Validate(); err != nil {
		var fe *nat.FieldError
		if !errors.As(err, &fe) {
			return q, err
		}
		value := fe.Value
		switch fe.Field {
		case "rateMbps":
			value = r.RateMax
		case "burstMB":
			value = r.BurstMax
		case "cidr", "matchDirection":
			value = r.MatchValue
		case "direction":
			value = string(r.Direction)
		case "interface":
			value = r.Interface
		}
		return q, invalid(field(apiFields[fe.Field]), value, fe.Reason)
	}
	return q, nil
}

// gatewayQoS resolves VpcNatGateway g's spec.qosPolicy into its rules (none
// when unset). A failure names the field; its err is set only for a failed
// read (not for a refused policy).
func (d *Deps) gatewayQoS(ctx context.Context, g *v1.VpcNatGateway) ([]gwqos.Rule, *failure) {
	name := g.Spec.QoSPolicy
	if name == "" {
		return nil, nil
	}
	p := &v1.QoSPolicy{}
	if err := d.Client.Get(ctx, types.NamespacedName{Name: name}, p); err != nil {
		f := fail(v1.ReasonInvalid, "spec.qosPolicy %q: %v", name, err)
		if !apierrors.IsNotFound(err) {
			f.err = err
		}
		return nil, f
	}
	rules, err := gatewayQoSRules(p)
	if err != nil {
		return nil, fail(v1.ReasonInvalid, "spec.qosPolicy %q: %v", name, err)
	}
	return rules, nil
}

// GatewayQoS returns the gateway-wide QoS gateway gw should hold per the
// cache: its live VpcNatGateway's policy's rules; none when there is no
// such gateway or policy, or the policy is refused (the gateway's
// reconcile reports that). An error is a failed read.
func (s *Source) GatewayQoS(ctx context.Context, gw string) ([]gwqos.Rule, error) {
	g := &v1.VpcNatGateway{}
	if err := s.deps.Client.Get(ctx, types.NamespacedName{Name: gw}, g); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("get VpcNatGateway %s: %w", gw, err)
	}
	if !isLive(g) {
		return nil, nil
	}
	rules, f := s.deps.gatewayQoS(ctx, g)
	if f != nil {
		return nil, f.err // nil for a refused policy: nothing programmed
	}
	return rules, nil
}

// gatewaysOfPolicy maps a QoSPolicy to the VpcNatGateways that name it.
func (d *Deps) gatewaysOfPolicy(ctx context.Context, o client.Object) []reconcile.Request {
	return d.requestsByIndex(ctx, &v1.VpcNatGateway{}, &v1.VpcNatGatewayList{}, qosPolicyIndex, o.GetName(), "map QoSPolicy to VpcNatGateways")
}

// policyStatusChanged passes the QoSPolicy updates a gateway's QoS reads:
// the status upstream's gateway path reads (shared, bindingType, rules).
var policyStatusChanged = updateChanged(func(o, n *v1.QoSPolicy) bool {
	return o.Status.Shared != n.Status.Shared || o.Status.BindingType != n.Status.BindingType ||
		!equality.Semantic.DeepEqual(o.Status.BandwidthLimitRules, n.Status.BandwidthLimitRules)
})
