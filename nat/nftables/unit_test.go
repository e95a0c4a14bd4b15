package nftables

import (
	"context"
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	nft "github.com/google/nftables"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nattest"
	"github.com/natgw/natgw/nat/nftconn"
)

// TestRenderParse renders every object of the golden set and parses its
// elements back: each element names the owner, and the primary element
// rebuilds the object exactly.
func TestRenderParse(t *testing.T) {
	for _, o := range goldenObjects() {
		t.Run(o.String(), func(t *testing.T) {
			es := setElems{}
			if err := renderAll([]nat.Object{o}, es); err != nil {
				t.Fatal(err)
			}
			rebuilt := 0
			for set, l := range es {
				for _, e := range l {
					uid, got, err := parseElem(set, e)
					if err != nil {
						t.Fatalf("%s: %v", set, err)
					}
					if set == setShareMod || set == setShareMod6 {
						if uid != shareComment {
							t.Errorf("%s: comment %q, want %q", set, uid, shareComment)
						}
						continue
					}
					if uid != o.UID {
						t.Errorf("%s: owner %q, want %q", set, uid, o.UID)
					}
					if got.Kind == "" {
						continue
					}
					rebuilt++
					if !got.Equal(o) {
						t.Errorf("%s: parsed %s, want %s", set, got, o)
					}
				}
			}
			if rebuilt == 0 {
				t.Error("no element rebuilds the object")
			}
		})
	}
}

// renderAll renders objs as the kernel holds them: every object's elements
// and those of each share identity (its slots, its share_mod element).
func renderAll(objs []nat.Object, out setElems) error {
	for _, o := range objs {
		if err := render(o, out); err != nil {
			return err
		}
	}
	for k, bs := range shareWanted(slices.Values(objs)) {
		for set, es := range shareRender(k, bs) {
			out[set] = append(out[set], es...)
		}
	}
	// The IPv6 EIPs' mark ids, as a table made for objs holds them.
	ch := &change{add: setElems{}}
	if _, err := (&Backend{}).markFull(ch, objs); err != nil {
		return err
	}
	out[setMarks6] = append(out[setMarks6], ch.add[setMarks6]...)
	return nil
}

func TestRenderRefuses(t *testing.T) {
	big := goldenObjects()[0]
	q := *big.EIP.QoS
	q.IngressBurstMbit = 40_000 // 5e9 bytes: not a uint32
	e := *big.EIP
	e.QoS = &q
	big.EIP = &e
	if err := render(big, setElems{}); err == nil || !strings.Contains(err.Error(), "eip.qos.ingressBurstMbit") {
		t.Errorf("render of a 40,000 Mbit burst: %v, want a field error", err)
	}
}

func TestParseElemRejects(t *testing.T) {
	for _, tc := range []struct {
		name, set string
		e         nft.SetElement
		want      string // in the error
	}{
		{"no comment", setFIPDNAT, nft.SetElement{Key: []byte{1, 2, 3, 4}, Val: []byte{5, 6, 7, 8}}, ""},
		{"short key", setFIPDNAT, nft.SetElement{Key: []byte{1}, Val: []byte{5, 6, 7, 8}, Comment: "u"}, "short address (1 bytes)"},
		{"short fip value", setFIPSNAT, nft.SetElement{Key: []byte{1, 2, 3, 4}, Val: []byte{5}, Comment: "u"}, "short address (1 bytes)"},
		{"eip without plen", setEIPs, nft.SetElement{Key: []byte{1, 2, 3, 4}, Comment: "u x=1"}, `eip 1.2.3.4: bad plen ""`},
		{"eip bad qos", setEIPs, nft.SetElement{Key: []byte{1, 2, 3, 4}, Comment: "u plen=24 qos=1/2"}, `eip 1.2.3.4: bad qos "1/2"`},
		{"port dnat protocol", setPortDNAT, nft.SetElement{Key: make([]byte, 12), Val: make([]byte, 8), Comment: "u"}, "port dnat: protocol 0"},
		{"port dnat length", setPortDNAT, nft.SetElement{Key: make([]byte, 12), Val: make([]byte, 20), Comment: "u"}, "port dnat: bad key/value length 12/20"},
		{"short snat value", "snat_p24", nft.SetElement{Key: []byte{1, 2, 3, 0}, Val: []byte{5}, Comment: "u"}, "short address (1 bytes)"},
		{"unknown set", "other", nft.SetElement{Key: []byte{1, 2, 3, 4}, Comment: "u"}, `unknown set "other"`},
		{"short IPv6 key", setFIPDNAT6, nft.SetElement{Key: make([]byte, 4), Val: make([]byte, 16), Comment: "u"}, "short IPv6 address (4 bytes)"},
		{"short fip6 value", setFIPSNAT6, nft.SetElement{Key: make([]byte, 16), Val: make([]byte, 4), Comment: "u"}, "short IPv6 address (4 bytes)"},
		{"eip6 without plen", setEIPs6, nft.SetElement{Key: make([]byte, 16), Comment: "u x=1"}, `eip ::: bad plen ""`},
		{"eip6 bad qos", setEIPs6, nft.SetElement{Key: make([]byte, 16), Comment: "u plen=64 qos=x/1/2/3"}, `eip ::: bad qos "x/1/2/3"`},
		{"port dnat6 protocol", setPortDNAT6, nft.SetElement{Key: make([]byte, 24), Val: make([]byte, 20), Comment: "u"}, "port dnat6: protocol 0"},
		{"port dnat6 length", setPortDNAT6, nft.SetElement{Key: make([]byte, 24), Val: make([]byte, 8), Comment: "u"}, "port dnat6: bad key/value length 24/8"},
		{"short snat6 value", "snat6_p64", nft.SetElement{Key: make([]byte, 16), Val: make([]byte, 4), Comment: "u"}, "short IPv6 address (4 bytes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := parseElem(tc.set, tc.e)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("parseElem(%s, %+v): error %v, want one with %q", tc.set, tc.e, err, tc.want)
			}
		})
	}
}

