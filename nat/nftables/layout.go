package nftables

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	nft "github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

// tableName is the name of natgw's table, nftconn.MainTable (family inet:
// IPv4 and IPv6 in one table), as the netlink encoders take it. natgw
// never writes any other table; Load deletes table ip natgw, the table of
// layouts 1-3, in the transaction that creates the inet one.
const tableName = string(nftconn.MainTable)

// tableFamily is the family of natgw's table; nfFamily the same as the
// nfgenmsg family of its messages.
const (
	tableFamily = nft.TableFamilyINet
	nfFamily    = unix.NFPROTO_INET
)

// LayoutVersion is stored in the kernel with the boot id. A table holding
// another version is dropped and recreated (with a new boot id).
const LayoutVersion = 6

// HairpinMark is the packet mark bit given to packets that enter from the
// internal interface; the hairpin rule matches it.
const HairpinMark = 0x4000

// Names of the sets/maps of the table (see nat/README.md).
const (
	setMeta     = "natgw_meta"
	setEIPs     = "eips"
	setRoutes   = "routes"
	setFIPDNAT  = nftconn.MainSetFIPDNAT
	setFIPSNAT  = nftconn.MainSetFIPSNAT
	setPortDNAT = "port_dnat"
	setQoSIn    = "qos_in"
	setQoSOut   = "qos_out"
	setShareMod = "share_mod"
	setShareBk  = "share_backends"

	setEIPs6     = "eips6"
	setFIPDNAT6  = "fip_dnat6"
	setFIPSNAT6  = "fip_snat6"
	setPortDNAT6 = "port_dnat6"
	setRoutes6   = "routes6"
	setQoSIn6    = "qos_in6"
	setQoSOut6   = "qos_out6"
	setShareMod6 = "share_mod6"
	setShareBk6  = "share_backends6"
	setMarks6    = "eip_marks6"
)

// Names of the chains.
const (
	chainDNAT     = "dstnat"
	chainSNAT     = "srcnat"
	chainSNATCIDR = "snat_cidr"
	chainQoSIn    = "qos_ingress"
	chainQoSOut   = "qos_egress"
	chainShare    = "share"
	chainShare6   = "share6"
	chainMark6    = "mark6"
)

// Chain priorities (see nat/README.md for why).
const (
	prioDNAT   = nft.ChainPriority(-100) // dstnat
	prioSNAT   = nft.ChainPriority(100)  // srcnat
	prioQoSIn  = nft.ChainPriority(-150) // mangle: before DNAT, the EIP is still the destination
	prioQoSOut = nft.ChainPriority(150)  // after SNAT, the EIP is already the source
	prioMark6  = nft.ChainPriority(120)  // after srcnat (100): the packet carries its SNAT
)

// 32-bit registers (NFT_REG32_00...). Concatenations are laid out on them.
const (
	reg0 = 8 + iota
	reg1
	reg2
	reg3
	reg4
)

// metaKey is the key of the single element of the meta set.
var metaKey = binaryutil.NativeEndian.PutUint32(1)

// udataGen is a userdata TLV type of natgw's own (nft shows only the
// comment TLV and ignores it) on the natgw_meta element: the ruleset
// generation that natgw's last transaction committed, as far as natgw knew
// (4 bytes, big endian). See nat/README.md, "Start".
const udataGen = 0xf0

// udataSnap is the userdata TLV type of natgw's own on the natgw_meta
// element that names the index snapshot the FIP maps equal (8 bytes, big
// endian; absent: none). See nat/README.md, "The index snapshot".
const udataSnap = 0xf1

// udataRules is the userdata TLV type of natgw's own on the natgw_meta
// element that fingerprints the rules of the fixed chains natgw wrote
// (8 bytes, big endian; absent: unknown): rulesPrint of the writer's
// configuration. While the mirror condition holds, a Load whose own
// rulesPrint equals it leaves those rules alone instead of rewriting them
// (see nat/README.md, "Start").
const udataRules = 0xf2

// rulesPrints holds rulesPrint of the interface names every Kube-OVN
// gateway has (external net1, internal eth0) on a little-endian host
// (the fixed rules hold the hairpin mark in native byte order), computed
// once here: rulesPrint encodes every fixed rule, ≈ 11% of the CPU of a
// `natgw serve` start at 100 rules (perf, 2026-12-07), paid by every
// agent of a restarted controller. TestRulesPrints keeps it equal to
// rulesPrint: a change to the fixed rules fails it with the new value.
var rulesPrints = map[[2]string]uint64{
	{nat.DefaultExternalInterface, nat.DefaultInternalInterface}: 0xca8fdfb10a4df4d8,
}

// rulesPrintOf is rulesPrint(cfg), from rulesPrints when it holds cfg's
// interfaces on this host.
func rulesPrintOf(cfg nat.Config) (uint64, error) {
	if v, ok := rulesPrints[[2]string{cfg.ExternalInterface, cfg.InternalInterface}]; ok && littleEndian {
		return v, nil
	}
	return rulesPrint(cfg)
}

