package agentapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/natgw/natgw/nat"
)

// maxValueText bounds the offending value quoted in an error.
const maxValueText = 120

// DecodeRequest parses one request line strictly: unknown fields, trailing
// data, unknown ops and fields that the op does not use are refused. The
// error is an *Error with CodeBadRequest naming the field (a JSON path such
// as "objects[2].fip.eip") and the offending value where there is one; the
// returned Request carries the id when it could be recovered, so that the
// error response can be correlated.
func DecodeRequest(data []byte) (Request, error) {
	req, ok := fastRequest(data)
	if !ok {
		var err error
		if req, err = decodeStrict(data); err != nil {
			return req, err
		}
	}
	return checkRequest(req)
}

// decodeStrict decodes a line that is not in canonical form with
// encoding/json, refusing unknown fields and trailing data.
func decodeStrict(data []byte) (Request, error) {
	var req Request
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		id, _ := idFromPrefix(data, true)
		e := &Error{Code: CodeBadRequest, Message: "malformed request: " + err.Error()}
		if field, value, reason := blame(data, reflect.TypeFor[Request](), ""); field != "" {
			e.Field, e.Value = field, value
			e.Message = fmt.Sprintf("malformed request: field %s: %s", field, reason)
		}
		return Request{ID: id}, e
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Request{ID: req.ID}, &Error{Code: CodeBadRequest, Message: "malformed request: data after the JSON object"}
	}
	return req, nil
}

// checkRequest refuses ops, and fields the op does not take, and bad UIDs.
func checkRequest(req Request) (Request, error) {
	bad := func(field, value, msg string) (Request, error) {
		return Request{ID: req.ID}, &Error{Code: CodeBadRequest, Field: field, Value: clip(value), Message: msg}
	}
	var allows string // which of objects (o), uids (u), fresh (f), qos (q) the op takes
	switch req.Op {
	case OpApply, OpSync:
		allows = "o"
	case OpDelete:
		allows = "u"
	case OpList, OpInfo:
		allows = "f"
	case OpGatewayQoS:
		allows = "q"
	case "":
		return bad("op", "", "missing op (want one of apply, delete, list, sync, info, gwqos)")
	default:
		return bad("op", req.Op, fmt.Sprintf("unknown op %q (want one of apply, delete, list, sync, info, gwqos)", req.Op))
	}
	if len(req.Objects) > 0 && !strings.Contains(allows, "o") {
		return bad("objects", "", "op "+req.Op+" takes no objects")
	}
	if len(req.UIDs) > 0 && !strings.Contains(allows, "u") {
		return bad("uids", "", "op "+req.Op+" takes no uids")
	}
	if req.Fresh && !strings.Contains(allows, "f") {
		return bad("fresh", "true", "op "+req.Op+" takes no fresh flag")
	}
	if len(req.QoS) > 0 && !strings.Contains(allows, "q") {
		return bad("qos", "", "op "+req.Op+" takes no qos")
	}
	for i, uid := range req.UIDs {
		if err := nat.ValidateUID(uid); err != nil {
			var fe *nat.FieldError
			reason := err.Error()
			if errors.As(err, &fe) {
				reason = fe.Reason
			}
			return bad(fmt.Sprintf("uids[%d]", i), uid, fmt.Sprintf("uids[%d] %q: %s", i, uid, reason))
		}
	}
	return req, nil
}

// blame finds the first field of data (a JSON object meant for a value of
// type t) whose value does not decode, by decoding field by field. It
// returns the field's JSON path, its raw value and why it failed, or "" when
// it cannot point at one field (e.g. a syntax error).
func blame(data []byte, t reflect.Type, path string) (field, value, reason string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice:
		var elems []json.RawMessage
		if json.Unmarshal(data, &elems) != nil {
			return "", "", ""
		}
		for i, el := range elems {
			if f, v, r := blameValue(el, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); f != "" {
				return f, v, r
			}
		}
		return "", "", ""
	case reflect.Struct:
	default:
		return "", "", ""
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(data, &fields) != nil {
		return "", "", ""
	}
	// Walk keys in input order so the first bad field is reported.
	for _, key := range keysInOrder(data) {
		raw := fields[key]
		name := key
		if path != "" {
			name = path + "." + key
		}
		sf, ok := fieldByJSONName(t, key)
		if !ok {
			return name, "", "unknown field"
		}
		if f, v, r := blameValue(raw, sf.Type, name); f != "" {
			return f, v, r
		}
	}
	return "", "", ""
}

// blameValue decodes raw into a new value of type t and, when that fails,
// descends into structs and slices to find the innermost bad field.
func blameValue(raw json.RawMessage, t reflect.Type, path string) (field, value, reason string) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	err := dec.Decode(reflect.New(t).Interface())
	if err == nil {
		return "", "", ""
	}
	if f, v, r := blame(raw, t, path); f != "" {
		return f, v, r
	}
	msg := err.Error()
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		msg = fmt.Sprintf("cannot use JSON %s as %s", te.Value, te.Type)
	}
	return path, clip(strings.Trim(string(raw), `"`)), msg
}

// fieldByJSONName finds the struct field that encoding/json would fill for
// key (exact tag match first, then case-insensitive, like encoding/json).
func fieldByJSONName(t reflect.Type, key string) (reflect.StructField, bool) {
	var fold *reflect.StructField
	for i := range t.NumField() {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = sf.Name
		}
		if name == key {
			return sf, true
		}
		if fold == nil && strings.EqualFold(name, key) {
			fold = &sf
		}
	}
	if fold != nil {
		return *fold, true
	}
	return reflect.StructField{}, false
}

// keysInOrder returns the top-level keys of a JSON object in input order.
func keysInOrder(data []byte) []string {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var keys []string
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return keys
		}
		k, ok := t.(string)
		if !ok {
			return keys
		}
		keys = append(keys, k)
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return keys
		}
	}
	return keys
}

func clip(s string) string {
	if len(s) > maxValueText {
		return s[:maxValueText] + "…"
	}
	return s
}