func TestNames(t *testing.T) {
	for _, c := range []snatClass{{0, false, false}, {8, true, false}, {24, false, false}, {32, true, false}, {0, false, true}, {64, true, true}, {128, false, true}} {
		got, ok := parseSNATSet(c.setName())
		if !ok || got != c {
			t.Errorf("parseSNATSet(%q) = %v, %v", c.setName(), got, ok)
		}
	}
	for _, bad := range []string{"snat_p33", "snat_p024", "snat_p", "snat_px_rf", "fip_snat", "snat6_p129", "snat6_p064", "snat6_p"} {
		if _, ok := parseSNATSet(bad); ok {
			t.Errorf("parseSNATSet(%q) accepted it", bad)
		}
	}
	k := qosKey{qosOut, addr("192.0.2.10")}
	if got, ok := parseQoSName(k.name()); !ok || got != k {
		t.Errorf("parseQoSName(%q) = %v, %v", k.name(), got, ok)
	}
	for _, bad := range []string{"qos_in_1_2_3", "qos_up_1_2_3_4", "qos_ingress", "qos_in_01_2_3_4"} {
		if _, ok := parseQoSName(bad); ok {
			t.Errorf("parseQoSName(%q) accepted it", bad)
		}
	}
	cs := []snatClass{{8, false, false}, {64, false, true}, {24, true, false}, {24, false, false}, {128, false, true}, {32, false, false}}
	sortSNATClasses(cs)
	want := []snatClass{{32, false, false}, {24, false, false}, {24, true, false}, {8, false, false}, {128, false, true}, {64, false, true}}
	for i := range cs {
		if cs[i] != want[i] {
			t.Fatalf("sorted classes %v, want %v", cs, want)
		}
	}
}

// TestChunks checks that no message's element list can reach the 16-bit
// attribute length, with the largest UIDs.
func TestChunks(t *testing.T) {
	objs := manyFIPs(5000, nat.MaxUIDLen)
	es := setElems{}
	for _, o := range objs {
		if err := render(o, es); err != nil {
			t.Fatal(err)
		}
	}
	l := es[setFIPDNAT]
	total := 0
	for _, part := range nftconn.Chunks(l) {
		size := 0
		for _, e := range part {
			size += nftconn.ElemSize(e)
		}
		if size > nftconn.MaxMsgElemBytes || len(part) > nftconn.MaxMsgElems || len(part) == 0 {
			t.Errorf("chunk of %d elements, %d bytes", len(part), size)
		}
		total += len(part)
	}
	if total != len(l) {
		t.Errorf("chunks hold %d elements, want %d", total, len(l))
	}
	// The bound covers the real encoding: a 64-character-UID FIP element
	// encodes to 4 (entry) + 12 (key) + 12 (value) + 4+68 (comment) bytes.
	if got := nftconn.ElemSize(l[0]); got < 100 {
		t.Errorf("elemSize = %d, below the real encoding (100 bytes)", got)
	}
}

