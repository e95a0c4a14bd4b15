package iptables

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/natgw/natgw/nat"
)

// Tables natgw writes to, in the order a restore script lists them.
const (
	tableNAT    = "nat"
	tableMangle = "mangle"
)

var tables = []string{tableNAT, tableMangle}

// Chains of our own. Their shapes follow the upstream gateway script
// (nat-gateway.sh); the NATGW_ prefix keeps them apart from anyone else's.
const (
	chainDNATFilter    = "NATGW_DNAT_FILTER"
	chainSNATFilter    = "NATGW_SNAT_FILTER"
	chainExclusiveDNAT = "NATGW_EXCLUSIVE_DNAT"
	chainSharedDNAT    = "NATGW_SHARED_DNAT"
	chainExclusiveSNAT = "NATGW_EXCLUSIVE_SNAT"
	chainSharedSNAT    = "NATGW_SHARED_SNAT"
	chainHairpinSNAT   = "NATGW_HAIRPIN_SNAT"
	chainObjects       = "NATGW_OBJECTS"
	chainQoSIngress    = "NATGW_QOS_INGRESS"
	chainQoSEgress     = "NATGW_QOS_EGRESS"
)

// ownChains lists our chains per table, in the order they are declared.
var ownChains = map[string][]string{
	tableNAT: {chainDNATFilter, chainSNATFilter, chainExclusiveDNAT, chainSharedDNAT,
		chainExclusiveSNAT, chainSharedSNAT, chainHairpinSNAT, chainObjects},
	tableMangle: {chainQoSIngress, chainQoSEgress},
}

// orderedChains are compared rule by rule in order; in every other chain of
// ours the rules are disjoint and their order does not matter.
var orderedChains = map[string]bool{chainDNATFilter: true, chainSNATFilter: true, chainSharedSNAT: true}

// hook is the one jump natgw puts into a built-in chain.
type hook struct {
	table, builtin, target string
}

// hooks are the only rules natgw adds to built-in chains, each inserted at the
// top once.
var hooks = []hook{
	{tableNAT, "PREROUTING", chainDNATFilter},
	{tableNAT, "POSTROUTING", chainSNATFilter},
	{tableMangle, "PREROUTING", chainQoSIngress},
	{tableMangle, "POSTROUTING", chainQoSEgress},
}

// HairpinMark is the packet mark (and mask) set on new connections entering
// from the internal interface, so that NATGW_HAIRPIN_SNAT can tell
// VPC-internal clients apart in POSTROUTING, where the input interface is
// unknown. It stays clear of kube-proxy's 0x4000 and 0x8000.
const HairpinMark = 0x20000

var hairpinMarkArg = fmt.Sprintf("%#x/%#x", HairpinMark, HairpinMark)

// bootTag starts the comment of the rule that stores the boot id. A UID
// cannot start with "@", so the tag cannot collide with an object.
const bootTag = "@natgw-boot"

// Rule is one iptables rule: the table and chain it lives in and its
// arguments after "-A CHAIN", in the canonical order iptables-save prints.
type Rule struct {
	Table string
	Chain string
	Args  []string
}

// Line renders the rule as an iptables-restore line with the given command
// ("-A" or "-D"), quoting arguments like iptables-save.
func (r Rule) Line(cmd string) string {
	var b strings.Builder
	b.WriteString(cmd)
	b.WriteByte(' ')
	b.WriteString(r.Chain)
	for _, a := range r.Args {
		b.WriteByte(' ')
		b.WriteString(quote(a))
	}
	return b.String()
}

// key identifies a rule for comparing desired and actual chain contents. The
// hashlimit rate and burst are left out: the kernel rounds them, so
// iptables-save does not print back what was written; the hashlimit name
// holds a digest of the configuration instead (see hashlimitName).
func (r Rule) key() string {
	var b strings.Builder
	b.WriteString(r.Chain)
	for i := 0; i < len(r.Args); i++ {
		a := r.Args[i]
		if (a == "--hashlimit-above" || a == "--hashlimit-burst") && i+1 < len(r.Args) {
			i++
			continue
		}
		if a == "--probability" && i+1 < len(r.Args) {
			// However written, the kernel keeps it quantized: compare
			// in iptables-save's form (see probability).
			if p, err := strconv.ParseFloat(r.Args[i+1], 64); err == nil {
				b.WriteString(" --probability " + probability(p))
				i++
				continue
			}
		}
		b.WriteByte(' ')
		b.WriteString(quote(a))
	}
	return b.String()
}

