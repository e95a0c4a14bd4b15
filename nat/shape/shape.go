// Package shape shapes EIP traffic the way Kube-OVN v1.16.2's
// nat-gateway.sh does (eip-ingress-qos-add / eip-egress-qos-add): one HTB
// class per EIP and direction with rate = ceil = the limit in Mbit/s and
// burst = cburst = the burst in MB of 2^20 bytes, so that traffic above the
// rate waits in the class's queue instead of being dropped.
//
// Both directions are shaped as egress, with no IFB device (upstream
// redirects net1's ingress to an IFB device; nftables classifies after
// DNAT and SNAT, so no redirect is needed): traffic to the EIP
// (upstream's "ingress") leaves through the internal interface (eth0),
// traffic from the EIP ("egress") through the external one (net1). No tc
// filter picks the class: nftables does (`meta priority set`), in table
// natgw_shape, which is natgw's own and separate from the NAT table:
//
//	table inet natgw_shape {
//	  map ingress { type mark : classid }      # the EIP's ct mark (IPv4 and IPv6 mark id) : HTB class (major:minor)
//	  map egress  { type ipv4_addr : classid } # EIP's IPv4 address : HTB class
//	  map egress6 { type ipv6_addr : classid } # EIP's IPv6 address : HTB class
//	  chain post { type filter hook postrouting priority 200
//	    oifname eth0 meta priority set ct mark map @ingress
//	    oifname net1 meta priority set ip saddr map @egress
//	    oifname net1 meta priority set ip6 saddr map @egress6
//	  }
//	}
//
// A dual-stack EIP has one class per direction for both families; an IPv6
// address's connections carry its EIP's mark id (EIP.Mark6) as ct mark.
// Layouts before IPv6 shaping kept the IPv4 maps in table ip natgw_shape:
// read while the inet table is missing, deleted when it is written.
//
// Traffic to an EIP is recognised by its connection's ct mark, which
// natgw's nftables data plane sets to the EIP on every connection to an EIP
// or NATed through one (nat/README.md, "Conntrack: ct mark = EIP";
// conntrack.MarkOf): a FIP's or DNAT's inbound connections and the replies
// of connections VPC hosts opened through SNAT alike. (The iptables data
// plane does not set it: there only egress is classified.) At postrouting
// priority 200 source NAT (100) has put the EIP in the source of what
// leaves net1. HTB sends a packet whose priority is its handle:minor to
// that class; the rest goes to the qdisc's direct queue, unshaped
// (`default 0`). (The conntrack tuples would need `ct reply ip daddr`,
// which google/nftables v0.3.0 cannot encode in a form `nft` can print.)
// `nft` shows the maps' keys and classids byte-swapped (google/nftables
// does not record their host byte order for it): 192.0.2.10's mark as
// 0x0a0200c0, class 4e47:1 as 100:474e.
//
// natgw's qdisc is the root HTB of handle 4e47: on each interface, made
// when the first class of the interface is wanted and deleted with the
// last. A root qdisc of another handle that is not the kernel's default
// (handle 0) is someone else's: Set refuses to touch the interface. Each
// element's comment keeps the class's rate and burst as asked, so Get
// reads the state back from the kernel.
//
// Set is all-or-nothing: everything is validated before the kernel is
// touched; classes are added or changed first, then the maps are replaced
// in one nftables transaction, then classes no longer used are deleted; a
// failure before the maps are replaced undoes the class changes made.
//
// Upstream gives each class an fq_codel leaf; so does natgw where the
// kernel has fq_codel: the first class natgw makes probes it once per
// process (FqCodel), and on a kernel without it (the CI kernel) every
// class keeps HTB's default leaf (pfifo of the interface's txqueuelen,
// 1000 packets on veth): measured against a bfifo of 100 ms and against
// the policer (TestQoSFigures, gwimage/README.md "EIP QoS: policer or
// shaper"), it is the one that keeps TCP free of retransmits and fair
// between flows, at the price of queueing delay under load (about 20 ms
// at 100 Mbit/s, 100 ms at 10 Mbit/s, over a second at 1 Mbit/s).
// LeafDelay > 0 puts a bfifo of that many seconds of rate under each
// class instead.
package shape

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/conntrack"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
	"github.com/natgw/natgw/nat/nlsock"
)

// Major is the handle of natgw's root HTB qdisc on both interfaces
// (`tc` prints it as 4e47:).
const Major = 0x4e47

// BytesPerMB is upstream's burst unit (its script multiplies by 1,048,576).
const BytesPerMB = 1 << 20

// Limits of a Limit: HTB's 32-bit rate in bytes per second without the
// 64-bit extension (34,359 Mbit/s), and a burst in 32-bit bytes whose
// transmit time at the rate fits HTB's 32-bit buffer of 64 ns ticks.
const (
	MaxRateMbps = 34_359
	MaxBurstMB  = float64(math.MaxUint32) / BytesPerMB
	// MaxBurstTime is the longest burst HTB holds, in seconds at the rate.
	MaxBurstTime = float64(math.MaxUint32) * 64 / 1e9
)

// LeafDelay, when above 0, gives each class a bfifo leaf holding that long
// at its rate, at least LeafMinBytes; 0 (the default) leaves HTB's default
// leaf.
var (
	LeafDelay    time.Duration
	LeafMinBytes = uint32(16 * 1514)
)

// leafLimit is the bfifo limit of a class of l, in bytes.
func (l Limit) leafLimit() uint32 {
	b := float64(l.rate()) * LeafDelay.Seconds()
	return uint32(max(min(b, math.MaxUint32), float64(LeafMinBytes)))
}

// mtu is what the default burst adds to a tick's worth of rate, as tc does.
const mtu = 1600

