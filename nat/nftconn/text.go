package nftconn

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// The nft text of set elements and limit objects, rendered from their
// types when a transaction or a Fake is shown (a Set's elements carry no
// text: a 100,000-FIP Sync cannot afford one per element).

// TypeText is the set's type as nft writes it: `ipv4_addr . inet_proto`,
// `ipv4_addr : verdict`.
func (s Set) TypeText() string {
	t := fieldsText(s.Key)
	if s.IsMap() {
		t += " : " + fieldsText(s.Data)
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

// KeyText is key, a key of s, as nft writes it.
func (s Set) KeyText(key []byte) string { return valueText(s.Key, key) }

// ElementText is e, an element of s, as nft lists it: `key [comment "c"]
// [: value]`.
func (s Set) ElementText(e nft.SetElement) string {
	t := valueText(s.Key, e.Key)
	if e.Comment != "" {
		t += " comment " + strconv.Quote(e.Comment)
	}
	switch {
	case e.VerdictData != nil:
		t += " : " + verdictText(e.VerdictData)
	case s.IsMap() && s.Data.Name == nft.TypeMark.Name && len(e.Val) == 4:
		// A mark as map data is host order in the kernel, like the ct
		// mark it is copied to, but nft, without the data byte order in
		// the set's user data (google/nftables does not write it), prints
		// it as big endian: 2 shows as 0x02000000.
		t += fmt.Sprintf(" : 0x%08x", binary.BigEndian.Uint32(e.Val))
	case s.IsMap():
		t += " : " + valueText(s.Data, e.Val)
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

// LimitText is a limit object's spec as nft lists it: `rate over 15625
// kbytes/second burst 3 kbytes` (nft shows byte counts in the largest unit
// that divides them; packet limits as `N/unit burst N packets`).
func LimitText(l expr.Limit) string {
	over := ""
	if l.Over {
		over = "over "
	}
	unit := limitUnits[l.Unit]
	if unit == "" {
		unit = fmt.Sprintf("unit%d", l.Unit)
	}
	if l.Type != expr.LimitTypePktBytes {
		s := fmt.Sprintf("rate %s%d/%s", over, l.Rate, unit)
		if l.Burst > 0 {
			s += fmt.Sprintf(" burst %d packets", l.Burst)
		}
		return s
	}
	rate, bu := byteUnit(l.Rate)
	s := fmt.Sprintf("rate %s%d %s/%s", over, rate, bu, unit)
	if l.Burst > 0 {
		burst, bu := byteUnit(uint64(l.Burst))
		s += fmt.Sprintf(" burst %d %s", burst, bu)
	}
	return s
}

var limitUnits = map[expr.LimitTime]string{
	expr.LimitTimeSecond: "second", expr.LimitTimeMinute: "minute", expr.LimitTimeHour: "hour",
	expr.LimitTimeDay: "day", expr.LimitTimeWeek: "week",
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