// group names the share DNAT identity of a share backend's rule in
// NATGW_SHARED_DNAT (from its comment: the backends of one identity are
// compared in order), or "" for any other rule.
func (r Rule) group() string {
	if r.Chain != chainSharedDNAT {
		return ""
	}
	f := strings.Fields(r.comment())
	if !slices.Contains(f, "type="+string(nat.DNATShare)) {
		return ""
	}
	g := "share"
	for _, kv := range f {
		if strings.HasPrefix(kv, "eip=") || strings.HasPrefix(kv, "proto=") || strings.HasPrefix(kv, "port=") {
			g += " " + kv
		}
	}
	return g
}

// comment returns the argument of "-m comment --comment", or "".
func (r Rule) comment() string {
	for i := 0; i+1 < len(r.Args); i++ {
		if r.Args[i] == "--comment" {
			return r.Args[i+1]
		}
	}
	return ""
}

// quote quotes an argument for iptables-restore when it needs it, the way
// iptables-save does.
func quote(s string) string {
	if s != "" && !strings.ContainsAny(s, " \t\"'\\") {
		return s
	}
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(s) + `"`
}

// renderer holds what rule rendering needs beyond the objects.
type renderer struct {
	extIf, intIf string // external and internal interfaces
}

// skeleton returns the fixed rules of our chains (dispatch, hairpin mark,
// boot id), without the hooks in built-in chains.
func (rd renderer) skeleton(bootID string) []Rule {
	jump := func(table, chain, target string) Rule {
		return Rule{table, chain, []string{"-j", target}}
	}
	return []Rule{
		{tableNAT, chainDNATFilter, []string{"-i", rd.intIf, "-j", "MARK", "--set-xmark", hairpinMarkArg}},
		jump(tableNAT, chainDNATFilter, chainExclusiveDNAT),
		jump(tableNAT, chainDNATFilter, chainSharedDNAT),
		jump(tableNAT, chainSNATFilter, chainExclusiveSNAT),
		jump(tableNAT, chainSNATFilter, chainSharedSNAT),
		jump(tableNAT, chainSNATFilter, chainHairpinSNAT),
		{tableNAT, chainObjects, withComment(nil, bootTag+" "+bootID, "-j", "RETURN")},
	}
}

// withComment appends "-m comment --comment c" and then rest to pre.
func withComment(pre []string, c string, rest ...string) []string {
	out := append(append([]string{}, pre...), "-m", "comment", "--comment", c)
	return append(out, rest...)
}

func host(a netip.Addr) string { return a.String() + "/32" }

// rules renders the rules of one valid object. Every rule carries the
// object's comment (see encodeComment), so any one of them is enough to
// rebuild the object. Rules of the SHARED_SNAT chain are returned too; the
// caller keeps that chain in longest-prefix-first order.
func (rd renderer) rules(o nat.Object) []Rule {
	c := encodeComment(o)
	hairpin := func(eip netip.Addr) Rule {
		return Rule{tableNAT, chainHairpinSNAT, withComment([]string{"-o", rd.intIf}, c,
			"-m", "mark", "--mark", hairpinMarkArg,
			"-m", "conntrack", "--ctstate", "DNAT", "--ctorigdst", eip.String(),
			"-j", "SNAT", "--to-source", eip.String())}
	}
	switch o.Kind {
	case nat.KindEIP:
		out := []Rule{{tableNAT, chainObjects, withComment(nil, c, "-j", "RETURN")}}
		return append(out, rd.qosRules(o.EIP, c)...)
	case nat.KindRoute:
		return []Rule{{tableNAT, chainObjects, withComment(nil, c, "-j", "RETURN")}}
	case nat.KindFIP:
		f := o.FIP
		return []Rule{
			{tableNAT, chainExclusiveDNAT, withComment([]string{"-d", host(f.EIP)}, c,
				"-j", "DNAT", "--to-destination", f.InternalIP.String())},
			{tableNAT, chainExclusiveSNAT, withComment([]string{"-s", host(f.InternalIP), "-o", rd.extIf}, c,
				"-j", "SNAT", "--to-source", f.EIP.String())},
			hairpin(f.EIP),
		}
	case nat.KindDNAT:
		d := o.DNAT
		if d.Shared() { // the DNAT rule depends on the identity's other backends: shareRules
			return []Rule{hairpin(d.EIP)}
		}
		return []Rule{dnatRule(*d, c, nil), hairpin(d.EIP)}
	case nat.KindSNAT:
		s := o.SNAT
		var pre []string
		if s.InternalCIDR.Bits() > 0 { // iptables-save omits -s 0.0.0.0/0
			pre = []string{"-s", s.InternalCIDR.String()}
		}
		pre = append(pre, "-o", rd.extIf)
		args := withComment(pre, c, "-j", "SNAT", "--to-source", s.EIP.String())
		if s.RandomFully {
			args = append(args, "--random-fully")
		}
		return []Rule{{tableNAT, chainSharedSNAT, args}}
	}
	return nil
}