// Limit is one direction's shape in upstream's units.
type Limit struct {
	RateMbps float64 `json:"rateMbps"` // Mbit/s (10^6), decimals allowed; 0: not shaped
	BurstMB  float64 `json:"burstMB"`  // MB of 2^20 bytes; 0: tc's default (rate/HZ + 1600 bytes)
}

// EIP is the shape of one EIP's traffic: Ingress is traffic to the EIP
// (shaped leaving the internal interface), Egress traffic from it (shaped
// leaving the external interface). A zero Limit leaves that direction
// alone.
//
// An EIP with an IPv6 address (V6Address; Address is then its IPv4
// address, or the zero Addr for an IPv6-only EIP) has one class per
// direction shared by both families. Its IPv6 connections are found by
// Mark6, the conntrack mark id natgw's nftables data plane gives its IPv6
// address (eip_marks6, nat/README.md "Conntrack"); 0 (not known yet) leaves
// its IPv6 ingress unclassified.
type EIP struct {
	Address   netip.Addr `json:"address,omitzero"`
	V6Address netip.Addr `json:"v6Address,omitzero"`
	Mark6     uint32     `json:"mark6,omitzero"`
	Ingress   Limit      `json:"ingress,omitzero"`
	Egress    Limit      `json:"egress,omitzero"`
}

// key is the address e is known by: its IPv4 address, else its IPv6 one.
func (e EIP) key() netip.Addr {
	if e.Address.IsValid() {
		return e.Address
	}
	return e.V6Address
}

// direction names the two directions and their maps.
type direction int

const (
	ingress direction = iota
	egress
)

func (d direction) String() string { return [...]string{"ingress", "egress"}[d] }

func (e EIP) limit(d direction) Limit {
	if d == ingress {
		return e.Ingress
	}
	return e.Egress
}

// Validate checks a Limit; field prefixes the field names of the error
// (a *nat.FieldError).
func (l Limit) Validate(field string) error {
	bad := func(f, v, reason string) error {
		return &nat.FieldError{Field: field + "." + f, Value: v, Reason: reason}
	}
	if l.RateMbps == 0 {
		if l.BurstMB != 0 {
			return bad("burstMB", fmt.Sprint(l.BurstMB), "a burst without a rate")
		}
		return nil
	}
	if !(l.RateMbps > 0 && l.RateMbps <= MaxRateMbps) || l.rate() == 0 {
		return bad("rateMbps", fmt.Sprint(l.RateMbps), fmt.Sprintf("want a rate above 0 and at most %d Mbit/s (HTB's 32-bit rate)", MaxRateMbps))
	}
	if !(l.BurstMB >= 0 && l.BurstMB <= MaxBurstMB) {
		return bad("burstMB", fmt.Sprint(l.BurstMB), "want a burst from 0 to 4095 MB")
	}
	if t := float64(l.burst()) / float64(l.rate()); t > MaxBurstTime {
		return bad("burstMB", fmt.Sprint(l.BurstMB), fmt.Sprintf("%.0f s at %g Mbit/s, HTB holds at most %.0f s of rate", t, l.RateMbps, MaxBurstTime))
	}
	return nil
}

// rate is the limit in bytes per second, rounded.
func (l Limit) rate() uint64 { return uint64(math.Round(l.RateMbps * 1e6 / 8)) }

// burst is the burst in bytes as tc gets it: MB × 2^20, rounded, or tc's
// default for 0.
func (l Limit) burst() uint32 {
	if l.BurstMB == 0 {
		return uint32(float64(l.rate())/netlink.Hz() + mtu)
	}
	return uint32(math.Round(l.BurstMB * BytesPerMB))
}

// quantum is the class's DRR quantum: a tenth of a second's rate divided
// by r2q as HTB computes it, held between one frame and HTB's 200,000.
func (l Limit) quantum() uint32 {
	return uint32(min(max(l.rate()/10, mtu), 200_000))
}

// comment is the element comment that records the class's limit and, for
// an EIP with an IPv6 address, that address (v6=…), so that every element
// of the class names its EIP.
func (c class) comment() string {
	s := "natgw rate=" + strconv.FormatFloat(c.lim.RateMbps, 'g', -1, 64) + " burst=" + strconv.FormatFloat(c.lim.BurstMB, 'g', -1, 64)
	if c.v6.IsValid() {
		s += " v6=" + c.v6.String()
	}
	return s
}

// parseComment reads a comment written by class.comment.
func parseComment(s string) (Limit, netip.Addr, error) {
	var l Limit
	var v6 netip.Addr
	rest, ok := strings.CutPrefix(s, "natgw ")
	if !ok {
		return l, v6, fmt.Errorf("comment %q: not natgw's", s)
	}
	for _, f := range strings.Fields(rest) {
		k, v, _ := strings.Cut(f, "=")
		if k == "v6" {
			a, err := netip.ParseAddr(v)
			if err != nil || !a.Is6() {
				return l, v6, fmt.Errorf("comment %q: v6: not an IPv6 address", s)
			}
			v6 = a
			continue
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return l, v6, fmt.Errorf("comment %q: %s: %w", s, k, err)
		}
		switch k {
		case "rate":
			l.RateMbps = x
		case "burst":
			l.BurstMB = x
		}
	}
	return l, v6, nil
}

