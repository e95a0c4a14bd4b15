// Package gwqos programs a gateway's gateway-wide QoS (Kube-OVN's
// VpcNatGateway.spec.qosPolicy with bindingType NATGW, upstream's
// `nat-gateway.sh qos-add/qos-del`) as upstream's script does it: shaped,
// one HTB class per rule (rate = ceil = the rate in Mbit/s, burst = cburst
// = the burst in MB of 2^20 bytes), picked by the matching rule of lowest
// priority. It is the one implementation both callers share: the compat
// path (qos-add/qos-del, and policed EIP QoS, change rules by Key) and the
// agent (`natgw serve`: Set replaces the gateway's whole QoS state, the
// controller's desired-state form).
//
// Layout (nat/README.md, "Gateway-wide QoS"): the classes are nat/shape's
// (GatewayClass: minors from shape.GatewayMinorBase under natgw's root HTB
// 4e47:, beside the EIP classes); table ip natgw_gwqos picks them
// (`meta priority set 4e47:<minor>`): chain "ingress" (filter,
// prerouting, priority mangle -150: before DNAT, the addresses as they
// arrived) for traffic arriving on the rule's interface, which puts the
// rule's class in bits 18-31 of the packet mark (the kernel
// resets skb->priority when it forwards); it is shaped where it leaves the
// gateway (ShapedOn: the other gateway interface; no IFB device).
// Chain "egress" (filter, postrouting, priority 150: after source NAT,
// before nat/shape's EIP chain at 200, so an EIP's own class wins over a
// gateway-wide rule) holds the rules for traffic leaving the interface,
// then turns an ingress rule's mark into its class. Rules are in priority order and the first
// match ends the chain (`accept`), so, as with upstream's tc filters, the
// matching rule of lowest priority applies. Each rule's parameters and
// class are kept in its first nftables rule's user data, so the state is
// read back from the kernel. A rule with Police (the compat path's EIP QoS
// with --eip-qos=police) is dropped above its rate instead, in its chain
// in priority order: `match limit rate over RATE burst BURST drop`, then
// `match accept`. Every call is classes, then one nftables
// transaction (the classes changed are put back if it fails), then unused
// classes deleted; no rule left means no table and no class.
package gwqos

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"slices"
	"strings"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
	"github.com/natgw/natgw/nat/shape"
)

// BytesPerMB is upstream's burst unit: its script multiplies the burst by
// 1,048,576 to get bytes.
const BytesPerMB = 1 << 20

// Limits of a rule's rate and burst: HTB's 32-bit rate and byte count
// (nat/shape's limits; a burst must also fit HTB's buffer at the rate).
const (
	MaxRateMbps = shape.MaxRateMbps
	MaxBurstMB  = shape.MaxBurstMB
)

// Direction of a rule.
type Direction string

// Directions.
const (
	Ingress Direction = "ingress"
	Egress  Direction = "egress"
)

// Classifiers, upstream's tc terms.
const (
	U32      = "u32"      // match the source or destination address in a CIDR
	MatchAll = "matchall" // all of the interface's traffic
)

// Rule is one gateway-wide QoS rule with upstream's tc semantics: on Iface,
// traffic leaving it (egress) or arriving on it (ingress), all of it
// (matchall) or that whose MatchDir address is in CIDR (u32), is held to
// RateMbps (Mbit/s, decimals allowed) with a burst of BurstMB (MB of 2^20
// bytes); of the rules of one interface and direction the one of lowest
// Priority that matches applies (ties: the earlier rule). Key identifies a
// rule: a later rule of the same key replaces an earlier one, as upstream's
// qos-add deletes the filter of the same address and match direction (u32)
// or the device's matchall filter before adding.
type Rule struct {
	Direction  Direction    `json:"direction"`
	Iface      string       `json:"interface"`
	Priority   uint16       `json:"priority"`
	Classifier string       `json:"classifier"`
	MatchDir   string       `json:"matchDirection,omitempty"` // "src" or "dst" (u32)
	CIDR       netip.Prefix `json:"cidr,omitzero"`            // u32
	RateMbps   float64      `json:"rateMbps"`
	BurstMB    float64      `json:"burstMB"`
	// Police drops what exceeds the rate instead of shaping it (`limit
	// rate over RATE burst BURST drop`, the kernel's bucket holding one
	// second of rate plus the burst): the compat path's EIP QoS with
	// --eip-qos=police. Not part of Key.
	Police bool `json:"police,omitempty"`
}

