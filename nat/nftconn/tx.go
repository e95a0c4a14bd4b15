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
// it so), and either its tag, stored as the rule's user data as it is, by
// which natgw finds it again, or its comment, stored as nft's comment TLV
// (nft lists it as `comment "C"` after the rule). Not both: Encode
// refuses a rule with both.
type Rule struct {
	Exprs   []expr.Any
	Text    string
	Tag     string
	Comment string
}

// line is the rule as a dump shows it.
func (r Rule) line() string {
	s := r.Text
	if r.Comment != "" {
		s += " comment " + strconv.Quote(r.Comment)
	}
	if r.Tag != "" {
		s += " # " + strconv.Quote(r.Tag)
	}
	return s
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
	opAddSet
	opFlushSet
	opDeleteSet
	opAddSetElements
	opDeleteSetElements
	opAddElementUserData
	opAddLimit
	opDeleteLimit
)

type op struct {
	kind     opKind
	table    Table
	chain    Chain
	rule     Rule
	handle   uint64
	set      Map
	elements []Element

	// Sets (Set), their elements and limit objects.
	spec     Set
	elems    []nft.SetElement // kept as the caller gave them
	excl     bool
	userData []byte // opAddElementUserData: after the comment TLV
	note     string // opAddElementUserData: what userData holds
	object   string // a limit object's name
	limit    expr.Limit
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

// Reset empties tx for the next transaction. It keeps the room of its
// operations if they are at most keep (a writer of many small
// transactions saves their growth); a larger transaction's is let go.
// Either way tx no longer holds what its operations referred to.
func (tx *Tx) Reset(keep int) {
	if cap(tx.ops) > keep {
		tx.ops = nil
		return
	}
	clear(tx.ops)
	tx.ops = tx.ops[:0]
}

// SizeHint estimates the bytes of tx's netlink batch, to size its buffer
// once: its elements' messages (ElemBytes) and 4 KiB for the rest.
func (tx *Tx) SizeHint() int {
	n := 4096
	for i := range tx.ops {
		if o := &tx.ops[i]; o.kind == opAddSetElements || o.kind == opDeleteSetElements {
			n += ElemBytes(o.elems)
		}
	}
	return n
}

// String renders the transaction in nft syntax, one command per line; a
// rule's tag follows as a # comment. A Set's elements are one command
// each, rendered from the set's types (Set.ElementText).
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
		default:
			o.setText(&b)
		}
	}
	return b.String()
}

// setText renders the operations on Sets and limit objects.
func (o *op) setText(b *strings.Builder) {
	switch o.kind {
	case opAddSet:
		fmt.Fprintf(b, "add %s %s %s { type %s; }\n", o.spec.word(), o.table, o.spec.Name, o.spec.TypeText())
	case opFlushSet:
		fmt.Fprintf(b, "flush %s %s %s\n", o.spec.word(), o.table, o.spec.Name)
	case opDeleteSet:
		fmt.Fprintf(b, "delete %s %s %s\n", o.spec.word(), o.table, o.spec.Name)
	case opAddSetElements, opDeleteSetElements:
		verb := "add"
		switch {
		case o.kind == opDeleteSetElements:
			verb = "delete"
		case o.excl:
			verb = "create"
		}
		for _, e := range o.elems {
			text := ""
			if o.kind == opDeleteSetElements {
				text = o.spec.KeyText(e.Key)
			} else {
				text = o.spec.ElementText(e)
			}
			fmt.Fprintf(b, "%s element %s %s { %s }\n", verb, o.table, o.spec.Name, text)
		}
	case opAddElementUserData:
		fmt.Fprintf(b, "add element %s %s { %s }", o.table, o.spec.Name, o.spec.ElementText(o.elems[0]))
		if o.note != "" {
			fmt.Fprintf(b, " # %s", o.note)
		}
		b.WriteString("\n")
	case opAddLimit:
		fmt.Fprintf(b, "add limit %s %s { %s; }\n", o.table, o.object, LimitText(o.limit))
	case opDeleteLimit:
		fmt.Fprintf(b, "delete limit %s %s\n", o.table, o.object)
	default:
		fmt.Fprintf(b, "# unknown operation %d on %s\n", o.kind, o.table)
	}
}

// elementsText is els' Texts as nft lists them, comma-separated.
func elementsText(els []Element) string {
	texts := make([]string, len(els))
	for i, e := range els {
		texts[i] = e.Text
	}
	return strings.Join(texts, ", ")
}