// ValidateAll checks eips: each address a unicast IPv4 address, or with
// V6Address a unicast IPv6 one and Address the zero Addr or a unicast IPv4
// address, every address at most once, Mark6 a mark id (at most 0xffffff)
// only with V6Address, and valid limits. The error names the field
// (eips[i].…).
func ValidateAll(eips []EIP) error {
	seen := map[netip.Addr]int{}
	for i, e := range eips {
		f := fmt.Sprintf("eips[%d]", i)
		if (e.Address.IsValid() || !e.V6Address.IsValid()) && (!e.Address.Is4() || e.Address.IsUnspecified() || e.Address.IsMulticast()) {
			return &nat.FieldError{Field: f + ".address", Value: e.Address.String(), Reason: "want a unicast IPv4 address"}
		}
		if e.V6Address.IsValid() && (!e.V6Address.Is6() || e.V6Address.Is4In6() || e.V6Address.IsUnspecified() || e.V6Address.IsMulticast()) {
			return &nat.FieldError{Field: f + ".v6Address", Value: e.V6Address.String(), Reason: "want a unicast IPv6 address"}
		}
		if e.Mark6 > conntrack.MarkID6Max || e.Mark6 != 0 && !e.V6Address.IsValid() {
			return &nat.FieldError{Field: f + ".mark6", Value: fmt.Sprint(e.Mark6), Reason: "want an IPv6 EIP's mark id (at most 0xffffff)"}
		}
		for _, a := range []struct {
			field string
			addr  netip.Addr
		}{{".address", e.Address}, {".v6Address", e.V6Address}} {
			if !a.addr.IsValid() {
				continue
			}
			if j, ok := seen[a.addr]; ok {
				return &nat.FieldError{Field: f + a.field, Value: a.addr.String(), Reason: fmt.Sprintf("also eips[%d]", j)}
			}
			seen[a.addr] = i
		}
		if err := e.Ingress.Validate(f + ".ingress"); err != nil {
			return err
		}
		if err := e.Egress.Validate(f + ".egress"); err != nil {
			return err
		}
	}
	return nil
}

// class is one HTB class natgw wants or has: eip is its EIP's key
// (EIP.key), v6 and mark6 its EIP's V6Address and Mark6.
type class struct {
	dir   direction
	eip   netip.Addr
	v6    netip.Addr
	mark6 uint32
	minor uint16
	lim   Limit
}

func (c class) id() uint32 { return netlink.MakeHandle(Major, c.minor) }

// device returns the interface a direction is shaped on.
func device(cfg nat.Config, d direction) string {
	if d == ingress {
		return cfg.InternalInterface
	}
	return cfg.ExternalInterface
}

// assign gives every wanted class a minor: the one the EIP has now in that
// direction, else the lowest free one. The result is sorted by direction,
// then address.
func assign(cur []class, eips []EIP) ([]class, error) {
	var out []class
	for _, d := range []direction{ingress, egress} {
		have := map[netip.Addr]uint16{}
		used := map[uint16]bool{}
		for _, c := range cur {
			if c.dir == d {
				have[c.eip], used[c.minor] = c.minor, true
			}
		}
		var want []class
		for _, e := range eips {
			if l := e.limit(d); l.RateMbps != 0 {
				c := class{dir: d, eip: e.key(), v6: e.V6Address, lim: l}
				if d == ingress {
					c.mark6 = e.Mark6 // only ingress classifies by mark
				}
				want = append(want, c)
			}
		}
		slices.SortFunc(want, func(a, b class) int { return a.eip.Compare(b.eip) })
		// Free the minors of EIPs no longer wanted here first, so a
		// full table can take new ones.
		keep := map[uint16]bool{}
		for i := range want {
			if m, ok := have[want[i].eip]; ok {
				want[i].minor, keep[m] = m, true
			}
		}
		next := uint16(1)
		for i := range want {
			if want[i].minor != 0 {
				continue
			}
			for next < GatewayMinorBase && (keep[next] || used[next] && !keep[next] && stillUsed(cur, d, next, want)) {
				next++
			}
			if next == GatewayMinorBase {
				return nil, fmt.Errorf("shape: more than %d shaped EIPs in direction %s", GatewayMinorBase-1, d)
			}
			want[i].minor, keep[next] = next, true
			next++
		}
		out = append(out, want...)
	}
	return out, nil
}

// stillUsed: a minor of cur in direction d belongs to an EIP that keeps it.
func stillUsed(cur []class, d direction, minor uint16, want []class) bool {
	for _, c := range cur {
		if c.dir == d && c.minor == minor {
			return slices.ContainsFunc(want, func(w class) bool { return w.eip == c.eip })
		}
	}
	return false
}

// Set makes the gateway's EIP shaping exactly eips (cfg names the
// namespace and interfaces; empty interface names are Kube-OVN's). No EIP
// with a rate removes natgw's qdiscs and table.
func Set(ctx context.Context, cfg nat.Config, eips []EIP) error {
	cfg = cfg.WithDefaults()
	if err := ValidateAll(eips); err != nil {
		return err
	}
	return withKernel(ctx, cfg, func(k *kernel) error { return k.set(eips) })
}

// set is Set over k.
func (k *kernel) set(eips []EIP) error {
	cur, there, err := k.readMaps()
	if err != nil {
		return err
	}
	want, err := assign(cur, eips)
	if err != nil {
		return err
	}
	return k.apply(cur, there, want)
}

// Get returns the EIPs natgw shapes, sorted by address, as recorded in its
// table (nil when there is none), without a direction whose class is not
// in the kernel with its rate (deleted or changed by hand): what is
// shaped, so a drift check that compares it with what it wants sees the
// difference and repairs it (Set and Dataplane.Sync write missing classes
// again).
func Get(ctx context.Context, cfg nat.Config) ([]EIP, error) {
	cfg = cfg.WithDefaults()
	var out []EIP
	err := withKernel(ctx, cfg, func(k *kernel) (err error) { out, err = k.get(); return err })
	return out, err
}