// Key identifies the rule an add replaces and a delete removes.
func (r Rule) Key() string {
	if r.Classifier == MatchAll {
		return fmt.Sprintf("%s %s matchall", r.Direction, r.Iface)
	}
	return fmt.Sprintf("%s %s u32 %s %s", r.Direction, r.Iface, r.MatchDir, r.CIDR)
}

// String is the rule as qos-add's argument (upstream's field order:
// direction, interface, priority, classifier, match type, match direction,
// CIDR, rate, burst).
func (r Rule) String() string {
	mt, cidr := "", ""
	if r.Classifier == U32 {
		mt, cidr = "ip", r.CIDR.String()
	}
	return fmt.Sprintf("%s,%s,%d,%s,%s,%s,%s,%g,%g", r.Direction, r.Iface, r.Priority, r.Classifier, mt, r.MatchDir, cidr, r.RateMbps, r.BurstMB)
}

// ValidInterface reports whether s is an interface name natgw accepts: 1 to
// 15 letters, digits, '-', '_' or '@'.
func ValidInterface(s string) bool {
	if s == "" || len(s) > 15 {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '@') {
			return false
		}
	}
	return true
}

// Validate checks a rule to be programmed (Iface set, rate and burst in
// range); the error is a *nat.FieldError naming the field (its JSON name)
// and value.
func (r Rule) Validate() error {
	bad := func(field, value, reason string) error {
		return &nat.FieldError{Field: field, Value: value, Reason: reason}
	}
	if r.Direction != Ingress && r.Direction != Egress {
		return bad("direction", string(r.Direction), "want ingress or egress")
	}
	if !ValidInterface(r.Iface) {
		return bad("interface", r.Iface, "not an interface name (1-15 letters, digits, -, _ or @)")
	}
	switch r.Classifier {
	case U32:
		if r.MatchDir != "src" && r.MatchDir != "dst" {
			return bad("matchDirection", r.MatchDir, "want src or dst")
		}
		if !r.CIDR.IsValid() || !r.CIDR.Addr().Is4() {
			return bad("cidr", r.CIDR.String(), "want an IPv4 CIDR (gateway-wide QoS is IPv4 only)")
		}
		if r.CIDR.Masked() != r.CIDR {
			return bad("cidr", r.CIDR.String(), "host bits set")
		}
	case MatchAll:
		if r.MatchDir != "" || r.CIDR.IsValid() {
			return bad("matchDirection", r.MatchDir+" "+r.CIDR.String(), "must be empty for matchall")
		}
	default:
		return bad("classifier", r.Classifier, "want u32 or matchall")
	}
	if !(r.RateMbps > 0 && r.RateMbps <= MaxRateMbps) {
		return bad("rateMbps", fmt.Sprint(r.RateMbps), fmt.Sprintf("want a rate above 0 and at most %d Mbit/s", MaxRateMbps))
	}
	if !(r.BurstMB >= 0 && r.BurstMB <= MaxBurstMB) {
		return bad("burstMB", fmt.Sprint(r.BurstMB), "want a burst from 0 to 4095 MB")
	}
	// The rest of HTB's limits (a burst longer than its buffer holds).
	var fe *nat.FieldError
	if err := r.limit().Validate("limit"); errors.As(err, &fe) {
		return bad(strings.TrimPrefix(fe.Field, "limit."), fe.Value, fe.Reason)
	} else if err != nil {
		return err
	}
	return nil
}

// limit is the rule's class limit in nat/shape's terms.
func (r Rule) limit() shape.Limit { return shape.Limit{RateMbps: r.RateMbps, BurstMB: r.BurstMB} }

// ValidateAll validates rules; the error's field is "qos[i].<field>".
func ValidateAll(rules []Rule) error {
	for i, r := range rules {
		if err := r.Validate(); err != nil {
			var fe *nat.FieldError
			if errors.As(err, &fe) {
				c := *fe
				c.Field = fmt.Sprintf("qos[%d].%s", i, fe.Field)
				return &c
			}
			return fmt.Errorf("qos[%d]: %w", i, err)
		}
	}
	return nil
}

// Change is one rule change of the compat path: Add adds the rule (or
// replaces the one of the same Key), else the rule of that Key goes (rate
// and burst are not read).
type Change struct {
	Add bool
	Rule
}

// entry is a stored rule: the rule and the order it was added in (ties of
// priority keep that order).
type entry struct {
	Rule
	Seq   uint64 `json:"seq"`
	Minor uint16 `json:"class"` // its HTB class 4e47:Minor
}

