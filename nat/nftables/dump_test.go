package nftables

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat/nftconn"
)

// encodeElemList encodes one NEWSETELEM payload (after the nfgenmsg
// header) with a single element of a set (key and comment), as the
// kernel sends it.
func encodeElemList(t *testing.T, key []byte, comment string) []byte {
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

// TestDecodeMetaCopies: the natgw_meta element decoded from a dump buffer
// stays intact once the buffer is reused for the next reply (a key left
// pointing into it made Load find no boot id and recreate the table).
func TestDecodeMetaCopies(t *testing.T) {
	b := encodeElemList(t, metaKey, metaComment("0123"))
	var m metaElem
	if err := nftconn.ElemList(b, func(v []byte) error {
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