// dnatRule is a DNAT's rule in NATGW_SHARED_DNAT, with the matches stat
// (a share backend's statistic match, or none) after the port match.
func dnatRule(d nat.DNAT, c string, stat []string) Rule {
	p := string(d.Protocol)
	pre := append([]string{"-d", host(d.EIP), "-p", p, "-m", p, "--dport", strconv.Itoa(int(d.ExternalPort))}, stat...)
	return Rule{tableNAT, chainSharedDNAT, withComment(pre, c,
		"-j", "DNAT", "--to-destination", netip.AddrPortFrom(d.InternalIP, d.InternalPort).String())}
}

// shareKey is a share DNAT identity: EIP, protocol, external port.
type shareKey struct {
	eip   netip.Addr
	proto nat.Protocol
	port  uint16
}

func shareKeyOf(d *nat.DNAT) shareKey { return shareKey{d.EIP, d.Protocol, d.ExternalPort} }

// shareRules renders the NATGW_SHARED_DNAT rules of one share identity
// from its backends (all of one identity): one rule per backend, in UID
// order, rank i of N matching with probability 1/(N-i) and the last with
// no statistic match, so that each backend gets 1/N of new connections.
// The rules must stay contiguous and in this order; none for no backends.
func shareRules(backends []nat.Object) []Rule {
	bs := sortedByUID(backends)
	out := make([]Rule, 0, len(bs))
	for i, o := range bs {
		var stat []string
		if left := len(bs) - i; left > 1 {
			stat = []string{"-m", "statistic", "--mode", "random", "--probability", probability(1 / float64(left))}
		}
		out = append(out, dnatRule(*o.DNAT, encodeComment(o), stat))
	}
	return out
}

// sortedByUID returns a copy of objs in UID order.
func sortedByUID(objs []nat.Object) []nat.Object {
	out := append([]nat.Object(nil), objs...)
	sort.Slice(out, func(i, j int) bool { return out[i].UID < out[j].UID })
	return out
}

// probability formats p the way iptables-legacy-save prints a statistic
// probability: the kernel keeps round(p × 2^31) and iptables prints it
// back with 11 decimals (1/3 is 0.33333333349), so a rendered rule and its
// listing have one text.
func probability(p float64) string {
	const scale = 1 << 31
	return strconv.FormatFloat(math.Round(p*scale)/scale, 'f', 11, 64)
}

// qosRules polices an EIP like upstream's `tc ... police ... drop`, with one
// hashlimit bucket per direction (no --hashlimit-mode: all of the EIP's
// traffic shares it). Ingress is matched in mangle PREROUTING, before DNAT,
// by destination EIP on the external interface. Egress is matched in mangle
// POSTROUTING, which runs before SNAT, through conntrack: packets leaving
// the external interface of connections that were addressed to the EIP
// (replies of FIP/DNAT traffic) or that are answered to the EIP (SNATed
// traffic). Both egress rules use one hashlimit name, so they share a bucket.
func (rd renderer) qosRules(e *nat.EIP, c string) []Rule {
	if e.QoS == nil {
		return nil
	}
	q, a := e.QoS, e.Address.String()
	var out []Rule
	if q.IngressRateMbps > 0 {
		hl := hashlimitArgs("in", e.Address, q.IngressRateMbps, q.IngressBurstMbit)
		out = append(out, Rule{tableMangle, chainQoSIngress, withComment([]string{"-d", host(e.Address), "-i", rd.extIf}, c, hl...)})
	}
	if q.EgressRateMbps > 0 {
		hl := hashlimitArgs("out", e.Address, q.EgressRateMbps, q.EgressBurstMbit)
		for _, m := range []string{"--ctorigdst", "--ctrepldst"} {
			out = append(out, Rule{tableMangle, chainQoSEgress, withComment([]string{"-o", rd.extIf}, c,
				append([]string{"-m", "conntrack", m, a}, hl...)...)})
		}
	}
	return out
}

