package nftables

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"reflect"
	"strings"
	"testing"

	nft "github.com/google/nftables"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// encodeElemList encodes one NEWSETELEM payload (after the nfgenmsg
// header) with a single element, as the kernel sends it.
func encodeElemList(t *testing.T, key, val []byte, verdictChain, comment string) []byte {
	t.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.String(unix.NFTA_SET_ELEM_LIST_TABLE, tableName)
	ae.String(unix.NFTA_SET_ELEM_LIST_SET, "x")
	ae.Nested(unix.NFTA_SET_ELEM_LIST_ELEMENTS, func(l *netlink.AttributeEncoder) error {
		l.Nested(unix.NFTA_LIST_ELEM, func(e *netlink.AttributeEncoder) error {
			e.Nested(unix.NFTA_SET_ELEM_KEY, func(d *netlink.AttributeEncoder) error {
				d.Bytes(unix.NFTA_DATA_VALUE, key)
				return nil
			})
			switch {
			case verdictChain != "":
				e.Nested(unix.NFTA_SET_ELEM_DATA, func(d *netlink.AttributeEncoder) error {
					d.Nested(unix.NFTA_DATA_VERDICT, func(v *netlink.AttributeEncoder) error {
						v.ByteOrder = binary.BigEndian // as the kernel sends it
						code := int32(unix.NFT_GOTO)
						v.Uint32(unix.NFTA_VERDICT_CODE, uint32(code))
						v.String(unix.NFTA_VERDICT_CHAIN, verdictChain)
						return nil
					})
					return nil
				})
			case val != nil:
				e.Nested(unix.NFTA_SET_ELEM_DATA, func(d *netlink.AttributeEncoder) error {
					d.Bytes(unix.NFTA_DATA_VALUE, val)
					return nil
				})
			}
			e.Bytes(unix.NFTA_SET_ELEM_USERDATA, userdata.AppendString(nil, userdata.NFTNL_UDATA_SET_ELEM_COMMENT, comment))
			return nil
		})
		return nil
	})
	b, err := ae.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeAll decodes every element of one NEWSETELEM payload.
func decodeAll(b []byte) ([]nft.SetElement, error) {
	var es []nft.SetElement
	err := decodeElemList(b, func(b []byte) error {
		e, err := decodeElem(b)
		if err == nil {
			es = append(es, e)
		}
		return err
	})
	return es, err
}

// TestDecodeElemList decodes elements as the kernel encodes them, and
// refuses (without panicking) every truncation of one.
func TestDecodeElemList(t *testing.T) {
	for _, tc := range []struct {
		name         string
		key, val     []byte
		chain, cmt   string
		wantVerdict  bool
		wantValueNil bool
	}{
		{name: "map", key: []byte{192, 0, 2, 10}, val: []byte{198, 51, 100, 10}, cmt: "uid-1"},
		{name: "set", key: []byte{192, 0, 2, 10}, cmt: "uid-2 plen=24", wantValueNil: true},
		{name: "verdict map", key: []byte{192, 0, 2, 10}, chain: "qos_in_192_0_2_10", cmt: "uid-3", wantVerdict: true, wantValueNil: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := encodeElemList(t, tc.key, tc.val, tc.chain, tc.cmt)
			es, err := decodeAll(b)
			if err != nil {
				t.Fatal(err)
			}
			if len(es) != 1 {
				t.Fatalf("got %d elements, want 1", len(es))
			}
			e := es[0]
			if !bytes.Equal(e.Key, tc.key) || e.Comment != tc.cmt || (e.Val == nil) != tc.wantValueNil || (tc.val != nil && !bytes.Equal(e.Val, tc.val)) {
				t.Errorf("got key %x val %x comment %q, want %x %x %q", e.Key, e.Val, e.Comment, tc.key, tc.val, tc.cmt)
			}
			if tc.wantVerdict && (e.VerdictData == nil || e.VerdictData.Chain != tc.chain || e.VerdictData.Kind != -4 /* NFT_GOTO */) {
				t.Errorf("verdict %+v, want goto %s", e.VerdictData, tc.chain)
			}
			// Every truncation decodes without a panic; one that cuts
			// into the element must not yield it intact.
			for n := range len(b) {
				es, err := decodeAll(b[:n])
				if err == nil && len(es) > 0 && n < len(b)-3 { // more than the trailing padding cut
					t.Errorf("truncated to %d of %d bytes: decoded intact", n, len(b))
				}
			}
		})
	}
}

// TestDecodeMetaCopies: the natgw_meta element decoded from a dump buffer
// stays intact once the buffer is reused for the next reply (a key left
// pointing into it made Load find no boot id and recreate the table).
func TestDecodeMetaCopies(t *testing.T) {
	b := encodeElemList(t, metaKey, nil, "", metaComment("0123"))
	var m metaElem
	if err := decodeElemList(b, func(v []byte) error {
		var err error
		m, err = decodeMeta(v)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = 0xff // the next reply
	}
	if got, broken := parseMeta([]metaElem{m}); broken != "" || got.boot != "0123" {
		t.Errorf("after the buffer's reuse: boot %q, broken %q; want boot 0123", got.boot, broken)
	}
}

// TestParseMeta: parseMeta finds the element with the meta key, checks
// its layout and boot id, and returns it whole (the generation, snapshot
// and fingerprint readKernel decides the mirror condition from).
func TestParseMeta(t *testing.T) {
	good := metaElem{key: metaKey, comment: metaComment("b00t"), gen: 7, hasGen: true, snap: 9, rules: 11}
	other := metaElem{key: []byte{9, 9, 9, 9}, comment: metaComment("other")}
	for _, tc := range []struct {
		name   string
		es     []metaElem
		want   metaElem // its boot set
		broken string
	}{
		{"none", nil, metaElem{}, "no boot id"},
		{"other key only", []metaElem{other}, metaElem{}, "no boot id"},
		{"found after another key", []metaElem{other, good}, withBoot(good, "b00t"), ""},
		{"without generation", []metaElem{{key: metaKey, comment: metaComment("x")}}, metaElem{key: metaKey, comment: metaComment("x"), boot: "x"}, ""},
		{"older layout", []metaElem{{key: metaKey, comment: "natgw layout=3 boot=x"}}, metaElem{},
			fmt.Sprintf("meta element %q: not layout %d", "natgw layout=3 boot=x", LayoutVersion)},
		{"not natgw's", []metaElem{{key: metaKey, comment: "kube layout=4 boot=x"}}, metaElem{}, "not layout"},
		{"no boot", []metaElem{{key: metaKey, comment: fmt.Sprintf("natgw layout=%d boot=", LayoutVersion)}}, metaElem{}, "no boot id"},
		{"no boot field", []metaElem{{key: metaKey, comment: fmt.Sprintf("natgw layout=%d id=x", LayoutVersion)}}, metaElem{}, "no boot id"},
		{"empty comment", []metaElem{{key: metaKey}}, metaElem{}, "not layout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, broken := parseMeta(tc.es)
			if tc.broken == "" && broken != "" || !strings.Contains(broken, tc.broken) {
				t.Fatalf("broken %q, want %q", broken, tc.broken)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func withBoot(m metaElem, boot string) metaElem {
	m.boot = boot
	return m
}