func TestBadInterfaceName(t *testing.T) {
	_, err := NewBackend(nat.Config{NetNS: "/nonexistent", ExternalInterface: strings.Repeat("x", 16)})
	if err == nil || !strings.Contains(err.Error(), "interface name") {
		t.Errorf("NewBackend with a 16-byte interface name: %v", err)
	}
}

// TestObjectsCheck rebuilds objects from element sets as a Load reads them:
// consistent sets, the mirror shortcut, and the damage Load must see
// (missing mirror element, conflicting mirror) or must read again (an
// element twice in a dump: a torn dump, never repaired from).
func TestObjectsCheck(t *testing.T) {
	objs := goldenObjects()
	rendered := setElems{}
	if err := renderAll(objs, rendered); err != nil {
		t.Fatal(err)
	}
	shareMap := setShareBk
	with := func(edit func(m map[string][]nft.SetElement)) map[string][]nft.SetElement {
		m := map[string][]nft.SetElement{}
		for set, es := range rendered {
			m[set] = append([]nft.SetElement(nil), es...)
		}
		edit(m)
		return m
	}
	same := func(map[string][]nft.SetElement) {}
	dupFirst := func(set string) func(m map[string][]nft.SetElement) {
		return func(m map[string][]nft.SetElement) { m[set] = append(m[set], m[set][0]) }
	}
	for _, tc := range []struct {
		name             string
		mirror           bool
		elems            map[string][]nft.SetElement
		consistent, torn bool
	}{
		{"consistent", false, with(same), true, false},
		{"mirror", true, with(func(m map[string][]nft.SetElement) { delete(m, setFIPSNAT); delete(m, setFIPSNAT6) }), true, false},
		{"IPv6 mirror element missing", false, with(func(m map[string][]nft.SetElement) { m[setFIPSNAT6] = nil }), false, false},
		{"IPv6 mirror disagrees", false, with(func(m map[string][]nft.SetElement) {
			e := m[setFIPSNAT6][0]
			e.Val = addr("2001:db8::99").AsSlice()
			m[setFIPSNAT6] = []nft.SetElement{e}
		}), false, false},
		{"fip_dnat6 element twice, mirror", true, with(func(m map[string][]nft.SetElement) {
			delete(m, setFIPSNAT)
			delete(m, setFIPSNAT6)
			dupFirst(setFIPDNAT6)(m)
		}), true, true},
		{"eips6 element twice", false, with(dupFirst(setEIPs6)), true, true},
		{"eips6 half of a dual-stack EIP missing", false, with(func(m map[string][]nft.SetElement) {
			var keep []nft.SetElement
			for _, e := range m[setEIPs6] {
				if !strings.Contains(e.Comment, "v4=") {
					keep = append(keep, e)
				}
			}
			m[setEIPs6] = keep
		}), false, false},
		{"port_dnat6 element twice", false, with(dupFirst(setPortDNAT6)), true, true},
		{"mirror element missing", false, with(func(m map[string][]nft.SetElement) { m[setFIPSNAT] = nil }), false, false},
		{"mirror disagrees", false, with(func(m map[string][]nft.SetElement) {
			e := m[setFIPSNAT][0]
			e.Val = []byte{192, 0, 2, 99}
			m[setFIPSNAT] = []nft.SetElement{e}
		}), false, false},
		{"fip_dnat element twice, mirror", true, with(func(m map[string][]nft.SetElement) {
			delete(m, setFIPSNAT)
			delete(m, setFIPSNAT6)
			dupFirst(setFIPDNAT)(m)
		}), true, true},
		{"fip_dnat element twice", false, with(dupFirst(setFIPDNAT)), true, true},
		{"eips element twice", false, with(dupFirst(setEIPs)), true, true},
		{"share backends at swapped indexes", false, with(func(m map[string][]nft.SetElement) {
			es := m[shareMap]
			es[0].Comment, es[1].Comment = es[1].Comment, es[0].Comment
		}), false, false},
		{"share slot count element missing", false, with(func(m map[string][]nft.SetElement) { delete(m, setShareMod) }), false, false},
		{"share slot count wrong", false, with(func(m map[string][]nft.SetElement) {
			e := m[setShareMod][0]
			e.Val = binary.NativeEndian.AppendUint32(nil, 3)
			m[setShareMod] = []nft.SetElement{e}
		}), false, false},
		{"share slot twice", false, with(dupFirst(setShareBk)), true, true},
		{"share slot of a backend with another address", false, with(func(m map[string][]nft.SetElement) {
			e := m[setShareBk][1]
			e.Val = append([]byte{198, 51, 100, 99}, e.Val[4:]...)
			e.Key, e.Comment = shareKey{addr("192.0.2.11"), nat.TCP, 443}.slotKey(2), m[setShareBk][0].Comment
			m[setShareBk] = append(m[setShareBk], e)
		}), false, false},
		{"share backend missing", false, with(func(m map[string][]nft.SetElement) { m[shareMap] = m[shareMap][1:] }), false, false},
		{"IPv6 share slot count wrong", false, with(func(m map[string][]nft.SetElement) {
			e := m[setShareMod6][0]
			e.Val = binary.NativeEndian.AppendUint32(nil, 2)
			m[setShareMod6] = []nft.SetElement{e}
		}), false, false},
		{"IPv6 share slot count element missing", false, with(func(m map[string][]nft.SetElement) { delete(m, setShareMod6) }), false, false},
		{"IPv6 share backend missing", false, with(func(m map[string][]nft.SetElement) { m[setShareBk6] = m[setShareBk6][1:] }), false, false},
		{"IPv6 share slot twice", false, with(dupFirst(setShareBk6)), true, true},
		{"IPv6 mark id missing", false, with(func(m map[string][]nft.SetElement) { m[setMarks6] = m[setMarks6][1:] }), false, false},
		{"IPv6 mark id of another UID", false, with(func(m map[string][]nft.SetElement) {
			m[setMarks6] = slices.Clone(m[setMarks6])
			m[setMarks6][0].Comment = m[setMarks6][1].Comment
		}), false, false},
		{"IPv6 mark id used twice", false, with(func(m map[string][]nft.SetElement) {
			m[setMarks6] = slices.Clone(m[setMarks6])
			m[setMarks6][0].Val = m[setMarks6][1].Val
		}), false, false},
		{"IPv6 mark id out of range", false, with(func(m map[string][]nft.SetElement) {
			m[setMarks6] = slices.Clone(m[setMarks6])
			m[setMarks6][0].Val = binary.NativeEndian.AppendUint32(nil, 7) // a share slot count
		}), false, false},
		{"IPv6 mark id of no EIP", false, with(func(m map[string][]nft.SetElement) {
			m[setMarks6] = append(m[setMarks6], markElem(addr("2001:db8::99"), markID{m[setMarks6][0].Comment, 0x00020000}))
		}), false, false},
		{"IPv6 mark id element twice", false, with(dupFirst(setMarks6)), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			blocks := map[string][][]nft.SetElement{}
			for set, es := range tc.elems {
				blocks[set] = [][]nft.SetElement{es[:len(es)/2], es[len(es)/2:]}
			}
			k := &kernelState{elems: blocks, mirror: tc.mirror}
			st, _, consistent := k.objects(logr.Discard())
			got := st.Objects()
			if consistent != tc.consistent || k.torn != tc.torn {
				t.Errorf("consistent %v, torn %v; want %v, %v", consistent, k.torn, tc.consistent, tc.torn)
			}
			if tc.consistent && (!sameObjects(got, objs) || st.Len() != len(objs)) {
				t.Errorf("rebuilt %d objects (state %d), want %d", len(got), st.Len(), len(objs))
			}
		})
	}
}

