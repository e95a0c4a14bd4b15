// Package compat translates the subcommands of Kube-OVN's gateway script
// (dist/images/vpcnatgateway/nat-gateway.sh) into natgw objects, so that an
// unmodified Kube-OVN controller can drive the natgw image.
//
// The controller runs `nat-gateway.sh <op> <rule> <rule>...`, each rule one
// argument of comma-joined fields. Parse is a pure function from such an
// invocation to a Plan: objects to apply, UIDs to delete, EIP QoS changes.
// Objects made this way get a UID derived from their identity, so a later
// "-del" finds them without the controller knowing any UID:
//
//	eip-add           "EIP/LEN,GATEWAY"        eip    compat-eip-EIP  (+ route compat-route-0.0.0.0-0 via GATEWAY, external)
//	eip-del           "EIP[/LEN]"              deletes compat-eip-EIP
//	floating-ip-add   "EIP,INTERNAL"           fip    compat-fip-EIP
//	floating-ip-del   "EIP[,INTERNAL]"         deletes compat-fip-EIP
//	dnat-add          "EIP,PORT,PROTO,IP,PORT" dnat   compat-dnat-EIP-PROTO-PORT
//	dnat-del          "EIP,PORT,PROTO[,...]"   deletes compat-dnat-EIP-PROTO-PORT
//	snat-add          "EIP,CIDR[,--random-fully]" snat compat-snat-EIP-ADDR-LEN
//	snat-del          "EIP,CIDR"               deletes compat-snat-EIP-ADDR-LEN
//	init              "CIDR,NEXTHOP" ...       route  compat-route-ADDR-LEN via NEXTHOP, internal
//	                  (no rules, or "IFACE,IFACE": nothing to program)
//	subnet-route-add  "CIDR,NEXTHOP"           route  compat-route-ADDR-LEN via NEXTHOP, internal
//	subnet-route-del  "CIDR[,...]"             deletes compat-route-ADDR-LEN
//	ext-subnet-route-add "CIDR,GATEWAY"        route  compat-route-0.0.0.0-0 via GATEWAY, external
//	ext-subnet-route-del                       nothing (upstream never deletes it)
//	eip-ingress-qos-add "EIP,PRIO,RATE,BURST"  sets the EIP object's ingress rate/burst (Mbit/s, Mbit)
//	eip-egress-qos-add  "EIP,PRIO,RATE,BURST"  same for egress
//	eip-ingress-qos-del "EIP" / eip-egress-qos-del "EIP"  clears that direction
//	get-iptables-version                       prints a version line (see VersionLine)
//
// Like the script, each argument is split on whitespace and each rule's
// fields on commas, empty fields dropped; an EIP field may carry a /LEN,
// which is ignored except for eip-add. One invocation is one transaction.
package compat

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/natgw/natgw/nat"
)

// The subcommands Parse accepts.
const (
	OpInit               = "init"
	OpSubnetRouteAdd     = "subnet-route-add"
	OpSubnetRouteDel     = "subnet-route-del"
	OpExtSubnetRouteAdd  = "ext-subnet-route-add"
	OpExtSubnetRouteDel  = "ext-subnet-route-del"
	OpEIPAdd             = "eip-add"
	OpEIPDel             = "eip-del"
	OpFIPAdd             = "floating-ip-add"
	OpFIPDel             = "floating-ip-del"
	OpDNATAdd            = "dnat-add"
	OpDNATDel            = "dnat-del"
	OpSNATAdd            = "snat-add"
	OpSNATDel            = "snat-del"
	OpEIPIngressQoSAdd   = "eip-ingress-qos-add"
	OpEIPIngressQoSDel   = "eip-ingress-qos-del"
	OpEIPEgressQoSAdd    = "eip-egress-qos-add"
	OpEIPEgressQoSDel    = "eip-egress-qos-del"
	OpGetIptablesVersion = "get-iptables-version"
)