const tagPrefix = "natgw gwqos "

// Set makes the gateway's QoS exactly rules, in one transaction: what was
// there before, whoever added it, is replaced (cfg.NetNS is the gateway's
// network namespace, a name under /run/netns or a path, "" the current
// one; its interfaces, Kube-OVN's when empty, say where ingress is
// shaped). Rules are taken in order, a later rule of the same Key
// replacing an earlier one. No rule removes the table and the classes.
func Set(ctx context.Context, cfg nat.Config, rules []Rule) error {
	_, err := Ensure(ctx, cfg, rules)
	return err
}

// Ensure is Set that first reads what the gateway holds and writes only
// when it differs (the drift check's repair): changed says whether it
// wrote. The table differs when its rules, in the order they apply, are not
// rules' (after Set's replacement of same-Key rules), or when its chains
// hold anything else (a rule added or removed by hand), or cannot be read.
func Ensure(ctx context.Context, cfg nat.Config, rules []Rule) (changed bool, err error) {
	cfg = cfg.WithDefaults()
	if err := ValidateAll(rules); err != nil {
		return false, err
	}
	changes := make([]Change, len(rules))
	for i, r := range rules {
		changes[i] = Change{Add: true, Rule: r}
	}
	err = withConn(ctx, cfg.NetNS, func(c nftconn.Conn) error {
		exists, err := nftconn.HasTable(ctx, c, table)
		if err != nil {
			return fmt.Errorf("gateway QoS: %w", err)
		}
		var cur []entry
		if exists {
			// Unreadable: rewritten whole.
			cur, _, _ = readAll(ctx, c)
		}
		want := merge(cur, changes, true)
		sortEntries(want)
		if exists && holds(ctx, c, want) && classesHeld(ctx, cfg, want) || !exists && len(want) == 0 {
			return nil
		}
		changed = true
		return write(ctx, c, cfg, exists, cur, want)
	})
	return changed, err
}

// holds says whether the table holds exactly want (sorted): the same rules
// with the same classes in the same order, and no nftables rule but those
// write adds for them.
func holds(ctx context.Context, c nftconn.Conn, want []entry) bool {
	have, total, err := readAll(ctx, c)
	if err != nil || len(have) != len(want) {
		return false
	}
	n := 0
	for _, e := range want {
		n += len(nftRules(e))
	}
	if total != n {
		return false
	}
	sortEntries(have)
	for i := range have {
		if have[i].Rule != want[i].Rule || have[i].Minor != want[i].Minor {
			return false
		}
	}
	return true
}

// Apply carries out changes (qos-add / qos-del) on the rules the gateway
// holds, in one transaction (cfg as for Set).
func Apply(ctx context.Context, cfg nat.Config, changes []Change) error {
	cfg = cfg.WithDefaults()
	for i, ch := range changes {
		if !ch.Add {
			continue
		}
		if err := ch.Validate(); err != nil {
			return fmt.Errorf("rule %d (%s): %w", i, ch.Key(), err)
		}
	}
	return withConn(ctx, cfg.NetNS, func(c nftconn.Conn) error {
		exists, err := nftconn.HasTable(ctx, c, table)
		if err != nil {
			return fmt.Errorf("gateway QoS: %w", err)
		}
		var cur []entry
		if exists {
			if cur, _, err = readAll(ctx, c); err != nil {
				return err
			}
		}
		next := merge(cur, changes, false)
		if len(next) == 0 && !exists {
			return nil
		}
		return write(ctx, c, cfg, exists, cur, next)
	})
}

// List returns the rules the gateway holds, in the order they apply
// (priority, then the order they were added in); none when there is no
// table.
func List(ctx context.Context, cfg nat.Config) ([]Rule, error) {
	var out []Rule
	err := withConn(ctx, cfg.NetNS, func(c nftconn.Conn) error {
		exists, err := nftconn.HasTable(ctx, c, table)
		if err != nil {
			return fmt.Errorf("gateway QoS: %w", err)
		}
		if !exists {
			return nil
		}
		entries, _, err := readAll(ctx, c)
		if err != nil {
			return err
		}
		sortEntries(entries)
		for _, e := range entries {
			out = append(out, e.Rule)
		}
		return nil
	})
	return out, err
}