// TestShareSlots: every backend of an identity of n backends holds
// floor(S/n) or ceil(S/n) of its S slots, S is a modulus of chain share,
// and the spread is within 1/16 of even (exact up to 8 backends and for
// powers of two).
func TestShareSlots(t *testing.T) {
	ns := []int{1000, 2047, 2048, 2049, maxShareBackends - 1, maxShareBackends}
	for n := 1; n <= 300; n++ {
		ns = append(ns, n)
	}
	for _, n := range ns {
		s := shareSlots(n)
		if !slices.Contains(shareModuli, s) {
			t.Fatalf("%d backends: %d slots, not a modulus of chain %s", n, s, chainShare)
		}
		k := shareKey{addr("192.0.2.1"), nat.TCP, 80}
		bs := make([]nat.Object, n)
		for i := range bs {
			bs[i] = nattest.ShareDNAT(nattest.UID(nat.KindDNAT, i), k.eip, nat.TCP, 80, addr("10.0.0.1"), uint16(1000+i))
		}
		held := map[string]int{}
		for _, e := range shareElems(k, bs) {
			held[e.Comment]++
		}
		even := float64(s) / float64(n)
		for _, o := range bs {
			if c := float64(held[o.UID]); c < even*15/16 || c > even*17/16 || (n <= 8 || n&(n-1) == 0) && c != even {
				t.Fatalf("%d backends over %d slots: %s holds %v slots, even is %.2f", n, s, o.UID, c, even)
			}
		}
	}
}

