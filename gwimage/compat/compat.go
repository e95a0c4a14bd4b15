// Package compat translates the subcommands of Kube-OVN's gateway script
// (dist/images/vpcnatgateway/nat-gateway.sh) as the controllers of Kube-OVN
// v1.13 to v1.16 call it into natgw objects, so that an unmodified Kube-OVN
// can drive the natgw image.
//
// The controller runs `nat-gateway.sh <op> <rule> <rule>...`, each rule one
// argument of comma-joined fields. Parse is a pure function from such an
// invocation to a Plan: objects to apply, UIDs to delete, EIP QoS changes,
// interface names. Objects made this way get a UID derived from their
// identity, so a later "-del" finds them without the controller knowing any
// UID:
//
//	init              (none) | "VPC_IFACE,EXT_IFACE"   interface names (v1.16 non-primary CNI mode)
//	subnet-route-add  "CIDR,NEXTHOP" ...       route  compat-route-ADDR-LEN via NEXTHOP, internal
//	subnet-route-del  "CIDR" ...               deletes compat-route-ADDR-LEN (must exist, as `ip route del`)
//	eip-add           "EIP/LEN"                eip    compat-eip-EIP (+ default route from $GATEWAY_V4, see Plan.DefaultRouteFromEnv)
//	eip-del           "EIP/LEN"                deletes compat-eip-EIP
//	floating-ip-add   "EIP,INTERNAL"           fip    compat-fip-EIP
//	floating-ip-del   "EIP" | "EIP,INTERNAL"   deletes compat-fip-EIP
//	dnat-add          "EIP,PORT,PROTO,IP,PORT" dnat   compat-dnat-EIP-PROTO-PORT
//	dnat-del          "EIP,PORT,PROTO[,IP,PORT]" deletes compat-dnat-EIP-PROTO-PORT
//	nft-dnat-map-add  "EIP,PORT,PROTO,IP1:PORT1@IP2:PORT2..." (Kube-OVN master) share dnats
//	                                           compat-share-EIP-PROTO-PORT-IP-PORT, one per backend: the
//	                                           identity's whole backend set, replacing the one programmed
//	nft-dnat-map-del  "EIP,PORT,PROTO"         (Kube-OVN master) deletes every backend of the identity
//	snat-add          "EIP,CIDR[,--random-fully]" snat compat-snat-EIP-ADDR-LEN
//	snat-del          "EIP,CIDR"               deletes compat-snat-EIP-ADDR-LEN
//	eip-ingress-qos-add "EIP,PRIO,RATE,BURST"  EIP QoS (Plan.EIPQoS): traffic to EIP/32 (u32 dst), Mbit/s, MB
//	eip-egress-qos-add  "EIP,PRIO,RATE,BURST"  same for traffic from it (u32 src EIP/32, as upstream's script)
//	eip-ingress-qos-del "EIP" / eip-egress-qos-del "EIP"  removes that limit (whether or not the EIP is there)
//	qos-add "DIR,IFACE,PRIO,CLASSIFIER,MATCHTYPE,MATCHDIR,CIDR,RATE,BURST" / qos-del (7 or 9 fields)
//	                                           gateway-wide QoS (VpcNatGateway.spec.qosPolicy), see GatewayQoS
//	get-iptables-version                       prints a version line (see VersionLine)
//
// Like the script, the arguments are joined and split on blanks, and each
// rule's fields on commas; an EIP field may carry a /LEN, which is ignored
// except by eip-add. One invocation is one transaction.
package compat

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