// hashlimitArgs returns the hashlimit match (byte mode) and DROP target for
// one direction. Rates are Mbit/s, bursts Mbit.
//
// In byte mode hashlimit does not keep a bucket of the given size: an entry
// starts with one second of credit, and --hashlimit-burst B is turned by
// iptables into k = ceil(B / rate') one-second refills (rate' being the rate
// as the kernel rounds it; iptables refuses B < rate'). So the burst is
// rendered as whole seconds of rate: none (1 s) when the object's burst fits
// in one second, else k = ceil(burst/rate') - 1 refills passed as exactly
// k × rate' bytes, for a total of ceil(burst/rate') seconds ≥ the burst.
func hashlimitArgs(dir string, eip netip.Addr, rateMbps, burstMbit uint32) []string {
	rate := uint64(rateMbps) * 125_000 // bytes per second
	burst := uint64(burstMbit) * 125_000
	quantum := hashlimitQuantum(rate)
	var refills uint64
	if burst > quantum {
		refills = (burst+quantum-1)/quantum - 1
	}
	args := []string{"-m", "hashlimit", "--hashlimit-above", strconv.FormatUint(rate, 10) + "b/s"}
	if refills > 0 {
		args = append(args, "--hashlimit-burst", strconv.FormatUint(refills*quantum, 10)+"b")
	}
	return append(args, "--hashlimit-name", hashlimitName(dir, eip, rate, refills), "-j", "DROP")
}

// hashlimitQuantum returns the bytes per second the kernel enforces for a
// byte rate, computed like iptables 1.8's libxt_hashlimit (bytes_to_cost,
// then cost_to_bytes): packet lengths count in 16-byte steps and the rate
// is kept as a cost per step.
func hashlimitQuantum(rate uint64) uint64 {
	const maxU32 = 1<<32 - 1
	steps := uint64(uint32(rate >> 4))
	cost := maxU32 / (steps + 1)
	if cost == 0 {
		return rate
	}
	return (maxU32/cost - 1) << 4
}

// hashlimitName names a bucket after a digest of its whole configuration
// (at most 15 characters). A changed rate gets a new bucket: rules that reuse
// a name share the first rule's table and configuration in the kernel.
func hashlimitName(dir string, eip netip.Addr, rate, refills uint64) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%s|%s|%d|%d", dir, eip, rate, refills)))
	return "ngw" + hex.EncodeToString(sum[:6])
}

// sortSNATs orders SNAT objects longest prefix first, then by address, the
// order of the SHARED_SNAT chain. CIDRs of one length cannot overlap, so
// the order among them does not matter; it is fixed only to be canonical.
func sortSNATs(s []nat.Object) {
	sort.Slice(s, func(i, j int) bool {
		a, b := s[i].SNAT.InternalCIDR, s[j].SNAT.InternalCIDR
		if a.Bits() != b.Bits() {
			return a.Bits() > b.Bits()
		}
		return a.Addr().Less(b.Addr())
	})
}

// encodeComment renders an object's comment: its UID, kind and whole spec
// as key=value fields, e.g.
//
//	"3f2c... fip eip=192.0.2.10 in=198.51.100.10"
//
// It is at most ~150 characters (UIDs are at most 64), well under
// iptables' 255.
func encodeComment(o nat.Object) string {
	f := []string{o.UID, string(o.Kind)}
	kv := func(k, v string) { f = append(f, k+"="+v) }
	switch o.Kind {
	case nat.KindEIP:
		e := o.EIP
		kv("addr", netip.PrefixFrom(e.Address, e.PrefixLen).String())
		if q := e.QoS; q != nil {
			kv("qos", fmt.Sprintf("%d/%d/%d/%d", q.IngressRateMbps, q.IngressBurstMbit, q.EgressRateMbps, q.EgressBurstMbit))
		}
	case nat.KindFIP:
		kv("eip", o.FIP.EIP.String())
		kv("in", o.FIP.InternalIP.String())
	case nat.KindDNAT:
		d := o.DNAT
		kv("eip", d.EIP.String())
		kv("proto", string(d.Protocol))
		kv("port", strconv.Itoa(int(d.ExternalPort)))
		kv("to", netip.AddrPortFrom(d.InternalIP, d.InternalPort).String())
		if d.Shared() {
			kv("type", string(nat.DNATShare))
		}
	case nat.KindSNAT:
		s := o.SNAT
		kv("eip", s.EIP.String())
		kv("cidr", s.InternalCIDR.String())
		if s.RandomFully {
			kv("random-fully", "1")
		}
	case nat.KindRoute:
		r := o.Route
		kv("dst", r.Destination.String())
		kv("via", r.NextHop.String())
		kv("dev", string(r.Device))
	}
	return strings.Join(f, " ")
}

