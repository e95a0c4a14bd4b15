package agentapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

// FuzzDecodeRequest: any bytes decode to a request or to a BadRequest *Error,
// never a panic; an accepted request survives an encode/decode round trip.
// Seeds: testdata/fuzz/FuzzDecodeRequest.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"id":1,"op":"apply","objects":[{"uid":"a","kind":"fip","fip":{"eip":"192.0.2.1","internalIP":"10.0.0.1"}}]}`,
		`{"id":2,"op":"delete","uids":["a"]}`,
		`{"id":3,"op":"list","fresh":true}`,
		`{"id":4,"op":"apply","objects":[{"uid":"d","kind":"dnat","dnat":{"eip":"192.0.2.1","protocol":"tcp","externalPort":80,"internalIP":"10.0.0.2","internalPort":8080}}]}`,
		`{"id":5,"op":"sync","objects":[{"uid":"s","kind":"snat","snat":{"eip":"192.0.2.1","internalCIDR":"10.0.0.0/24","randomFully":true}}]}`,
		`{"id":6,"op":"apply","objects":[{"uid":"e","kind":"eip","eip":{"address":"192.0.2.1","prefixLen":24,"qos":{"ingressRateMbps":10}}}]}`,
		`{"id":7,"op":"apply","objects":[{"uid":"r","kind":"route","route":{"destination":"0.0.0.0/0","nextHop":"192.0.2.254","device":"external"}}]}`,
		`{"id":8`, `[]`, `"x"`, `{"id":1e3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := DecodeRequest(data)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Code != CodeBadRequest || pe.Message == "" {
				t.Fatalf("error %v (%T), want a BadRequest *Error with a message", err, err)
			}
			return
		}
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		again, err := DecodeRequest(b)
		if err != nil {
			t.Fatalf("re-decode of %s: %v", b, err)
		}
		b2, _ := json.Marshal(again)
		if !bytes.Equal(b, b2) {
			t.Fatalf("round trip changed the request:\n%s\n%s", b, b2)
		}
	})
}

// FuzzServe: arbitrary input to the agent yields one response per non-blank
// line, in order, and Serve ends cleanly at EOF.
func FuzzServe(f *testing.F) {
	f.Add([]byte("{\"id\":1,\"op\":\"info\"}\nnot json\n\n{\"id\":2,\"op\":\"list\"}"))
	f.Add([]byte(strings.Repeat("y", 300) + "\n{\"id\":3,\"op\":\"delete\",\"uids\":[\"a\"]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		const max = 256
		var out bytes.Buffer
		if err := Serve(context.Background(), newFakeDP(), bytes.NewReader(data), &out, Info{}, WithMaxLineBytes(max)); err != nil {
			t.Fatalf("Serve: %v", err)
		}
		want := 0
		lr := newLineReader(bytes.NewReader(data), max)
		for {
			l, err := lr.next()
			if errors.Is(err, io.EOF) {
				break
			}
			if l.overflow > 0 || len(trimSpace(l.data)) > 0 {
				want++
			}
		}
		got := 0
		dec := json.NewDecoder(&out)
		for {
			var r Response
			if err := dec.Decode(&r); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("response %d not JSON: %v", got, err)
			}
			if !r.OK && (r.Error == nil || r.Error.Code == "") {
				t.Fatalf("failed response without an error code: %+v", r)
			}
			if r.OK && !reflect.DeepEqual(r.Error, (*Error)(nil)) {
				t.Fatalf("ok response with an error: %+v", r)
			}
			got++
		}
		if got != want {
			t.Fatalf("%d responses for %d lines", got, want)
		}
	})
}
