package nftables

import (
	"encoding/binary"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/natgw/natgw/nat"
)

// elemRef names one element held in the kernel: its set and key. The key is
// held inline (every key of the table fits in maxKey bytes), so building an
// index of 200,000 elements allocates nothing per element.
type elemRef struct {
	set  string
	n    uint8
	key  [maxKey]byte
	long string // a key longer than maxKey (never rendered by natgw)
}

// maxKey is the longest element key natgw renders (IPv6 route:
// destination . netmask, 32 bytes).
const maxKey = 32

func refOf(set string, key []byte) elemRef {
	r := elemRef{set: set}
	if len(key) > maxKey {
		r.long = string(key)
		return r
	}
	r.n = uint8(len(key))
	copy(r.key[:], key)
	return r
}

// setElems is elements grouped by set name.
type setElems map[string][]nft.SetElement

func (m setElems) add(set string, e nft.SetElement) { m[set] = append(m[set], e) }

// room implements elemSink: a new slice per key or value.
func (setElems) room(n int) []byte { return make([]byte, 0, n) }

// elemSink is where render puts an object's elements: a setElems, or a
// bulkElems for every object of a full Sync.
type elemSink interface {
	// add appends e to the elements of set.
	add(set string, e nft.SetElement)
	// room returns an empty slice of capacity n to write a key or a
	// value in.
	room(n int) []byte
}

// bulkElems collects the elements of many objects (renderBulk): each set's
// in one slice sized once, found by a scan of the few set names instead
// of a map lookup per element, and the keys and values written in shared
// slabs instead of an allocation each (100k FIPs rendered 400,000 4-byte
// keys and values and did 400,000 map assignments; see bench/README.md
// "Scenario 2: the Sync's user-space path").
type bulkElems struct {
	names []string
	lists [][]nft.SetElement
	slab  []byte
}

// bulkSlab is the size of one slab of keys and values (4,096 FIPs').
const bulkSlab = 64 << 10

func (b *bulkElems) add(set string, e nft.SetElement) {
	for i, n := range b.names {
		if n == set {
			b.lists[i] = append(b.lists[i], e)
			return
		}
	}
	b.names = append(b.names, set)
	b.lists = append(b.lists, []nft.SetElement{e})
}

func (b *bulkElems) room(n int) []byte {
	if len(b.slab)+n > cap(b.slab) {
		b.slab = make([]byte, 0, max(bulkSlab, n))
	}
	o := len(b.slab)
	b.slab = b.slab[:o+n]
	return b.slab[o : o : o+n]
}

// renderBulk renders every object of objs (all valid) into one setElems.
func renderBulk(objs []nat.Object) (setElems, error) {
	b := presized(objs)
	for _, o := range objs {
		if err := render(o, b); err != nil {
			return nil, err
		}
	}
	out := make(setElems, len(b.names))
	for i, n := range b.names {
		if len(b.lists[i]) > 0 {
			out[n] = b.lists[i]
		}
	}
	return out, nil
}

// presized returns a bulkElems with room for the fixed sets' elements of
// objs (counted by kind, without a map).
func presized(objs []nat.Object) *bulkElems {
	var eips, fip4, fip6, dnat, route4, route6 int
	for _, o := range objs {
		switch o.Kind {
		case nat.KindEIP:
			eips++
		case nat.KindFIP:
			if o.FIP != nil && o.FIP.EIP.Is6() {
				fip6++
				break
			}
			fip4++
		case nat.KindDNAT:
			dnat++
		case nat.KindRoute:
			if o.Route != nil && o.Route.Destination.Addr().Is6() {
				route6++
				break
			}
			route4++
		}
	}
	b := &bulkElems{}
	for _, s := range []struct {
		name string
		n    int
	}{{setFIPDNAT, fip4}, {setFIPSNAT, fip4}, {setFIPDNAT6, fip6}, {setFIPSNAT6, fip6},
		{setEIPs, eips}, {setPortDNAT, dnat}, {setRoutes, route4}, {setRoutes6, route6}} {
		if s.n > 0 {
			b.names = append(b.names, s.name)
			b.lists = append(b.lists, make([]nft.SetElement, 0, s.n))
		}
	}
	return b
}