// The subcommands Parse accepts: those of the script of Kube-OVN v1.13 to
// v1.16 (v1.12's ext-subnet-route-add and eip-add "EIP/LEN,GATEWAY" are gone
// upstream since v1.13.0 and are refused like any unknown subcommand).
const (
	OpInit               = "init"
	OpSubnetRouteAdd     = "subnet-route-add"
	OpSubnetRouteDel     = "subnet-route-del"
	OpEIPAdd             = "eip-add"
	OpEIPDel             = "eip-del"
	OpFIPAdd             = "floating-ip-add"
	OpFIPDel             = "floating-ip-del"
	OpDNATAdd            = "dnat-add"
	OpDNATDel            = "dnat-del"
	OpNftDNATMapAdd      = "nft-dnat-map-add"
	OpNftDNATMapDel      = "nft-dnat-map-del"
	OpSNATAdd            = "snat-add"
	OpSNATDel            = "snat-del"
	OpEIPIngressQoSAdd   = "eip-ingress-qos-add"
	OpEIPIngressQoSDel   = "eip-ingress-qos-del"
	OpEIPEgressQoSAdd    = "eip-egress-qos-add"
	OpEIPEgressQoSDel    = "eip-egress-qos-del"
	OpQoSAdd             = "qos-add"
	OpQoSDel             = "qos-del"
	OpGetIptablesVersion = "get-iptables-version"
)

// Ops lists every accepted subcommand, for usage messages.
var Ops = []string{
	OpInit, OpSubnetRouteAdd, OpSubnetRouteDel,
	OpEIPAdd, OpEIPDel, OpFIPAdd, OpFIPDel, OpDNATAdd, OpDNATDel, OpNftDNATMapAdd, OpNftDNATMapDel, OpSNATAdd, OpSNATDel,
	OpEIPIngressQoSAdd, OpEIPIngressQoSDel, OpEIPEgressQoSAdd, OpEIPEgressQoSDel,
	OpQoSAdd, OpQoSDel, OpGetIptablesVersion,
}

// GatewayQoS is one gateway-wide QoS rule of qos-add (Add) or qos-del:
// package gwqos's rule, with upstream's tc semantics and units (Mbit/s, MB
// of 2^20 bytes), identified by its Key (an add replaces the rule of the
// same key, a del removes it).
type GatewayQoS = gwqos.Change

// Direction of a QoS rule.
type Direction = gwqos.Direction

// QoS directions.
const (
	Ingress = gwqos.Ingress
	Egress  = gwqos.Egress
)

// BytesPerMB is upstream's burst unit: the script multiplies the burst by
// 1,048,576 to get bytes.
const BytesPerMB = gwqos.BytesPerMB

// Presence says what an add does when an object with the same UID is
// already programmed with another spec.
type Presence int

// Presence values.
const (
	// Replace updates the object in place (`ip addr replace`, `ip route
	// replace`).
	Replace Presence = iota
	// Keep leaves the programmed object and succeeds (the script finds the
	// rule and adds nothing: snat-add with the same EIP and CIDR).
	Keep
	// Refuse fails the call (the script's floating-ip-add and dnat-add when
	// the identity is bound to another internal address).
	Refuse
)

// Interfaces are the gateway's interface names given to init.
type Interfaces struct {
	VPC      string // the VPC side (Kube-OVN: eth0)
	External string // the external side (Kube-OVN: net1)
}