// decodeComment parses a comment written by encodeComment back into a valid
// object.
func decodeComment(c string) (nat.Object, error) {
	f := strings.Fields(c)
	if len(f) < 2 {
		return nat.Object{}, fmt.Errorf("comment %q: want \"<uid> <kind> key=value...\"", c)
	}
	o := nat.Object{UID: f[0], Kind: nat.Kind(f[1])}
	kv := map[string]string{}
	for _, p := range f[2:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return nat.Object{}, fmt.Errorf("comment %q: field %q is not key=value", c, p)
		}
		if _, dup := kv[k]; dup {
			return nat.Object{}, fmt.Errorf("comment %q: field %q twice", c, k)
		}
		kv[k] = v
	}
	var errs []error
	take := func(k string) string {
		v, ok := kv[k]
		if !ok {
			errs = append(errs, fmt.Errorf("missing %s", k))
		}
		delete(kv, k)
		return v
	}
	addr := func(k string) netip.Addr {
		v := take(k)
		a, err := netip.ParseAddr(v)
		if err != nil && v != "" {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
		}
		return a
	}
	prefix := func(k string) netip.Prefix {
		v := take(k)
		p, err := netip.ParsePrefix(v)
		if err != nil && v != "" {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
		}
		return p
	}
	port := func(k, v string) uint16 {
		n, err := strconv.ParseUint(v, 10, 16)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", k, err))
		}
		return uint16(n)
	}
	switch o.Kind {
	case nat.KindEIP:
		p := prefix("addr")
		o.EIP = &nat.EIP{Address: p.Addr(), PrefixLen: p.Bits()}
		if v, ok := kv["qos"]; ok {
			delete(kv, "qos")
			var q nat.QoS
			if _, err := fmt.Sscanf(v, "%d/%d/%d/%d", &q.IngressRateMbps, &q.IngressBurstMbit, &q.EgressRateMbps, &q.EgressBurstMbit); err != nil {
				errs = append(errs, fmt.Errorf("qos %q: %w", v, err))
			}
			o.EIP.QoS = &q
		}
	case nat.KindFIP:
		o.FIP = &nat.FIP{EIP: addr("eip"), InternalIP: addr("in")}
	case nat.KindDNAT:
		d := &nat.DNAT{EIP: addr("eip"), Protocol: nat.Protocol(take("proto"))}
		d.ExternalPort = port("port", take("port"))
		if to := take("to"); to != "" {
			ap, err := netip.ParseAddrPort(to)
			if err != nil {
				errs = append(errs, fmt.Errorf("to: %w", err))
			}
			d.InternalIP, d.InternalPort = ap.Addr(), ap.Port()
		}
		if v, ok := kv["type"]; ok {
			delete(kv, "type")
			d.Type = nat.DNATType(v) // anything but share fails the canonical check below
		}
		o.DNAT = d
	case nat.KindSNAT:
		s := &nat.SNAT{EIP: addr("eip"), InternalCIDR: prefix("cidr")}
		if v, ok := kv["random-fully"]; ok {
			delete(kv, "random-fully")
			s.RandomFully = v == "1"
		}
		o.SNAT = s
	case nat.KindRoute:
		o.Route = &nat.Route{Destination: prefix("dst"), NextHop: addr("via"), Device: nat.RouteDevice(take("dev"))}
	default:
		return nat.Object{}, fmt.Errorf("comment %q: unknown kind %q", c, o.Kind)
	}
	for k := range kv {
		errs = append(errs, fmt.Errorf("unknown field %q", k))
	}
	if len(errs) > 0 {
		return nat.Object{}, fmt.Errorf("comment %q: %v", c, errs)
	}
	if err := o.Validate(); err != nil {
		return nat.Object{}, fmt.Errorf("comment %q: %w", c, err)
	}
	if encodeComment(o) != c {
		return nat.Object{}, fmt.Errorf("comment %q: not in canonical form (%q)", c, encodeComment(o))
	}
	return o, nil
}