// TestShareChangeElementsOnly: adding or removing one backend of a share
// identity, whatever its size, is element operations on share_mod and
// share_backends only (no set, chain or rule changes: the kernel does not
// revalidate the ruleset), and the result is the rendering of the new
// backends.
func TestShareChangeElementsOnly(t *testing.T) {
	for _, fam := range []struct {
		name    string
		eip, in netip.Addr
	}{{"IPv4", addr("192.0.2.1"), addr("10.0.0.1")}, {"IPv6", addr("2001:db8::1"), addr("fd00::1")}} {
		t.Run(fam.name, func(t *testing.T) { testShareChangeElementsOnly(t, fam.eip, fam.in) })
	}
}

// testShareChangeElementsOnly is TestShareChangeElementsOnly for an
// identity of EIP eip with backends at address in.
func testShareChangeElementsOnly(t *testing.T, eip, in netip.Addr) {
	k := shareKey{eip, nat.TCP, 80}
	backend := func(i int) nat.Object {
		return nattest.ShareDNAT(nattest.UID(nat.KindDNAT, i), k.eip, nat.TCP, 80, in, uint16(1000+i))
	}
	for _, tc := range []struct {
		name     string
		from, to int // backends before and after
	}{
		{"first backend", 0, 1}, {"second", 1, 2}, {"third", 2, 3}, {"ninth", 8, 9}, {"tenth", 9, 10},
		{"65th", 64, 65}, {"last removed", 1, 0}, {"ninth removed", 9, 8}, {"third removed", 3, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Backend{share: map[shareKey][]nat.Object{}}
			var before []nat.Object
			for i := range tc.from {
				before = append(before, backend(i))
			}
			if len(before) > 0 {
				r.share[k] = before
			}
			ch := &change{}
			if tc.to > tc.from {
				r.shareChange(ch, nil, []nat.Object{backend(tc.from)})
			} else {
				r.shareChange(ch, []nat.Object{backend(tc.to)}, nil)
			}
			tx := r.plan(ch)
			ctx := context.Background()
			f := nftconn.NewFake()
			setup := &txPlan{}
			setup.createTable()
			for _, set := range []string{k.modSet(), k.bkSet()} {
				setup.addSet(specOf(set))
			}
			for set, es := range shareRender(k, before) {
				setup.addElements(set, es, false)
			}
			if err := f.Apply(ctx, &setup.tx); err != nil {
				t.Fatal(err)
			}
			for i, line := range strings.Split(strings.TrimSuffix(tx.tx.String(), "\n"), "\n") {
				if !strings.HasPrefix(line, "add element ") && !strings.HasPrefix(line, "delete element ") {
					t.Fatalf("command %d is not an element operation: %s", i+1, line)
				}
			}
			if err := f.Apply(ctx, &tx.tx); err != nil {
				t.Fatalf("the change: %v\n%s", err, tx.tx.String())
			}
			r.commitShare(ch)
			want, got := 0, 0
			for _, set := range []string{k.modSet(), k.bkSet()} {
				spec := specOf(set).conn()
				els, err := f.MapElements(ctx, mainTable, nftconn.MapName(set))
				if err != nil {
					t.Fatal(err)
				}
				got += len(els)
				texts := map[string]string{}
				for _, e := range els {
					texts[spec.KeyText(e.Key)] = e.Text
				}
				es := shareRender(k, r.share[k])[set]
				want += len(es)
				for _, e := range es {
					if g := texts[spec.KeyText(e.Key)]; g != spec.ElementText(e) {
						t.Errorf("%s: %q, want %q", set, g, spec.ElementText(e))
					}
				}
			}
			if got != want || len(r.share[k]) != tc.to {
				t.Errorf("%d elements and %d backends after the change, want %d and %d", got, len(r.share[k]), want, tc.to)
			}
		})
	}
}
