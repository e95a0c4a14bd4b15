package reconciler

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/gwimage/compat"
	"github.com/natgw/natgw/nat"
)

// This file turns API objects into nat.Objects. The functions are pure: the
// callers resolve what they need from the API first.

// invalid is a spec the gateway cannot program: a *nat.FieldError naming
// the API field, as nat's own validation names the object's.
func invalid(field, value, reason string) error {
	return &nat.FieldError{Field: field, Value: value, Reason: reason}
}

// validated runs nat's own validation so that what reaches the agent is
// known to be valid (the agent would refuse the same way).
func validated(o nat.Object) (nat.Object, error) {
	if err := o.Validate(); err != nil {
		return nat.Object{}, err
	}
	return o, nil
}

// EIPAddress returns the address an EIP uses: spec.v4ip, else status.ip
// (set by an allocator), parsed with nat.ParseUnicastIPv4; the error names the
// field it came from. The empty Addr means none yet. The admission webhook
// and the reconciles read an EIP's address only through it.
func EIPAddress(e *v1.IptablesEIP) (netip.Addr, error) {
	s := e.Spec.V4ip
	field := "spec.v4ip"
	if s == "" {
		s, field = e.Status.IP, "status.ip"
	}
	if s == "" {
		return netip.Addr{}, nil
	}
	return nat.ParseUnicastIPv4(field, s)
}

// eipObject is the EIP as a gateway object: its address with the external
// network's prefix length, and its QoS when a policy limits it.
func eipObject(e *v1.IptablesEIP, prefixLen int, qos *nat.QoS) (nat.Object, error) {
	addr, err := EIPAddress(e)
	if err != nil {
		return nat.Object{}, err
	}
	if !addr.IsValid() {
		return nat.Object{}, invalid("spec.v4ip", "", "no address: set spec.v4ip (with --network-source=config natgw reserves no addresses)")
	}
	return validated(nat.Object{UID: string(e.UID), Kind: nat.KindEIP,
		EIP: &nat.EIP{Address: addr, PrefixLen: prefixLen, QoS: qos}})
}

// qosObject maps a QoSPolicy's EIP bandwidth limits (Mbit/s, as upstream)
// to nat.QoS. A rule's match (matchType/matchValue) is not used: the limit
// holds all of the EIP's traffic in its direction, as Kube-OVN's EIP path
// programs it (addOrUpdateEIPBandwidthLimitRules passes the EIP, direction,
// priority, rate and burst to eip-*-qos-add, vpc_nat_gw_eip.go:434-443);
// the QoSPolicy reconcile reports the unused match on the policy.
func qosObject(p *v1.QoSPolicy) (*nat.QoS, error) {
	if p == nil {
		return nil, nil
	}
	q := &nat.QoS{}
	for i, r := range p.Spec.BandwidthLimitRules {
		where := fmt.Sprintf("qosPolicy %s: bandwidthLimitRules[%d]", p.Name, i)
		rate, err := mbit(where+".rateMax", r.RateMax)
		if err != nil {
			return nil, err
		}
		burst, err := burstMbit(where+".burstMax", r.BurstMax)
		if err != nil {
			return nil, err
		}
		switch r.Direction {
		case v1.QoSDirectionIngress:
			q.IngressRateMbps, q.IngressBurstMbit = rate, burst
		case v1.QoSDirectionEgress:
			q.EgressRateMbps, q.EgressBurstMbit = rate, burst
		default:
			return nil, invalid(where+".direction", string(r.Direction), "must be ingress or egress")
		}
	}
	if *q == (nat.QoS{}) {
		return nil, nil
	}
	return q, nil
}

// burstMbit parses a burst in Kube-OVN's unit, MB of 1,048,576 bytes
// (upstream's script multiplies it by 1,048,576; decimals allowed), into
// the data plane's whole Mbit (125,000 bytes), rounded up so that a burst is
// never smaller than asked. At most 4095 MB (the script's 32-bit bytes).
func burstMbit(field, s string) (uint32, error) {
	if s == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f*compat.BytesPerMB > math.MaxUint32 {
		return 0, invalid(field, s, "not a number of MB from 0 to 4095")
	}
	return uint32(math.Ceil(f * compat.BytesPerMB * 8 / 1e6)), nil
}

// mbit parses a whole number of Mbit ("" is 0); fractions are rounded up so
// that a limit never becomes "unlimited".
func mbit(field, s string) (uint32, error) {
	if s == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f > 100_000 {
		return 0, invalid(field, s, "not a number of Mbit from 0 to 100000")
	}
	n := uint32(f)
	if float64(n) < f {
		n++
	}
	return n, nil
}

func fipObject(f *v1.IptablesFIPRule, eip netip.Addr) (nat.Object, error) {
	in, err := nat.ParseUnicastIPv4("spec.internalIp", f.Spec.InternalIP)
	if err != nil {
		return nat.Object{}, err
	}
	return validated(nat.Object{UID: string(f.UID), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip, InternalIP: in}})
}