// get is Get over k.
func (k *kernel) get() ([]EIP, error) {
	cur, _, err := k.readMaps()
	if err != nil {
		return nil, err
	}
	held, err := k.heldClasses(cur)
	if err != nil {
		return nil, err
	}
	return toEIPs(held), nil
}

// heldClasses returns the classes of cs that the kernel holds with their
// rate.
func (k *kernel) heldClasses(cs []class) ([]class, error) {
	out := make([]class, 0, len(cs))
	rates := map[string]map[uint16]uint64{}
	for _, c := range cs {
		dev := device(k.cfg, c.dir)
		have, ok := rates[dev]
		if !ok {
			var err error
			if have, err = k.classRates(dev); err != nil {
				return nil, err
			}
			rates[dev] = have
		}
		if r, ok := have[c.minor]; ok && r == c.lim.rate() {
			out = append(out, c)
		}
	}
	return out, nil
}

func toEIPs(cs []class) []EIP {
	by := map[netip.Addr]*EIP{}
	var out []EIP
	for _, c := range cs {
		e := by[c.eip]
		if e == nil {
			e = &EIP{V6Address: c.v6}
			if c.eip.Is4() {
				e.Address = c.eip
			}
			by[c.eip] = e
		}
		if c.dir == ingress {
			e.Mark6 = c.mark6
			e.Ingress = c.lim
		} else {
			e.Egress = c.lim
		}
	}
	for _, e := range by {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b EIP) int { return a.key().Compare(b.key()) })
	return out
}

// kernel holds the netlink handle and the nftables connection of one
// namespace.
type kernel struct {
	cfg  nat.Config
	h    *netlink.Handle
	ctx  context.Context
	conn nftconn.Conn
}

// withKernel runs fn over a kernel dialed for the call (Set, Get and the
// other package functions: one call of a short-lived process). A
// Dataplane keeps one for its life instead (lastingKernel).
func withKernel(ctx context.Context, cfg nat.Config, fn func(k *kernel) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("shape: %w", err)
	}
	var h *netlink.Handle
	var conn nftconn.Conn
	if cfg.NetNS != "" {
		ns, err := netns.Open(cfg.NetNS)
		if err != nil {
			return fmt.Errorf("shape: %w", err)
		}
		defer ns.Close()
		if h, err = netlink.NewHandleAt(vnetns.NsHandle(ns.Fd())); err != nil {
			return fmt.Errorf("shape: netlink in %s: %w", cfg.NetNS, err)
		}
		conn = nftconn.Open(ns)
	} else {
		var err error
		if h, err = netlink.NewHandle(); err != nil {
			return fmt.Errorf("shape: netlink: %w", err)
		}
		conn = nftconn.Current()
	}
	defer h.Close()
	return fn(&kernel{cfg: cfg, h: h, ctx: ctx, conn: conn})
}

// lastingKernel is a kernel a Dataplane keeps for its life: the
// namespace open, a route netlink handle (tc) and an nftables socket
// (nftconn.Lasting) that are not closed between calls.
type lastingKernel struct {
	kernel
	ns      *netns.NS // nil: the calling thread's namespace
	lasting *nftconn.Lasting
}

// Buffers of a lastingKernel's nftables socket: natgw_shape's maps hold
// one element per shaped EIP and direction (at most 2^15 classes per
// device: ~4 MiB of batch).
const (
	lastingSendBuf = 16 << 20
	lastingRecvBuf = 4 << 20
)

// dialKernel opens a lastingKernel in cfg's namespace.
func dialKernel(cfg nat.Config) (_ *lastingKernel, err error) {
	lk := &lastingKernel{kernel: kernel{cfg: cfg}}
	defer func() {
		if err != nil {
			lk.close()
		}
	}()
	if cfg.NetNS != "" {
		if lk.ns, err = netns.Open(cfg.NetNS); err != nil {
			return nil, fmt.Errorf("shape: %w", err)
		}
		if lk.h, err = netlink.NewHandleAt(vnetns.NsHandle(lk.ns.Fd()), unix.NETLINK_ROUTE); err != nil {
			return nil, fmt.Errorf("shape: netlink in %s: %w", cfg.NetNS, err)
		}
	} else if lk.h, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return nil, fmt.Errorf("shape: netlink: %w", err)
	}
	if lk.lasting, err = nftconn.DialLasting(lk.ns, cfg.NetNS, nlsock.DefaultTimeout, lastingSendBuf, lastingRecvBuf); err != nil {
		return nil, fmt.Errorf("shape: %w", err)
	}
	lk.conn = lk.lasting
	return lk, nil
}

// close closes what dialKernel opened (kernel state stays).
func (lk *lastingKernel) close() {
	if lk.lasting != nil {
		_ = lk.lasting.Close()
	}
	if lk.h != nil {
		lk.h.Close()
	}
	if lk.ns != nil {
		_ = lk.ns.Close()
	}
}

// table is natgw's shaping table, family inet: one chain classifies both
// families. oldTable is where layouts before it kept the IPv4 maps (family
// ip): read when the inet table is not there yet, deleted by the
// transaction that writes the inet one.
var (
	table    = nftconn.Table{Family: nft.TableFamilyINet, Name: nftconn.ShapeTable}
	oldTable = nftconn.Table{Family: nft.TableFamilyIPv4, Name: nftconn.ShapeTable}
)

// mapKind is one of the table's maps: ingress keyed by the connection's ct
// mark (an IPv4 EIP's address, conntrack.MarkOf, or an IPv6 EIP's mark
// id), egress by the IPv4 source address, egress6 by the IPv6 one; the
// values are classids (tc's major:minor, 4 bytes in host order).
type mapKind int

const (
	mapIngress mapKind = iota
	mapEgress
	mapEgress6
)

var mapKinds = []mapKind{mapIngress, mapEgress, mapEgress6}

