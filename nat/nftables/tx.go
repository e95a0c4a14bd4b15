package nftables

import (
	nft "github.com/google/nftables"

	"github.com/natgw/natgw/nat/nftconn"
)

// Tx is one transaction on natgw's table as a value: the operations, in the
// order the kernel applies them. The layout step (Backend.plan, Plan)
// computes it from a change of objects without touching the kernel; String
// renders it in nft syntax; the transport (encode.go, batch.go) sends it as
// one netlink batch, all or nothing.
type Tx struct {
	ops []op
}

// opKind is what one operation of a Tx does.
type opKind uint8

const (
	opCreateTable       opKind = iota + 1 // create the table; fails if it exists
	opDeleteTable                         // delete the table and everything in it
	opAddSet                              // add a set or map (set)
	opFlushSet                            // delete every element of a set
	opDeleteSet                           // delete a set
	opAddChain                            // add a chain (chain: base chains have a hook)
	opFlushChain                          // delete every rule of a chain
	opDeleteChain                         // delete an empty chain
	opAddRule                             // append a rule to a chain (rule)
	opAddLimit                            // add a named limit object (limit)
	opDeleteLimit                         // delete a named limit object
	opAddElements                         // add elements to a set (elems; excl: fail on an existing key)
	opDeleteElements                      // delete elements of a set by key (elems)
	opStamp                               // replace natgw_meta's element (comment, gen)
	opDeleteLegacyTable                   // delete table ip natgw (layouts 1-3: IPv4 only)
)

// op is one operation; which fields are set depends on kind.
type op struct {
	kind    opKind
	name    string // the set, chain or limit object
	set     setSpec
	chain   chainSpec
	rule    ruleSpec
	limit   qosVal
	elems   []nft.SetElement
	excl    bool
	comment string
	gen     uint32
	snap    uint64 // opStamp: the index snapshot id (0: none)
}

// Len returns the number of operations.
func (t *Tx) Len() int { return len(t.ops) }

// Empty reports whether the transaction does nothing.
func (t *Tx) Empty() bool { return len(t.ops) == 0 }

func (t *Tx) add(o op) { t.ops = append(t.ops, o) }

func (t *Tx) createTable()                { t.add(op{kind: opCreateTable}) }
func (t *Tx) deleteTable()                { t.add(op{kind: opDeleteTable}) }
func (t *Tx) deleteLegacyTable()          { t.add(op{kind: opDeleteLegacyTable}) }
func (t *Tx) addSet(s setSpec)            { t.add(op{kind: opAddSet, name: s.name, set: s}) }
func (t *Tx) flushSet(name string)        { t.add(op{kind: opFlushSet, name: name}) }
func (t *Tx) deleteSet(name string)       { t.add(op{kind: opDeleteSet, name: name}) }
func (t *Tx) addChain(c chainSpec)        { t.add(op{kind: opAddChain, name: c.name, chain: c}) }
func (t *Tx) flushChain(name string)      { t.add(op{kind: opFlushChain, name: name}) }
func (t *Tx) deleteChain(name string)     { t.add(op{kind: opDeleteChain, name: name}) }
func (t *Tx) deleteLimit(name string)     { t.add(op{kind: opDeleteLimit, name: name}) }
func (t *Tx) addLimit(k qosKey, v qosVal) { t.add(op{kind: opAddLimit, name: k.name(), limit: v}) }

func (t *Tx) addRule(chain string, r ruleSpec) {
	t.add(op{kind: opAddRule, name: chain, rule: r})
}

// addElements adds es to the set; with excl, the kernel refuses the
// transaction if one of the keys is present.
func (t *Tx) addElements(set string, es []nft.SetElement, excl bool) {
	if len(es) > 0 {
		t.add(op{kind: opAddElements, name: set, set: specOf(set), elems: es, excl: excl})
	}
}

// deleteElements deletes the elements of es's keys (values are ignored).
func (t *Tx) deleteElements(set string, es []nft.SetElement) {
	if len(es) > 0 {
		t.add(op{kind: opDeleteElements, name: set, set: specOf(set), elems: es})
	}
}

// stamp replaces the natgw_meta element: comment, and gen and the index
// snapshot id snap (0: none) in userdata.
func (t *Tx) stamp(comment string, gen uint32, snap uint64) {
	t.add(op{kind: opStamp, name: setMeta, comment: comment, gen: gen, snap: snap})
}

// snap returns the index snapshot id t's stamp stores (0: none, or no
// stamp).
func (t *Tx) snap() uint64 {
	for _, o := range t.ops {
		if o.kind == opStamp {
			return o.snap
		}
	}
	return 0
}

// touchesFIPs says whether t changes the FIP maps' elements (or may:
// a table created or deleted, a FIP map flushed), which ends the validity
// of an index snapshot (see nat/README.md, "The index snapshot").
func (t *Tx) touchesFIPs() bool {
	for _, o := range t.ops {
		switch o.kind {
		case opCreateTable, opDeleteTable:
			return true
		case opFlushSet, opDeleteSet, opAddElements, opDeleteElements:
			if isFIPMap(o.name) {
				return true
			}
		}
	}
	return false
}

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

// elemBytes estimates the encoded size of the transaction's element
// messages, to size the batch buffer once.
func (t *Tx) elemBytes() int {
	n := 0
	for _, o := range t.ops {
		if o.kind == opAddElements || o.kind == opDeleteElements {
			n += nftconn.ElemBytes(o.elems)
		}
	}
	return n + 4096
}
