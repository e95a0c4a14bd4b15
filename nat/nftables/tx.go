package nftables

import (
	"encoding/binary"
	"fmt"

	nft "github.com/google/nftables"

	"github.com/natgw/natgw/nat/nftconn"
)

// mainTable is natgw's table: inet natgw.
var mainTable = nftconn.Table{Family: tableFamily, Name: nftconn.MainTable}

// legacyIPTable is the table layouts 1-3 wrote: ip natgw (IPv4 only).
var legacyIPTable = nftconn.Table{Family: nft.TableFamilyIPv4, Name: nftconn.MainTable}

// txPlan is one transaction on natgw's table being planned: an
// nftconn.Tx (the one transaction type of every natgw table; it encodes
// and renders it) whose operations name the main table, and what the
// Backend keeps of it once it commits: whether it stores the generation
// in natgw_meta and which index snapshot id, and whether it changes the
// FIP maps' elements. The layout step (Backend.plan, Plan) computes it
// from a change of objects without touching the kernel; the transport
// sends its Tx as one netlink batch, all or nothing.
type txPlan struct {
	tx      nftconn.Tx
	stamped bool   // stores the generation (see stamp)
	snap    uint64 // the index snapshot id the stamp stores (0: none)
	touches bool   // changes the FIP maps (or may: see touchesFIPs)
}

func (p *txPlan) createTable() { p.tx.CreateTable(mainTable); p.touches = true }
func (p *txPlan) deleteTable() { p.tx.DeleteTable(mainTable); p.touches = true }

// deleteLegacyTable deletes table ip natgw (layouts 1-3).
func (p *txPlan) deleteLegacyTable() { p.tx.DeleteTable(legacyIPTable) }

func (p *txPlan) addSet(s setSpec) { p.tx.AddSet(mainTable, s.conn()) }

func (p *txPlan) flushSet(name string) {
	p.tx.FlushSet(mainTable, specOf(name).conn())
	p.touches = p.touches || isFIPMap(name)
}

func (p *txPlan) deleteSet(name string) {
	p.tx.DeleteSet(mainTable, specOf(name).conn())
	p.touches = p.touches || isFIPMap(name)
}

func (p *txPlan) addChain(c chainSpec) { p.tx.AddChain(mainTable, c.conn()) }

func (p *txPlan) flushChain(name string) { p.tx.FlushChain(mainTable, nftconn.ChainName(name)) }

// deleteChain deletes an empty chain.
func (p *txPlan) deleteChain(name string) { p.tx.DeleteChain(mainTable, nftconn.ChainName(name)) }

// addRule appends r to chain, its comment as nft's.
func (p *txPlan) addRule(chain string, r ruleSpec) {
	p.tx.AppendRule(mainTable, nftconn.ChainName(chain), nftconn.Rule{Exprs: r.exprs, Text: r.text, Comment: r.comment})
}

func (p *txPlan) addLimit(k qosKey, v qosVal) { p.tx.AddLimit(mainTable, k.name(), *limitExpr(v)) }
func (p *txPlan) deleteLimit(name string)     { p.tx.DeleteLimit(mainTable, name) }

// addElements adds es to the set; with excl, the kernel refuses the
// transaction if one of the keys is present. The Tx keeps es.
func (p *txPlan) addElements(set string, es []nft.SetElement, excl bool) {
	if len(es) > 0 {
		p.tx.AddSetElements(mainTable, specOf(set).conn(), es, excl)
		p.touches = p.touches || isFIPMap(set)
	}
}

// deleteElements deletes the elements of es's keys (values are ignored).
func (p *txPlan) deleteElements(set string, es []nft.SetElement) {
	if len(es) > 0 {
		p.tx.DeleteSetElements(mainTable, specOf(set).conn(), es)
		p.touches = p.touches || isFIPMap(set)
	}
}

// stamp flushes natgw_meta and adds its element again with comment, and
// in its user data the generation gen (see udataGen), the index snapshot
// id snap unless 0 (see udataSnap) and the fixed rules' fingerprint rules
// unless 0 (see udataRules; the text's note leaves it out). A flush, not a
// delete, so that it works even if the element was deleted by hand.
func (p *txPlan) stamp(comment string, gen uint32, snap, rules uint64) {
	meta := specOf(setMeta).conn()
	ud := binary.BigEndian.AppendUint32([]byte{udataGen, 4}, gen)
	note := fmt.Sprintf("generation %d", gen)
	if snap != 0 {
		ud = append(ud, udataSnap, 8)
		ud = binary.BigEndian.AppendUint64(ud, snap)
		note += fmt.Sprintf(", index snapshot %016x", snap)
	}
	if rules != 0 {
		ud = append(ud, udataRules, 8)
		ud = binary.BigEndian.AppendUint64(ud, rules)
	}
	p.tx.FlushSet(mainTable, meta)
	p.tx.AddElementUserData(mainTable, meta, metaKey, comment, ud, note+" in userdata")
	p.stamped, p.snap = true, snap
}

// touchesFIPs says whether the transaction changes the FIP maps' elements
// (or may: a table created or deleted, a FIP map flushed), which ends the
// validity of an index snapshot (see nat/README.md, "The index
// snapshot").
func (p *txPlan) touchesFIPs() bool { return p.touches }

// specOf returns the spec of a set of the table by name (fixed or CIDR SNAT).
func specOf(name string) setSpec {
	for _, s := range fixedSets {
		if s.name == name {
			return s
		}
	}
	if c, ok := parseSNATSet(name); ok {
		return c.spec()
	}
	return setSpec{name: name}
}

// conn is s as an nftconn.Set: the one place the main table's set spec
// becomes nftconn's (its netlink attributes and its text).
func (s setSpec) conn() nftconn.Set {
	return nftconn.Set{Name: nftconn.SetName(s.name), Key: s.key, Data: s.val, Concat: s.concat}
}

// conn is c as an nftconn.Chain: the one place the main table's chain
// name becomes nftconn's (its header text and its netlink attributes).
func (c chainSpec) conn() nftconn.Chain {
	return nftconn.Chain{Name: nftconn.ChainName(c.name), Type: c.typ, Hook: c.hook, Priority: c.prio}
}