// Ops lists every accepted subcommand, for usage messages.
var Ops = []string{
	OpInit, OpSubnetRouteAdd, OpSubnetRouteDel, OpExtSubnetRouteAdd, OpExtSubnetRouteDel,
	OpEIPAdd, OpEIPDel, OpFIPAdd, OpFIPDel, OpDNATAdd, OpDNATDel, OpSNATAdd, OpSNATDel,
	OpEIPIngressQoSAdd, OpEIPIngressQoSDel, OpEIPEgressQoSAdd, OpEIPEgressQoSDel, OpGetIptablesVersion,
}

// Direction of an EIP QoS change.
type Direction string

// QoS directions.
const (
	Ingress Direction = "ingress"
	Egress  Direction = "egress"
)

// QoSChange sets (or, with Remove, clears) one direction of an EIP's QoS.
type QoSChange struct {
	EIP       netip.Addr
	Direction Direction
	RateMbps  uint32
	BurstMbit uint32
	Remove    bool
}

// Plan is what one invocation does. At most one of Apply, Delete and QoS is
// non-empty.
type Plan struct {
	Op     string
	Apply  []nat.Object
	Delete []string
	QoS    []QoSChange
	// PrintVersion: get-iptables-version, print VersionLine.
	PrintVersion bool
}

// Empty reports whether the plan changes nothing.
func (p Plan) Empty() bool { return len(p.Apply) == 0 && len(p.Delete) == 0 && len(p.QoS) == 0 }

// ArgError says which rule of an invocation is bad and why.
type ArgError struct {
	Op     string
	Index  int    // 0-based index of the rule; -1 for the op itself
	Rule   string // the rule as given
	Field  string // e.g. "eip", "internalPort"
	Value  string
	Reason string
}

func (e *ArgError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("%s: %s", e.Op, e.Reason)
	}
	if e.Field == "" {
		return fmt.Sprintf("%s: rule %d %q: %s", e.Op, e.Index+1, e.Rule, e.Reason)
	}
	return fmt.Sprintf("%s: rule %d %q: %s %q: %s", e.Op, e.Index+1, e.Rule, e.Field, e.Value, e.Reason)
}

// VersionLine is printed by get-iptables-version. The controller only reads
// it to decide whether snat-add may carry --random-fully (iptables >=
// 1.6.2, matched by `v([0-9]+(\.[0-9]+)+)`); the nftables data plane
// supports fully random port allocation, so the line claims a version that
// allows it and names what really runs.
func VersionLine(natgwVersion, dataplane string) string {
	return fmt.Sprintf("iptables v1.8.9 (natgw %s, %s data plane; compatibility answer)", natgwVersion, dataplane)
}

// UIDs of objects made by the compatibility layer.

// EIPUID is the UID of the EIP object of address eip.
func EIPUID(eip netip.Addr) string { return "compat-eip-" + eip.String() }

// FIPUID is the UID of the floating IP on eip (one FIP per EIP).
func FIPUID(eip netip.Addr) string { return "compat-fip-" + eip.String() }

// DNATUID is the UID of the port DNAT of (eip, proto, port).
func DNATUID(eip netip.Addr, proto nat.Protocol, port uint16) string {
	return fmt.Sprintf("compat-dnat-%s-%s-%d", eip, proto, port)
}

// SNATUID is the UID of the SNAT of cidr to eip.
func SNATUID(eip netip.Addr, cidr netip.Prefix) string {
	return fmt.Sprintf("compat-snat-%s-%s-%d", eip, cidr.Addr(), cidr.Bits())
}

// RouteUID is the UID of the route to dest.
func RouteUID(dest netip.Prefix) string {
	return fmt.Sprintf("compat-route-%s-%d", dest.Addr(), dest.Bits())
}

// DefaultRoute is the destination of the external default route.
var DefaultRoute = netip.PrefixFrom(netip.IPv4Unspecified(), 0)

