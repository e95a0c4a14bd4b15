package reconciler

import (
	"errors"
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

// EIPAddrs returns the addresses an EIP uses: IPv4 from spec.v4ip, else
// status.ip when it is IPv4 (set by an allocator); IPv6 from spec.v6ip, else
// status.ip when it is IPv6 (an IPv6-only EIP). They are parsed with nat's
// rules (nat.ParseUnicastIPv4, nat.ParseUnicastIPv6, nat.ParseUnicastIP);
// the error names the field the value came from. Prefix lengths and QoS are
// left zero. An EIP without any address yet has neither set. The admission
// webhook and the reconciles read an EIP's addresses only through it.
func EIPAddrs(e *v1.IptablesEIP) (nat.EIP, error) {
	var out nat.EIP
	var err error
	if s := e.Spec.V4ip; s != "" {
		if out.Address, err = nat.ParseUnicastIPv4("spec.v4ip", s); err != nil {
			return nat.EIP{}, err
		}
	}
	if s := e.Spec.V6ip; s != "" {
		if out.V6Address, err = nat.ParseUnicastIPv6("spec.v6ip", s); err != nil {
			return nat.EIP{}, err
		}
	}
	if s := e.Status.IP; s != "" {
		a, err := nat.ParseUnicastIP("status.ip", s)
		if err != nil {
			return nat.EIP{}, err
		}
		switch {
		case a.Is4() && !out.Address.IsValid():
			out.Address = a
		case a.Is6() && !out.V6Address.IsValid() && !out.Address.IsValid():
			out.V6Address = a
		}
	}
	return out, nil
}

// EIPAddress returns the EIP's primary address (what status.ip and the
// rules' label eip-v4ip show): its IPv4 address, else its IPv6 one (an
// IPv6-only EIP), from EIPAddrs. The empty Addr means none yet.
func EIPAddress(e *v1.IptablesEIP) (netip.Addr, error) {
	a, err := EIPAddrs(e)
	if err != nil {
		return netip.Addr{}, err
	}
	return primary(a), nil
}

// primary is an EIP's first address (IPv4 first), or the zero Addr.
func primary(e nat.EIP) netip.Addr {
	if as := e.Addrs(); len(as) > 0 {
		return as[0]
	}
	return netip.Addr{}
}

// eipObject is the EIP as a gateway object: its addresses with the
// external network's prefix lengths (prefixLen for IPv4, v6PrefixLen for
// IPv6), and its QoS when a policy limits it.
func eipObject(e *v1.IptablesEIP, prefixLen, v6PrefixLen int, qos *nat.QoS) (nat.Object, error) {
	addrs, err := EIPAddrs(e)
	if err != nil {
		return nat.Object{}, err
	}
	if !addrs.Address.IsValid() && !addrs.V6Address.IsValid() {
		return nat.Object{}, invalid("spec.v4ip", "", "no address: set spec.v4ip or spec.v6ip (with --network-source=config natgw reserves no addresses)")
	}
	addrs.QoS = qos
	if addrs.Address.IsValid() {
		addrs.PrefixLen = prefixLen
	}
	if addrs.V6Address.IsValid() {
		if v6PrefixLen == 0 {
			return nat.Object{}, invalid("spec.v6ip", addrs.V6Address.String(), "the external network has no IPv6 prefix length (externalV6PrefixLen in the gateway config, or an IPv6 CIDR in the external subnet)")
		}
		addrs.V6PrefixLen = v6PrefixLen
	}
	return validated(nat.Object{UID: string(e.UID), Kind: nat.KindEIP, EIP: &addrs})
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

// ruleEIP returns the address of eip a rule with the internal address
// internal (parsed from field, text value) uses: nat's family rule
// (nat.EIP.AddressFor), the error naming field and value as written.
func ruleEIP(eip nat.EIP, field, value string, internal netip.Addr) (netip.Addr, error) {
	a, err := eip.AddressFor(field, internal)
	var fe *nat.FieldError
	if errors.As(err, &fe) {
		fe.Value = value
	}
	return a, err
}

// internalIP parses a FIP's or DNAT's spec.internalIp (either family) and
// returns it with the EIP address of its family.
func internalIP(s string, eip nat.EIP) (in, ext netip.Addr, err error) {
	const field = "spec.internalIp"
	if in, err = nat.ParseUnicastIP(field, s); err != nil {
		return netip.Addr{}, netip.Addr{}, err
	}
	ext, err = ruleEIP(eip, field, s, in)
	return in, ext, err
}

func fipObject(f *v1.IptablesFIPRule, eip nat.EIP) (nat.Object, error) {
	in, ext, err := internalIP(f.Spec.InternalIP, eip)
	if err != nil {
		return nat.Object{}, err
	}
	return validated(nat.Object{UID: string(f.UID), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: ext, InternalIP: in}})
}

func dnatObject(d *v1.IptablesDnatRule, eip nat.EIP) (nat.Object, error) {
	in, eipAddr, err := internalIP(d.Spec.InternalIP, eip)
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
		EIP: eipAddr, Protocol: proto, ExternalPort: ext, InternalIP: in, InternalPort: inPort, Type: dnatType(d.Spec.Type)}})
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

// snatObject accepts a CIDR of either family, or a bare address (a /32 or
// /128), with host bits set (masked), like iptables does for upstream's
// script; the EIP address is the one of the CIDR's family.
func snatObject(s *v1.IptablesSnatRule, eip nat.EIP) (nat.Object, error) {
	const field = "spec.internalCIDR"
	cidr, err := nat.ParsePrefix(field, s.Spec.InternalCIDR)
	if err != nil {
		return nat.Object{}, err
	}
	ext, err := ruleEIP(eip, field, s.Spec.InternalCIDR, cidr.Addr())
	if err != nil {
		return nat.Object{}, err
	}
	return validated(nat.Object{UID: string(s.UID), Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: ext, InternalCIDR: cidr.Masked()}})
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
// (onlink) of each family when net names one (IPv4: GATEWAY_V4, IPv6:
// GATEWAY_V6 in upstream's script).
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
	for _, d := range []struct {
		dst netip.Prefix
		gw  netip.Addr
	}{{defaultRoute, net.ExternalGateway}, {defaultRouteV6, net.ExternalGatewayV6}} {
		if !d.gw.IsValid() {
			continue
		}
		if prev, dup := seen[d.dst]; dup {
			return nil, invalid(prev+".cidr", d.dst.String(), "the default route goes via the external gateway "+d.gw.String())
		}
		if err := add("default route", d.dst, d.gw, nat.DeviceExternal); err != nil {
			return nil, err
		}
	}
	return out, nil
}
