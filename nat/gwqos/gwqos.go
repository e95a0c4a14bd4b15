// Package gwqos programs a gateway's gateway-wide QoS (Kube-OVN's
// VpcNatGateway.spec.qosPolicy with bindingType NATGW, upstream's
// `nat-gateway.sh qos-add/qos-del`) in natgw's nftables table natgw_gwqos.
// It is the one implementation both callers share: the compat path
// (qos-add/qos-del and the EIP QoS subcommands change rules by Key) and the
// agent (`natgw serve`: Set replaces the gateway's whole QoS state, the
// controller's desired-state form).
//
// Layout (nat/README.md, "Gateway-wide QoS"): table ip natgw_gwqos, chain
// "ingress" (filter, prerouting, priority mangle -150: traffic arriving on
// the interface, addresses as they arrive, before DNAT) and chain "egress"
// (filter, postrouting, priority 300: traffic leaving it, after source
// NAT), as tc on the device sees them. Each rule is two nftables rules in
// priority order: `iifname|oifname IFACE [ip saddr|daddr CIDR] limit rate
// over RATE bytes/second burst BURST bytes drop`, then the same match
// `accept`, so that, as with upstream's tc filters, the matching rule of
// lowest priority is the one that applies. Each rule's parameters are kept
// in its drop rule's user data, so the state is read back from the kernel.
// Every call is one nftables transaction; no rule left means no table.
package gwqos

import (
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
)

// Table is the nftables table (family ip) of gateway-wide QoS.
const Table = "natgw_gwqos"

// BytesPerMB is upstream's burst unit: its script multiplies the burst by
// 1,048,576 to get bytes.
const BytesPerMB = 1 << 20

// Limits of a rule's rate and burst: what upstream's controller accepts
// (tc's rate) and what the kernel's 32-bit byte count of a burst holds.
const (
	MaxRateMbps = 100_000
	MaxBurstMB  = float64(math.MaxUint32) / BytesPerMB
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
	return nil
}

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
	Seq uint64 `json:"seq"`
}

const tagPrefix = "natgw gwqos "

// Set makes the gateway's QoS exactly rules, in one transaction: what was
// there before, whoever added it, is replaced (ns is the gateway's network
// namespace, a name under /run/netns or a path; "" is the current one).
// Rules are taken in order, a later rule of the same Key replacing an
// earlier one. No rule removes the table.
func Set(ns string, rules []Rule) error {
	_, err := Ensure(ns, rules)
	return err
}

// Ensure is Set that first reads what the gateway holds and writes only
// when it differs (the drift check's repair): changed says whether it
// wrote. The table differs when its rules, in the order they apply, are not
// rules' (after Set's replacement of same-Key rules), or when its chains
// hold anything else (a rule added or removed by hand), or cannot be read.
func Ensure(ns string, rules []Rule) (changed bool, err error) {
	if err := ValidateAll(rules); err != nil {
		return false, err
	}
	changes := make([]Change, len(rules))
	for i, r := range rules {
		changes[i] = Change{Add: true, Rule: r}
	}
	want := merge(nil, changes)
	sortEntries(want)
	err = withConn(ns, func(c *nft.Conn) error {
		exists, err := tableExists(c)
		if err != nil {
			return err
		}
		if exists && holds(c, want) || !exists && len(want) == 0 {
			return nil
		}
		changed = true
		return write(c, exists, want)
	})
	return changed, err
}

// holds says whether the table holds exactly want (sorted): the same rules
// in the same order, and no rule but the two write adds for each.
func holds(c *nft.Conn, want []entry) bool {
	have, total, err := readAll(c)
	if err != nil || total != 2*len(have) || len(have) != len(want) {
		return false
	}
	sortEntries(have)
	for i := range have {
		if have[i].Rule != want[i].Rule {
			return false
		}
	}
	return true
}

// Apply carries out changes (qos-add / qos-del) on the rules the gateway
// holds, in one transaction.
func Apply(ns string, changes []Change) error {
	for i, ch := range changes {
		if !ch.Add {
			continue
		}
		if err := ch.Validate(); err != nil {
			return fmt.Errorf("rule %d (%s): %w", i, ch.Key(), err)
		}
	}
	return withConn(ns, func(c *nft.Conn) error {
		exists, err := tableExists(c)
		if err != nil {
			return err
		}
		var cur []entry
		if exists {
			if cur, err = read(c); err != nil {
				return err
			}
		}
		return write(c, exists, merge(cur, changes))
	})
}