// littleEndian is whether this host's native byte order is little endian.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// rulesPrint returns the fingerprint of the fixed chains' rules for cfg:
// the FNV-1a hash of their netlink encoding (each chain and its rules, as
// a repair transaction adds them), so it changes with anything that
// changes a rule's bytes: the configuration (interface names) or the code
// that renders them. Never 0.
func rulesPrint(cfg nat.Config) (uint64, error) {
	var p txPlan
	for _, cs := range fixedChains(cfg) {
		p.addChain(cs)
		for _, rs := range cs.rules {
			p.addRule(cs.name, rs)
		}
	}
	b := nftconn.NewBatch(0, p.tx.SizeHint(), nil)
	if err := p.tx.Encode(b); err != nil {
		return 0, fmt.Errorf("fingerprint of the fixed rules: %w", err)
	}
	h := fnv.New64a()
	h.Write(b.Bytes())
	return max(h.Sum64(), 1), nil
}

// metaComment is the comment of the natgw_meta element.
func metaComment(boot string) string {
	return fmt.Sprintf("natgw layout=%d boot=%s", LayoutVersion, boot)
}

var (
	typePortKey   = nft.MustConcatSetType(nft.TypeIPAddr, nft.TypeInetProto, nft.TypeInetService)
	typePortVal   = nft.MustConcatSetType(nft.TypeIPAddr, nft.TypeInetService)
	typeRouteKey  = nft.MustConcatSetType(nft.TypeIPAddr, nft.TypeIPAddr)
	typeSlotKey   = nft.MustConcatSetType(nft.TypeIPAddr, nft.TypeInetProto, nft.TypeInetService, nft.TypeMark)
	typePortKey6  = nft.MustConcatSetType(nft.TypeIP6Addr, nft.TypeInetProto, nft.TypeInetService)
	typePortVal6  = nft.MustConcatSetType(nft.TypeIP6Addr, nft.TypeInetService)
	typeRouteKey6 = nft.MustConcatSetType(nft.TypeIP6Addr, nft.TypeIP6Addr)
	typeSlotKey6  = nft.MustConcatSetType(nft.TypeIP6Addr, nft.TypeInetProto, nft.TypeInetService, nft.TypeMark)
)

// setSpec describes one set or map of the table.
type setSpec struct {
	name   string
	key    nft.SetDatatype
	val    nft.SetDatatype // zero for a plain set
	concat bool
}

func (s setSpec) isMap() bool { return s.val.Name != "" }

// fixedSets are created with the table and never deleted.
var fixedSets = []setSpec{
	{name: setMeta, key: nft.TypeMark},
	{name: setEIPs, key: nft.TypeIPAddr},
	{name: setRoutes, key: typeRouteKey, val: nft.TypeIPAddr, concat: true},
	{name: setFIPDNAT, key: nft.TypeIPAddr, val: nft.TypeIPAddr},
	{name: setFIPSNAT, key: nft.TypeIPAddr, val: nft.TypeIPAddr},
	{name: setPortDNAT, key: typePortKey, val: typePortVal, concat: true},
	{name: setQoSIn, key: nft.TypeIPAddr, val: nft.TypeVerdict},
	{name: setQoSOut, key: nft.TypeIPAddr, val: nft.TypeVerdict},
	{name: setShareMod, key: typePortKey, val: nft.TypeMark, concat: true},
	{name: setShareBk, key: typeSlotKey, val: typePortVal, concat: true},
	{name: setEIPs6, key: nft.TypeIP6Addr},
	{name: setFIPDNAT6, key: nft.TypeIP6Addr, val: nft.TypeIP6Addr},
	{name: setFIPSNAT6, key: nft.TypeIP6Addr, val: nft.TypeIP6Addr},
	{name: setPortDNAT6, key: typePortKey6, val: typePortVal6, concat: true},
	{name: setRoutes6, key: typeRouteKey6, val: nft.TypeIP6Addr, concat: true},
	{name: setQoSIn6, key: nft.TypeIP6Addr, val: nft.TypeVerdict},
	{name: setQoSOut6, key: nft.TypeIP6Addr, val: nft.TypeVerdict},
	{name: setShareMod6, key: typePortKey6, val: nft.TypeMark, concat: true},
	{name: setShareBk6, key: typeSlotKey6, val: typePortVal6, concat: true},
	{name: setMarks6, key: nft.TypeIP6Addr, val: nft.TypeMark},
}

// isFIPMap says whether set is one of the FIP maps, whose two halves
// mirror each other (see the mirror shortcut in nat/README.md).
func isFIPMap(set string) bool {
	return set == setFIPDNAT || set == setFIPSNAT || set == setFIPDNAT6 || set == setFIPSNAT6
}

// isFIPSNATMap says whether set is the SNAT half of a family's FIP maps.
func isFIPSNATMap(set string) bool { return set == setFIPSNAT || set == setFIPSNAT6 }

// elementSets are the fixed sets that hold objects' elements (all but meta).
var elementSets = fixedSets[1:]