// maxComment bounds an element comment (the kernel's userdata TLV holds at
// most 255 bytes including the trailing NUL).
const maxComment = 254

// mbit is bytes per megabit.
const mbit = 1_000_000 / 8

// qosOf returns the policers an EIP object asks for.
func qosOf(o nat.Object) (map[qosKey]qosVal, error) {
	if o.Kind != nat.KindEIP || o.EIP == nil || o.EIP.QoS == nil {
		return nil, nil
	}
	q := o.EIP.QoS
	out := map[qosKey]qosVal{}
	for _, d := range []struct {
		dir         qosDir
		rate, burst uint32
		field       string
	}{
		{qosIn, q.IngressRateMbps, q.IngressBurstMbit, "eip.qos.ingressBurstMbit"},
		{qosOut, q.EgressRateMbps, q.EgressBurstMbit, "eip.qos.egressBurstMbit"},
	} {
		if d.rate == 0 {
			continue
		}
		burst := uint64(d.burst) * mbit
		if burst > math.MaxUint32 {
			return nil, &nat.FieldError{UID: o.UID, Field: d.field, Value: strconv.FormatUint(uint64(d.burst), 10),
				Reason: fmt.Sprintf("above %d (nftables limit burst is a 32-bit byte count)", math.MaxUint32/mbit)}
		}
		out[qosKey{d.dir, policerAddr(o.EIP)}] = qosVal{rate: uint64(d.rate) * mbit, burst: uint32(burst)}
	}
	return out, nil
}

func a4(a netip.Addr) []byte { b := a.As4(); return b[:] }

// policerAddr is the address that names an EIP's policers: its IPv4
// address, or the IPv6 one of an IPv6-only EIP.
func policerAddr(e *nat.EIP) netip.Addr {
	if e.Address.IsValid() {
		return e.Address
	}
	return e.V6Address
}

func a16(a netip.Addr) []byte { b := a.As16(); return b[:] }

// addrBytes is a in its family's width: a4 or a16.
func addrBytes(a netip.Addr) []byte {
	if a.Is6() {
		return a16(a)
	}
	return a4(a)
}

func port4(p uint16) []byte { return []byte{byte(p >> 8), byte(p), 0, 0} }

// put4 appends a's 4 bytes to b; put16 its 16.
func put4(b []byte, a netip.Addr) []byte  { x := a.As4(); return append(b, x[:]...) }
func put16(b []byte, a netip.Addr) []byte { x := a.As16(); return append(b, x[:]...) }

// putPort4 appends port4(p) to b.
func putPort4(b []byte, p uint16) []byte { return append(b, byte(p>>8), byte(p), 0, 0) }

// eipComment is the comment of an EIP's eips element (its IPv4 address):
// the whole EIP, the IPv6 address of a dual-stack one included.
func eipComment(o nat.Object) string {
	s := fmt.Sprintf("%s plen=%d", o.UID, o.EIP.PrefixLen)
	if e := o.EIP; e.V6Address.IsValid() {
		s += fmt.Sprintf(" v6=%s/%d", e.V6Address, e.V6PrefixLen)
	}
	if q := o.EIP.QoS; q != nil {
		s += fmt.Sprintf(" qos=%d/%d/%d/%d", q.IngressRateMbps, q.IngressBurstMbit, q.EgressRateMbps, q.EgressBurstMbit)
	}
	return s
}

// eip6Comment is the comment of an EIP's eips6 element: the whole EIP of
// an IPv6-only one (with qos= as eipComment writes it); of a dual-stack
// one its prefix length and, as v4=, the IPv4 address whose eips element
// holds the EIP (Load rebuilds the EIP from that one).
func eip6Comment(o nat.Object) string {
	s := fmt.Sprintf("%s plen=%d", o.UID, o.EIP.V6PrefixLen)
	if e := o.EIP; e.Address.IsValid() {
		return s + " v4=" + e.Address.String()
	}
	if q := o.EIP.QoS; q != nil {
		s += fmt.Sprintf(" qos=%d/%d/%d/%d", q.IngressRateMbps, q.IngressBurstMbit, q.EgressRateMbps, q.EgressBurstMbit)
	}
	return s
}

