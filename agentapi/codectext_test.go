package agentapi

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"

	"github.com/natgw/natgw/nat"
)

// addrCases are addresses the fast paths must write and read as netip
// does: every octet width, zeros, the ends of the range, and what the
// IPv4 fast path leaves to netip (IPv6, IPv4-mapped, zones, the zero
// Addr).
func addrCases() []netip.Addr {
	var out []netip.Addr
	for _, s := range []string{"0.0.0.0", "255.255.255.255", "1.2.3.4", "10.0.0.1", "100.64.9.99",
		"192.0.2.10", "8.80.200.250", "2001:db8::1", "::ffff:1.2.3.4", "fe80::1%eth0", "::"} {
		out = append(out, netip.MustParseAddr(s))
	}
	for i := range 256 {
		out = append(out, netip.AddrFrom4([4]byte{byte(i), byte(255 - i), byte(i * 7), byte(i / 3)}))
	}
	return append(out, netip.Addr{})
}

// TestAppendAddr: appendAddr writes json.Marshal's bytes for an address.
func TestAppendAddr(t *testing.T) {
	for _, a := range addrCases() {
		want, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendAddr([]byte("x"), a); !bytes.Equal(got, append([]byte("x"), want...)) {
			t.Errorf("%v: got %s, want x%s", a, got, want)
		}
	}
}

// TestParseIPv4: the IPv4 fast path gives ParseAddr's address for every
// dotted quad ParseAddr takes, and leaves the rest to it.
func TestParseIPv4(t *testing.T) {
	for _, a := range addrCases() {
		s := a.String()
		got, ok := parseIPv4([]byte(s))
		if want := a.Is4(); ok != want {
			t.Errorf("%q: fast path ok = %v, want %v", s, ok, want)
		}
		if ok && got != a {
			t.Errorf("%q: got %v, want %v", s, got, a)
		}
	}
	for _, s := range []string{"", "1.2.3", "1.2.3.4.5", "01.2.3.4", "1.2.3.04", "1.2.3.256", "1.2.3.1000",
		"1..3.4", ".1.2.3", "1.2.3.", "1.2.3.4 ", "+1.2.3.4", "1.2.3.-4", "00.1.2.3", "1.2.3.4/32", "::1"} {
		if a, ok := parseIPv4([]byte(s)); ok {
			t.Errorf("%q: fast path took it as %v; netip.ParseAddr refuses it", s, a)
		}
	}
}

// FuzzParseIPv4: whatever the IPv4 fast path takes, netip.ParseAddr takes
// as the same address; and a dotted quad ParseAddr takes, the fast path
// takes.
func FuzzParseIPv4(f *testing.F) {
	for _, s := range []string{"1.2.3.4", "255.255.255.255", "0.0.0.0", "01.2.3.4", "1.2.3.256", "1.2.3", "::1", "1.2.3.4%x"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fast, ok := parseIPv4(data)
		slow, err := netip.ParseAddr(string(data))
		if ok && (err != nil || slow != fast) {
			t.Fatalf("%q: fast %v, netip %v (%v)", data, fast, slow, err)
		}
		if !ok && err == nil && slow.Is4() {
			t.Fatalf("%q: netip takes it as %v, the fast path does not", data, slow)
		}
	})
}

// TestFastDecodeInterns: the fast decoder gives the same request as
// encoding/json for known and unknown kinds, protocols and ops (the known
// ones come back without allocating).
func TestFastDecodeInterns(t *testing.T) {
	objs := []nat.Object{
		{UID: "f", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netip.MustParseAddr("192.0.2.1"), InternalIP: netip.MustParseAddr("10.0.0.1")}},
		{UID: "k", Kind: "fipx", FIP: &nat.FIP{}},
		{UID: "k2", Kind: "fi", FIP: &nat.FIP{}},
		{UID: "d", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: netip.MustParseAddr("192.0.2.1"), Protocol: nat.UDP, ExternalPort: 1, InternalIP: netip.MustParseAddr("10.0.0.1"), InternalPort: 2}},
		{UID: "d2", Kind: nat.KindDNAT, DNAT: &nat.DNAT{Protocol: "sctp"}},
	}
	for _, op := range []string{OpApply, OpSync, "syncx", "sy"} {
		line := appendRequest(nil, Request{ID: 1, Op: op, Objects: objs})
		fast, ok := fastRequest(line)
		slow, err := decodeStrict(line)
		if !ok || err != nil || !reflect.DeepEqual(fast, slow) {
			t.Errorf("%s (fast ok %v, slow err %v):\nfast %+v\nslow %+v", line, ok, err, fast, slow)
		}
	}
	line := appendRequest(nil, Request{ID: 1, Op: OpSync, Objects: objs[:1]})
	if n := testing.AllocsPerRun(10, func() { fastRequest(line) }); n > 4 {
		t.Errorf("fast decode of one FIP: %v allocations, want at most 4 (objects, UID, FIP, and slack)", n)
	}
}

// TestStrRun: strRun gives the length of the prefix of bytes in strByte,
// as the table says, for every byte at every position of a word and
// across words; plain agrees with plainByte.
func TestStrRun(t *testing.T) {
	base := []byte("0123456789abcdef0123456789abcdef-xyz")
	for pos := 0; pos < 20; pos++ {
		for c := range 256 {
			s := append([]byte(nil), base[:pos+3]...)
			s[pos] = byte(c)
			want := 0
			for want < len(s) && strByte[s[want]] {
				want++
			}
			if got := strRun(s); got != want {
				t.Fatalf("strRun(%q) = %d, want %d", s, got, want)
			}
			if got, want := plain(string(s)), plainByte[byte(c)]; got != want {
				t.Fatalf("plain(%q) = %v, want %v", s, got, want)
			}
		}
	}
}

// FuzzStrRun: strRun agrees with the table on any bytes.
func FuzzStrRun(f *testing.F) {
	f.Add([]byte("00000001-f111-4000-8000-a00000000001"))
	f.Add([]byte("abcdefgh\x7f<>&\"\\\x00\xff"))
	f.Fuzz(func(t *testing.T, s []byte) {
		want := 0
		for want < len(s) && strByte[s[want]] {
			want++
		}
		if got := strRun(s); got != want {
			t.Fatalf("strRun(%q) = %d, want %d", s, got, want)
		}
	})
}