// snatClass is one CIDR SNAT map: all SNATs of one family, one prefix
// length and one random-fully setting.
type snatClass struct {
	bits        int
	randomFully bool
	v6          bool
}

func (c snatClass) setName() string {
	p := "snat_p"
	if c.v6 {
		p = "snat6_p"
	}
	if c.randomFully {
		return fmt.Sprintf("%s%d_rf", p, c.bits)
	}
	return fmt.Sprintf("%s%d", p, c.bits)
}

func (c snatClass) spec() setSpec {
	if c.v6 {
		return setSpec{name: c.setName(), key: nft.TypeIP6Addr, val: nft.TypeIP6Addr}
	}
	return setSpec{name: c.setName(), key: nft.TypeIPAddr, val: nft.TypeIPAddr}
}

// parseSNATSet recognizes a CIDR SNAT map name.
func parseSNATSet(name string) (snatClass, bool) {
	var c snatClass
	rest, ok := strings.CutPrefix(name, "snat_p")
	maxBits := 32
	if !ok {
		if rest, ok = strings.CutPrefix(name, "snat6_p"); !ok {
			return snatClass{}, false
		}
		c.v6, maxBits = true, 128
	}
	rest, c.randomFully = strings.CutSuffix(rest, "_rf")
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n > maxBits || strconv.Itoa(n) != rest {
		return snatClass{}, false
	}
	c.bits = n
	return c, true
}

// sortSNATClasses orders classes as the snat_cidr chain evaluates them:
// IPv4 before IPv6 (a rule only matches its own family), then longest
// prefix first.
func sortSNATClasses(cs []snatClass) {
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].v6 != cs[j].v6 {
			return !cs[i].v6
		}
		if cs[i].bits != cs[j].bits {
			return cs[i].bits > cs[j].bits
		}
		return !cs[i].randomFully && cs[j].randomFully
	})
}

// shareKey is one share DNAT identity: EIP, protocol, external port. It
// has an element in share_mod (its slot count S) and S elements in
// share_backends (identity . slot : backend); an identity of an IPv6 EIP
// in share_mod6 and share_backends6.
type shareKey struct {
	eip   netip.Addr
	proto nat.Protocol
	port  uint16
}

func shareKeyOf(d *nat.DNAT) shareKey { return shareKey{d.EIP, d.Protocol, d.ExternalPort} }

// String names the identity in messages: 192.0.2.10/tcp/80.
func (k shareKey) String() string {
	return k.eip.String() + "/" + string(k.proto) + "/" + strconv.Itoa(int(k.port))
}

// modSet and bkSet are the identity's family's share_mod and
// share_backends.
func (k shareKey) modSet() string {
	if k.eip.Is6() {
		return setShareMod6
	}
	return setShareMod
}

func (k shareKey) bkSet() string {
	if k.eip.Is6() {
		return setShareBk6
	}
	return setShareBk
}

// modKey is the identity's key in share_mod (share_mod6).
func (k shareKey) modKey() []byte {
	key := append(addrBytes(k.eip), k.proto.Number(), 0, 0, 0)
	return append(key, port4(k.port)...)
}

// slotKey is the key of the identity's slot s in share_backends.
func (k shareKey) slotKey(s int) []byte {
	return binary.NativeEndian.AppendUint32(k.modKey(), uint32(s))
}

func cmpShareKey(a, b shareKey) int {
	if c := a.eip.Compare(b.eip); c != 0 {
		return c
	}
	if c := strings.Compare(string(a.proto), string(b.proto)); c != 0 {
		return c
	}
	return int(a.port) - int(b.port)
}

// maxShareBackends is the most backends one share identity may have in
// this data plane: shareSlots keeps every backend within 1/16 of an even
// share up to it.
const maxShareBackends = 4096

// shareModuli are the slot counts an identity may have, each the modulus of
// one rule of chain share (numgen random mod S): 1..8, then the powers of
// two 256..65536.
var shareModuli = func() []int {
	m := []int{1, 2, 3, 4, 5, 6, 7, 8}
	for s := 256; s <= 65536; s *= 2 {
		m = append(m, s)
	}
	return m
}()

// shareSlots is the slot count of an identity of n backends (1 <= n <=
// maxShareBackends): n itself up to 8 (an exact even spread), else the
// smallest power of two of at least 16n (slot i holds backend i mod n, so
// each backend has floor(S/n) or ceil(S/n) slots: within 1/16 of even,
// exact when n is a power of two).
func shareSlots(n int) int {
	if n <= 8 {
		return n
	}
	s := 256
	for s < 16*n {
		s *= 2
	}
	return s
}