// dir is the direction whose classes m points at.
func (m mapKind) dir() direction {
	if m == mapIngress {
		return ingress
	}
	return egress
}

// keyLen is the length of the map's keys: a mark or an IPv4 address 4
// bytes, an IPv6 address 16.
func (m mapKind) keyLen() int {
	if m == mapEgress6 {
		return 16
	}
	return 4
}

// spec is the map's definition.
func (m mapKind) spec() nftconn.Map {
	switch m {
	case mapIngress:
		return nftconn.Map{Name: nftconn.ShapeIngressMap, KeyType: nft.TypeMark, DataType: nft.TypeClassID}
	case mapEgress:
		return nftconn.Map{Name: nftconn.ShapeEgressMap, KeyType: nft.TypeIPAddr, DataType: nft.TypeClassID}
	}
	return nftconn.Map{Name: nftconn.ShapeEgress6Map, KeyType: nft.TypeIP6Addr, DataType: nft.TypeClassID}
}

// elementsOf are want's elements in map m, one per family of each class's
// EIP: ingress its IPv4 mark (conntrack.MarkOf) and its IPv6 mark id (when
// known), egress its IPv4 address, egress6 its IPv6 one. Their Text is as
// nft lists them, which shows marks and classids in the wrong byte order
// (google/nftables does not record their host byte order for it).
func elementsOf(m mapKind, want []class) []nftconn.Element {
	var els []nftconn.Element
	for _, c := range want {
		if c.dir != m.dir() {
			continue
		}
		val := binary.NativeEndian.AppendUint32(nil, c.id())
		v := binary.BigEndian.Uint32(val)
		comment := c.comment()
		add := func(key []byte, keyText string) {
			els = append(els, nftconn.Element{Key: key, Val: val, Comment: comment,
				Text: fmt.Sprintf("%s comment %q : %x:%x", keyText, comment, v>>16, v&0xffff)})
		}
		mark := func(mk uint32) {
			key := binary.NativeEndian.AppendUint32(nil, mk)
			add(key, fmt.Sprintf("0x%08x", binary.BigEndian.Uint32(key)))
		}
		switch {
		case m == mapIngress:
			if c.eip.Is4() {
				mark(conntrack.MarkOf(c.eip))
			}
			if c.v6.IsValid() && c.mark6 != 0 {
				mark(c.mark6)
			}
		case m == mapEgress && c.eip.Is4():
			add(c.eip.AsSlice(), c.eip.String())
		case m == mapEgress6 && c.v6.IsValid():
			add(c.v6.AsSlice(), c.v6.String())
		}
	}
	return els
}

// readMaps returns the classes recorded in natgw's table, and which
// tables are there.
func (k *kernel) readMaps() ([]class, tablesThere, error) { return readMaps(k.ctx, k.conn) }

// readMaps returns the classes recorded in natgw's table (the old family
// ip one when the inet one is not there), read through c, by direction and
// minor: a class's elements (one per family) make one class. It also says
// which of the two tables are there, for the transaction that follows
// (tableTx): one listing of each family answers both.
func readMaps(ctx context.Context, c nftconn.Conn) ([]class, tablesThere, error) {
	var there tablesThere
	for _, x := range []struct {
		t  nftconn.Table
		ok *bool
	}{{table, &there.inet}, {oldTable, &there.old}} {
		ok, err := nftconn.HasTable(ctx, c, x.t)
		if err != nil {
			return nil, there, fmt.Errorf("shape: %w", err)
		}
		*x.ok = ok
	}
	t := table
	switch {
	case there.inet:
	case there.old:
		t = oldTable
	default:
		return nil, there, nil
	}
	type ref struct {
		dir   direction
		minor uint16
	}
	by := map[ref]*class{}
	var order []ref
	for _, m := range mapKinds {
		if m == mapEgress6 && t == oldTable {
			continue
		}
		els, err := c.MapElements(ctx, t, m.spec().Name)
		if err != nil {
			return nil, there, fmt.Errorf("shape: %w", err)
		}
		d := m.dir()
		for _, el := range els {
			if len(el.Val) != 4 || len(el.Key) != m.keyLen() {
				return nil, there, fmt.Errorf("shape: %s map %s: bad element %x : %x", t.Name, m.spec().Name, el.Key, el.Val)
			}
			id := binary.NativeEndian.Uint32(el.Val)
			lim, v6, err := parseComment(el.Comment)
			if err != nil {
				return nil, there, fmt.Errorf("shape: %s map %s element %x: %w", t.Name, m.spec().Name, el.Key, err)
			}
			if id>>16 != Major {
				return nil, there, fmt.Errorf("shape: %s map %s element %x: class %x:%x is not natgw's", t.Name, m.spec().Name, el.Key, id>>16, id&0xffff)
			}
			r := ref{d, uint16(id)}
			cl := by[r]
			if cl == nil {
				cl = &class{dir: d, minor: uint16(id), lim: lim, v6: v6}
				by[r] = cl
				order = append(order, r)
			}
			if cl.lim != lim || cl.v6 != v6 {
				return nil, there, fmt.Errorf("shape: %s map %s element %x: class %x:%x is also %q's", t.Name, m.spec().Name, el.Key, Major, uint16(id), el.Comment)
			}
			switch m {
			case mapIngress:
				if mk := binary.NativeEndian.Uint32(el.Key); mk <= conntrack.MarkID6Max {
					cl.mark6 = mk
				} else {
					cl.eip = netip.AddrFrom4([4]byte(binary.BigEndian.AppendUint32(nil, mk)))
				}
			case mapEgress:
				cl.eip = netip.AddrFrom4([4]byte(el.Key))
			case mapEgress6:
				cl.v6 = netip.AddrFrom16([16]byte(el.Key))
			}
		}
	}
	out := make([]class, 0, len(order))
	for _, r := range order {
		cl := *by[r]
		if !cl.eip.IsValid() {
			cl.eip = cl.v6 // IPv6-only EIP
		}
		if !cl.eip.IsValid() {
			return nil, there, fmt.Errorf("shape: %s: class %x:%x has no EIP address", t.Name, Major, cl.minor)
		}
		out = append(out, cl)
	}
	return out, there, nil
}

