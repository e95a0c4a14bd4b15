package nftconn

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Table names one nftables table: its family and name.
type Table struct {
	Family nft.TableFamily
	Name   TableName
}

// String is the table as nft commands name it: `ip natgw_lbsvc`.
func (t Table) String() string { return FamilyName(t.Family) + " " + string(t.Name) }

// FamilyName is a table family as nft writes it (ip, ip6, inet, ...).
func FamilyName(f nft.TableFamily) string {
	switch f {
	case nft.TableFamilyIPv4:
		return "ip"
	case nft.TableFamilyIPv6:
		return "ip6"
	case nft.TableFamilyINet:
		return "inet"
	case nft.TableFamilyARP:
		return "arp"
	case nft.TableFamilyBridge:
		return "bridge"
	case nft.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family%d", f)
}

// Chain is a chain's spec: a base chain has Hook and Priority (and Type),
// a regular chain neither.
type Chain struct {
	Name     ChainName
	Type     nft.ChainType
	Hook     *nft.ChainHook
	Priority *nft.ChainPriority
}

// Header is a base chain's `type T hook H priority P; policy accept;` as
// nft lists it; "" for a regular chain.
func (c Chain) Header() string {
	if c.Hook == nil || c.Priority == nil {
		return ""
	}
	prio, ok := prioNames[*c.Priority]
	if !ok {
		prio = strconv.Itoa(int(*c.Priority))
	}
	hook, ok := hookNames[*c.Hook]
	if !ok {
		hook = strconv.Itoa(int(*c.Hook))
	}
	return fmt.Sprintf("type %s hook %s priority %s; policy accept;", c.Type, hook, prio)
}

var prioNames = map[nft.ChainPriority]string{
	*nft.ChainPriorityRaw: "raw", *nft.ChainPriorityMangle: "mangle", *nft.ChainPriorityNATDest: "dstnat",
	*nft.ChainPriorityFilter: "filter", *nft.ChainPrioritySecurity: "security", *nft.ChainPriorityNATSource: "srcnat",
}

var hookNames = map[nft.ChainHook]string{
	*nft.ChainHookPrerouting: "prerouting", *nft.ChainHookInput: "input", *nft.ChainHookForward: "forward",
	*nft.ChainHookOutput: "output", *nft.ChainHookPostrouting: "postrouting",
}

// Rule is one rule: the expressions the kernel gets, the same rule as nft
// lists it (Text, for people and golden files; the layout that builds
// Exprs writes it, and the layout's kernel test checks that nft lists
// it so), and its tag, stored as the rule's user data, by which natgw
// finds it again.
type Rule struct {
	Exprs []expr.Any
	Text  string
	Tag   string
}

// line is the rule as a dump shows it.
func (r Rule) line() string {
	if r.Tag == "" {
		return r.Text
	}
	return r.Text + " # " + strconv.Quote(r.Tag)
}

// Map is a map's spec: its name and the datatypes of its keys and values
// (google/nftables' SetDatatype, whose Name is nft's type name).
type Map struct {
	Name     MapName
	KeyType  nft.SetDatatype
	DataType nft.SetDatatype
}

// Element is one element of a map: its key and value as the kernel gets
// them, its comment, and Text, the element as nft lists it (`KEY comment
// "C" : VALUE`; the layout that builds Key and Val writes it, for people
// and golden files). Elements read back from the kernel have no Text.
type Element struct {
	Key, Val []byte
	Comment  string
	Text     string
}

// RuleRef is a rule found in a chain: its handle and its tag.
type RuleRef struct {
	Handle uint64
	Tag    string
}

// Tx is one nftables transaction as a value: its operations in the order
// the kernel applies them, all or nothing. String renders it in nft
// syntax; Conn.Apply sends it.
type Tx struct {
	ops []op
}

type opKind uint8

const (
	opAddTable opKind = iota + 1
	opCreateTable
	opDeleteTable
	opAddChain
	opFlushChain
	opDeleteChain
	opAppendRule
	opInsertRule
	opDeleteRule
	opAddMap
	opFlushMap
	opAddElements
)

type op struct {
	kind     opKind
	table    Table
	chain    Chain
	rule     Rule
	handle   uint64
	set      Map
	elements []Element
}

// AddTable adds t; a table that exists is kept as it is (nft's `add`).
func (tx *Tx) AddTable(t Table) { tx.ops = append(tx.ops, op{kind: opAddTable, table: t}) }

// CreateTable adds t; the transaction fails (EEXIST) if t exists (nft's
// `create`).
func (tx *Tx) CreateTable(t Table) { tx.ops = append(tx.ops, op{kind: opCreateTable, table: t}) }

// DeleteTable deletes t and everything in it; the transaction fails if t
// does not exist.
func (tx *Tx) DeleteTable(t Table) { tx.ops = append(tx.ops, op{kind: opDeleteTable, table: t}) }

// AddChain adds c to t; a chain that exists keeps its rules.
func (tx *Tx) AddChain(t Table, c Chain) {
	tx.ops = append(tx.ops, op{kind: opAddChain, table: t, chain: c})
}

// FlushChain deletes every rule of chain; the transaction fails if the
// chain does not exist.
func (tx *Tx) FlushChain(t Table, chain ChainName) {
	tx.ops = append(tx.ops, op{kind: opFlushChain, table: t, chain: Chain{Name: chain}})
}

// DeleteChain deletes chain and its rules; the transaction fails if the
// chain does not exist or a rule of another chain jumps to it.
func (tx *Tx) DeleteChain(t Table, chain ChainName) {
	tx.ops = append(tx.ops, op{kind: opDeleteChain, table: t, chain: Chain{Name: chain}})
}

// AppendRule adds r at the end of chain.
func (tx *Tx) AppendRule(t Table, chain ChainName, r Rule) {
	tx.ops = append(tx.ops, op{kind: opAppendRule, table: t, chain: Chain{Name: chain}, rule: r})
}

// InsertRule adds r at the start of chain (iptables' -I).
func (tx *Tx) InsertRule(t Table, chain ChainName, r Rule) {
	tx.ops = append(tx.ops, op{kind: opInsertRule, table: t, chain: Chain{Name: chain}, rule: r})
}

// DeleteRule deletes the rule of chain with handle h (tag is for the
// text only); the transaction fails if there is none.
func (tx *Tx) DeleteRule(t Table, chain ChainName, h uint64, tag string) {
	tx.ops = append(tx.ops, op{kind: opDeleteRule, table: t, chain: Chain{Name: chain}, handle: h, rule: Rule{Tag: tag}})
}

// AddMap adds map m to t; a map that exists keeps its elements.
func (tx *Tx) AddMap(t Table, m Map) { tx.ops = append(tx.ops, op{kind: opAddMap, table: t, set: m}) }

// FlushMap deletes every element of map name; the transaction fails if
// the map does not exist.
func (tx *Tx) FlushMap(t Table, name MapName) {
	tx.ops = append(tx.ops, op{kind: opFlushMap, table: t, set: Map{Name: name}})
}

// AddElements adds els to map name (a map added earlier in the same
// transaction, or one that exists); an element whose key is there with
// the same value is kept, with another value it fails the transaction.
func (tx *Tx) AddElements(t Table, name MapName, els ...Element) {
	if len(els) == 0 {
		return
	}
	tx.ops = append(tx.ops, op{kind: opAddElements, table: t, set: Map{Name: name}, elements: slices.Clone(els)})
}

// Len returns the number of operations.
func (tx *Tx) Len() int { return len(tx.ops) }

// String renders the transaction in nft syntax, one command per line; a
// rule's tag follows as a # comment.
func (tx *Tx) String() string {
	var b strings.Builder
	for _, o := range tx.ops {
		switch o.kind {
		case opAddTable:
			fmt.Fprintf(&b, "add table %s\n", o.table)
		case opCreateTable:
			fmt.Fprintf(&b, "create table %s\n", o.table)
		case opDeleteTable:
			fmt.Fprintf(&b, "delete table %s\n", o.table)
		case opAddChain:
			if h := o.chain.Header(); h != "" {
				fmt.Fprintf(&b, "add chain %s %s { %s }\n", o.table, o.chain.Name, h)
			} else {
				fmt.Fprintf(&b, "add chain %s %s\n", o.table, o.chain.Name)
			}
		case opFlushChain:
			fmt.Fprintf(&b, "flush chain %s %s\n", o.table, o.chain.Name)
		case opDeleteChain:
			fmt.Fprintf(&b, "delete chain %s %s\n", o.table, o.chain.Name)
		case opAppendRule:
			fmt.Fprintf(&b, "add rule %s %s %s\n", o.table, o.chain.Name, o.rule.line())
		case opInsertRule:
			fmt.Fprintf(&b, "insert rule %s %s %s\n", o.table, o.chain.Name, o.rule.line())
		case opDeleteRule:
			fmt.Fprintf(&b, "delete rule %s %s handle %d", o.table, o.chain.Name, o.handle)
			if o.rule.Tag != "" {
				fmt.Fprintf(&b, " # %q", o.rule.Tag)
			}
			b.WriteString("\n")
		case opAddMap:
			fmt.Fprintf(&b, "add map %s %s { type %s : %s; }\n", o.table, o.set.Name, o.set.KeyType.Name, o.set.DataType.Name)
		case opFlushMap:
			fmt.Fprintf(&b, "flush map %s %s\n", o.table, o.set.Name)
		case opAddElements:
			fmt.Fprintf(&b, "add element %s %s { %s }\n", o.table, o.set.Name, elementsText(o.elements))
		}
	}
	return b.String()
}

// elementsText is els' Texts as nft lists them, comma-separated.
func elementsText(els []Element) string {
	texts := make([]string, len(els))
	for i, e := range els {
		texts[i] = e.Text
	}
	return strings.Join(texts, ", ")
}