// shareChain is the fixed chain that dstnat rule 5 sends a share
// identity's new connections to, with the identity's slot count in the ct
// mark: one rule per slot count, which sets the ct mark to the EIP and
// DNATs to the backend of a random slot; a last rule puts the EIP back in
// the ct mark should no rule have matched (a slot element missing).
//
// With v6 it is chain share6, where dstnat rule 9 sends the identities of
// IPv6 EIPs: the same rules over share_backends6, except that the ct mark
// is set to the EIP's mark id (eip_marks6), and a second set of rules,
// for an EIP without a mark id, sets it back to 0 (see Conntrack in
// nat/README.md).
func shareChain(v6 bool) chainSpec {
	c := chainSpec{name: chainShare}
	set, ip, fam, what := setShareBk, "ip", uint32(unix.NFPROTO_IPV4), "share DNAT"
	markText, markExprs := "ct mark set ip daddr", func() []expr.Any {
		return cat([]expr.Any{loadIP(offDaddr, reg0)}, markFrom(reg0, reg4))
	}
	// Registers: the address, then protocol, port and slot.
	addr, pr, port, slot := uint32(reg0), uint32(reg1), uint32(reg2), uint32(reg3)
	if v6 {
		c.name, set, ip, fam, what = chainShare6, setShareBk6, "ip6", unix.NFPROTO_IPV6, "IPv6 share DNAT"
		markText, markExprs = "ct mark set 0x00000000", func() []expr.Any {
			return []expr.Any{
				&expr.Immediate{Register: 1, Data: []byte{0, 0, 0, 0}},
				&expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true},
			}
		}
		addr, pr, port, slot = r6a, r6p, r6d, r6d+1
	}
	slotRule := func(s int, markText string, markExprs []expr.Any, comment string) ruleSpec {
		var body []expr.Any
		if v6 {
			body = cat(markExprs, nfproto(true), []expr.Any{loadIP6(offDaddr6, r6a)})
		} else {
			body = cat(nfproto(false), markExprs)
		}
		return ruleSpec{
			text:    fmt.Sprintf("ct mark 0x%08x %s dnat %s to %s daddr . meta l4proto . th dport . numgen random mod %d map @%s", s, markText, ip, ip, s, set),
			comment: comment,
			exprs: cat([]expr.Any{
				&expr.Ct{Key: expr.CtKeyMARK, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(uint32(s))},
			}, body, []expr.Any{
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: pr},
				&expr.Payload{DestRegister: port, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Numgen{Register: slot, Modulus: uint32(s), Type: unix.NFT_NG_RANDOM},
				lookup(set, addr, addr),
				&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: addr, RegProtoMin: pr},
			}),
		}
	}
	if v6 {
		// The EIP's mark id first; an EIP without one (no IPv6 EIP
		// object) misses it and goes on to the rules below, which set
		// the ct mark back to 0.
		id := []expr.Any{
			nfproto(true)[0], nfproto(true)[1],
			loadIP6(offDaddr6, r6a),
			lookup(setMarks6, r6a, r6b),
			&expr.Ct{Key: expr.CtKeyMARK, Register: r6b, SourceRegister: true},
		}
		for _, s := range shareModuli {
			c.rules = append(c.rules, slotRule(s, "ct mark set ip6 daddr map @"+setMarks6, id,
				fmt.Sprintf("natgw: IPv6 share DNAT, %d slots", s)))
		}
		for _, s := range shareModuli {
			c.rules = append(c.rules, slotRule(s, markText, markExprs(),
				fmt.Sprintf("natgw: IPv6 share DNAT, %d slots, EIP without a mark id", s)))
		}
	} else {
		for _, s := range shareModuli {
			c.rules = append(c.rules, slotRule(s, markText, markExprs(), fmt.Sprintf("natgw: %s, %d slots", what, s)))
		}
	}
	last := ruleSpec{
		text:    markText,
		comment: "natgw: share DNAT: no slot, the EIP back in the ct mark",
		exprs:   cat(nfproto(false), markExprs()),
	}
	if v6 {
		last.comment, last.exprs = "natgw: IPv6 share DNAT: no slot, the ct mark back to 0", markExprs()
	}
	c.rules = append(c.rules, last)
	return c
}

// shareModRule is dstnat's share DNAT rule of one family (rule 5, with
// v6 rule 9): a new connection to a share identity gets the identity's
// slot count S from share_mod (share_mod6) in its ct mark and goes to
// chain share (share6), which picks a slot.
func shareModRule(v6 bool) ruleSpec {
	ip, set, chain, what := "ip", setShareMod, chainShare, "share DNAT"
	addr, pr, port := uint32(reg0), uint32(reg1), uint32(reg2)
	load := loadIP(offDaddr, reg0)
	if v6 {
		ip, set, chain, what = "ip6", setShareMod6, chainShare6, "IPv6 share DNAT"
		addr, pr, port = r6a, r6p, r6d
		load = loadIP6(offDaddr6, r6a)
	}
	return ruleSpec{
		text:    "ct mark set " + ip + " daddr . meta l4proto . th dport map @" + set + " goto " + chain,
		comment: "natgw: " + what + ": slot count to the ct mark, to chain " + chain,
		exprs: cat(nfproto(v6), []expr.Any{
			load,
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: pr},
			&expr.Payload{DestRegister: port, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			lookup(set, addr, addr),
			&expr.Ct{Key: expr.CtKeyMARK, Register: addr, SourceRegister: true},
			&expr.Verdict{Kind: expr.VerdictGoto, Chain: chain},
		}),
	}
}

