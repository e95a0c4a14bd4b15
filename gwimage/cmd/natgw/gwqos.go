package main

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/natgw/natgw/gwimage/compat"
)

// Gateway-wide QoS (qos-add / qos-del, VpcNatGateway.spec.qosPolicy) lives
// in natgw's nftables table natgw_gwqos: chain "ingress" (prerouting, before
// DNAT: traffic arriving on the interface, addresses as they arrive) and
// chain "egress" (postrouting after source NAT: traffic leaving it,
// addresses as they leave), as tc on the device sees them. Each rule is two nftables rules in priority order:
// `IFACE [ip saddr|daddr CIDR] limit rate over RATE burst BURST drop`, then
// the same match `accept`, so that, as with upstream's tc filters, the
// matching rule of lowest priority is the one that applies. The rules are
// kept in their rules' user data; each call rebuilds both chains in one
// transaction.

const gwQoSTable = "natgw_gwqos"

// gwQoSEntry is a stored rule: the parsed rule and the order it was added
// in (ties of priority keep that order).
type gwQoSEntry struct {
	compat.GatewayQoS
	Seq uint64
}

const gwQoSTagPrefix = "natgw gwqos "

// applyGatewayQoS carries out qos-add / qos-del rules.
func applyGatewayQoS(changes []compat.GatewayQoS) error {
	c, err := nft.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := &nft.Table{Name: gwQoSTable, Family: nft.TableFamilyIPv4}
	chains := map[compat.Direction]*nft.Chain{
		compat.Ingress: {Name: "ingress", Table: t, Type: nft.ChainTypeFilter, Hooknum: nft.ChainHookPrerouting, Priority: nft.ChainPriorityMangle},
		// After source NAT, as tc on the device sees the packets.
		compat.Egress: {Name: "egress", Table: t, Type: nft.ChainTypeFilter, Hooknum: nft.ChainHookPostrouting, Priority: nft.ChainPriorityRef(300)},
	}
	var entries []gwQoSEntry
	var seq uint64
	if tables, err := c.ListTablesOfFamily(nft.TableFamilyIPv4); err == nil && slices.ContainsFunc(tables, func(x *nft.Table) bool { return x.Name == gwQoSTable }) {
		for _, dir := range []compat.Direction{compat.Ingress, compat.Egress} {
			rules, err := c.GetRules(t, chains[dir])
			if err != nil {
				return fmt.Errorf("nftables: read %s %s: %w", gwQoSTable, dir, err)
			}
			for _, r := range rules {
				tag, ok := strings.CutPrefix(string(r.UserData), gwQoSTagPrefix)
				if !ok || !strings.HasPrefix(tag, "drop ") {
					continue
				}
				var e gwQoSEntry
				if err := json.Unmarshal([]byte(strings.TrimPrefix(tag, "drop ")), &e); err != nil {
					return fmt.Errorf("nftables: %s: rule %d: %w", gwQoSTable, r.Handle, err)
				}
				entries = append(entries, e)
				seq = max(seq, e.Seq)
			}
		}
	} else if err != nil {
		return fmt.Errorf("nftables: list tables: %w", err)
	}
	for _, ch := range changes {
		entries = slices.DeleteFunc(entries, func(e gwQoSEntry) bool { return e.Key() == ch.Key() })
		if ch.Add {
			seq++
			entries = append(entries, gwQoSEntry{GatewayQoS: ch, Seq: seq})
		}
	}
	slices.SortStableFunc(entries, func(a, b gwQoSEntry) int {
		if a.Priority != b.Priority {
			return int(a.Priority) - int(b.Priority)
		}
		return int(a.Seq) - int(b.Seq)
	})
	c.AddTable(t)
	for _, dir := range []compat.Direction{compat.Ingress, compat.Egress} {
		ch := c.AddChain(chains[dir])
		c.FlushChain(ch)
		for _, e := range entries {
			if e.Direction != dir {
				continue
			}
			js, err := json.Marshal(e)
			if err != nil {
				return err
			}
			match := gwQoSMatch(e.GatewayQoS)
			rate := uint64(math.Round(e.RateMbps * 1e6 / 8))
			burst := uint32(math.Round(e.BurstMB * compat.BytesPerMB))
			c.AddRule(&nft.Rule{Table: t, Chain: ch, UserData: []byte(gwQoSTagPrefix + "drop " + string(js)), Exprs: append(slices.Clone(match),
				&expr.Limit{Type: expr.LimitTypePktBytes, Rate: rate, Unit: expr.LimitTimeSecond, Burst: burst, Over: true},
				&expr.Verdict{Kind: expr.VerdictDrop})})
			c.AddRule(&nft.Rule{Table: t, Chain: ch, UserData: []byte(gwQoSTagPrefix + "accept " + e.Key()), Exprs: append(slices.Clone(match),
				&expr.Verdict{Kind: expr.VerdictAccept})})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: program gateway QoS: %w", err)
	}
	return nil
}

// gwQoSMatch matches a rule's traffic: the interface (iifname for ingress,
// oifname for egress) and, for u32, the source or destination CIDR.
func gwQoSMatch(q compat.GatewayQoS) []expr.Any {
	key := expr.MetaKeyIIFNAME
	if q.Direction == compat.Egress {
		key = expr.MetaKeyOIFNAME
	}
	name := make([]byte, 16)
	copy(name, q.Iface)
	out := []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: name},
	}
	if q.Classifier == "u32" {
		off := uint32(16)
		if q.MatchDir == "src" {
			off = 12
		}
		mask := net.CIDRMask(q.CIDR.Bits(), 32)
		a := q.CIDR.Addr().As4()
		out = append(out,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]},
		)
	}
	return out
}
