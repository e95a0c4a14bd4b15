package agentapi

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"reflect"
	"testing"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
)

// codecObjects covers every kind and every optional field, plus strings and
// values the fast paths must leave to encoding/json.
func codecObjects() []nat.Object {
	a := netip.MustParseAddr
	p := netip.MustParsePrefix
	return []nat.Object{
		{UID: "e1", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.10"), PrefixLen: 24}},
		{UID: "e2", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.11"), PrefixLen: 32, QoS: &nat.QoS{}}},
		{UID: "e3", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.12"), PrefixLen: 32, QoS: &nat.QoS{IngressRateMbps: 10, EgressBurstMbit: 4294967295}}},
		{UID: "e4", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.13"), QoS: &nat.QoS{IngressRateMbps: 1, IngressBurstMbit: 2, EgressRateMbps: 3, EgressBurstMbit: 4}}},
		{UID: "e5", Kind: nat.KindEIP, EIP: &nat.EIP{PrefixLen: -1}},
		{UID: "e6", Kind: nat.KindEIP, EIP: &nat.EIP{V6Address: a("2001:db8::10"), V6PrefixLen: 64}},
		{UID: "e7", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.14"), PrefixLen: 24, V6Address: a("2001:db8::11"), V6PrefixLen: 64, QoS: &nat.QoS{IngressRateMbps: 1}}},
		{UID: "e8", Kind: nat.KindEIP, EIP: &nat.EIP{V6PrefixLen: 64}},
		{UID: "f4", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a("2001:db8::10"), InternalIP: a("fd00::5")}},
		{UID: "s3", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a("2001:db8::10"), InternalCIDR: p("fd00:1::/64")}},
		{UID: "f1", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a("192.0.2.10"), InternalIP: a("10.0.0.1")}},
		{UID: "f2", Kind: nat.KindFIP, FIP: &nat.FIP{}},
		{UID: "f3", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a("2001:db8::1"), InternalIP: a("fe80::1%eth0")}},
		{UID: "d1", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a("192.0.2.10"), Protocol: nat.TCP, ExternalPort: 65535, InternalIP: a("10.0.0.2"), InternalPort: 0}},
		{UID: "d2", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a("192.0.2.10"), Protocol: nat.TCP, ExternalPort: 80, InternalIP: a("10.0.0.2"), InternalPort: 8080, Type: nat.DNATShare}},
		{UID: "d3", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a("192.0.2.10"), Protocol: nat.UDP, ExternalPort: 53, InternalIP: a("10.0.0.2"), InternalPort: 53, Type: nat.DNATExclusive}},
		{UID: "s1", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a("192.0.2.10"), InternalCIDR: p("10.0.0.0/16")}},
		{UID: "s2", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a("192.0.2.10"), InternalCIDR: p("10.0.1.0/24"), RandomFully: true}},
		{UID: "r1", Kind: nat.KindRoute, Route: &nat.Route{Destination: p("0.0.0.0/0"), NextHop: a("192.0.2.1"), Device: nat.DeviceExternal}},
		{UID: "x1", Kind: "fip"},
		{UID: "", Kind: ""},
		{UID: "two", Kind: nat.KindFIP, FIP: &nat.FIP{}, DNAT: &nat.DNAT{}},
		{UID: `q"u\o<t>&e`, Kind: "ünïcode\u2028", FIP: &nat.FIP{}},
	}
}

// plainCodecObjects are codecObjects in the fast decoder's reach: no
// escaped strings, no negative numbers.
func plainCodecObjects() []nat.Object {
	var out []nat.Object
	for _, o := range codecObjects() {
		if plain(o.UID) && plain(string(o.Kind)) && (o.EIP == nil || o.EIP.PrefixLen >= 0) {
			out = append(out, o)
		}
	}
	return out
}

func codecRequests() []Request {
	objs := codecObjects()
	return []Request{
		{ID: 1, Op: OpApply, Objects: objs},
		{ID: 18446744073709551615, Op: OpSync, Objects: objs[:1]},
		{ID: 3, Op: OpSync},
		{ID: 4, Op: OpDelete, UIDs: []string{"a", "b<c"}},
		{ID: 5, Op: OpList, Fresh: true},
		{ID: 6, Op: ""},
		{ID: 7, Op: "all of them", Objects: objs, UIDs: []string{"u"}, Fresh: true, QoS: codecQoS()},
		{ID: 8, Op: OpGatewayQoS, QoS: codecQoS()},
	}
}

// codecQoS is a gwqos request's rules: u32 and matchall, with and without
// interface.
func codecQoS() []gwqos.Rule {
	return []gwqos.Rule{
		{Direction: gwqos.Egress, Priority: 2, Classifier: gwqos.U32, MatchDir: "src", CIDR: netip.MustParsePrefix("10.0.1.0/24"), RateMbps: 12.5, BurstMB: 0.5},
		{Direction: gwqos.Ingress, Iface: "net1", Classifier: gwqos.MatchAll, RateMbps: 100},
	}
}