// withConn runs fn with an nftables connection to namespace ns ("" the
// calling thread's); fn's calls take ctx.
func withConn(ctx context.Context, ns string, fn func(c nftconn.Conn) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("gateway QoS: %w", err)
	}
	if ns == "" {
		return fn(nftconn.Current())
	}
	h, err := netns.Open(ns)
	if err != nil {
		return fmt.Errorf("gateway QoS: %w", err)
	}
	defer h.Close()
	return fn(nftconn.Open(h))
}

// table is the gateway-wide QoS table.
var table = nftconn.Table{Family: nft.TableFamilyIPv4, Name: nftconn.GatewayQoSTable}

// chains are the table's two base chains, by the direction of the rules
// they hold.
var chains = map[Direction]nftconn.Chain{
	// As packets arrive, before DNAT.
	Ingress: {Name: nftconn.GatewayQoSIngressChain, Type: nft.ChainTypeFilter, Hook: nft.ChainHookPrerouting, Priority: nft.ChainPriorityMangle},
	// After source NAT, as tc on the device sees the packets; before
	// nat/shape's EIP classes (200), which win over it.
	Egress: {Name: nftconn.GatewayQoSEgressChain, Type: nft.ChainTypeFilter, Hook: nft.ChainHookPostrouting, Priority: nft.ChainPriorityRef(150)},
}

// readAll returns the stored entries of both chains and how many rules the
// chains hold in all (one or two per entry as writeTx makes them).
func readAll(ctx context.Context, c nftconn.Conn) ([]entry, int, error) {
	var out []entry
	total := 0
	for _, dir := range []Direction{Ingress, Egress} {
		rules, err := c.Rules(ctx, table, chains[dir].Name)
		if err != nil {
			return nil, 0, fmt.Errorf("gateway QoS: %w", err)
		}
		total += len(rules)
		for _, r := range rules {
			tag, ok := strings.CutPrefix(r.Tag, tagPrefix+"rule ")
			if !ok {
				continue
			}
			var e entry
			if err := json.Unmarshal([]byte(tag), &e); err != nil {
				return nil, 0, fmt.Errorf("gateway QoS: %s %s: rule %d: %w", table.Name, dir, r.Handle, err)
			}
			out = append(out, e)
		}
	}
	return out, total, nil
}

// merge applies changes to entries (whole: only changes' rules are kept),
// numbering added rules after the highest number there. A rule keeps the
// class of the entry of its Key (its packets never pass through another
// class while the change is made); a new one takes the lowest free minor.
func merge(entries []entry, changes []Change, whole bool) []entry {
	var seq uint64
	classOf := map[string]uint16{}
	for _, e := range entries {
		seq = max(seq, e.Seq)
		classOf[e.Key()] = e.Minor
	}
	out := slices.Clone(entries)
	if whole {
		out, seq = nil, 0
	}
	for _, ch := range changes {
		out = slices.DeleteFunc(out, func(e entry) bool { return e.Key() == ch.Key() })
		if ch.Add {
			seq++
			out = append(out, entry{Rule: ch.Rule, Seq: seq, Minor: classOf[ch.Key()]})
		}
	}
	used := map[uint16]bool{}
	for _, e := range out {
		if e.Minor != 0 {
			used[e.Minor] = true
		}
	}
	next := uint16(shape.GatewayMinorBase)
	for i := range out {
		if out[i].Minor != 0 {
			continue
		}
		for used[next] {
			next++
		}
		out[i].Minor, used[next] = next, true
	}
	return out
}

func sortEntries(entries []entry) {
	slices.SortStableFunc(entries, func(a, b entry) int {
		if a.Priority != b.Priority {
			return int(a.Priority) - int(b.Priority)
		}
		return int(a.Seq) - int(b.Seq)
	})
}

// writeTx is the transaction that makes the table hold entries (exists:
// whether it is there now): none, the table deleted (an empty
// transaction if it is not there); else the table and its chains made if
// missing and emptied, then egress rules, then ingress rules (and their
// class rules, which come after every egress rule of chain egress), each
// direction in the order the rules apply.
func writeTx(exists bool, entries []entry) (*nftconn.Tx, error) {
	tx := &nftconn.Tx{}
	if len(entries) == 0 {
		if exists {
			tx.DeleteTable(table)
		}
		return tx, nil
	}
	if len(entries) > maxMarked {
		return nil, fmt.Errorf("gateway QoS: %d rules, at most %d", len(entries), maxMarked)
	}
	sortEntries(entries)
	tx.AddTable(table)
	for _, dir := range []Direction{Ingress, Egress} {
		tx.AddChain(table, chains[dir])
		tx.FlushChain(table, chains[dir].Name)
	}
	for _, dir := range []Direction{Egress, Ingress} {
		for _, e := range entries {
			if e.Direction != dir {
				continue
			}
			js, err := json.Marshal(e)
			if err != nil {
				return nil, fmt.Errorf("gateway QoS: encode rule %s: %w", e.Key(), err)
			}
			for i, r := range nftRules(e) {
				r.Tag = tagPrefix + "rule " + string(js)
				if i > 0 {
					r.Tag = tagPrefix + "class " + e.Key()
				}
				tx.AppendRule(table, chains[r.chain].Name, r.Rule)
			}
		}
	}
	return tx, nil
}

