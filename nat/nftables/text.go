package nftables

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

// Plan returns the transaction that creates natgw's table for cfg holding
// objs, from nothing, with boot as its boot id: the layout without a
// kernel. Its String is the table in nft syntax (see nat/README.md and
// testdata/golden/plan.nft).
func Plan(cfg nat.Config, objs []nat.Object, boot string) (*Tx, error) {
	cfg = cfg.WithDefaults()
	if err := checkInterfaces(cfg); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	st := nat.NewState()
	for _, o := range objs {
		if err := o.Validate(); err != nil {
			return nil, fmt.Errorf("plan: %w", err)
		}
		if err := st.Insert(o); err != nil {
			return nil, fmt.Errorf("plan: %w", err)
		}
	}
	ch := &change{createTable: true, bootID: boot, fixedChains: true, stamp: true, add: presized(objs),
		qosBefore: map[qosKey]qosState{}, qosAfter: map[qosKey]qosVal{}, snatBefore: map[snatClass]bool{}}
	for _, o := range objs {
		if err := render(o, ch.add); err != nil {
			return nil, fmt.Errorf("plan: %w", err)
		}
	}
	structureOf(slices.Values(objs), ch)
	ch.shareBefore, ch.shareAfter = map[shareKey][]nat.Object{}, shareWanted(slices.Values(objs))
	if err := checkShare(ch.shareAfter); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	if _, err := (&Backend{}).markFull(ch, objs); err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	r := &Backend{cfg: cfg}
	return r.plan(ch), nil
}

// String renders the transaction in nft syntax, one command per line and
// one command per element. Five of the fixed rules use expressions nft
// shows but cannot parse (`ct mark set ip daddr`: natgw copies an address
// into the mark with a byteorder expression nft has no syntax for), so the
// text is for people and golden tests, not for `nft -f`; TestListing
// checks, in the kernel, that it says what the netlink batch does.
func (t *Tx) String() string {
	var b strings.Builder
	for _, o := range t.ops {
		o.text(&b)
	}
	return b.String()
}

// tablePrefix is the table as nft commands name it: `inet natgw`.
var tablePrefix = nftconn.Table{Family: tableFamily, Name: nftconn.MainTable}.String()

func (o *op) text(b *strings.Builder) {
	switch o.kind {
	case opCreateTable:
		fmt.Fprintf(b, "create table %s\n", tablePrefix)
	case opDeleteTable:
		fmt.Fprintf(b, "delete table %s\n", tablePrefix)
	case opDeleteLegacyTable:
		fmt.Fprintf(b, "delete table ip %s\n", tableName)
	case opAddSet:
		fmt.Fprintf(b, "add %s %s %s { type %s; }\n", setWord(o.set), tablePrefix, o.name, typeText(o.set))
	case opFlushSet:
		fmt.Fprintf(b, "flush %s %s %s\n", setWord(specOf(o.name)), tablePrefix, o.name)
	case opDeleteSet:
		fmt.Fprintf(b, "delete %s %s %s\n", setWord(specOf(o.name)), tablePrefix, o.name)
	case opAddChain:
		if h := chainHeader(o.chain); h != "" {
			fmt.Fprintf(b, "add chain %s %s { %s }\n", tablePrefix, o.name, h)
		} else {
			fmt.Fprintf(b, "add chain %s %s\n", tablePrefix, o.name)
		}
	case opFlushChain:
		fmt.Fprintf(b, "flush chain %s %s\n", tablePrefix, o.name)
	case opDeleteChain:
		fmt.Fprintf(b, "delete chain %s %s\n", tablePrefix, o.name)
	case opAddRule:
		fmt.Fprintf(b, "add rule %s %s %s\n", tablePrefix, o.name, ruleText(o.rule))
	case opAddLimit:
		fmt.Fprintf(b, "add limit %s %s { %s; }\n", tablePrefix, o.name, limitText(o.limit))
	case opDeleteLimit:
		fmt.Fprintf(b, "delete limit %s %s\n", tablePrefix, o.name)
	case opAddElements, opDeleteElements:
		verb := "add"
		switch {
		case o.kind == opDeleteElements:
			verb = "delete"
		case o.excl:
			verb = "create"
		}
		for _, e := range o.elems {
			fmt.Fprintf(b, "%s element %s %s { %s }\n", verb, tablePrefix, o.name, elemText(o.set, e, o.kind == opDeleteElements))
		}
	case opStamp:
		fmt.Fprintf(b, "flush set %s %s\n", tablePrefix, setMeta)
		snap := ""
		if o.snap != 0 {
			snap = fmt.Sprintf(", index snapshot %016x", o.snap)
		}
		fmt.Fprintf(b, "add element %s %s { %s } # generation %d%s in userdata\n", tablePrefix, setMeta,
			elemText(specOf(setMeta), nft.SetElement{Key: metaKey, Comment: o.comment}, false), o.gen, snap)
	default:
		fmt.Fprintf(b, "# unknown operation %d on %s\n", o.kind, o.name)
	}
}

