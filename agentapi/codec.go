package agentapi

import (
	"encoding/json"
	"net/netip"
	"strconv"

	"github.com/natgw/natgw/nat"
)

// The wire format is JSON as encoding/json writes and reads it. A sync or a
// list carries every object of a gateway (100,000 FIPs are ~12 MB), and
// encoding/json's reflection spends a quarter of a second on each side of
// such a line. This file holds the fast paths: an encoder that writes
// exactly json.Marshal's bytes for requests and responses, and a decoder
// that accepts only that canonical form (keys in field order, no spaces, no
// escapes) and hands anything else to encoding/json. Either way the result is
// the same; the fast decoder just gives up early instead of explaining.
// Tests check both properties against encoding/json, also by fuzzing.
// Kept because it wins by a wide margin at 100k objects (BenchmarkSyncLine100k, BenchmarkSyncLine100kJSONv2:
// 2-5x over encoding/json and json/v2). A field added to nat.Object goes
// into appendObject and scanner.object; TestCodecCoversEveryField fills
// every field of nat.Object by reflection and fails until both have it.

// appendRequest appends req as json.Marshal encodes it.
func appendRequest(b []byte, req Request) []byte {
	b = append(b, `{"id":`...)
	b = strconv.AppendUint(b, req.ID, 10)
	b = append(b, `,"op":`...)
	b = appendString(b, req.Op)
	if len(req.Objects) > 0 {
		b = append(b, `,"objects":`...)
		b = appendObjects(b, req.Objects)
	}
	if len(req.UIDs) > 0 {
		b = append(b, `,"uids":[`...)
		for i, u := range req.UIDs {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, u)
		}
		b = append(b, ']')
	}
	if req.Fresh {
		b = append(b, `,"fresh":true`...)
	}
	if len(req.QoS) > 0 {
		// A few rules: encoding/json's bytes, no fast path needed.
		q, err := json.Marshal(req.QoS)
		if err == nil {
			b = append(b, `,"qos":`...)
			b = append(b, q...)
		}
	}
	return append(b, '}')
}

// marshalResponse encodes resp as json.Marshal does.
func marshalResponse(resp Response) ([]byte, error) {
	if resp.Error != nil || resp.Info != nil || resp.Changed {
		return json.Marshal(resp) // small; not worth a fast path
	}
	b := make([]byte, 0, 64+len(resp.Objects)*128)
	b = append(b, `{"id":`...)
	b = strconv.AppendUint(b, resp.ID, 10)
	b = append(b, `,"ok":`...)
	b = strconv.AppendBool(b, resp.OK)
	if len(resp.Objects) > 0 {
		b = append(b, `,"objects":`...)
		b = appendObjects(b, resp.Objects)
	}
	return append(b, '}'), nil
}

func appendObjects(b []byte, objs []nat.Object) []byte {
	b = append(b, '[')
	for i := range objs {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendObject(b, &objs[i])
	}
	return append(b, ']')
}

// appendObject appends o as json.Marshal encodes a nat.Object.
func appendObject(b []byte, o *nat.Object) []byte {
	b = append(b, `{"uid":`...)
	b = appendString(b, o.UID)
	b = append(b, `,"kind":`...)
	b = appendString(b, string(o.Kind))
	if e := o.EIP; e != nil {
		b = append(b, `,"eip":{"address":`...)
		b = appendAddr(b, e.Address)
		b = append(b, `,"prefixLen":`...)
		b = strconv.AppendInt(b, int64(e.PrefixLen), 10)
		if e.V6Address.IsValid() {
			b = append(b, `,"v6Address":`...)
			b = appendAddr(b, e.V6Address)
		}
		if e.V6PrefixLen != 0 {
			b = append(b, `,"v6PrefixLen":`...)
			b = strconv.AppendInt(b, int64(e.V6PrefixLen), 10)
		}
		if q := e.QoS; q != nil {
			b = append(b, `,"qos":{`...)
			n := 0
			for _, f := range [...]struct {
				name string
				v    uint32
			}{{"ingressRateMbps", q.IngressRateMbps}, {"ingressBurstMbit", q.IngressBurstMbit},
				{"egressRateMbps", q.EgressRateMbps}, {"egressBurstMbit", q.EgressBurstMbit}} {
				if f.v == 0 {
					continue
				}
				if n > 0 {
					b = append(b, ',')
				}
				n++
				b = append(b, '"')
				b = append(b, f.name...)
				b = append(b, `":`...)
				b = strconv.AppendUint(b, uint64(f.v), 10)
			}
			b = append(b, '}')
		}
		b = append(b, '}')
	}
	if f := o.FIP; f != nil {
		b = append(b, `,"fip":{"eip":`...)
		b = appendAddr(b, f.EIP)
		b = append(b, `,"internalIP":`...)
		b = appendAddr(b, f.InternalIP)
		b = append(b, '}')
	}
	if d := o.DNAT; d != nil {
		b = append(b, `,"dnat":{"eip":`...)
		b = appendAddr(b, d.EIP)
		b = append(b, `,"protocol":`...)
		b = appendString(b, string(d.Protocol))
		b = append(b, `,"externalPort":`...)
		b = strconv.AppendUint(b, uint64(d.ExternalPort), 10)
		b = append(b, `,"internalIP":`...)
		b = appendAddr(b, d.InternalIP)
		b = append(b, `,"internalPort":`...)
		b = strconv.AppendUint(b, uint64(d.InternalPort), 10)
		if d.Type != "" {
			b = append(b, `,"type":`...)
			b = appendString(b, string(d.Type))
		}
		b = append(b, '}')
	}
	if s := o.SNAT; s != nil {
		b = append(b, `,"snat":{"eip":`...)
		b = appendAddr(b, s.EIP)
		b = append(b, `,"internalCIDR":`...)
		b = appendText(b, s.InternalCIDR)
		if s.RandomFully {
			b = append(b, `,"randomFully":true`...)
		}
		b = append(b, '}')
	}
	if r := o.Route; r != nil {
		b = append(b, `,"route":{"destination":`...)
		b = appendText(b, r.Destination)
		b = append(b, `,"nextHop":`...)
		b = appendAddr(b, r.NextHop)
		b = append(b, `,"device":`...)
		b = appendString(b, string(r.Device))
		b = append(b, '}')
	}
	return append(b, '}')
}