func routeComment(o nat.Object) string {
	return fmt.Sprintf("%s dev=%s", o.UID, o.Route.Device)
}

// render appends the kernel elements of a valid object to out, by set.
// Every element carries the owner UID first in its comment. Keys and
// values are written in out's room.
func render(o nat.Object, out elemSink) error {
	add := func(set string, e nft.SetElement) error {
		if len(e.Comment) > maxComment {
			return &nat.FieldError{UID: o.UID, Field: "uid", Value: o.UID, Reason: "element comment too long for the kernel"}
		}
		out.add(set, e)
		return nil
	}
	addr4 := func(a netip.Addr) []byte { return put4(out.room(4), a) }
	addr16 := func(a netip.Addr) []byte { return put16(out.room(16), a) }
	switch o.Kind {
	case nat.KindEIP:
		pol, err := qosOf(o)
		if err != nil {
			return err
		}
		// Each address of the EIP goes to the EIP's one policer per
		// direction (a dual-stack EIP's two families share its bucket).
		for _, k := range sortedKeys(pol, cmpQoSKey) {
			v := &expr.Verdict{Kind: expr.VerdictGoto, Chain: k.name()}
			if a := o.EIP.Address; a.IsValid() {
				set := setQoSIn
				if k.dir == qosOut {
					set = setQoSOut
				}
				if err := add(set, nft.SetElement{Key: addr4(a), VerdictData: v, Comment: o.UID}); err != nil {
					return err
				}
			}
			if a := o.EIP.V6Address; a.IsValid() {
				set := setQoSIn6
				if k.dir == qosOut {
					set = setQoSOut6
				}
				if err := add(set, nft.SetElement{Key: addr16(a), VerdictData: v, Comment: o.UID}); err != nil {
					return err
				}
			}
		}
		if a := o.EIP.V6Address; a.IsValid() {
			if err := add(setEIPs6, nft.SetElement{Key: addr16(a), Comment: eip6Comment(o)}); err != nil {
				return err
			}
		}
		if !o.EIP.Address.IsValid() {
			return nil
		}
		return add(setEIPs, nft.SetElement{Key: addr4(o.EIP.Address), Comment: eipComment(o)})
	case nat.KindFIP:
		if o.FIP.EIP.Is6() {
			if err := add(setFIPDNAT6, nft.SetElement{Key: addr16(o.FIP.EIP), Val: addr16(o.FIP.InternalIP), Comment: o.UID}); err != nil {
				return err
			}
			return add(setFIPSNAT6, nft.SetElement{Key: addr16(o.FIP.InternalIP), Val: addr16(o.FIP.EIP), Comment: o.UID})
		}
		if err := add(setFIPDNAT, nft.SetElement{Key: addr4(o.FIP.EIP), Val: addr4(o.FIP.InternalIP), Comment: o.UID}); err != nil {
			return err
		}
		return add(setFIPSNAT, nft.SetElement{Key: addr4(o.FIP.InternalIP), Val: addr4(o.FIP.EIP), Comment: o.UID})
	case nat.KindDNAT:
		d := o.DNAT
		if d.Shared() {
			// A backend of a shared identity (of either family): its
			// elements are in the identity's map, at slots that
			// depend on the other backends (shareElems).
			if len(o.UID) > maxComment {
				return &nat.FieldError{UID: o.UID, Field: "uid", Value: o.UID, Reason: "element comment too long for the kernel"}
			}
			return nil
		}
		if d.EIP.Is6() {
			key := putPort4(append(put16(out.room(24), d.EIP), d.Protocol.Number(), 0, 0, 0), d.ExternalPort)
			return add(setPortDNAT6, nft.SetElement{Key: key, Val: putPort4(put16(out.room(20), d.InternalIP), d.InternalPort), Comment: o.UID})
		}
		key := putPort4(append(put4(out.room(12), d.EIP), d.Protocol.Number(), 0, 0, 0), d.ExternalPort)
		return add(setPortDNAT, nft.SetElement{Key: key, Val: putPort4(put4(out.room(8), d.InternalIP), d.InternalPort), Comment: o.UID})
	case nat.KindSNAT:
		c, _ := snatClassOf(o)
		if c.v6 {
			return add(c.setName(), nft.SetElement{Key: addr16(o.SNAT.InternalCIDR.Addr()), Val: addr16(o.SNAT.EIP), Comment: o.UID})
		}
		return add(c.setName(), nft.SetElement{Key: addr4(o.SNAT.InternalCIDR.Addr()), Val: addr4(o.SNAT.EIP), Comment: o.UID})
	case nat.KindRoute:
		rt := o.Route
		if rt.Destination.Addr().Is6() {
			m := prefixMask6(rt.Destination.Bits())
			return add(setRoutes6, nft.SetElement{Key: append(put16(out.room(32), rt.Destination.Addr()), m[:]...), Val: addr16(rt.NextHop), Comment: routeComment(o)})
		}
		key := binary.BigEndian.AppendUint32(put4(out.room(8), rt.Destination.Addr()), uint32(uint64(0xffffffff)<<(32-rt.Destination.Bits())))
		return add(setRoutes, nft.SetElement{Key: key, Val: addr4(rt.NextHop), Comment: routeComment(o)})
	}
	return &nat.FieldError{UID: o.UID, Field: "kind", Value: string(o.Kind), Reason: "unknown kind"}
}