// write makes the gateway hold entries (cur: what its table holds now):
// classes, one nftables transaction (writeTx), unused classes deleted
// (shape.SetGateway); no entry deletes the table and the classes.
func write(ctx context.Context, c nftconn.Conn, cfg nat.Config, exists bool, cur, entries []entry) error {
	tx, err := writeTx(exists, entries)
	if err != nil {
		return err
	}
	commit := func() error {
		if err := c.Apply(ctx, tx); err != nil {
			if len(entries) == 0 {
				return fmt.Errorf("gateway QoS: nftables: delete table %s: %w", table.Name, err)
			}
			return fmt.Errorf("gateway QoS: nftables: program %d rules: %w", len(entries), err)
		}
		return nil
	}
	if err := shape.SetGateway(ctx, cfg, classes(cfg, cur), classes(cfg, entries), commit); err != nil {
		return fmt.Errorf("gateway QoS: %w", err)
	}
	return nil
}

// ShapedOn is the interface a rule's traffic is shaped on: egress, its
// interface; ingress (traffic arriving on it), the gateway interface it
// leaves through: the internal one, or the external one for a rule on the
// internal interface (upstream shapes at an IFB of the interface; natgw
// uses no IFB device).
func ShapedOn(cfg nat.Config, r Rule) string {
	if r.Direction == Egress {
		return r.Iface
	}
	if r.Iface == cfg.InternalInterface {
		return cfg.ExternalInterface
	}
	return cfg.InternalInterface
}

// classes are entries' HTB classes.
func classes(cfg nat.Config, entries []entry) []shape.GatewayClass {
	out := make([]shape.GatewayClass, 0, len(entries))
	for _, e := range entries {
		if e.Minor == 0 || e.Police {
			continue // policed, or an entry of an older layout: no class
		}
		out = append(out, shape.GatewayClass{Device: ShapedOn(cfg, e.Rule), Minor: e.Minor, Limit: e.limit()})
	}
	return out
}

// classesHeld says whether every class of entries is in the kernel with
// its limit.
func classesHeld(ctx context.Context, cfg nat.Config, entries []entry) bool {
	ok, err := shape.HoldsGateway(ctx, cfg, classes(cfg, entries))
	return err == nil && ok
}

// limit is a policed rule's `limit rate over RATE bytes/second burst
// BURST bytes`: rate = Mbit/s × 125,000, burst = MB × 2^20, both rounded.
func limit(r Rule) *expr.Limit {
	return &expr.Limit{Type: expr.LimitTypePktBytes, Unit: expr.LimitTimeSecond, Over: true,
		Rate:  uint64(math.Round(r.RateMbps * 1e6 / 8)),
		Burst: uint32(math.Round(r.BurstMB * BytesPerMB))}
}

// MarkShift places an ingress rule's class in the packet mark (bits
// 18-31, MarkMask: minor - shape.GatewayMinorBase + 1): an ingress rule
// classifies in prerouting, where the addresses are as they arrived, but
// the kernel resets skb->priority when it forwards, so the class rides in
// the mark until postrouting. natgw's NAT planes keep those bits (their
// hairpin marks are 0x4000, nftables, and 0x20000, iptables).
const (
	MarkShift = 18
	MarkMask  = 0xfffc0000
	// maxMarked is how many classes the mark's bits number.
	maxMarked = MarkMask>>MarkShift - 1
)

// markOf is the mark of class minor.
func markOf(minor uint16) uint32 { return uint32(minor-shape.GatewayMinorBase+1) << MarkShift }

// nftRule is one nftables rule of an entry (its tag set by writeTx) and
// its chain.
type nftRule struct {
	chain Direction
	nftconn.Rule
}