// Plan is what one invocation does. At most one of Apply, Delete and
// GatewayQoS is non-empty.
type Plan struct {
	Op    string
	Apply []nat.Object
	// IfPresent says, by UID, what to do when an object of Apply is
	// already programmed with another spec; a missing UID is Replace.
	IfPresent map[string]Presence
	Delete    []string
	// MustExist lists UIDs of Delete that must be programmed, or the call
	// fails (subnet-route-del: `ip route del` of a missing route fails).
	MustExist []string
	// GatewayQoS are the rules of qos-add and qos-del, and of the EIP QoS
	// subcommands (Iface "": the external interface).
	GatewayQoS []GatewayQoS
	// EIPQoS: GatewayQoS are an EIP QoS call's (eip-*-qos-add / -del:
	// u32 rules on the EIP, Iface ""). natgw shapes them with nat/shape
	// (HTB classes, as upstream's script) unless EIP QoS is policed
	// (--eip-qos=police, the iptables data plane): then they are
	// gateway QoS rules like qos-add's.
	EIPQoS bool
	// Interfaces is set by init with "VPC_IFACE,EXT_IFACE".
	Interfaces *Interfaces
	// Init: the call is init (with or without interface names).
	Init bool
	// DefaultRouteFromEnv: eip-add also sets the default route via the
	// container's $GATEWAY_V4 on the external interface, when it is set
	// (Kube-OVN v1.16's pod has that variable; v1.13's has none and its
	// script does not read it, so nothing changes there).
	DefaultRouteFromEnv bool
	// PrintVersion: get-iptables-version, print VersionLine.
	PrintVersion bool
	// ShareIdentities are the share DNAT identities of nft-dnat-map-add
	// and -del: every programmed compat backend of one of them that is
	// not in Apply is deleted, in the same transaction as Apply (see
	// ShareUIDPrefix).
	ShareIdentities []ShareIdentity
}

// ShareIdentity is a share DNAT identity: EIP, protocol, external port.
type ShareIdentity struct {
	EIP      netip.Addr
	Protocol nat.Protocol
	Port     uint16
}

// ShareUIDPrefix starts the UID of every compat backend of the identity.
func ShareUIDPrefix(id ShareIdentity) string {
	return fmt.Sprintf("compat-share-%s-%s-%d-", id.EIP, id.Protocol, id.Port)
}

// ShareUID is the UID of the compat share DNAT backend in:inPort of id.
func ShareUID(id ShareIdentity, in netip.Addr, inPort uint16) string {
	return fmt.Sprintf("%s%s-%d", ShareUIDPrefix(id), in, inPort)
}

// Empty reports whether the plan changes nothing.
func (p Plan) Empty() bool {
	return len(p.Apply) == 0 && len(p.Delete) == 0 && len(p.GatewayQoS) == 0 && len(p.ShareIdentities) == 0
}