// Parse translates one invocation (op and its rule arguments) into a Plan.
// It does not touch the system. The error is an *ArgError.
func Parse(op string, args []string) (Plan, error) {
	p := Plan{Op: op}
	rules := strings.Fields(strings.Join(args, " "))
	spec, ok := specs[op]
	if !ok {
		return p, &ArgError{Op: op, Index: -1, Reason: fmt.Sprintf("unknown subcommand (want one of %s)", strings.Join(Ops, ", "))}
	}
	made := map[string]nat.Object{} // objects of earlier rules, by UID
	for i, rule := range rules {
		r := &ruleParser{op: op, index: i, rule: rule}
		for _, f := range strings.Split(rule, ",") {
			if f != "" {
				r.fields = append(r.fields, f)
			}
		}
		if len(r.fields) == 0 {
			continue
		}
		if len(r.fields) < spec.min {
			return p, r.fail("", "", fmt.Sprintf("want %d comma-separated fields (%s), got %d", spec.min, spec.format, len(r.fields)))
		}
		start := len(p.Apply)
		if err := spec.parse(r, &p); err != nil {
			return p, err
		}
		// Rules of one call that make the same object must agree; the
		// object is applied once.
		fresh := p.Apply[start:]
		kept := p.Apply[:start]
		for _, o := range fresh {
			prev, dup := made[o.UID]
			switch {
			case !dup:
				made[o.UID] = o
				kept = append(kept, o)
			case !prev.Equal(o):
				return p, r.fail("", "", fmt.Sprintf("contradicts an earlier rule of this call (both make %s)", o.UID))
			}
		}
		p.Apply = kept
	}
	p.Delete = dedupe(p.Delete)
	if op == OpGetIptablesVersion {
		p.PrintVersion = true
	}
	return p, nil
}

type opSpec struct {
	min    int    // least number of fields per rule
	format string // for messages
	parse  func(r *ruleParser, p *Plan) error
}