// TestEncodeMatchesEncodingJSON: the fast encoders write exactly the bytes
// of json.Marshal.
func TestEncodeMatchesEncodingJSON(t *testing.T) {
	for _, req := range codecRequests() {
		want, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendRequest(nil, req); !bytes.Equal(got, want) {
			t.Errorf("request %d:\n got %s\nwant %s", req.ID, got, want)
		}
	}
	for _, resp := range []Response{
		{ID: 1, OK: true},
		{ID: 2, OK: true, Objects: codecObjects()},
		{ID: 3, OK: true, Objects: []nat.Object{}},
		{ID: 4, Error: &Error{Code: CodeInvalid, Message: "m", Field: "f"}},
		{ID: 5, OK: true, Info: &Info{Version: "v", Counts: map[nat.Kind]int{nat.KindFIP: 2}}},
		{ID: 6, OK: false},
	} {
		want, err := json.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		got, err := marshalResponse(resp)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("response %d (err %v):\n got %s\nwant %s", resp.ID, err, got, want)
		}
	}
}

// TestFastDecode: the fast decoders take the canonical form of plain
// requests and responses and give what encoding/json gives; what they do not
// take still decodes through the slow path.
func TestFastDecode(t *testing.T) {
	for _, req := range codecRequests() {
		line := appendRequest(nil, req)
		fast, ok := fastRequest(line)
		slow, err := decodeStrict(line)
		if err != nil {
			t.Fatalf("slow decode of %s: %v", line, err)
		}
		if ok && !reflect.DeepEqual(fast, slow) {
			t.Errorf("fast decode of %s:\n got %+v\nwant %+v", line, fast, slow)
		}
		// Lines with escaped strings are left to encoding/json.
		// So are gwqos rules (ids 7 and 8).
		wantFast := req.ID != 7 && (req.ID != 1) && req.ID != 4 && req.ID != 8
		if ok != wantFast {
			t.Errorf("fast decode of request %d: ok = %v, want %v", req.ID, ok, wantFast)
		}
	}
	plainObjs := plainCodecObjects()
	for _, tc := range []struct {
		name string
		line string
		fast bool
	}{
		{"plain objects", string(appendRequest(nil, Request{ID: 9, Op: OpSync, Objects: plainObjs})), true},
		{"spaces", `{"id": 1,"op":"list"}`, false},
		{"keys in another order", `{"op":"list","id":1}`, false},
		{"upper-case key", `{"ID":1,"op":"list"}`, false},
		{"zero in qos", `{"id":1,"op":"apply","objects":[{"uid":"e","kind":"eip","eip":{"address":"","prefixLen":0,"qos":{"ingressRateMbps":0}}}]}`, false},
		{"leading zero", `{"id":01,"op":"list"}`, false},
		{"port out of range", `{"id":1,"op":"apply","objects":[{"uid":"d","kind":"dnat","dnat":{"eip":"","protocol":"tcp","externalPort":65536,"internalIP":"","internalPort":1}}]}`, false},
		{"bad address", `{"id":1,"op":"apply","objects":[{"uid":"f","kind":"fip","fip":{"eip":"1.2.3","internalIP":""}}]}`, false},
		{"empty objects", `{"id":1,"op":"sync","objects":[]}`, false},
		{"trailing data", `{"id":1,"op":"list"} `, false},
		{"null objects", `{"id":1,"op":"sync","objects":null}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fast, ok := fastRequest([]byte(tc.line))
			if ok != tc.fast {
				t.Fatalf("fast ok = %v, want %v", ok, tc.fast)
			}
			slow, err := decodeStrict([]byte(tc.line))
			if ok && (err != nil || !reflect.DeepEqual(fast, slow)) {
				t.Errorf("fast %+v, slow %+v (%v)", fast, slow, err)
			}
		})
	}
	line, _ := marshalResponse(Response{ID: 5, OK: true, Objects: plainObjs})
	fast, ok := fastResponse(line)
	var slow Response
	if err := json.Unmarshal(line, &slow); err != nil || !ok || !reflect.DeepEqual(fast, slow) {
		t.Errorf("response: fast ok=%v %+v, slow %+v (%v)", ok, fast, slow, err)
	}
	if _, ok := fastResponse([]byte(`{"id":5,"ok":false,"error":{"code":"Internal","message":"m"}}`)); ok {
		t.Error("fast response decoder took an error response")
	}
}

// FuzzFastDecode: whatever the fast decoders accept, encoding/json accepts
// with the same result.
func FuzzFastDecode(f *testing.F) {
	plainObjs := plainCodecObjects()
	f.Add(appendRequest(nil, Request{ID: 1, Op: OpSync, Objects: plainObjs}))
	f.Add(appendRequest(nil, Request{ID: 2, Op: OpDelete, UIDs: []string{"a", "b"}}))
	f.Add(appendRequest(nil, Request{ID: 3, Op: OpList, Fresh: true}))
	line, _ := marshalResponse(Response{ID: 4, OK: true, Objects: plainObjs})
	f.Add(line)
	// The IPv4 and name fast paths: octets at the edges, a leading zero
	// and an octet out of range (left to netip), names near the known ones.
	f.Add([]byte(`{"id":5,"op":"sync","objects":[{"uid":"a","kind":"fip","fip":{"eip":"255.0.10.199","internalIP":"01.2.3.4"}},{"uid":"b","kind":"fipx","fip":{"eip":"1.2.3.256","internalIP":"::ffff:1.2.3.4"}}]}`))
	f.Add([]byte(`{"id":6,"op":"syn","objects":[{"uid":"d","kind":"dnat","dnat":{"eip":"0.0.0.0","protocol":"udpx","externalPort":1,"internalIP":"9.9.9.9","internalPort":2}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if fast, ok := fastRequest(data); ok {
			slow, err := decodeStrict(data)
			if err != nil {
				t.Fatalf("fast decoder took %q, encoding/json refuses it: %v", data, err)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("%q:\nfast %+v\nslow %+v", data, fast, slow)
			}
		}
		if fast, ok := fastResponse(data); ok {
			var slow Response
			if err := json.Unmarshal(data, &slow); err != nil {
				t.Fatalf("fast decoder took response %q, encoding/json refuses it: %v", data, err)
			}
			if !reflect.DeepEqual(fast, slow) {
				t.Fatalf("%q:\nfast %+v\nslow %+v", data, fast, slow)
			}
		}
	})
}

// BenchmarkSyncLine100k: encoding and decoding a sync of 100,000 FIPs, fast
// paths against encoding/json.
// (codec_jsonv2_test.go adds encoding/json/v2 under GOEXPERIMENT=jsonv2.)
func BenchmarkSyncLine100k(b *testing.B) {
	req, line := syncRequest100k()
	b.Run("encode/fast", func(b *testing.B) {
		for b.Loop() {
			appendRequest(make([]byte, 0, len(line)), req)
		}
	})
	b.Run("encode/encoding-json", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/fast", func(b *testing.B) {
		for b.Loop() {
			if _, err := DecodeRequest(line); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/encoding-json", func(b *testing.B) {
		for b.Loop() {
			if _, err := decodeStrict(line); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// syncRequest100k is a sync request of 100,000 FIPs and its encoded line.
func syncRequest100k() (Request, []byte) {
	objs := make([]nat.Object, 100000)
	for i := range objs {
		objs[i] = nat.Object{UID: "00000001-f111-4000-8000-" + string(rune('a'+i%26)) + "00000000001", Kind: nat.KindFIP,
			FIP: &nat.FIP{EIP: netip.AddrFrom4([4]byte{100, 64, byte(i >> 8), byte(i)}), InternalIP: netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)})}}
	}
	req := Request{ID: 1, Op: OpSync, Objects: objs}
	return req, appendRequest(nil, req)
}

// TestCodecCoversEveryField: an object with every field of nat.Object set
// (found by reflection, so a field added to nat.Object is in it without
// touching this test) encodes to json.Marshal's bytes and decodes back on
// the fast path. A new field left out of appendObject or scanner.object
// fails here instead of being dropped on the wire.
func TestCodecCoversEveryField(t *testing.T) {
	var o nat.Object
	fillAll(t, reflect.ValueOf(&o).Elem(), "Object")
	want, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	if got := appendObject(nil, &o); !bytes.Equal(got, want) {
		t.Fatalf("fast encoder:\n got %s\nwant %s", got, want)
	}
	req := Request{ID: 1, Op: OpApply, Objects: []nat.Object{o}}
	fast, ok := fastRequest(appendRequest(nil, req))
	if !ok || !reflect.DeepEqual(fast, req) {
		t.Fatalf("fast decoder (ok %v):\n got %+v\nwant %+v", ok, fast, req)
	}
}

// fillAll sets every field reachable from v to a non-zero value the fast
// paths handle (plain strings, small numbers, IPv4 addresses and prefixes).
func fillAll(t *testing.T, v reflect.Value, path string) {
	t.Helper()
	switch v.Interface().(type) {
	case netip.Addr:
		v.Set(reflect.ValueOf(netip.MustParseAddr("192.0.2.7")))
		return
	case netip.Prefix:
		v.Set(reflect.ValueOf(netip.MustParsePrefix("10.0.0.0/8")))
		return
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString("x")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(7)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(7)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillAll(t, v.Elem(), path)
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fillAll(t, v.Field(i), path+"."+v.Type().Field(i).Name)
			}
		}
	default:
		t.Fatalf("%s: a %s field; teach fillAll (and the fast codec) about it", path, v.Kind())
	}
}