// link returns the interface named dev.
func (k *kernel) link(dev string) (netlink.Link, error) {
	l, err := k.h.LinkByName(dev)
	if err != nil {
		return nil, fmt.Errorf("shape: interface %s: %w", dev, err)
	}
	return l, nil
}

// rootState says whether natgw's root qdisc is on l, and refuses a root
// qdisc that is someone else's.
func (k *kernel) rootState(l netlink.Link) (ours bool, err error) {
	qs, err := k.h.QdiscList(l)
	if err != nil {
		return false, fmt.Errorf("shape: list qdiscs of %s: %w", l.Attrs().Name, err)
	}
	for _, q := range qs {
		a := q.Attrs()
		if a.Parent != netlink.HANDLE_ROOT {
			continue
		}
		if a.Handle == netlink.MakeHandle(Major, 0) && q.Type() == "htb" {
			return true, nil
		}
		if a.Handle>>16 != 0 {
			return false, fmt.Errorf("shape: interface %s has root qdisc %s %x: that natgw did not make; refusing to replace it", l.Attrs().Name, q.Type(), a.Handle>>16)
		}
	}
	return false, nil
}

func htbClass(l netlink.Link, c class) *netlink.HtbClass {
	bps := c.lim.rate() * 8
	return netlink.NewHtbClass(netlink.ClassAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.MakeHandle(Major, 0), Handle: c.id()},
		netlink.HtbClassAttrs{Rate: bps, Ceil: bps, Buffer: c.lim.burst(), Cbuffer: c.lim.burst(), Quantum: c.lim.quantum()})
}

// leaf puts a bfifo of c's leafLimit under class c (tc qdisc replace dev
// L parent 4e47:minor bfifo limit N; the netlink library has no fifo
// qdisc with options).
func (k *kernel) leaf(l netlink.Link, c class) error {
	req := nl.NewNetlinkRequest(unix.RTM_NEWQDISC, unix.NLM_F_CREATE|unix.NLM_F_REPLACE|unix.NLM_F_ACK)
	req.AddData(&nl.TcMsg{Family: nl.FAMILY_ALL, Ifindex: int32(l.Attrs().Index), Parent: c.id()})
	req.AddData(nl.NewRtAttr(nl.TCA_KIND, nl.ZeroTerminated("bfifo")))
	req.AddData(nl.NewRtAttr(nl.TCA_OPTIONS, binary.NativeEndian.AppendUint32(nil, c.lim.leafLimit())))
	exec := func() error { _, err := req.Execute(unix.NETLINK_ROUTE, 0); return err }
	var err error
	if k.cfg.NetNS == "" {
		err = exec()
	} else {
		err = netns.Do(k.cfg.NetNS, exec)
	}
	if err != nil {
		return fmt.Errorf("shape: bfifo limit %d under class %x:%x on %s: %w", c.lim.leafLimit(), Major, c.minor, l.Attrs().Name, err)
	}
	return nil
}

// Leaf kinds a class can get (leafKind).
const (
	leafDefault = ""         // HTB's default leaf (pfifo of txqueuelen packets)
	leafBfifo   = "bfifo"    // LeafDelay > 0
	leafFqCodel = "fq_codel" // upstream's, where the kernel has it
)

// fqCodel is what natgw knows of the kernel's fq_codel: 0 not probed yet,
// 1 there, 2 missing. The first class natgw makes probes it (by giving the
// class an fq_codel leaf); the answer holds for the process's life.
var fqCodel atomic.Int32

// fqCodelProbes counts the probes (tests).
var fqCodelProbes atomic.Int32

// leafKind is the leaf each class gets: a bfifo when delay is above 0
// (the measured alternative), else upstream's fq_codel unless the kernel
// is known to lack it (state 2), else HTB's default.
func leafKind(delay time.Duration, state int32) string {
	switch {
	case delay > 0:
		return leafBfifo
	case state == 2:
		return leafDefault
	default:
		return leafFqCodel
	}
}

// FqCodel reports whether classes get fq_codel leaves: known is false
// until the first class was made.
func FqCodel() (have, known bool) {
	s := fqCodel.Load()
	return s == 1, s != 0
}

// missingQdisc says whether err is the kernel's answer to a qdisc kind it
// does not have (tc: "Specified qdisc kind is unknown", ENOENT).
func missingQdisc(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP)
}

// setLeaf gives class c its leaf qdisc (leafKind): with fq_codel not yet
// probed, the first try is the probe, and a kernel without fq_codel leaves
// this and every later class with HTB's default leaf.
func (k *kernel) setLeaf(l netlink.Link, c class) error {
	switch leafKind(LeafDelay, fqCodel.Load()) {
	case leafBfifo:
		return k.leaf(l, c)
	case leafFqCodel:
		probing := fqCodel.Load() == 0
		if probing {
			fqCodelProbes.Add(1)
		}
		err := k.h.QdiscReplace(netlink.NewFqCodel(netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Parent: c.id()}))
		switch {
		case err == nil:
			fqCodel.Store(1)
		case probing && missingQdisc(err):
			fqCodel.Store(2) // this kernel has no fq_codel: HTB's default leaf
		default:
			return fmt.Errorf("shape: fq_codel under class %x:%x on %s: %w", Major, c.minor, l.Attrs().Name, err)
		}
	}
	return nil
}