var specs = map[string]opSpec{
	OpInit: {1, "CIDR,NEXTHOP or INTERNAL_IFACE,EXTERNAL_IFACE", func(r *ruleParser, p *Plan) error {
		if isIfaceName(r.fields[0]) {
			return nil // interface names (newer controllers): nothing to program
		}
		return routeRule(r, p, nat.DeviceInternal, false)
	}},
	OpSubnetRouteAdd: {2, "CIDR,NEXTHOP", func(r *ruleParser, p *Plan) error {
		return routeRule(r, p, nat.DeviceInternal, false)
	}},
	OpSubnetRouteDel: {1, "CIDR", func(r *ruleParser, p *Plan) error {
		dst, err := r.prefix(0, "cidr")
		if err != nil {
			return err
		}
		p.Delete = append(p.Delete, RouteUID(dst))
		return nil
	}},
	OpExtSubnetRouteAdd: {2, "CIDR,GATEWAY", func(r *ruleParser, p *Plan) error {
		if _, err := r.prefix(0, "cidr"); err != nil {
			return err
		}
		return routeRule(r, p, nat.DeviceExternal, true)
	}},
	OpExtSubnetRouteDel: {0, "CIDR", func(r *ruleParser, p *Plan) error { return nil }},
	OpEIPAdd: {2, "EIP/LEN,GATEWAY", func(r *ruleParser, p *Plan) error {
		addr, bits, err := r.addrLen(0, "eip")
		if err != nil {
			return err
		}
		gw, err := r.addr(1, "gateway")
		if err != nil {
			return err
		}
		p.Apply = append(p.Apply,
			nat.Object{UID: EIPUID(addr), Kind: nat.KindEIP, EIP: &nat.EIP{Address: addr, PrefixLen: bits}},
			nat.Object{UID: RouteUID(DefaultRoute), Kind: nat.KindRoute, Route: &nat.Route{Destination: DefaultRoute, NextHop: gw, Device: nat.DeviceExternal}})
		return nil
	}},
	OpEIPDel: {1, "EIP[/LEN]", func(r *ruleParser, p *Plan) error {
		addr, err := r.eip(0)
		if err != nil {
			return err
		}
		p.Delete = append(p.Delete, EIPUID(addr))
		return nil
	}},
	OpFIPAdd: {2, "EIP,INTERNAL_IP", func(r *ruleParser, p *Plan) error {
		eip, err := r.eip(0)
		if err != nil {
			return err
		}
		in, err := r.addr(1, "internalIP")
		if err != nil {
			return err
		}
		p.Apply = append(p.Apply, nat.Object{UID: FIPUID(eip), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip, InternalIP: in}})
		return nil
	}},
	OpFIPDel: {1, "EIP[,INTERNAL_IP]", func(r *ruleParser, p *Plan) error {
		eip, err := r.eip(0)
		if err != nil {
			return err
		}
		p.Delete = append(p.Delete, FIPUID(eip))
		return nil
	}},
	OpDNATAdd: {5, "EIP,EXTERNAL_PORT,PROTOCOL,INTERNAL_IP,INTERNAL_PORT", func(r *ruleParser, p *Plan) error {
		eip, port, proto, err := r.dnatKey()
		if err != nil {
			return err
		}
		in, err := r.addr(3, "internalIP")
		if err != nil {
			return err
		}
		inPort, err := r.port(4, "internalPort")
		if err != nil {
			return err
		}
		p.Apply = append(p.Apply, nat.Object{UID: DNATUID(eip, proto, port), Kind: nat.KindDNAT, DNAT: &nat.DNAT{
			EIP: eip, Protocol: proto, ExternalPort: port, InternalIP: in, InternalPort: inPort}})
		return nil
	}},
	OpDNATDel: {3, "EIP,EXTERNAL_PORT,PROTOCOL[,INTERNAL_IP,INTERNAL_PORT]", func(r *ruleParser, p *Plan) error {
		eip, port, proto, err := r.dnatKey()
		if err != nil {
			return err
		}
		p.Delete = append(p.Delete, DNATUID(eip, proto, port))
		return nil
	}},
	OpSNATAdd: {2, "EIP,INTERNAL_CIDR[,--random-fully]", func(r *ruleParser, p *Plan) error {
		eip, cidr, err := r.snatKey()
		if err != nil {
			return err
		}
		random := false
		if len(r.fields) > 2 {
			if r.fields[2] != "--random-fully" || len(r.fields) > 3 {
				return r.fail("option", strings.Join(r.fields[2:], ","), "the only option is --random-fully")
			}
			random = true
		}
		p.Apply = append(p.Apply, nat.Object{UID: SNATUID(eip, cidr), Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: eip, InternalCIDR: cidr, RandomFully: random}})
		return nil
	}},
	OpSNATDel: {2, "EIP,INTERNAL_CIDR", func(r *ruleParser, p *Plan) error {
		eip, cidr, err := r.snatKey()
		if err != nil {
			return err
		}
		p.Delete = append(p.Delete, SNATUID(eip, cidr))
		return nil
	}},
	OpEIPIngressQoSAdd:   {3, "EIP,PRIORITY,RATE_MBIT[,BURST_MBIT]", qosAdd(Ingress)},
	OpEIPEgressQoSAdd:    {3, "EIP,PRIORITY,RATE_MBIT[,BURST_MBIT]", qosAdd(Egress)},
	OpEIPIngressQoSDel:   {1, "EIP", qosDel(Ingress)},
	OpEIPEgressQoSDel:    {1, "EIP", qosDel(Egress)},
	OpGetIptablesVersion: {0, "", func(r *ruleParser, p *Plan) error { return nil }},
}