// shareOf returns the identity of a share DNAT.
func shareOf(o nat.Object) (shareKey, bool) {
	if o.Kind != nat.KindDNAT || o.DNAT == nil || !o.DNAT.Shared() {
		return shareKey{}, false
	}
	return shareKeyOf(o.DNAT), true
}

// shareElems renders the backends of identity k (ordered by UID) to its
// elements of share_backends (share_backends6 for an IPv6 EIP): slot i
// (0..shareSlots(n)-1) : the internal address . internal port of backend
// i mod n, that backend's UID as comment.
func shareElems(k shareKey, backends []nat.Object) []nft.SetElement {
	n := len(backends)
	es := make([]nft.SetElement, shareSlots(n))
	for i := range es {
		o := backends[i%n]
		d := o.DNAT
		es[i] = nft.SetElement{Key: k.slotKey(i), Val: append(addrBytes(d.InternalIP), port4(d.InternalPort)...), Comment: o.UID}
	}
	return es
}

// shareMod is the identity's element of share_mod (share_mod6): its slot
// count for n backends.
func shareMod(k shareKey, n int) nft.SetElement {
	return nft.SetElement{Key: k.modKey(), Val: binary.NativeEndian.AppendUint32(nil, uint32(shareSlots(n))), Comment: shareComment}
}

// shareComment is the comment of share_mod's elements: they belong to an
// identity, not to one object.
const shareComment = "share"

// snatClassOf returns the SNAT map class of an SNAT object.
func snatClassOf(o nat.Object) (snatClass, bool) {
	if o.Kind != nat.KindSNAT || o.SNAT == nil {
		return snatClass{}, false
	}
	return snatClass{o.SNAT.InternalCIDR.Bits(), o.SNAT.RandomFully, o.SNAT.EIP.Is6()}, true
}

// splitComment returns the UID (first word) and the key=value attributes of
// an element comment.
func splitComment(c string) (string, map[string]string, error) {
	// The UID is validated with the object it belongs to (nat.State).
	if c != "" && !strings.Contains(c, " ") {
		return c, nil, nil
	}
	f := strings.Fields(c)
	if len(f) == 0 {
		return "", nil, fmt.Errorf("element without an owner UID comment")
	}
	kv := map[string]string{}
	for _, w := range f[1:] {
		k, v, ok := strings.Cut(w, "=")
		if !ok {
			return "", nil, fmt.Errorf("comment %q: bad attribute %q", c, w)
		}
		kv[k] = v
	}
	return f[0], kv, nil
}