// nftRules are the nftables rules of one entry: egress, in chain egress,
// `oifname IFACE [ip saddr|daddr CIDR] meta priority set 4e47:<minor>
// accept`; ingress, in chain ingress, `iifname IFACE [ip saddr|daddr
// CIDR] meta mark set meta mark & ^MarkMask ^ markOf(minor) accept`, and
// in chain egress (after every egress rule) `meta mark & MarkMask ==
// markOf(minor) meta priority set 4e47:<minor> accept`. Each rule's Text
// is how nft lists it.
func nftRules(e entry) []nftRule {
	prio := []expr.Any{
		&expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint32(nil, uint32(shape.Major)<<16|uint32(e.Minor))},
		&expr.Meta{Key: expr.MetaKeyPRIORITY, SourceRegister: true, Register: 1},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}
	prioText := fmt.Sprintf("meta priority set %x:%x accept", shape.Major, e.Minor)
	match, matchText := Match(e.Rule), matchText(e.Rule)
	rule := func(chain Direction, text string, exprs ...[]expr.Any) nftRule {
		return nftRule{chain, nftconn.Rule{Exprs: slices.Concat(exprs...), Text: text}}
	}
	if e.Police {
		return []nftRule{
			rule(e.Direction, matchText+" "+limitText(e.Rule)+" drop", match, []expr.Any{limit(e.Rule), &expr.Verdict{Kind: expr.VerdictDrop}}),
			rule(e.Direction, matchText+" accept", match, []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}),
		}
	}
	if e.Direction == Egress {
		return []nftRule{rule(Egress, matchText+" "+prioText, match, prio)}
	}
	m := markOf(e.Minor)
	mark := binary.NativeEndian.AppendUint32(nil, m)
	return []nftRule{
		// nft lists (mark & a) ^ b, b inside ^a, as mark & (a|b) | b.
		rule(Ingress, fmt.Sprintf("%s meta mark set meta mark & 0x%08x | 0x%08x accept", matchText, ^uint32(MarkMask)|m, m),
			match, []expr.Any{
				&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binary.NativeEndian.AppendUint32(nil, ^uint32(MarkMask)), Xor: mark},
				&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
				&expr.Verdict{Kind: expr.VerdictAccept},
			}),
		rule(Egress, fmt.Sprintf("meta mark 0x%08x/%d %s", m, 32-MarkShift, prioText), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binary.NativeEndian.AppendUint32(nil, MarkMask), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: mark},
		}, prio),
	}
}

// limitText is limit(r) as nft lists it: each amount in the largest of
// bytes, kbytes and mbytes that holds it whole; no burst when it is 0.
func limitText(r Rule) string {
	l := limit(r)
	s := "limit rate over " + byteAmount(l.Rate) + "/second"
	if l.Burst != 0 {
		s += " burst " + byteAmount(uint64(l.Burst))
	}
	return s
}

func byteAmount(n uint64) string {
	unit := 0
	for ; unit < 2 && n != 0 && n%1024 == 0; unit++ {
		n /= 1024
	}
	return fmt.Sprintf("%d %s", n, []string{"bytes", "kbytes", "mbytes"}[unit])
}

// matchText is Match(r) as nft lists it.
func matchText(r Rule) string {
	s := fmt.Sprintf("iifname %q", r.Iface)
	if r.Direction == Egress {
		s = fmt.Sprintf("oifname %q", r.Iface)
	}
	if r.Classifier == U32 {
		addr := r.CIDR.String()
		if r.CIDR.IsSingleIP() {
			addr = r.CIDR.Addr().String()
		}
		field := "daddr"
		if r.MatchDir == "src" {
			field = "saddr"
		}
		s += " ip " + field + " " + addr
	}
	return s
}

func ifname(key expr.MetaKey, name string) []expr.Any {
	b := make([]byte, 16)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

// cidrMatch loads an address with load and compares it, masked, to p.
func cidrMatch(load expr.Any, p netip.Prefix) []expr.Any {
	a := p.Addr().As4()
	return []expr.Any{
		load,
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: net.CIDRMask(p.Bits(), 32), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
	}
}

// Match is the expressions that match an egress rule's traffic as it
// leaves: `oifname IFACE` and, for u32, the source or destination address
// masked to the CIDR's length (ingress rules: nftRules).
func Match(r Rule) []expr.Any {
	key := expr.MetaKeyIIFNAME
	if r.Direction == Egress {
		key = expr.MetaKeyOIFNAME
	}
	out := ifname(key, r.Iface)
	if r.Classifier == U32 {
		off := uint32(16)
		if r.MatchDir == "src" {
			off = 12
		}
		out = append(out, cidrMatch(&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}, r.CIDR)...)
	}
	return out
}