// qosDir is a QoS direction.
type qosDir string

const (
	qosIn  qosDir = "in"
	qosOut qosDir = "out"
)

// qosKey names one policer: one direction of one EIP. Each has a named
// limit object and a chain, both called qos_<dir>_<a>_<b>_<c>_<d>.
type qosKey struct {
	dir qosDir
	eip netip.Addr
}

// name is the policer's chain and limit object name: the EIP's address
// with its dots (IPv4) or colons (IPv6) as underscores.
func (k qosKey) name() string {
	return "qos_" + string(k.dir) + "_" + strings.NewReplacer(".", "_", ":", "_").Replace(k.eip.String())
}

func parseQoSName(name string) (qosKey, bool) {
	for _, d := range []qosDir{qosIn, qosOut} {
		rest, ok := strings.CutPrefix(name, "qos_"+string(d)+"_")
		if !ok {
			continue
		}
		a, err := netip.ParseAddr(strings.ReplaceAll(rest, "_", "."))
		if err != nil || !a.Is4() {
			if a, err = netip.ParseAddr(strings.ReplaceAll(rest, "_", ":")); err != nil || !a.Is6() {
				return qosKey{}, false
			}
		}
		k := qosKey{d, a}
		return k, k.name() == name
	}
	return qosKey{}, false
}

// qosVal is a policer's rate and burst in bytes.
type qosVal struct {
	rate  uint64 // bytes per second
	burst uint32 // bytes
}

// ifname returns the 16-byte (IFNAMSIZ) comparison value of an interface name.
func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

func loadIP(offset uint32, reg uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}
}

// loadIP6 loads a 16-byte IPv6 address (four 32-bit registers from reg).
func loadIP6(offset uint32, reg uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 16}
}

// Offsets of the addresses in the IPv4 and IPv6 headers.
const (
	offSaddr  = 12
	offDaddr  = 16
	offSaddr6 = 8
	offDaddr6 = 24
)

// nfproto matches the packet's family (meta nfproto ipv4 or ipv6): in the
// inet table, every rule that reads an address of one family has it just
// before the first such read (nft lists it as that read's implicit
// dependency, so it does not show).
func nfproto(v6 bool) []expr.Any {
	fam := byte(unix.NFPROTO_IPV4)
	if v6 {
		fam = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{fam}},
	}
}

// 32-bit registers for IPv6 rules: an address takes four (r6a: 8..11,
// r6b: 12..15), a protocol or port one.
const (
	r6a = 8
	r6b = 12
	r6p = 12 // l4proto after an address in r6a
	r6d = 13 // dport after it
)

// markFrom copies the IPv4 address in reg src into ct mark as a host-order
// 32-bit number (192.0.2.10 -> 0xc000020a), using tmp as scratch.
func markFrom(src, tmp uint32) []expr.Any {
	return []expr.Any{
		&expr.Byteorder{SourceRegister: src, DestRegister: tmp, Op: expr.ByteorderNtoh, Len: 4, Size: 4},
		&expr.Ct{Key: expr.CtKeyMARK, Register: tmp, SourceRegister: true},
	}
}

func lookup(set string, sreg, dreg uint32) *expr.Lookup {
	return &expr.Lookup{SourceRegister: sreg, DestRegister: dreg, IsDestRegSet: true, SetName: set}
}

func ifMatch(key expr.MetaKey, name string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(name)},
	}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// ruleSpec is one rule of a chain: its expressions, and the same rule as
// `nft list` shows it (TestListing checks that the two agree in the kernel).
type ruleSpec struct {
	text    string
	comment string
	exprs   []expr.Any
}

// chainSpec is one chain with its rules; a base chain has a hook.
type chainSpec struct {
	name  string
	hook  *nft.ChainHook
	prio  *nft.ChainPriority
	typ   nft.ChainType
	rules []ruleSpec
}