func addrOf(b []byte) (netip.Addr, error) {
	if len(b) < 4 {
		return netip.Addr{}, fmt.Errorf("short address (%d bytes)", len(b))
	}
	return netip.AddrFrom4([4]byte(b[:4])), nil
}

// addr6Of is addrOf for an IPv6 address.
func addr6Of(b []byte) (netip.Addr, error) {
	if len(b) < 16 {
		return netip.Addr{}, fmt.Errorf("short IPv6 address (%d bytes)", len(b))
	}
	return netip.AddrFrom16([16]byte(b[:16])), nil
}

// isV6Set says whether the elements of set are keyed by an IPv6 address.
func isV6Set(set string) bool {
	switch set {
	case setEIPs6, setFIPDNAT6, setFIPSNAT6, setPortDNAT6, setRoutes6, setQoSIn6, setQoSOut6, setShareMod6, setShareBk6, setMarks6:
		return true
	}
	c, ok := parseSNATSet(set)
	return ok && c.v6
}

// parseElem turns one kernel element of set into (a part of) an object.
// Elements of the policer maps carry only their owner UID (obj is the zero
// Object, of no Kind).
func parseElem(set string, e nft.SetElement) (uid string, obj nat.Object, err error) {
	uid, kv, err := splitComment(e.Comment)
	if err != nil {
		return "", nat.Object{}, err
	}
	switch set {
	case setShareMod, setShareMod6:
		return uid, nat.Object{}, nil // the identity's slot count, checked with its backends
	case setShareBk:
		return elems4.shareSlot(uid, e)
	case setShareBk6:
		return elems6.shareSlot(uid, e)
	}
	if isV6Set(set) {
		return parseElem6(set, e, uid, kv)
	}
	k0, err := addrOf(e.Key)
	if err != nil {
		return uid, nat.Object{}, err
	}
	switch set {
	case setEIPs:
		plen, err := plenOf(k0, kv)
		if err != nil {
			return uid, nat.Object{}, err
		}
		eip := &nat.EIP{Address: k0, PrefixLen: plen}
		if v6, ok := kv["v6"]; ok {
			p, err := netip.ParsePrefix(v6)
			if err != nil || !p.Addr().Is6() {
				return uid, nat.Object{}, fmt.Errorf("eip %s: bad v6 %q", k0, v6)
			}
			eip.V6Address, eip.V6PrefixLen = p.Addr(), p.Bits()
		}
		return eipObject(uid, k0, kv, eip)
	case setQoSIn, setQoSOut:
		return uid, nat.Object{}, nil
	case setFIPDNAT, setFIPSNAT:
		return elems4.fip(uid, k0, e, set == setFIPSNAT)
	case setPortDNAT:
		return elems4.portDNAT(uid, k0, e)
	case setRoutes:
		if len(e.Key) != 8 {
			return uid, nat.Object{}, fmt.Errorf("route: bad key length %d", len(e.Key))
		}
		mask := binary.BigEndian.Uint32(e.Key[4:8])
		bits := 32 - trailingZeros(mask)
		nh, err := addrOf(e.Val)
		if err != nil {
			return uid, nat.Object{}, err
		}
		return uid, nat.Object{UID: uid, Kind: nat.KindRoute, Route: &nat.Route{
			Destination: netip.PrefixFrom(k0, bits), NextHop: nh, Device: nat.RouteDevice(kv["dev"]),
		}}, nil
	}
	return elems4.snat(uid, set, k0, e)
}

func trailingZeros(m uint32) int {
	n := 0
	for n < 32 && m&(1<<n) == 0 {
		n++
	}
	return n
}

// protocolOf is the DNAT protocol of an IANA protocol number.
func protocolOf(n uint8) (nat.Protocol, bool) {
	for _, p := range []nat.Protocol{nat.TCP, nat.UDP, nat.SCTP} {
		if p.Number() == n {
			return p, true
		}
	}
	return "", false
}