// routeRule reads "CIDR,NEXTHOP": a route to CIDR (or, when dflt, the
// default route) via NEXTHOP on dev.
func routeRule(r *ruleParser, p *Plan, dev nat.RouteDevice, dflt bool) error {
	dst := DefaultRoute
	if !dflt {
		var err error
		if dst, err = r.prefix(0, "cidr"); err != nil {
			return err
		}
	}
	if len(r.fields) < 2 {
		return r.fail("nextHop", "", "missing next hop (want CIDR,NEXTHOP)")
	}
	nh, err := r.addr(1, "nextHop")
	if err != nil {
		return err
	}
	p.Apply = append(p.Apply, nat.Object{UID: RouteUID(dst), Kind: nat.KindRoute, Route: &nat.Route{Destination: dst, NextHop: nh, Device: dev}})
	return nil
}

func qosAdd(dir Direction) func(r *ruleParser, p *Plan) error {
	return func(r *ruleParser, p *Plan) error {
		eip, err := r.eip(0)
		if err != nil {
			return err
		}
		if _, err := r.uint(1, "priority", 1<<16-1); err != nil {
			return err
		}
		rate, err := r.uint(2, "rate", 100_000)
		if err != nil {
			return err
		}
		var burst uint64
		if len(r.fields) > 3 {
			if burst, err = r.uint(3, "burst", 100_000); err != nil {
				return err
			}
		}
		if rate == 0 {
			return r.fail("rate", "0", "must be at least 1 Mbit/s (use the -del subcommand to remove a limit)")
		}
		p.QoS = append(p.QoS, QoSChange{EIP: eip, Direction: dir, RateMbps: uint32(rate), BurstMbit: uint32(burst)})
		return nil
	}
}

func qosDel(dir Direction) func(r *ruleParser, p *Plan) error {
	return func(r *ruleParser, p *Plan) error {
		eip, err := r.eip(0)
		if err != nil {
			return err
		}
		p.QoS = append(p.QoS, QoSChange{EIP: eip, Direction: dir, Remove: true})
		return nil
	}
}

// ApplyQoS returns the EIP objects of current changed by changes (an EIP is
// found by address, whatever its UID). It fails when a change names an
// address that has no EIP object.
func ApplyQoS(current []nat.Object, changes []QoSChange) ([]nat.Object, error) {
	byAddr := map[netip.Addr]int{}
	var out []nat.Object
	for _, ch := range changes {
		i, ok := byAddr[ch.EIP]
		if !ok {
			found := false
			for _, o := range current {
				if o.Kind == nat.KindEIP && o.EIP != nil && o.EIP.Address == ch.EIP {
					e := *o.EIP
					if e.QoS != nil {
						q := *e.QoS
						e.QoS = &q
					}
					o.EIP = &e
					out = append(out, o)
					found = true
					break
				}
			}
			if !found {
				return nil, fmt.Errorf("eip %s: no EIP object holds this address (run eip-add first)", ch.EIP)
			}
			i = len(out) - 1
			byAddr[ch.EIP] = i
		}
		e := out[i].EIP
		q := nat.QoS{}
		if e.QoS != nil {
			q = *e.QoS
		}
		switch {
		case ch.Direction == Ingress && ch.Remove:
			q.IngressRateMbps, q.IngressBurstMbit = 0, 0
		case ch.Direction == Ingress:
			q.IngressRateMbps, q.IngressBurstMbit = ch.RateMbps, ch.BurstMbit
		case ch.Remove:
			q.EgressRateMbps, q.EgressBurstMbit = 0, 0
		default:
			q.EgressRateMbps, q.EgressBurstMbit = ch.RateMbps, ch.BurstMbit
		}
		if q == (nat.QoS{}) {
			e.QoS = nil
		} else {
			e.QoS = &q
		}
	}
	return out, nil
}

// ruleParser reads the fields of one rule.
type ruleParser struct {
	op     string
	index  int
	rule   string
	fields []string
}

func (r *ruleParser) fail(field, value, reason string) error {
	return &ArgError{Op: r.op, Index: r.index, Rule: r.rule, Field: field, Value: value, Reason: reason}
}

func (r *ruleParser) field(i int, name string) (string, error) {
	if i >= len(r.fields) {
		return "", r.fail(name, "", "missing")
	}
	return r.fields[i], nil
}