// fixedChains returns the chains created with the table, with their rules
// (snat_cidr's rules depend on the SNAT maps in use; see snatRule).
func fixedChains(cfg nat.Config) []chainSpec {
	ext, in := cfg.ExternalInterface, cfg.InternalInterface
	qext, qin := strconv.Quote(ext), strconv.Quote(in)
	hairpinMask := binaryutil.NativeEndian.PutUint32(^uint32(HairpinMark))
	hairpinBit := binaryutil.NativeEndian.PutUint32(HairpinMark)
	return []chainSpec{
		qosBaseChain(qosIn, ext),
		{
			name: chainDNAT, hook: nft.ChainHookPrerouting, prio: ptr(prioDNAT), typ: nft.ChainTypeNAT,
			rules: []ruleSpec{
				{
					text:    "iifname " + qin + " meta mark set meta mark | 0x00004000",
					comment: "natgw: mark traffic from the VPC for hairpin SNAT",
					exprs: cat(ifMatch(expr.MetaKeyIIFNAME, in), []expr.Any{
						&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
						&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: hairpinMask, Xor: hairpinBit},
						&expr.Meta{Key: expr.MetaKeyMARK, Register: 1, SourceRegister: true},
					}),
				},
				{
					text:    "ip daddr @eips ct mark set ip daddr",
					comment: "natgw: ct mark = EIP on every connection to an EIP",
					exprs: cat(nfproto(false), []expr.Any{
						loadIP(offDaddr, reg0),
						&expr.Lookup{SourceRegister: reg0, SetName: setEIPs},
					}, markFrom(reg0, reg1)),
				},
				fipRule(false, false),
				{
					text:    "ct mark set ip daddr dnat ip to ip daddr . meta l4proto . th dport map @port_dnat",
					comment: "natgw: port DNAT",
					exprs: cat(nfproto(false), []expr.Any{
						loadIP(offDaddr, reg0),
						&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
						&expr.Payload{DestRegister: reg2, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
						&expr.Byteorder{SourceRegister: reg0, DestRegister: reg4, Op: expr.ByteorderNtoh, Len: 4, Size: 4},
						lookup(setPortDNAT, reg0, reg0),
						&expr.Ct{Key: expr.CtKeyMARK, Register: reg4, SourceRegister: true},
						&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: reg0, RegProtoMin: reg1},
					}),
				},
				shareModRule(false),
				{
					text:    "ct mark set ip6 daddr map @eip_marks6",
					comment: "natgw: ct mark = the IPv6 EIP's mark id on every connection to an IPv6 EIP",
					exprs: cat(nfproto(true), []expr.Any{
						loadIP6(offDaddr6, r6a),
						lookup(setMarks6, r6a, r6b),
						&expr.Ct{Key: expr.CtKeyMARK, Register: r6b, SourceRegister: true},
					}),
				},
				fipRule(false, true),
				{
					text:    "dnat ip6 to ip6 daddr . meta l4proto . th dport map @port_dnat6",
					comment: "natgw: IPv6 port DNAT",
					exprs: cat(nfproto(true), []expr.Any{
						loadIP6(offDaddr6, r6a),
						&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: r6p},
						&expr.Payload{DestRegister: r6d, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
						lookup(setPortDNAT6, r6a, r6a),
						&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: r6a, RegProtoMin: r6p},
					}),
				},
				shareModRule(true),
			},
		},
		{
			name: chainSNAT, hook: nft.ChainHookPostrouting, prio: ptr(prioSNAT), typ: nft.ChainTypeNAT,
			rules: []ruleSpec{
				fipRule(true, false),
				fipRule(true, true),
				{
					text:    "oifname " + qext + " jump snat_cidr",
					comment: "natgw: CIDR SNAT on egress to the external network",
					exprs: cat(ifMatch(expr.MetaKeyOIFNAME, ext), []expr.Any{
						&expr.Verdict{Kind: expr.VerdictJump, Chain: chainSNATCIDR},
					}),
				},
				hairpinRule(in, false),
				hairpinRule(in, true),
			},
		},
		{name: chainSNATCIDR}, // rules: snatRules
		shareChain(false),
		shareChain(true),
		qosBaseChain(qosOut, ext),
		mark6Chain(),
	}
}

// fipRule is the floating IP NAT rule of one direction (DNAT, or SNAT
// with snat) and family: the packet's address (destination, or source)
// looked up in the FIP map of that direction gives the address to NAT
// to. An IPv4 connection's ct mark is set to its EIP, as a host-order
// number: the destination before DNAT, the address the map gives for
// SNAT. (An IPv6 EIP's mark id comes from eip_marks6, in other rules.)
func fipRule(snat, v6 bool) ruleSpec {
	verb, what, addr, typ := "dnat", "DNAT", "daddr", expr.NATTypeDestNAT
	set, off, set6, off6 := setFIPDNAT, uint32(offDaddr), setFIPDNAT6, uint32(offDaddr6)
	if snat {
		verb, what, addr, typ = "snat", "SNAT", "saddr", expr.NATTypeSourceNAT
		set, off, set6, off6 = setFIPSNAT, offSaddr, setFIPSNAT6, offSaddr6
	}
	if v6 {
		return ruleSpec{
			text:    verb + " ip6 to ip6 " + addr + " map @" + set6,
			comment: "natgw: IPv6 floating IP " + what,
			exprs: cat(nfproto(true), []expr.Any{
				loadIP6(off6, r6a),
				lookup(set6, r6a, r6b),
				&expr.NAT{Type: typ, Family: unix.NFPROTO_IPV6, RegAddrMin: r6b},
			}),
		}
	}
	markSrc, mark := uint32(reg0), "ct mark set ip daddr " // the EIP, before DNAT
	if snat {
		markSrc, mark = reg1, "ct mark set ip saddr map @"+set+" " // the EIP the map gives
	}
	return ruleSpec{
		text:    mark + verb + " ip to ip " + addr + " map @" + set,
		comment: "natgw: floating IP " + what,
		exprs: cat(nfproto(false), []expr.Any{
			loadIP(off, reg0),
			lookup(set, reg0, reg1),
		}, markFrom(markSrc, reg2), []expr.Any{
			&expr.NAT{Type: typ, Family: unix.NFPROTO_IPV4, RegAddrMin: reg1},
		}),
	}
}