// List returns the rules the gateway holds, in the order they apply
// (priority, then the order they were added in); none when there is no
// table.
func List(ns string) ([]Rule, error) {
	var out []Rule
	err := withConn(ns, func(c *nft.Conn) error {
		exists, err := tableExists(c)
		if err != nil || !exists {
			return err
		}
		entries, err := read(c)
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

// withConn runs fn with an nftables connection in namespace ns.
func withConn(ns string, fn func(c *nft.Conn) error) error {
	var opts []nft.ConnOption
	if ns != "" {
		h, err := netns.Open(ns)
		if err != nil {
			return fmt.Errorf("gateway QoS: %w", err)
		}
		defer h.Close()
		opts = append(opts, nft.WithNetNSFd(h.Fd()))
	}
	c, err := nft.New(opts...)
	if err != nil {
		return fmt.Errorf("gateway QoS: nftables: %w", err)
	}
	return fn(c)
}

func table() *nft.Table { return &nft.Table{Name: Table, Family: nft.TableFamilyIPv4} }

func chains(t *nft.Table) map[Direction]*nft.Chain {
	return map[Direction]*nft.Chain{
		Ingress: {Name: string(Ingress), Table: t, Type: nft.ChainTypeFilter, Hooknum: nft.ChainHookPrerouting, Priority: nft.ChainPriorityMangle},
		// After source NAT, as tc on the device sees the packets.
		Egress: {Name: string(Egress), Table: t, Type: nft.ChainTypeFilter, Hooknum: nft.ChainHookPostrouting, Priority: nft.ChainPriorityRef(300)},
	}
}

func tableExists(c *nft.Conn) (bool, error) {
	tables, err := c.ListTablesOfFamily(nft.TableFamilyIPv4)
	if err != nil {
		return false, fmt.Errorf("gateway QoS: nftables: list tables: %w", err)
	}
	return slices.ContainsFunc(tables, func(x *nft.Table) bool { return x.Name == Table }), nil
}

// read returns the stored entries of both chains.
func read(c *nft.Conn) ([]entry, error) {
	out, _, err := readAll(c)
	return out, err
}

// readAll returns the stored entries of both chains and how many rules the
// chains hold in all (two per entry as write makes them).
func readAll(c *nft.Conn) ([]entry, int, error) {
	t := table()
	chs := chains(t)
	var out []entry
	total := 0
	for _, dir := range []Direction{Ingress, Egress} {
		rules, err := c.GetRules(t, chs[dir])
		if err != nil {
			return nil, 0, fmt.Errorf("gateway QoS: nftables: read %s %s: %w", Table, dir, err)
		}
		total += len(rules)
		for _, r := range rules {
			tag, ok := strings.CutPrefix(string(r.UserData), tagPrefix+"drop ")
			if !ok {
				continue
			}
			var e entry
			if err := json.Unmarshal([]byte(tag), &e); err != nil {
				return nil, 0, fmt.Errorf("gateway QoS: %s %s: rule %d: %w", Table, dir, r.Handle, err)
			}
			out = append(out, e)
		}
	}
	return out, total, nil
}

// merge applies changes to entries, numbering added rules after the
// highest number there.
func merge(entries []entry, changes []Change) []entry {
	var seq uint64
	for _, e := range entries {
		seq = max(seq, e.Seq)
	}
	for _, ch := range changes {
		entries = slices.DeleteFunc(entries, func(e entry) bool { return e.Key() == ch.Key() })
		if ch.Add {
			seq++
			entries = append(entries, entry{Rule: ch.Rule, Seq: seq})
		}
	}
	return entries
}

func sortEntries(entries []entry) {
	slices.SortStableFunc(entries, func(a, b entry) int {
		if a.Priority != b.Priority {
			return int(a.Priority) - int(b.Priority)
		}
		return int(a.Seq) - int(b.Seq)
	})
}

// write makes the table hold entries in one transaction (deletes it when
// there are none; exists says whether it is there now).
func write(c *nft.Conn, exists bool, entries []entry) error {
	t := table()
	if len(entries) == 0 {
		if !exists {
			return nil
		}
		c.DelTable(t)
		if err := c.Flush(); err != nil {
			return fmt.Errorf("gateway QoS: nftables: delete table %s: %w", Table, err)
		}
		return nil
	}
	sortEntries(entries)
	c.AddTable(t)
	chs := chains(t)
	for _, dir := range []Direction{Ingress, Egress} {
		ch := c.AddChain(chs[dir])
		c.FlushChain(ch)
		for _, e := range entries {
			if e.Direction != dir {
				continue
			}
			js, err := json.Marshal(e)
			if err != nil {
				return fmt.Errorf("gateway QoS: encode rule %s: %w", e.Key(), err)
			}
			match := Match(e.Rule)
			c.AddRule(&nft.Rule{Table: t, Chain: ch, UserData: []byte(tagPrefix + "drop " + string(js)),
				Exprs: append(slices.Clone(match), limit(e.Rule), &expr.Verdict{Kind: expr.VerdictDrop})})
			c.AddRule(&nft.Rule{Table: t, Chain: ch, UserData: []byte(tagPrefix + "accept " + e.Key()),
				Exprs: append(slices.Clone(match), &expr.Verdict{Kind: expr.VerdictAccept})})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("gateway QoS: nftables: program %d rules: %w", len(entries), err)
	}
	return nil
}

// limit is the rule's `limit rate over RATE bytes/second burst BURST
// bytes`: rate = Mbit/s × 125,000, burst = MB × 2^20, both rounded.
func limit(r Rule) *expr.Limit {
	return &expr.Limit{Type: expr.LimitTypePktBytes, Unit: expr.LimitTimeSecond, Over: true,
		Rate:  uint64(math.Round(r.RateMbps * 1e6 / 8)),
		Burst: uint32(math.Round(r.BurstMB * BytesPerMB))}
}

// Match is the expressions that match a rule's traffic: the interface
// (iifname for ingress, oifname for egress) and, for u32, the source or
// destination address masked to the CIDR's length.
func Match(r Rule) []expr.Any {
	key := expr.MetaKeyIIFNAME
	if r.Direction == Egress {
		key = expr.MetaKeyOIFNAME
	}
	name := make([]byte, 16)
	copy(name, r.Iface)
	out := []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
	}
	if r.Classifier == U32 {
		off := uint32(16)
		if r.MatchDir == "src" {
			off = 12
		}
		mask := net.CIDRMask(r.CIDR.Bits(), 32)
		a := r.CIDR.Addr().As4()
		out = append(out,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
		)
	}
	return out
}