// addr reads an IPv4 address.
func (r *ruleParser) addr(i int, name string) (netip.Addr, error) {
	s, err := r.field(i, name)
	if err != nil {
		return netip.Addr{}, err
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return netip.Addr{}, r.fail(name, s, "not an IPv4 address")
	}
	return a, nil
}

// eip reads an EIP field, ignoring a /LEN suffix like the script does.
func (r *ruleParser) eip(i int) (netip.Addr, error) {
	a, _, err := r.addrLen(i, "eip")
	return a, err
}

// addrLen reads ADDR[/LEN]; LEN defaults to 32.
func (r *ruleParser) addrLen(i int, name string) (netip.Addr, int, error) {
	s, err := r.field(i, name)
	if err != nil {
		return netip.Addr{}, 0, err
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() {
			return netip.Addr{}, 0, r.fail(name, s, "not an IPv4 address with prefix length")
		}
		return p.Addr(), p.Bits(), nil
	}
	a, err := r.addr(i, name)
	return a, 32, err
}

// prefix reads a CIDR; a bare address is a /32.
func (r *ruleParser) prefix(i int, name string) (netip.Prefix, error) {
	s, err := r.field(i, name)
	if err != nil {
		return netip.Prefix{}, err
	}
	p, err := parsePrefixOrAddr(s)
	if err != nil {
		return netip.Prefix{}, r.fail(name, s, "not an IPv4 CIDR")
	}
	return p, nil
}

func parsePrefixOrAddr(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is4() {
			return netip.Prefix{}, fmt.Errorf("not IPv4: %q", s)
		}
		return netip.PrefixFrom(a, 32), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil || !p.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("not an IPv4 CIDR: %q", s)
	}
	return p, nil
}

func (r *ruleParser) uint(i int, name string, max uint64) (uint64, error) {
	s, err := r.field(i, name)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > max {
		return 0, r.fail(name, s, fmt.Sprintf("want a whole number 0..%d", max))
	}
	return n, nil
}

func (r *ruleParser) port(i int, name string) (uint16, error) {
	n, err := r.uint(i, name, 65535)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, r.fail(name, "0", "want a port 1..65535")
	}
	return uint16(n), nil
}

// dnatKey reads the identity of a DNAT rule: EIP, port, protocol.
func (r *ruleParser) dnatKey() (netip.Addr, uint16, nat.Protocol, error) {
	eip, err := r.eip(0)
	if err != nil {
		return netip.Addr{}, 0, "", err
	}
	port, err := r.port(1, "externalPort")
	if err != nil {
		return netip.Addr{}, 0, "", err
	}
	s, err := r.field(2, "protocol")
	if err != nil {
		return netip.Addr{}, 0, "", err
	}
	proto := nat.Protocol(strings.ToLower(s))
	if proto.Number() == 0 {
		return netip.Addr{}, 0, "", r.fail("protocol", s, "want tcp or udp")
	}
	return eip, port, proto, nil
}

// snatKey reads the identity of an SNAT rule: EIP and internal CIDR.
func (r *ruleParser) snatKey() (netip.Addr, netip.Prefix, error) {
	eip, err := r.eip(0)
	if err != nil {
		return netip.Addr{}, netip.Prefix{}, err
	}
	cidr, err := r.prefix(1, "internalCIDR")
	if err != nil {
		return netip.Addr{}, netip.Prefix{}, err
	}
	return eip, cidr, nil
}

// isIfaceName tells an interface name (newer controllers pass
// "INTERNAL_IFACE,EXTERNAL_IFACE" to init) from an address or CIDR.
func isIfaceName(s string) bool {
	if s == "" || len(s) > 15 || strings.ContainsAny(s, "./:") {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '@') {
			return false
		}
	}
	return true
}

func dedupe(s []string) []string {
	seen := make(map[string]bool, len(s))
	out := s[:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