// mark6Chain is the base chain that gives a new IPv6 connection SNATed
// to an IPv6 EIP (FIP and CIDR SNAT, hairpin) that EIP's mark id
// (eip_marks6) after srcnat (postrouting, priority 120), where the
// packet's source is the EIP the SNAT map gave. (DNATed ones were marked
// in dstnat, where their destination is still the EIP.) A miss (no IPv6
// EIP object for the address) leaves the mark as it is.
func mark6Chain() chainSpec {
	zero4 := []byte{0, 0, 0, 0}
	return chainSpec{
		name: chainMark6, hook: nft.ChainHookPostrouting, prio: ptr(prioMark6), typ: nft.ChainTypeFilter,
		rules: []ruleSpec{{
			text:    "ct state new ct status snat ct mark set ip6 saddr map @eip_marks6",
			comment: "natgw: ct mark = the IPv6 EIP's mark id on new connections SNATed to it",
			exprs: cat([]expr.Any{
				&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(ctStateNew), Xor: zero4},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: zero4},
				&expr.Ct{Key: expr.CtKeySTATUS, Register: 1},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binaryutil.NativeEndian.PutUint32(ipsSrcNAT), Xor: zero4},
				&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: zero4},
			}, nfproto(true), []expr.Any{
				loadIP6(offSaddr6, r6a),
				lookup(setMarks6, r6a, r6b),
				&expr.Ct{Key: expr.CtKeyMARK, Register: r6b, SourceRegister: true},
			}),
		}},
	}
}

// ctStateNew is the ct state bit of a new connection (NF_CT_STATE_BIT of
// IP_CT_NEW); ipsSrcNAT is IPS_SRC_NAT of enum ip_conntrack_status.
const (
	ctStateNew = 1 << 3
	ipsSrcNAT  = 1 << 4
)

// hairpinRule is srcnat's hairpin SNAT of one family: a new connection
// from the VPC (hairpin mark) that was DNATed and leaves through the
// internal interface again is SNATed to the address it was sent to (the
// EIP), so the reply comes back through the gateway.
func hairpinRule(in string, v6 bool) ruleSpec {
	zero4 := []byte{0, 0, 0, 0}
	hairpinBit := binaryutil.NativeEndian.PutUint32(HairpinMark)
	// ct original daddr: in the inet family the kernel loads the 16 bytes
	// of the tuple's address union, of which an IPv4 NAT reads the first
	// four (google/nftables sends no direction with the family-specific
	// NFT_CT_DST_IP keys, which the kernel requires).
	ip, fam, comment := "ip", byte(unix.NFPROTO_IPV4), "natgw: hairpin SNAT to the EIP for VPC clients"
	if v6 {
		ip, fam, comment = "ip6", unix.NFPROTO_IPV6, "natgw: IPv6 hairpin SNAT to the EIP for VPC clients"
	}
	return ruleSpec{
		text:    "meta mark & 0x00004000 != 0x00000000 ct status dnat oifname " + strconv.Quote(in) + " meta nfproto " + map[bool]string{false: "ipv4", true: "ipv6"}[v6] + " snat " + ip + " to ct original " + ip + " daddr",
		comment: comment,
		exprs: cat([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: hairpinBit, Xor: zero4},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: zero4},
			&expr.Ct{Key: expr.CtKeySTATUS, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: zero4},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: zero4},
		}, ifMatch(expr.MetaKeyOIFNAME, in), nfproto(v6), []expr.Any{
			&expr.Ct{Key: expr.CtKeyDST, Register: reg0, Direction: 0},
			&expr.NAT{Type: expr.NATTypeSourceNAT, Family: uint32(fam), RegAddrMin: reg0},
		}),
	}
}

// qosBaseChain is the base chain that sends one direction's packets of
// policed EIPs to their policer chains: ingress looks up the destination of
// packets in from the external interface before DNAT, egress the source of
// packets out to it after SNAT.
func qosBaseChain(dir qosDir, ext string) chainSpec {
	c := chainSpec{name: chainQoSIn, hook: nft.ChainHookPrerouting, prio: ptr(prioQoSIn), typ: nft.ChainTypeFilter}
	iface, ifWord, addr, off, set, comment := expr.MetaKeyIIFNAME, "iifname", "daddr", uint32(offDaddr), setQoSIn, "natgw: EIP ingress QoS, before DNAT"
	if dir == qosOut {
		c = chainSpec{name: chainQoSOut, hook: nft.ChainHookPostrouting, prio: ptr(prioQoSOut), typ: nft.ChainTypeFilter}
		iface, ifWord, addr, off, set, comment = expr.MetaKeyOIFNAME, "oifname", "saddr", offSaddr, setQoSOut, "natgw: EIP egress QoS, after SNAT"
	}
	off6, set6 := uint32(offDaddr6), setQoSIn6
	if dir == qosOut {
		off6, set6 = offSaddr6, setQoSOut6
	}
	c.rules = []ruleSpec{{
		text:    ifWord + " " + strconv.Quote(ext) + " ip " + addr + " vmap @" + set,
		comment: comment,
		exprs:   cat(ifMatch(iface, ext), nfproto(false), []expr.Any{loadIP(off, reg0), lookup(set, reg0, 0)}),
	}, {
		text:    ifWord + " " + strconv.Quote(ext) + " ip6 " + addr + " vmap @" + set6,
		comment: strings.Replace(comment, "EIP", "IPv6 EIP", 1),
		exprs:   cat(ifMatch(iface, ext), nfproto(true), []expr.Any{loadIP6(off6, r6a), lookup(set6, r6a, 0)}),
	}}
	return c
}