// parseElem6 is parseElem for the IPv6 sets.
func parseElem6(set string, e nft.SetElement, uid string, kv map[string]string) (string, nat.Object, error) {
	k0, err := addr6Of(e.Key)
	if err != nil {
		return uid, nat.Object{}, err
	}
	switch set {
	case setQoSIn6, setQoSOut6, setMarks6:
		// Policer and mark id elements only name their owner (the
		// mark ids are checked with the EIPs, see rebuild.finish).
		return uid, nat.Object{}, nil
	case setEIPs6:
		plen, err := plenOf(k0, kv)
		if err != nil {
			return uid, nat.Object{}, err
		}
		if _, dual := kv["v4"]; dual {
			// The IPv6 half of a dual-stack EIP: the object comes
			// from its eips element (this one only names its owner).
			return uid, nat.Object{}, nil
		}
		return eipObject(uid, k0, kv, &nat.EIP{V6Address: k0, V6PrefixLen: plen})
	case setFIPDNAT6, setFIPSNAT6:
		return elems6.fip(uid, k0, e, set == setFIPSNAT6)
	case setRoutes6:
		if len(e.Key) != 32 {
			return uid, nat.Object{}, fmt.Errorf("route6: bad key length %d", len(e.Key))
		}
		nh, err := addr6Of(e.Val)
		if err != nil {
			return uid, nat.Object{}, err
		}
		bits := 0
		for _, b := range e.Key[16:32] {
			bits += onesOf(b)
		}
		if m := prefixMask6(bits); string(m[:]) != string(e.Key[16:32]) {
			return uid, nat.Object{}, fmt.Errorf("route6 %s: netmask %x is not a prefix", k0, e.Key[16:32])
		}
		return uid, nat.Object{UID: uid, Kind: nat.KindRoute, Route: &nat.Route{
			Destination: netip.PrefixFrom(k0, bits), NextHop: nh, Device: nat.RouteDevice(kv["dev"]),
		}}, nil
	case setPortDNAT6:
		return elems6.portDNAT(uid, k0, e)
	}
	return elems6.snat(uid, set, k0, e)
}

// elemFamily is how the elements of one family's sets hold addresses: the
// width of an address in keys and values, how to read one, and the suffix
// of the family's set kinds in errors ("" for IPv4, "6" for IPv6).
type elemFamily struct {
	width  int
	addrOf func([]byte) (netip.Addr, error)
	suffix string
}

var (
	elems4 = elemFamily{width: 4, addrOf: addrOf}
	elems6 = elemFamily{width: 16, addrOf: addr6Of, suffix: "6"}
)

// fip is the FIP object of a fip_dnat element (key k0 the EIP, value the
// internal IP) or, with snat, of a fip_snat one (key the internal IP, value
// the EIP).
func (f elemFamily) fip(uid string, k0 netip.Addr, e nft.SetElement, snat bool) (string, nat.Object, error) {
	v, err := f.addrOf(e.Val)
	if err != nil {
		return uid, nat.Object{}, err
	}
	fp := &nat.FIP{EIP: k0, InternalIP: v}
	if snat {
		fp = &nat.FIP{EIP: v, InternalIP: k0}
	}
	return uid, nat.Object{UID: uid, Kind: nat.KindFIP, FIP: fp}, nil
}

// portDNAT is the DNAT object of a port_dnat element: key EIP k0 .
// protocol . external port, value internal IP . internal port (protocol
// and ports each padded to 4 bytes).
func (f elemFamily) portDNAT(uid string, k0 netip.Addr, e nft.SetElement) (string, nat.Object, error) {
	n := f.width
	if len(e.Key) != n+8 || len(e.Val) != n+4 {
		return uid, nat.Object{}, fmt.Errorf("port dnat%s: bad key/value length %d/%d", f.suffix, len(e.Key), len(e.Val))
	}
	proto, ok := protocolOf(e.Key[n])
	if !ok {
		return uid, nat.Object{}, fmt.Errorf("port dnat%s: protocol %d", f.suffix, e.Key[n])
	}
	in, _ := f.addrOf(e.Val)
	return uid, nat.Object{UID: uid, Kind: nat.KindDNAT, DNAT: &nat.DNAT{
		EIP: k0, Protocol: proto, ExternalPort: binary.BigEndian.Uint16(e.Key[n+4 : n+6]),
		InternalIP: in, InternalPort: binary.BigEndian.Uint16(e.Val[n : n+2]),
	}}, nil
}

