package agentapi

import (
	"encoding/binary"
	"net/netip"
	"strconv"
)

// The codec's text pieces: which bytes of a string pass as they are, and
// IPv4 addresses written and read without netip's general text code
// (together most of the instructions of a FIP's encoding and decoding).

// plainByte[c] says that encoding/json writes byte c of a string as is:
// printable ASCII other than the quote, the backslash and the HTML
// characters it escapes.
var plainByte = byteSet(func(c byte) bool {
	return c >= 0x20 && c <= 0x7e && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
})

// strByte[c] says that the fast decoder takes byte c inside a string:
// printable ASCII other than the quote (which ends it) and the backslash
// (escapes are left to encoding/json).
var strByte = byteSet(func(c byte) bool { return c >= 0x20 && c <= 0x7e && c != '"' && c != '\\' })

func byteSet(in func(byte) bool) (t [256]bool) {
	for c := range 256 {
		t[c] = in(byte(c))
	}
	return t
}

// Words of eight equal bytes, for run's tests of eight bytes at once.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// strRun returns the length of the longest prefix of b whose bytes are
// all in strByte: what str takes of a string. Eight bytes at a time it
// rules out the bytes strByte does not hold; a word that may hold one is
// decided byte by byte. TestStrRun holds it to the table.
func strRun(b []byte) int {
	i := 0
	for ; i+8 <= len(b) && !odd(binary.LittleEndian.Uint64(b[i:])); i += 8 {
	}
	for ; i < len(b) && strByte[b[i]]; i++ {
	}
	return i
}

// odd says that the eight bytes of w may hold one that strByte does not
// (a byte < 0x20 or ≥ 0x7f, the quote or the backslash): a false alarm is
// possible, a miss is not.
func odd(w uint64) bool {
	return ((w-0x20*ones)|(w+0x01*ones)|w|zeroBytes(w^('"'*ones))|zeroBytes(w^('\\'*ones)))&highs != 0
}

// zeroBytes sets the high bit of every byte of the result whose byte in w
// is zero (and may set it for bytes above a zero byte, and other bits:
// callers only ask whether any high bit is set).
func zeroBytes(w uint64) uint64 { return (w - ones) &^ w }

// plain reports whether s needs no escaping in encoding/json's output.
// (A table loop: eight bytes at a time, as strRun reads, measured no
// faster here.)
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		if !plainByte[s[i]] {
			return false
		}
	}
	return true
}

// decimal[i] is the decimal text of i (an IPv4 address's octets).
var decimal = func() (t [256]string) {
	for i := range t {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

// appendAddr appends a as its quoted text form, like appendText; an IPv4
// address is written here, octet by octet. TestAppendAddr holds it to
// encoding/json's.
func appendAddr(b []byte, a netip.Addr) []byte {
	if !a.Is4() {
		return appendText(b, a)
	}
	v := a.As4()
	b = append(b, '"')
	b = append(b, decimal[v[0]]...)
	b = append(b, '.')
	b = append(b, decimal[v[1]]...)
	b = append(b, '.')
	b = append(b, decimal[v[2]]...)
	b = append(b, '.')
	b = append(b, decimal[v[3]]...)
	return append(b, '"')
}

// ipv4Prefix reads a dotted quad at the start of b as netip.ParseAddr
// takes one (four decimal octets of at most 255, no leading zeros) and
// returns its bytes and length; ok is false when b does not start with
// one. The caller checks what follows (a dotted quad followed by more
// digits or dots is not an address).
func ipv4Prefix(b []byte) (v [4]byte, n int, ok bool) {
	for f := range 4 {
		if f > 0 {
			if n >= len(b) || b[n] != '.' {
				return v, 0, false
			}
			n++
		}
		if n >= len(b) || b[n]-'0' > 9 {
			return v, 0, false
		}
		x := uint(b[n] - '0')
		n++
		if n < len(b) && b[n]-'0' <= 9 {
			if x == 0 {
				return v, 0, false // a leading zero
			}
			x = x*10 + uint(b[n]-'0')
			n++
			if n < len(b) && b[n]-'0' <= 9 {
				x = x*10 + uint(b[n]-'0')
				n++
			}
		}
		if x > 255 {
			return v, 0, false
		}
		v[f] = byte(x)
	}
	return v, n, true
}

// parseIPv4 parses t when it is a dotted quad as netip.ParseAddr takes it;
// ok is false for anything else, which ParseAddr then judges.
// FuzzParseIPv4 holds it to ParseAddr.
func parseIPv4(t []byte) (netip.Addr, bool) {
	v, n, ok := ipv4Prefix(t)
	if !ok || n != len(t) {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4(v), true
}