// ArgError says which rule of an invocation is bad and why. It is not a
// nat.FieldError: it places the error in the script call (the subcommand,
// the rule's index and text), and some of its errors are about the call or
// the rule as a whole, with no field.
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
func VersionLine(natgwVersion string, dataplane nat.DataplaneName) string {
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

// DefaultRouteObject is the default route eip-add sets from $GATEWAY_V4: via
// gw on the external interface, on link (the script's `ip route replace
// default via $GATEWAY_V4 dev EXT onlink`). gw must be an IPv4 address.
func DefaultRouteObject(gw string) (nat.Object, error) {
	a, err := nat.ParseIPv4("GATEWAY_V4", gw)
	if err != nil {
		return nat.Object{}, &ArgError{Op: OpEIPAdd, Index: -1, Field: "GATEWAY_V4", Value: gw, Reason: fmt.Sprintf("environment variable GATEWAY_V4 %q is not an IPv4 address", gw)}
	}
	return nat.Object{UID: RouteUID(DefaultRoute), Kind: nat.KindRoute, Route: &nat.Route{Destination: DefaultRoute, NextHop: a, Device: nat.DeviceExternal}}, nil
}

// Parse translates one invocation (op and its rule arguments) into a Plan.
// It does not touch the system. The error is an *ArgError.
func Parse(op string, args []string) (Plan, error) {
	p := Plan{Op: op}
	rules := strings.Fields(strings.Join(args, " "))
	spec, ok := specs[op]
	if !ok {
		return p, &ArgError{Op: op, Index: -1, Reason: fmt.Sprintf("unknown subcommand (want one of %s)", strings.Join(Ops, ", "))}
	}
	if op == OpInit {
		return parseInit(p, args)
	}
	made := map[string]nat.Object{} // objects of earlier rules, by UID
	for i, rule := range rules {
		r := &ruleParser{op: op, index: i, rule: rule}
		if spec.keepEmpty {
			r.fields = strings.Split(rule, ",")
		} else {
			for _, f := range strings.Split(rule, ",") {
				if f != "" {
					r.fields = append(r.fields, f)
				}
			}
		}
		if len(r.fields) == 0 {
			continue
		}
		if len(r.fields) < spec.min {
			return p, r.fail("", "", fmt.Sprintf("want %d comma-separated fields (%s), got %d", spec.min, spec.format, len(r.fields)))
		}
		if spec.max > 0 && len(r.fields) > spec.max {
			return p, r.fail("", "", fmt.Sprintf("want at most %d comma-separated fields (%s), got %d", spec.max, spec.format, len(r.fields)))
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
	p.MustExist = dedupe(p.MustExist)
	switch op {
	case OpGetIptablesVersion:
		p.PrintVersion = true
	case OpEIPAdd:
		p.DefaultRouteFromEnv = true
	}
	return p, nil
}

// parseInit reads init's rules: none, or "VPC_IFACE,EXT_IFACE" (the script
// joins the arguments, drops blanks around commas and wants exactly two
// non-empty names).
func parseInit(p Plan, args []string) (Plan, error) {
	p.Init = true
	joined := strings.TrimSpace(strings.Join(args, " "))
	if joined == "" {
		return p, nil
	}
	parts := strings.Split(joined, ",")
	fail := func(field, value, reason string) (Plan, error) {
		return p, &ArgError{Op: OpInit, Index: 0, Rule: joined, Field: field, Value: value, Reason: reason}
	}
	if len(parts) != 2 {
		return fail("", "", "want two interface names separated by a comma (VPC_IFACE,EXT_IFACE)")
	}
	names := [2]string{strings.TrimSpace(parts[0]), strings.TrimSpace(parts[1])}
	for i, field := range []string{"vpcInterface", "externalInterface"} {
		if names[i] == "" {
			return fail(field, "", "interface name is empty")
		}
		if !isIfaceName(names[i]) {
			return fail(field, names[i], "not an interface name")
		}
	}
	p.Interfaces = &Interfaces{VPC: names[0], External: names[1]}
	return p, nil
}

type opSpec struct {
	min, max  int    // least and most number of fields per rule (max 0: any)
	keepEmpty bool   // empty fields count (qos-add/qos-del: matchall leaves some empty)
	format    string // for messages
	parse     func(r *ruleParser, p *Plan) error
}

var specs = map[string]opSpec{
	OpInit: {format: "VPC_IFACE,EXT_IFACE"}, // parseInit
	OpSubnetRouteAdd: {min: 2, max: 2, format: "CIDR,NEXTHOP", parse: func(r *ruleParser, p *Plan) error {
		dst, err := r.prefix(0, "cidr")
		if err != nil {
			return err
		}
		nh, err := r.addr(1, "nextHop")
		if err != nil {
			return err
		}
		p.Apply = append(p.Apply, nat.Object{UID: RouteUID(dst), Kind: nat.KindRoute, Route: &nat.Route{Destination: dst, NextHop: nh, Device: nat.DeviceInternal}})
		return nil
	}},
	OpSubnetRouteDel: {min: 1, format: "CIDR", parse: func(r *ruleParser, p *Plan) error {
		dst, err := r.prefix(0, "cidr")
		if err != nil {
			return err
		}
		p.Delete = append(p.Delete, RouteUID(dst))
		p.MustExist = append(p.MustExist, RouteUID(dst))
		return nil
	}},
	OpEIPAdd: {min: 1, max: 1, format: "EIP/LEN", parse: func(r *ruleParser, p *Plan) error {
		addr, bits, err := r.addrLen(0, "eip")
		if err != nil {
			return err
		}
		p.Apply = append(p.Apply, nat.Object{UID: EIPUID(addr), Kind: nat.KindEIP, EIP: &nat.EIP{Address: addr, PrefixLen: bits}})
		return nil
	}},
	OpEIPDel: {min: 1, format: "EIP/LEN", parse: func(r *ruleParser, p *Plan) error {
		addr, err := r.eip(0)
		if err != nil {
			return err
		}
		p.Delete = append(p.Delete, EIPUID(addr))
		return nil
	}},
	OpFIPAdd: {min: 2, max: 2, format: "EIP,INTERNAL_IP", parse: func(r *ruleParser, p *Plan) error {
		eip, err := r.eip(0)
		if err != nil {
			return err
		}
		in, err := r.addr(1, "internalIP")
		if err != nil {
			return err
		}
		p.refuse(nat.Object{UID: FIPUID(eip), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: eip, InternalIP: in}})
		return nil
	}},
	OpFIPDel: {min: 1, max: 2, format: "EIP[,INTERNAL_IP]", parse: func(r *ruleParser, p *Plan) error {
		eip, err := r.eip(0)
		if err != nil {
			return err
		}
		if len(r.fields) > 1 {
			if _, err := r.addr(1, "internalIP"); err != nil {
				return err
			}
		}
		p.Delete = append(p.Delete, FIPUID(eip))
		return nil
	}},
	OpDNATAdd: {min: 5, max: 5, format: "EIP,EXTERNAL_PORT,PROTOCOL,INTERNAL_IP,INTERNAL_PORT", parse: func(r *ruleParser, p *Plan) error {
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
		p.refuse(nat.Object{UID: DNATUID(eip, proto, port), Kind: nat.KindDNAT, DNAT: &nat.DNAT{
			EIP: eip, Protocol: proto, ExternalPort: port, InternalIP: in, InternalPort: inPort}})
		return nil
	}},
	OpDNATDel: {min: 3, max: 5, format: "EIP,EXTERNAL_PORT,PROTOCOL[,INTERNAL_IP,INTERNAL_PORT]", parse: func(r *ruleParser, p *Plan) error {
		eip, port, proto, err := r.dnatKey()
		if err != nil {
			return err
		}
		if len(r.fields) == 4 {
			return r.fail("internalPort", "", "missing (want 3 or 5 fields)")
		}
		if len(r.fields) == 5 {
			if _, err := r.addr(3, "internalIP"); err != nil {
				return err
			}
			if _, err := r.port(4, "internalPort"); err != nil {
				return err
			}
		}
		p.Delete = append(p.Delete, DNATUID(eip, proto, port))
		return nil
	}},
	OpNftDNATMapAdd: {min: 4, max: 4, format: "EIP,EXTERNAL_PORT,PROTOCOL,IP1:PORT1@IP2:PORT2...", parse: func(r *ruleParser, p *Plan) error {
		id, err := r.shareIdentity(p)
		if err != nil {
			return err
		}
		seen := map[netip.AddrPort]bool{}
		for _, b := range strings.Split(r.fields[3], "@") {
			ap, err := backend(b)
			if err != nil {
				return r.fail("backends", b, "want IPv4:PORT (port 1..65535, decimal, no leading zero), backends separated by @")
			}
			if seen[ap] {
				return r.fail("backends", b, "backend listed twice")
			}
			seen[ap] = true
			p.Apply = append(p.Apply, nat.Object{UID: ShareUID(id, ap.Addr(), ap.Port()), Kind: nat.KindDNAT, DNAT: &nat.DNAT{
				EIP: id.EIP, Protocol: id.Protocol, ExternalPort: id.Port, InternalIP: ap.Addr(), InternalPort: ap.Port(), Type: nat.DNATShare}})
		}
		p.ShareIdentities = append(p.ShareIdentities, id)
		return nil
	}},
	OpNftDNATMapDel: {min: 3, max: 3, format: "EIP,EXTERNAL_PORT,PROTOCOL", parse: func(r *ruleParser, p *Plan) error {
		id, err := r.shareIdentity(p)
		if err != nil {
			return err
		}
		p.ShareIdentities = append(p.ShareIdentities, id)
		return nil
	}},
	OpSNATAdd: {min: 2, max: 3, format: "EIP,INTERNAL_CIDR[,--random-fully]", parse: func(r *ruleParser, p *Plan) error {
		eip, cidr, err := r.snatKey()
		if err != nil {
			return err
		}
		random := false
		if len(r.fields) > 2 {
			if r.fields[2] != "--random-fully" {
				return r.fail("option", r.fields[2], "the only option is --random-fully")
			}
			random = true
		}
		o := nat.Object{UID: SNATUID(eip, cidr), Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: eip, InternalCIDR: cidr, RandomFully: random}}
		p.Apply = append(p.Apply, o)
		p.presence(o.UID, Keep)
		return nil
	}},
	OpSNATDel: {min: 2, format: "EIP,INTERNAL_CIDR[,...]", parse: func(r *ruleParser, p *Plan) error {
		eip, cidr, err := r.snatKey()
		if err != nil {
			return err
		}
		p.Delete = append(p.Delete, SNATUID(eip, cidr))
		return nil
	}},
	OpEIPIngressQoSAdd: {min: 4, max: 4, format: "EIP,PRIORITY,RATE_MBIT_S,BURST_MB", parse: qosAdd(Ingress)},
	OpEIPEgressQoSAdd:  {min: 4, max: 4, format: "EIP,PRIORITY,RATE_MBIT_S,BURST_MB", parse: qosAdd(Egress)},
	OpEIPIngressQoSDel: {min: 1, max: 1, format: "EIP", parse: qosDel(Ingress)},
	OpEIPEgressQoSDel:  {min: 1, max: 1, format: "EIP", parse: qosDel(Egress)},
	OpQoSAdd: {min: 9, max: 9, keepEmpty: true, format: "DIRECTION,IFACE,PRIORITY,CLASSIFIER,MATCHTYPE,MATCHDIR,CIDR,RATE,BURST", parse: func(r *ruleParser, p *Plan) error {
		return gatewayQoS(r, p, true)
	}},
	OpQoSDel: {min: 7, max: 9, keepEmpty: true, format: "DIRECTION,IFACE,PRIORITY,CLASSIFIER,MATCHTYPE,MATCHDIR,CIDR[,RATE,BURST]", parse: func(r *ruleParser, p *Plan) error {
		return gatewayQoS(r, p, false)
	}},
	OpGetIptablesVersion: {format: "", parse: func(r *ruleParser, p *Plan) error { return nil }},
}

// refuse adds o to the plan; an object already programmed with another spec
// under its UID fails the call.
func (p *Plan) refuse(o nat.Object) {
	p.Apply = append(p.Apply, o)
	p.presence(o.UID, Refuse)
}

func (p *Plan) presence(uid string, pr Presence) {
	if p.IfPresent == nil {
		p.IfPresent = map[string]Presence{}
	}
	p.IfPresent[uid] = pr
}

// gatewayQoS reads one gateway-wide QoS rule (qos-add: with rate and
// burst; qos-del: 7 fields, or 9 whose rate and burst are ignored).
func gatewayQoS(r *ruleParser, p *Plan, add bool) error {
	q := GatewayQoS{Add: add}
	switch r.fields[0] {
	case "ingress", "egress":
		q.Direction = Direction(r.fields[0])
	default:
		return r.fail("direction", r.fields[0], "want ingress or egress")
	}
	if !isIfaceName(r.fields[1]) {
		return r.fail("iface", r.fields[1], "not an interface name")
	}
	q.Iface = r.fields[1]
	prio, err := r.uint(2, "priority", 1<<16-1)
	if err != nil {
		return err
	}
	q.Priority = uint16(prio)
	q.Classifier = r.fields[3]
	switch r.fields[3] {
	case "u32":
		if r.fields[4] != "ip" {
			return r.fail("matchType", r.fields[4], "want ip")
		}
		if r.fields[5] != "src" && r.fields[5] != "dst" {
			return r.fail("matchDirection", r.fields[5], "want src or dst")
		}
		q.MatchDir = r.fields[5]
		if q.CIDR, err = r.prefix(6, "cidr"); err != nil {
			return err
		}
		if err := nat.CheckNetwork("cidr", q.CIDR); err != nil {
			return r.refused(err)
		}
	case "matchall":
		for i, name := range map[int]string{4: "matchType", 5: "matchDirection", 6: "cidr"} {
			if r.fields[i] != "" {
				return r.fail(name, r.fields[i], "must be empty for matchall")
			}
		}
	default:
		return r.fail("classifier", r.fields[3], "want u32 or matchall")
	}
	if add {
		if err := r.rateBurst(&q, 7, ""); err != nil {
			return err
		}
	}
	p.GatewayQoS = append(p.GatewayQoS, q)
	return nil
}

// rateBurst reads a QoS rule's rate (Mbit/s) and burst (MB) from fields i
// and i+1; hint ends the message of a rate out of range.
func (r *ruleParser) rateBurst(q *GatewayQoS, i int, hint string) error {
	var err error
	if q.RateMbps, err = r.decimal(i, "rate"); err != nil {
		return err
	}
	if q.RateMbps <= 0 || q.RateMbps > gwqos.MaxRateMbps {
		return r.fail("rate", r.fields[i], fmt.Sprintf("want a rate above 0 and at most %d Mbit/s", gwqos.MaxRateMbps)+hint)
	}
	if q.BurstMB, err = r.decimal(i+1, "burst"); err != nil {
		return err
	}
	if q.BurstMB > gwqos.MaxBurstMB {
		return r.fail("burst", r.fields[i+1], "at most 4095 MB")
	}
	return nil
}

// eipQoS is the QoS rule upstream's script makes for an EIP: on the
// external interface, ingress by destination, egress by source.
func eipQoS(dir Direction, eip netip.Addr) GatewayQoS {
	q := GatewayQoS{Rule: gwqos.Rule{Direction: dir, Classifier: gwqos.U32, MatchDir: "dst", CIDR: netip.PrefixFrom(eip, 32)}}
	if dir == Egress {
		q.MatchDir = "src"
	}
	return q
}

func qosAdd(dir Direction) func(r *ruleParser, p *Plan) error {
	return func(r *ruleParser, p *Plan) error {
		eip, err := r.eip(0)
		if err != nil {
			return err
		}
		q := eipQoS(dir, eip)
		q.Add = true
		prio, err := r.uint(1, "priority", 1<<16-1)
		if err != nil {
			return err
		}
		q.Priority = uint16(prio)
		if err := r.rateBurst(&q, 2, " (use the -del subcommand to remove a limit)"); err != nil {
			return err
		}
		p.GatewayQoS, p.EIPQoS = append(p.GatewayQoS, q), true
		return nil
	}
}

func qosDel(dir Direction) func(r *ruleParser, p *Plan) error {
	return func(r *ruleParser, p *Plan) error {
		eip, err := r.eip(0)
		if err != nil {
			return err
		}
		p.GatewayQoS, p.EIPQoS = append(p.GatewayQoS, eipQoS(dir, eip)), true
		return nil
	}
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

// refused turns the *nat.FieldError of nat's parse rules into an ArgError
// of this rule, keeping nat's field, value and reason.
func (r *ruleParser) refused(err error) error {
	var fe *nat.FieldError
	if errors.As(err, &fe) {
		return r.fail(fe.Field, fe.Value, fe.Reason)
	}
	return r.fail("", "", err.Error())
}

// backend parses a share DNAT backend, IPv4:PORT, with nat's rules.
func backend(s string) (netip.AddrPort, error) {
	host, port, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, &nat.FieldError{Field: "backends", Value: s, Reason: "want IPv4:PORT"}
	}
	a, err := nat.ParseIPv4("backends", host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	n, err := nat.ParsePort("backends", port)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(a, n), nil
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
	a, err := nat.ParseUnicastIPv4(name, s)
	if err != nil {
		return netip.Addr{}, r.refused(err)
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
		p, err := nat.ParseIPv4Prefix(name, s)
		if err != nil {
			return netip.Addr{}, 0, r.fail(name, s, "not an IPv4 address with prefix length")
		}
		if err := nat.CheckUnicastIPv4(name, p.Addr()); err != nil {
			return netip.Addr{}, 0, r.refused(err)
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
	p, err := nat.ParseIPv4Prefix(name, s)
	if err != nil {
		return netip.Prefix{}, r.refused(err)
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
	s, err := r.field(i, name)
	if err != nil {
		return 0, err
	}
	n, err := nat.ParsePort(name, s)
	if err != nil {
		return 0, r.refused(err)
	}
	return n, nil
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
	if s == "" { // the script has no default: iptables -p "" fails
		return netip.Addr{}, 0, "", r.fail("protocol", s, "missing")
	}
	proto, err := nat.ParseProtocol("protocol", s)
	if err != nil {
		return netip.Addr{}, 0, "", r.refused(err)
	}
	return eip, port, proto, nil
}

// shareIdentity reads the identity of an nft-dnat-map rule: EIP (without
// /LEN, like master's script's check), port, and tcp or udp (master's
// script takes tcp, udp, TCP or UDP).
func (r *ruleParser) shareIdentity(p *Plan) (ShareIdentity, error) {
	if s, _ := r.field(0, "eip"); strings.Contains(s, "/") {
		return ShareIdentity{}, r.fail("eip", s, "not an IPv4 address")
	}
	eip, port, proto, err := r.dnatKey()
	if err != nil {
		return ShareIdentity{}, err
	}
	if s := r.fields[2]; s != "tcp" && s != "udp" && s != "TCP" && s != "UDP" {
		return ShareIdentity{}, r.fail("protocol", s, "want tcp or udp (TCP, UDP)")
	}
	id := ShareIdentity{eip, proto, port}
	if slices.Contains(p.ShareIdentities, id) {
		return ShareIdentity{}, r.fail("", "", fmt.Sprintf("identity %s:%d/%s given twice in one call", eip, port, proto))
	}
	return id, nil
}

// snatKey reads the identity of an SNAT rule: EIP and internal CIDR, host
// bits masked as iptables -s masks them for upstream's script (and as the
// reconcile does for spec.internalCIDR).
func (r *ruleParser) snatKey() (netip.Addr, netip.Prefix, error) {
	eip, err := r.eip(0)
	if err != nil {
		return netip.Addr{}, netip.Prefix{}, err
	}
	cidr, err := r.prefix(1, "internalCIDR")
	if err != nil {
		return netip.Addr{}, netip.Prefix{}, err
	}
	return eip, cidr.Masked(), nil
}

// isIfaceName tells an interface name (newer controllers pass
// "INTERNAL_IFACE,EXTERNAL_IFACE" to init) from an address or CIDR.
func isIfaceName(s string) bool { return gwqos.ValidInterface(s) }

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

// decimal reads a non-negative decimal number as the script's awk and tc
// read it (digits with an optional fraction: "25", "1.5").
func (r *ruleParser) decimal(i int, name string) (float64, error) {
	s, err := r.field(i, name)
	if err != nil {
		return 0, err
	}
	ok := s != "" && s != "."
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c == '.') {
			ok = false
		}
	}
	v, perr := strconv.ParseFloat(s, 64)
	if !ok || perr != nil || strings.Count(s, ".") > 1 {
		return 0, r.fail(name, s, "want a decimal number such as 25 or 1.5")
	}
	return v, nil
}