// shareSlot is the share DNAT backend of a share_backends element: key
// EIP . protocol . external port . slot, value internal IP . internal port
// (protocol, ports and slot each 4 bytes).
func (f elemFamily) shareSlot(uid string, e nft.SetElement) (string, nat.Object, error) {
	n := f.width
	if len(e.Key) != n+12 || len(e.Val) != n+4 {
		return uid, nat.Object{}, fmt.Errorf("share dnat%s: bad key/value length %d/%d", f.suffix, len(e.Key), len(e.Val))
	}
	eip, _ := f.addrOf(e.Key)
	in, _ := f.addrOf(e.Val)
	proto, ok := protocolOf(e.Key[n])
	if !ok {
		return uid, nat.Object{}, fmt.Errorf("share dnat%s %s: unknown protocol %d", f.suffix, eip, e.Key[n])
	}
	return uid, nat.Object{UID: uid, Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: eip, Protocol: proto, ExternalPort: binary.BigEndian.Uint16(e.Key[n+4 : n+6]),
		InternalIP: in, InternalPort: binary.BigEndian.Uint16(e.Val[n : n+2]), Type: nat.DNATShare}}, nil
}

// snat is the SNAT object of an element of an SNAT map set (key the
// network address k0, value the EIP); any other set is unknown.
func (f elemFamily) snat(uid, set string, k0 netip.Addr, e nft.SetElement) (string, nat.Object, error) {
	c, ok := parseSNATSet(set)
	if !ok {
		return uid, nat.Object{}, fmt.Errorf("unknown set %q", set)
	}
	v, err := f.addrOf(e.Val)
	if err != nil {
		return uid, nat.Object{}, err
	}
	return uid, nat.Object{UID: uid, Kind: nat.KindSNAT, SNAT: &nat.SNAT{
		EIP: v, InternalCIDR: netip.PrefixFrom(k0, c.bits), RandomFully: c.randomFully,
	}}, nil
}

// plenOf is the plen= attribute of the comment of EIP k0's element.
func plenOf(k0 netip.Addr, kv map[string]string) (int, error) {
	plen, err := strconv.Atoi(kv["plen"])
	if err != nil {
		return 0, fmt.Errorf("eip %s: bad plen %q", k0, kv["plen"])
	}
	return plen, nil
}

// eipObject is the EIP object eip of element k0, with the QoS of the
// comment's qos= attribute if it has one.
func eipObject(uid string, k0 netip.Addr, kv map[string]string, eip *nat.EIP) (string, nat.Object, error) {
	if q, ok := kv["qos"]; ok {
		var err error
		if eip.QoS, err = parseQoSComment(q); err != nil {
			return uid, nat.Object{}, fmt.Errorf("eip %s: %w", k0, err)
		}
	}
	return uid, nat.Object{UID: uid, Kind: nat.KindEIP, EIP: eip}, nil
}

// onesOf counts the set bits of b.
func onesOf(b byte) int {
	n := 0
	for ; b != 0; b &= b - 1 {
		n++
	}
	return n
}

// parseQoSComment parses the qos= attribute of an EIP comment:
// inRate/inBurst/outRate/outBurst.
func parseQoSComment(q string) (*nat.QoS, error) {
	var v [4]uint32
	parts := strings.Split(q, "/")
	if len(parts) != 4 {
		return nil, fmt.Errorf("bad qos %q", q)
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("bad qos %q", q)
		}
		v[i] = uint32(n)
	}
	return &nat.QoS{IngressRateMbps: v[0], IngressBurstMbit: v[1], EgressRateMbps: v[2], EgressBurstMbit: v[3]}, nil
}