func setWord(s setSpec) string {
	if s.isMap() {
		return "map"
	}
	return "set"
}

// typeText is a set's type as nft writes it: `ipv4_addr . inet_proto`,
// `ipv4_addr : verdict`.
func typeText(s setSpec) string {
	t := fieldsText(s.key)
	if s.isMap() {
		t += " : " + fieldsText(s.val)
	}
	return t
}

func fieldsText(t nft.SetDatatype) string {
	var names []string
	for _, f := range nft.ConcatSetTypeElements(t) {
		names = append(names, f.Name)
	}
	return strings.Join(names, " . ")
}

// chainHeader is a base chain's `type ... hook ... priority ...; policy
// accept;` as nft lists it (nftconn's rendering, shared by every natgw
// table); "" for a regular chain.
func chainHeader(c chainSpec) string { return c.conn().Header() }

// conn is c as an nftconn.Chain: the one place the main table's chain
// name becomes nftconn's (its header text and its netlink attributes).
func (c chainSpec) conn() nftconn.Chain {
	return nftconn.Chain{Name: nftconn.ChainName(c.name), Type: c.typ, Hook: c.hook, Priority: c.prio}
}

// ruleText is a rule as nft lists it, with its comment.
func ruleText(r ruleSpec) string {
	return r.text + " comment " + strconv.Quote(r.comment)
}

// limitText is a policer's limit object as nft lists it (nft shows byte
// counts in the largest unit that divides them).
func limitText(v qosVal) string {
	rate, unit := byteUnit(v.rate)
	s := fmt.Sprintf("rate over %d %s/second", rate, unit)
	if v.burst > 0 {
		burst, unit := byteUnit(uint64(v.burst))
		s += fmt.Sprintf(" burst %d %s", burst, unit)
	}
	return s
}

func byteUnit(n uint64) (uint64, string) {
	units := []string{"bytes", "kbytes", "mbytes"}
	i := 0
	for n != 0 && n%1024 == 0 && i < len(units)-1 {
		n /= 1024
		i++
	}
	return n, units[i]
}

// elemText is an element as nft writes it: `key [comment "c"] [: value]`.
func elemText(s setSpec, e nft.SetElement, keyOnly bool) string {
	t := valueText(s.key, e.Key)
	if keyOnly {
		return t
	}
	if e.Comment != "" {
		t += " comment " + strconv.Quote(e.Comment)
	}
	switch {
	case e.VerdictData != nil:
		t += " : " + verdictText(e.VerdictData)
	case s.isMap() && s.val.Name == nft.TypeMark.Name && len(e.Val) == 4:
		// A mark as map data (share_mod) is host order in the kernel,
		// like the ct mark it is copied to, but nft, without the data
		// byte order in the set's user data (google/nftables does not
		// write it), prints it as big endian: 2 shows as 0x02000000.
		t += fmt.Sprintf(" : 0x%08x", binary.BigEndian.Uint32(e.Val))
	case s.isMap():
		t += " : " + valueText(s.val, e.Val)
	}
	return t
}

func verdictText(v *expr.Verdict) string {
	switch v.Kind {
	case expr.VerdictGoto:
		return "goto " + v.Chain
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictAccept:
		return "accept"
	}
	return fmt.Sprintf("verdict %d", v.Kind)
}

// valueText renders b, a value of type t (fields of a concatenation are
// padded to 4 bytes each).
func valueText(t nft.SetDatatype, b []byte) string {
	fields := nft.ConcatSetTypeElements(t)
	var parts []string
	for _, f := range fields {
		n := int(f.Bytes)
		if len(fields) > 1 {
			n = (n + 3) &^ 3
		}
		if len(b) < n {
			parts = append(parts, fmt.Sprintf("0x%x", b))
			break
		}
		parts = append(parts, fieldText(f, b[:f.Bytes]))
		b = b[n:]
	}
	return strings.Join(parts, " . ")
}

func fieldText(f nft.SetDatatype, b []byte) string {
	switch f.Name {
	case nft.TypeIPAddr.Name:
		return netip.AddrFrom4([4]byte(b)).String()
	case nft.TypeIP6Addr.Name:
		return netip.AddrFrom16([16]byte(b)).String()
	case nft.TypeMark.Name:
		return fmt.Sprintf("0x%08x", binary.NativeEndian.Uint32(b))
	case nft.TypeInetService.Name:
		return strconv.Itoa(int(binary.BigEndian.Uint16(b)))
	case nft.TypeInetProto.Name:
		if p, ok := protoNames[b[0]]; ok {
			return p
		}
		return strconv.Itoa(int(b[0]))
	}
	return fmt.Sprintf("0x%x", b)
}

var protoNames = map[uint8]string{1: "icmp", 6: "tcp", 17: "udp"}