// ipsDstNAT is IPS_DST_NAT of enum ip_conntrack_status.
const ipsDstNAT = 1 << 5

func ptr[T any](v T) *T { return &v }

// snatRule is the snat_cidr rule of one class: mask the source to the
// class's prefix length and look it up in the class's map. An IPv4 rule
// also puts the EIP in the ct mark.
func snatRule(c snatClass) ruleSpec {
	if c.v6 {
		return snatRule6(c)
	}
	var ex []expr.Any
	src := "ip saddr"
	ex = append(ex, nfproto(false)...)
	ex = append(ex, loadIP(offSaddr, reg0))
	if c.bits < 32 {
		m := binary.BigEndian.AppendUint32(nil, uint32(uint64(0xffffffff)<<(32-c.bits)))
		ex = append(ex, &expr.Bitwise{SourceRegister: reg0, DestRegister: reg0, Len: 4, Mask: m, Xor: []byte{0, 0, 0, 0}})
		src += " & " + netip.AddrFrom4([4]byte(m)).String()
	}
	ex = append(ex, lookup(c.setName(), reg0, reg1))
	ex = append(ex, markFrom(reg1, reg2)...)
	ex = append(ex, &expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: reg1, FullyRandom: c.randomFully})
	rf, rfText := "", ""
	if c.randomFully {
		rf, rfText = ", random-fully", " fully-random"
	}
	m := src + " map @" + c.setName()
	return ruleSpec{
		text:    "ct mark set " + m + " snat ip to " + m + rfText,
		comment: fmt.Sprintf("natgw: CIDR SNAT /%d%s", c.bits, rf),
		exprs:   ex,
	}
}

// snatRule6 is snatRule for an IPv6 class (the ct mark is set after it,
// by chain mark6: see mark6Chain).
func snatRule6(c snatClass) ruleSpec {
	ex := cat(nfproto(true), []expr.Any{loadIP6(offSaddr6, r6a)})
	src := "ip6 saddr"
	if c.bits < 128 {
		m := prefixMask6(c.bits)
		ex = append(ex, &expr.Bitwise{SourceRegister: r6a, DestRegister: r6a, Len: 16, Mask: m[:], Xor: make([]byte, 16)})
		src += " & " + netip.AddrFrom16(m).String()
	}
	ex = append(ex, lookup(c.setName(), r6a, r6b),
		&expr.NAT{Type: expr.NATTypeSourceNAT, Family: unix.NFPROTO_IPV6, RegAddrMin: r6b, FullyRandom: c.randomFully})
	rf, rfText := "", ""
	if c.randomFully {
		rf, rfText = ", random-fully", " fully-random"
	}
	return ruleSpec{
		text:    "snat ip6 to " + src + " map @" + c.setName() + rfText,
		comment: fmt.Sprintf("natgw: IPv6 CIDR SNAT /%d%s", c.bits, rf),
		exprs:   ex,
	}
}

// prefixMask6 is the 16-byte netmask of an IPv6 prefix length.
func prefixMask6(bits int) [16]byte {
	var m [16]byte
	for i := range m {
		switch {
		case bits >= 8*(i+1):
			m[i] = 0xff
		case bits > 8*i:
			m[i] = byte(0xff << (8*(i+1) - bits))
		}
	}
	return m
}

// qosRule is the one rule of a policer chain.
func qosRule(k qosKey) ruleSpec {
	return ruleSpec{
		text:    "limit name " + strconv.Quote(k.name()) + " drop",
		comment: "natgw: EIP " + k.eip.String() + " " + map[qosDir]string{qosIn: "ingress", qosOut: "egress"}[k.dir] + " policer",
		exprs: []expr.Any{
			&expr.Objref{Type: int(nft.ObjTypeLimit), Name: k.name()},
			&expr.Verdict{Kind: expr.VerdictDrop},
		},
	}
}

// limitExpr is a policer's limit: packets beyond rate (plus burst) match.
func limitExpr(v qosVal) *expr.Limit {
	return &expr.Limit{Type: expr.LimitTypePktBytes, Rate: v.rate, Unit: expr.LimitTimeSecond, Burst: v.burst, Over: true}
}