// classRef names class Major:minor of l (enough to delete it).
func classRef(l netlink.Link, minor uint16) netlink.Class {
	return &netlink.GenericClass{ClassAttrs: netlink.ClassAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.MakeHandle(Major, 0), Handle: netlink.MakeHandle(Major, minor)}, ClassType: "htb"}
}

// apply moves the kernel from cur to want (both with minors); there is
// which tables readMaps found.
func (k *kernel) apply(cur []class, there tablesThere, want []class) (err error) {
	links := map[direction]netlink.Link{}
	ours := map[direction]bool{}
	wanted := map[direction]bool{}
	for _, c := range want {
		wanted[c.dir] = true
	}
	had := map[direction]bool{}
	for _, c := range cur {
		had[c.dir] = true
	}
	for _, d := range []direction{ingress, egress} {
		l, err := k.link(device(k.cfg, d))
		if err != nil {
			if !wanted[d] && !had[d] {
				continue // nothing of natgw's there, nothing wanted
			}
			return err
		}
		links[d] = l
		o, err := k.rootState(l)
		if err != nil && wanted[d] {
			return err
		}
		ours[d] = o
	}

	var undo undoList
	defer undo.onError(&err)
	// 1. qdiscs and classes wanted.
	for _, d := range []direction{ingress, egress} {
		if !wanted[d] || ours[d] {
			continue
		}
		l := links[d]
		q := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(Major, 0), Parent: netlink.HANDLE_ROOT})
		if err := k.h.QdiscAdd(q); err != nil {
			return fmt.Errorf("shape: add htb qdisc %x: on %s: %w", Major, l.Attrs().Name, err)
		}
		undo = append(undo, func() error { return k.h.QdiscDel(q) })
	}
	existing := map[direction]map[uint32]uint64{} // class handle: its rate (bytes/s) when its ceil is that
	for _, d := range []direction{ingress, egress} {
		existing[d] = map[uint32]uint64{}
		if !ours[d] {
			continue
		}
		cls, err := k.h.ClassList(links[d], netlink.MakeHandle(Major, 0))
		if err != nil {
			return fmt.Errorf("shape: list classes of %s: %w", links[d].Attrs().Name, err)
		}
		for _, c := range cls {
			var rate uint64
			if h, ok := c.(*netlink.HtbClass); ok && h.Rate == h.Ceil {
				rate = h.Rate
			}
			existing[d][c.Attrs().Handle] = rate
		}
	}
	curBy := map[[2]any]class{}
	for _, c := range cur {
		curBy[[2]any{c.dir, c.minor}] = c
	}
	for _, c := range want {
		old, had := curBy[[2]any{c.dir, c.minor}]
		rate, there := existing[c.dir][c.id()]
		if had && old.eip == c.eip && old.lim == c.lim && there && rate == c.lim.rate() {
			// (A rate changed by hand is written again.)
			continue
		}
		l := links[c.dir]
		if err := k.h.ClassReplace(htbClass(l, c)); err != nil {
			return fmt.Errorf("shape: %s class %x:%x for %s (%g Mbit/s, burst %g MB) on %s: %w", c.dir, Major, c.minor, c.eip, c.lim.RateMbps, c.lim.BurstMB, l.Attrs().Name, err)
		}
		if err := k.setLeaf(l, c); err != nil {
			return err
		}
		if had && there {
			undo = append(undo, func() error { return k.h.ClassReplace(htbClass(l, old)) })
		} else {
			undo = append(undo, func() error { return k.h.ClassDel(classRef(l, c.minor)) })
		}
	}
	// 2. the table, in one transaction.
	if err := k.writeTable(len(want) > 0, there, want); err != nil {
		return err
	}
	undo = nil // the maps point at want now: no going back.
	// 3. classes and qdiscs no longer used.
	var errs []error
	keep := map[[2]any]bool{}
	for _, c := range want {
		keep[[2]any{c.dir, c.minor}] = true
	}
	for _, d := range []direction{ingress, egress} {
		l := links[d]
		if l == nil {
			continue
		}
		for h := range existing[d] {
			// Gateway-wide classes (nat/gwqos) share the qdisc: not ours.
			if uint16(h) < GatewayMinorBase && !keep[[2]any{d, uint16(h)}] {
				if err := k.h.ClassDel(classRef(l, uint16(h))); err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, fmt.Errorf("shape: delete class %x:%x of %s: %w", Major, uint16(h), l.Attrs().Name, err))
				}
			}
		}
		if !wanted[d] && ours[d] {
			errs = append(errs, k.dropEmptyRoot(l))
		}
	}
	return errors.Join(errs...)
}

// tablesThere says which of natgw's shaping tables a namespace holds.
type tablesThere struct{ inet, old bool }

// writeTable makes natgw_shape hold want's maps (deletes it when want is
// empty), in one transaction (tableTx).
func (k *kernel) writeTable(wanted bool, there tablesThere, want []class) error {
	if err := k.conn.Apply(k.ctx, tableTx(k.cfg, wanted, there, want)); err != nil {
		if !wanted {
			return fmt.Errorf("shape: nftables: delete table %s: %w", table.Name, err)
		}
		return fmt.Errorf("shape: nftables: program %d classes in %s: %w", len(want), table.Name, err)
	}
	return nil
}

// postChain is the table's one chain.
var postChain = nftconn.Chain{Name: nftconn.ShapePostChain, Type: nft.ChainTypeFilter, Hook: nft.ChainHookPostrouting, Priority: nft.ChainPriorityRef(200)}