func appendString(b []byte, s string) []byte {
	if !plain(s) {
		q, _ := json.Marshal(s) // never fails for a string
		return append(b, q...)
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendText appends an address or prefix as its quoted text form, like
// encoding/json does through MarshalText (the zero value is "").
func appendText[T interface{ AppendText([]byte) ([]byte, error) }](b []byte, v T) []byte {
	b = append(b, '"')
	b, _ = v.AppendText(b) // netip's AppendText never fails
	return append(b, '"')
}

// scanner reads the canonical form; any deviation sets bad, and the caller
// falls back to encoding/json.
type scanner struct {
	b   []byte
	i   int
	bad bool
}

// lit consumes s exactly.
func (s *scanner) lit(lit string) bool {
	if s.bad || len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		s.bad = true
		return false
	}
	s.i += len(lit)
	return true
}

// next says that the input continues with `,"` and c: the first letter of
// an optional key, checked before peek compares the whole key.
func (s *scanner) next(c byte) bool {
	return len(s.b)-s.i > 2 && s.b[s.i] == ',' && s.b[s.i+1] == '"' && s.b[s.i+2] == c
}

// peek consumes lit when the input continues with it.
func (s *scanner) peek(lit string) bool {
	if s.bad || len(s.b)-s.i < len(lit) || string(s.b[s.i:s.i+len(lit)]) != lit {
		return false
	}
	s.i += len(lit)
	return true
}

// str reads a string without escapes; it returns the raw bytes.
func (s *scanner) str() []byte {
	if !s.lit(`"`) {
		return nil
	}
	b := s.b[s.i:]
	j := strRun(b)
	if j == len(b) || b[j] != '"' {
		s.bad = true // escapes and non-ASCII: let encoding/json judge
		return nil
	}
	s.i += j + 1
	return b[:j]
}

// name reads a string that is most often one of known (a kind, a
// protocol): that one is returned without allocating a new string.
func name[T ~string](s *scanner, known []T) T {
	t := s.str()
	for _, k := range known {
		if string(t) == string(k) {
			return k
		}
	}
	return T(t)
}

// Values name returns without allocating.
var (
	protocols = []nat.Protocol{nat.TCP, nat.UDP}
	ops       = []string{OpApply, OpDelete, OpList, OpSync, OpInfo, OpGatewayQoS}
)

// uint reads an unsigned integer in canonical form that fits in bits.
func (s *scanner) uint(bits int) uint64 {
	if s.bad {
		return 0
	}
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	d := s.b[start:s.i]
	if len(d) == 0 || len(d) > 1 && d[0] == '0' || len(d) > 20 {
		s.bad = true
		return 0
	}
	v, err := strconv.ParseUint(string(d), 10, bits)
	if err != nil {
		s.bad = true
		return 0
	}
	return v
}

// addr reads a string holding an address; a dotted quad is parsed in
// place (ipv4Prefix), anything else by netip.ParseAddr.
func (s *scanner) addr() netip.Addr {
	if !s.bad && s.i < len(s.b) && s.b[s.i] == '"' {
		rest := s.b[s.i+1:]
		if v, n, ok := ipv4Prefix(rest); ok && n < len(rest) && rest[n] == '"' {
			s.i += n + 2
			return netip.AddrFrom4(v)
		}
	}
	t := s.str()
	if s.bad || len(t) == 0 {
		return netip.Addr{}
	}
	a, err := netip.ParseAddr(string(t))
	if err != nil {
		s.bad = true
	}
	return a
}

func (s *scanner) prefix() netip.Prefix { return scanText(s, netip.ParsePrefix) }

// scanText reads a string holding the text form of a netip value; "" is the
// zero value, as netip's UnmarshalText has it.
func scanText[T any](s *scanner, parse func(string) (T, error)) T {
	var v T
	t := s.str()
	if s.bad || len(t) == 0 {
		return v
	}
	v, err := parse(string(t))
	if err != nil {
		s.bad = true
	}
	return v
}

// objects reads a non-empty array of objects.
func (s *scanner) objects() []nat.Object {
	if !s.lit("[") {
		return nil
	}
	// One object is at least ~80 bytes of a FIP line: a good first guess.
	objs := make([]nat.Object, 0, max(1, (len(s.b)-s.i)/110))
	for !s.bad {
		objs = append(objs, nat.Object{})
		s.object(&objs[len(objs)-1])
		if s.peek("]") {
			return objs
		}
		s.lit(",")
	}
	return nil
}

func (s *scanner) object(o *nat.Object) {
	s.lit(`{"uid":`)
	o.UID = string(s.str())
	s.lit(`,"kind":`)
	o.Kind = name(s, nat.Kinds)
	if s.next('e') && s.peek(`,"eip":{"address":`) {
		e := &nat.EIP{Address: s.addr()}
		s.lit(`,"prefixLen":`)
		e.PrefixLen = int(s.uint(31)) // non-negative and fits any int
		if s.peek(`,"v6Address":`) {
			e.V6Address = s.addr()
		}
		if s.peek(`,"v6PrefixLen":`) {
			e.V6PrefixLen = int(s.uint(31))
		}
		if s.peek(`,"qos":{`) {
			q := &nat.QoS{}
			first := true
			for _, f := range [...]struct {
				name string
				v    *uint32
			}{{"ingressRateMbps", &q.IngressRateMbps}, {"ingressBurstMbit", &q.IngressBurstMbit},
				{"egressRateMbps", &q.EgressRateMbps}, {"egressBurstMbit", &q.EgressBurstMbit}} {
				key := `,"` + f.name + `":`
				if first {
					key = key[1:]
				}
				if s.peek(key) {
					if *f.v = uint32(s.uint(32)); *f.v == 0 {
						s.bad = true // json.Marshal omits zeros
					}
					first = false
				}
			}
			s.lit("}")
			e.QoS = q
		}
		s.lit("}")
		o.EIP = e
	}
	if s.next('f') && s.peek(`,"fip":{"eip":`) {
		f := &nat.FIP{EIP: s.addr()}
		s.lit(`,"internalIP":`)
		f.InternalIP = s.addr()
		s.lit("}")
		o.FIP = f
	}
	if s.next('d') && s.peek(`,"dnat":{"eip":`) {
		d := &nat.DNAT{EIP: s.addr()}
		s.lit(`,"protocol":`)
		d.Protocol = name(s, protocols)
		s.lit(`,"externalPort":`)
		d.ExternalPort = uint16(s.uint(16))
		s.lit(`,"internalIP":`)
		d.InternalIP = s.addr()
		s.lit(`,"internalPort":`)
		d.InternalPort = uint16(s.uint(16))
		if s.peek(`,"type":`) {
			d.Type = nat.DNATType(s.str())
		}
		s.lit("}")
		o.DNAT = d
	}
	if s.next('s') && s.peek(`,"snat":{"eip":`) {
		n := &nat.SNAT{EIP: s.addr()}
		s.lit(`,"internalCIDR":`)
		n.InternalCIDR = s.prefix()
		n.RandomFully = s.peek(`,"randomFully":true`)
		s.lit("}")
		o.SNAT = n
	}
	if s.next('r') && s.peek(`,"route":{"destination":`) {
		r := &nat.Route{Destination: s.prefix()}
		s.lit(`,"nextHop":`)
		r.NextHop = s.addr()
		s.lit(`,"device":`)
		r.Device = nat.RouteDevice(s.str())
		s.lit("}")
		o.Route = r
	}
	s.lit("}")
}

// fastRequest decodes a request line in canonical form; ok is false when
// the line is anything else (which encoding/json then decodes or refuses).
func fastRequest(data []byte) (req Request, ok bool) {
	s := &scanner{b: data}
	s.lit(`{"id":`)
	req.ID = s.uint(64)
	s.lit(`,"op":`)
	req.Op = name(s, ops)
	if s.peek(`,"objects":`) {
		req.Objects = s.objects()
	}
	if s.peek(`,"uids":[`) {
		for !s.bad {
			req.UIDs = append(req.UIDs, string(s.str()))
			if s.peek("]") {
				break
			}
			s.lit(",")
		}
	}
	req.Fresh = s.peek(`,"fresh":true`)
	if s.peek(`,"qos":`) {
		s.bad = true // small: encoding/json decodes it
	}
	s.lit("}")
	return req, !s.bad && s.i == len(data)
}

// fastResponse decodes a successful response line in canonical form (what
// marshalResponse writes without an error, info or changed); ok is false
// otherwise.
func fastResponse(data []byte) (resp Response, ok bool) {
	s := &scanner{b: data}
	s.lit(`{"id":`)
	resp.ID = s.uint(64)
	s.lit(`,"ok":true`)
	resp.OK = true
	if s.peek(`,"objects":`) {
		resp.Objects = s.objects()
	}
	s.lit("}")
	return resp, !s.bad && s.i == len(data)
}