func dnatObject(d *v1.IptablesDnatRule, eip netip.Addr) (nat.Object, error) {
	in, err := nat.ParseUnicastIPv4("spec.internalIp", d.Spec.InternalIP)
	if err != nil {
		return nat.Object{}, err
	}
	ext, err := nat.ParsePort("spec.externalPort", d.Spec.ExternalPort)
	if err != nil {
		return nat.Object{}, err
	}
	inPort, err := nat.ParsePort("spec.internalPort", d.Spec.InternalPort)
	if err != nil {
		return nat.Object{}, err
	}
	proto, err := nat.ParseProtocol("spec.protocol", d.Spec.Protocol)
	if err != nil {
		return nat.Object{}, err
	}
	return validated(nat.Object{UID: string(d.UID), Kind: nat.KindDNAT, DNAT: &nat.DNAT{
		EIP: eip, Protocol: proto, ExternalPort: ext, InternalIP: in, InternalPort: inPort, Type: dnatType(d.Spec.Type)}})
}

// dnatType is spec.type as natgw's DNAT type: share, or exclusive (the
// default, also for an empty type). Other values are left for nat's
// validation to refuse.
func dnatType(t string) nat.DNATType {
	switch t {
	case "", v1.DnatTypeExclusive:
		return ""
	}
	return nat.DNATType(t)
}

// snatObject accepts a bare address (a /32) and a CIDR with host bits set
// (masked), like iptables does for upstream's script.
func snatObject(s *v1.IptablesSnatRule, eip netip.Addr) (nat.Object, error) {
	cidr, err := nat.ParseIPv4Prefix("spec.internalCIDR", s.Spec.InternalCIDR)
	if err != nil {
		return nat.Object{}, err
	}
	return validated(nat.Object{UID: string(s.UID), Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: eip, InternalCIDR: cidr.Masked()}})
}

// routeSep separates a gateway's UID from a route's destination in the
// UIDs of route objects: "<gateway uid>:rt:<a.b.c.d>-<len>". Deriving the
// UID from the destination keeps it stable when routes are reordered, and a
// next-hop change is then one in-place update.
const routeSep = ":rt:"

// routeUID returns the UID of the route to dst of gateway gwUID.
func routeUID(gwUID string, dst netip.Prefix) string {
	return gwUID + routeSep + dst.Addr().String() + "-" + strconv.Itoa(dst.Bits())
}

// routeOwner returns the gateway UID of a route object's UID.
func routeOwner(uid string) (string, bool) {
	owner, _, ok := strings.Cut(uid, routeSep)
	return owner, ok
}

// routeObjects are the gateway's routes: spec.routes via the VPC
// interface; the routes to the VPC's other subnets via the internal
// gateway (net.VPCRoutes; a destination spec.routes also names keeps
// spec.routes' next hop); and the default route via the external gateway
// (onlink) when net names one.
func routeObjects(g *v1.VpcNatGateway, net kubeovn.Network) ([]nat.Object, error) {
	var out []nat.Object
	add := func(field string, dst netip.Prefix, via netip.Addr, dev nat.RouteDevice) error {
		o, err := validated(nat.Object{UID: routeUID(string(g.UID), dst), Kind: nat.KindRoute,
			Route: &nat.Route{Destination: dst, NextHop: via, Device: dev}})
		if err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		out = append(out, o)
		return nil
	}
	seen := map[netip.Prefix]string{}
	for i, r := range g.Spec.Routes {
		field := fmt.Sprintf("spec.routes[%d]", i)
		dst, err := nat.ParseIPv4Network(field+".cidr", r.CIDR)
		if err != nil {
			return nil, err
		}
		if prev, dup := seen[dst]; dup {
			return nil, invalid(field+".cidr", r.CIDR, "same destination as "+prev)
		}
		seen[dst] = field
		via, err := nat.ParseUnicastIPv4(field+".nextHopIP", r.NextHopIP)
		if err != nil {
			return nil, err
		}
		if err := add(field, dst, via, nat.DeviceInternal); err != nil {
			return nil, err
		}
	}
	for _, dst := range net.VPCRoutes {
		if _, dup := seen[dst]; dup {
			continue
		}
		seen[dst] = "the VPC subnet route " + dst.String()
		if err := add("VPC subnet route "+dst.String(), dst, net.InternalGateway, nat.DeviceInternal); err != nil {
			return nil, err
		}
	}
	if gw := net.ExternalGateway; gw.IsValid() {
		if prev, dup := seen[defaultRoute]; dup {
			return nil, invalid(prev+".cidr", "0.0.0.0/0", "the default route goes via the external gateway "+gw.String())
		}
		if err := add("default route", defaultRoute, gw, nat.DeviceExternal); err != nil {
			return nil, err
		}
	}
	return out, nil
}