// tableTx is the transaction that makes the table hold want (there: the
// tables there now): the old family ip table deleted first if it is there
// (its classes are want's: readMaps read them from it); not wanted, the
// inet table deleted (nothing if it is not there); else the table, the
// maps (flushed and refilled) and the chain (flushed and refilled).
func tableTx(cfg nat.Config, wanted bool, there tablesThere, want []class) *nftconn.Tx {
	tx := &nftconn.Tx{}
	if there.old {
		tx.DeleteTable(oldTable)
	}
	if !wanted {
		if there.inet {
			tx.DeleteTable(table)
		}
		return tx
	}
	tx.AddTable(table)
	for _, m := range mapKinds {
		spec := m.spec()
		tx.AddMap(table, spec)
		if there.inet {
			tx.FlushMap(table, spec.Name)
		}
		tx.AddElements(table, spec.Name, elementsOf(m, want)...)
	}
	tx.AddChain(table, postChain)
	if there.inet {
		tx.FlushChain(table, postChain.Name)
	}
	for _, r := range rules(cfg) {
		tx.AppendRule(table, postChain.Name, r)
	}
	return tx
}

func ifname(name string) []byte {
	b := make([]byte, 16)
	copy(b, name)
	return b
}

// rules are the chain's rules, each tagged "natgw: " and what it does:
// ingress by the connection's ct mark (both families), egress by the IPv4
// and by the IPv6 source.
func rules(cfg nat.Config) []nftconn.Rule {
	oif := func(dev string) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(dev)},
		}
	}
	family := func(f byte) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{f}},
		}
	}
	setPrio := func(m mapKind) []expr.Any {
		return []expr.Any{
			&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: string(m.spec().Name)},
			&expr.Meta{Key: expr.MetaKeyPRIORITY, SourceRegister: true, Register: 1},
		}
	}
	return []nftconn.Rule{
		{Tag: "natgw: ingress: class of the connection's EIP (its ct mark)",
			Text:  fmt.Sprintf("oifname %q meta priority set ct mark map @%s", cfg.InternalInterface, mapIngress.spec().Name),
			Exprs: slices.Concat(oif(cfg.InternalInterface), []expr.Any{&expr.Ct{Key: expr.CtKeyMARK, Register: 1}}, setPrio(mapIngress))},
		{Tag: "natgw: egress: class of the IPv4 source (the EIP after SNAT)",
			Text: fmt.Sprintf("oifname %q meta priority set ip saddr map @%s", cfg.ExternalInterface, mapEgress.spec().Name),
			Exprs: slices.Concat(oif(cfg.ExternalInterface), family(unix.NFPROTO_IPV4), []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			}, setPrio(mapEgress))},
		{Tag: "natgw: egress: class of the IPv6 source (the EIP after SNAT)",
			Text: fmt.Sprintf("oifname %q meta priority set ip6 saddr map @%s", cfg.ExternalInterface, mapEgress6.spec().Name),
			Exprs: slices.Concat(oif(cfg.ExternalInterface), family(unix.NFPROTO_IPV6), []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16},
			}, setPrio(mapEgress6))},
	}
}

// Update is a change of one direction of one EIP's shaping, as upstream's
// eip-ingress-qos-add / eip-egress-qos-add / -del make it: Limit's zero
// value removes that direction's class.
type Update struct {
	Address netip.Addr
	Egress  bool // traffic from the EIP (shaped leaving the external interface); false: to it
	Limit   Limit
}

// Change changes the shaping the gateway holds (read back from its kernel)
// by updates, in order, and programs the result as Set does: validated
// first, all or nothing. The other EIPs' classes are untouched.
func Change(ctx context.Context, cfg nat.Config, updates []Update) error {
	cfg = cfg.WithDefaults()
	for i, u := range updates {
		f := fmt.Sprintf("updates[%d]", i)
		if !u.Address.Is4() || u.Address.IsUnspecified() || u.Address.IsMulticast() {
			return &nat.FieldError{Field: f + ".address", Value: u.Address.String(), Reason: "want a unicast IPv4 address"}
		}
		if err := u.Limit.Validate(f + ".limit"); err != nil {
			return err
		}
	}
	return withKernel(ctx, cfg, func(k *kernel) error {
		cur, there, err := k.readMaps()
		if err != nil {
			return err
		}
		eips := applyUpdates(toEIPs(cur), updates)
		if err := ValidateAll(eips); err != nil {
			return err
		}
		want, err := assign(cur, eips)
		if err != nil {
			return err
		}
		return k.apply(cur, there, want)
	})
}

// applyUpdates returns eips changed by updates (EIPs left with no limit
// dropped), sorted by address.
func applyUpdates(eips []EIP, updates []Update) []EIP {
	by := map[netip.Addr]EIP{}
	for _, e := range eips {
		by[e.key()] = e
	}
	for _, u := range updates {
		e := by[u.Address]
		e.Address = u.Address
		if u.Egress {
			e.Egress = u.Limit
		} else {
			e.Ingress = u.Limit
		}
		by[u.Address] = e
	}
	out := make([]EIP, 0, len(by))
	for _, e := range by {
		if e.Ingress != (Limit{}) || e.Egress != (Limit{}) {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b EIP) int { return a.key().Compare(b.key()) })
	return out
}

// undoList is the steps that put back the class changes made so far, run
// last first when the change fails.
type undoList []func() error

// onError runs u when *err is set, adding any failure of a step to *err.
// Deferred as `defer undo.onError(&err)`; `undo = nil` commits.
func (u *undoList) onError(err *error) {
	if *err == nil {
		return
	}
	for i := len(*u) - 1; i >= 0; i-- {
		if uerr := (*u)[i](); uerr != nil {
			*err = fmt.Errorf("%w (undoing: %v)", *err, uerr)
		}
	}
}
