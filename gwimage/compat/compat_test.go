package compat

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/natgw/natgw/nat"
)

var (
	a   = netip.MustParseAddr
	pfx = netip.MustParsePrefix
)

func eipObj(addr string, bits int, q *nat.QoS) nat.Object {
	return nat.Object{UID: "compat-eip-" + addr, Kind: nat.KindEIP, EIP: &nat.EIP{Address: a(addr), PrefixLen: bits, QoS: q}}
}

func route(uid, dst, nh string, dev nat.RouteDevice) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindRoute, Route: &nat.Route{Destination: pfx(dst), NextHop: a(nh), Device: dev}}
}

func TestParse(t *testing.T) {
	defRoute := route("compat-route-0.0.0.0-0", "0.0.0.0/0", "192.0.2.1", nat.DeviceExternal)
	tests := []struct {
		name string
		op   string
		args []string
		want Plan
	}{
		{"init v1.13 service cidr", "init", []string{"10.96.0.0/12,198.51.100.1"}, Plan{Apply: []nat.Object{
			route("compat-route-10.96.0.0-12", "10.96.0.0/12", "198.51.100.1", nat.DeviceInternal)}}},
		{"init no rules", "init", nil, Plan{}},
		{"init interface names", "init", []string{"eth0,net1"}, Plan{}},
		{"subnet routes, several per call", "subnet-route-add", []string{"10.0.1.0/24,198.51.100.1", "10.0.2.0/24,198.51.100.1"}, Plan{Apply: []nat.Object{
			route("compat-route-10.0.1.0-24", "10.0.1.0/24", "198.51.100.1", nat.DeviceInternal),
			route("compat-route-10.0.2.0-24", "10.0.2.0/24", "198.51.100.1", nat.DeviceInternal)}}},
		{"subnet route del", "subnet-route-del", []string{"10.0.1.0/24"}, Plan{Delete: []string{"compat-route-10.0.1.0-24"}}},
		{"ext subnet route", "ext-subnet-route-add", []string{"192.0.2.0/24,192.0.2.1"}, Plan{Apply: []nat.Object{defRoute}}},
		{"ext subnet route del is a no-op", "ext-subnet-route-del", []string{"192.0.2.0/24"}, Plan{}},
		{"eip add", "eip-add", []string{"192.0.2.10/24,192.0.2.1"}, Plan{Apply: []nat.Object{eipObj("192.0.2.10", 24, nil), defRoute}}},
		{"two eips share the default route", "eip-add", []string{"192.0.2.10/24,192.0.2.1", "192.0.2.11/24,192.0.2.1"}, Plan{Apply: []nat.Object{
			eipObj("192.0.2.10", 24, nil), defRoute, eipObj("192.0.2.11", 24, nil)}}},
		{"eip without length", "eip-add", []string{"192.0.2.10,192.0.2.1"}, Plan{Apply: []nat.Object{eipObj("192.0.2.10", 32, nil), defRoute}}},
		{"eip del", "eip-del", []string{"192.0.2.10/24", "192.0.2.11"}, Plan{Delete: []string{"compat-eip-192.0.2.10", "compat-eip-192.0.2.11"}}},
		{"fip add (eip may carry a length)", "floating-ip-add", []string{"192.0.2.10/24,198.51.100.10"}, Plan{Apply: []nat.Object{
			{UID: "compat-fip-192.0.2.10", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a("192.0.2.10"), InternalIP: a("198.51.100.10")}}}}},
		{"fip del with internal ip", "floating-ip-del", []string{"192.0.2.10,198.51.100.10"}, Plan{Delete: []string{"compat-fip-192.0.2.10"}}},
		{"fip del eip only (newer controllers)", "floating-ip-del", []string{"192.0.2.10"}, Plan{Delete: []string{"compat-fip-192.0.2.10"}}},
		{"fip del stateless form", "floating-ip-del", []string{"192.0.2.10,"}, Plan{Delete: []string{"compat-fip-192.0.2.10"}}},
		{"dnat add", "dnat-add", []string{"192.0.2.11,8080,TCP,198.51.100.11,80"}, Plan{Apply: []nat.Object{
			{UID: "compat-dnat-192.0.2.11-tcp-8080", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a("192.0.2.11"), Protocol: nat.TCP, ExternalPort: 8080, InternalIP: a("198.51.100.11"), InternalPort: 80}}}}},
		{"dnat del full rule", "dnat-del", []string{"192.0.2.11,8080,tcp,198.51.100.11,80"}, Plan{Delete: []string{"compat-dnat-192.0.2.11-tcp-8080"}}},
		{"dnat del identity triplet", "dnat-del", []string{"192.0.2.11,53,udp"}, Plan{Delete: []string{"compat-dnat-192.0.2.11-udp-53"}}},
		{"snat add random fully", "snat-add", []string{"192.0.2.12,198.51.100.0/24,--random-fully"}, Plan{Apply: []nat.Object{
			{UID: "compat-snat-192.0.2.12-198.51.100.0-24", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a("192.0.2.12"), InternalCIDR: pfx("198.51.100.0/24"), RandomFully: true}}}}},
		{"snat add single ip", "snat-add", []string{"192.0.2.12,198.51.100.7"}, Plan{Apply: []nat.Object{
			{UID: "compat-snat-192.0.2.12-198.51.100.7-32", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a("192.0.2.12"), InternalCIDR: pfx("198.51.100.7/32")}}}}},
		{"snat del", "snat-del", []string{"192.0.2.12,198.51.100.0/24"}, Plan{Delete: []string{"compat-snat-192.0.2.12-198.51.100.0-24"}}},
		{"rules split on whitespace like the script", "floating-ip-del", []string{"192.0.2.10 192.0.2.11"}, Plan{Delete: []string{"compat-fip-192.0.2.10", "compat-fip-192.0.2.11"}}},
		{"duplicate deletes collapse", "eip-del", []string{"192.0.2.10", "192.0.2.10/24"}, Plan{Delete: []string{"compat-eip-192.0.2.10"}}},
		{"ingress qos", "eip-ingress-qos-add", []string{"192.0.2.10,1,10,5"}, Plan{QoS: []QoSChange{{EIP: a("192.0.2.10"), Direction: Ingress, RateMbps: 10, BurstMbit: 5}}}},
		{"egress qos without burst", "eip-egress-qos-add", []string{"192.0.2.10/24,2,20"}, Plan{QoS: []QoSChange{{EIP: a("192.0.2.10"), Direction: Egress, RateMbps: 20}}}},
		{"qos del", "eip-egress-qos-del", []string{"192.0.2.10"}, Plan{QoS: []QoSChange{{EIP: a("192.0.2.10"), Direction: Egress, Remove: true}}}},
		{"version", "get-iptables-version", nil, Plan{PrintVersion: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse(tt.op, tt.args)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			tt.want.Op = tt.op
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Parse(%s %q)\n got %+v\nwant %+v", tt.op, tt.args, got, tt.want)
			}
			for _, o := range got.Apply {
				if err := o.Validate(); err != nil {
					t.Errorf("object %s invalid: %v", o, err)
				}
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		op    string
		args  []string
		index int
		field string
		want  string
	}{
		{"explode", nil, -1, "", "unknown subcommand"},
		{"qos-add", []string{"ingress,net1,1,matchall"}, -1, "", "unknown subcommand"},
		{"floating-ip-add", []string{"192.0.2.10"}, 0, "", "want 2 comma-separated fields"},
		{"floating-ip-add", []string{"192.0.2.10,198.51.100.1", "192.0.2.300,198.51.100.2"}, 1, "eip", "not an IPv4 address"},
		{"floating-ip-add", []string{"2001:db8::1,198.51.100.1"}, 0, "eip", "not an IPv4"},
		{"dnat-add", []string{"192.0.2.11,0,tcp,198.51.100.11,80"}, 0, "externalPort", "1..65535"},
		{"dnat-add", []string{"192.0.2.11,80,sctp,198.51.100.11,80"}, 0, "protocol", "tcp or udp"},
		{"dnat-add", []string{"192.0.2.11,80,tcp,198.51.100.11,65536"}, 0, "internalPort", "0..65535"},
		{"snat-add", []string{"192.0.2.12,198.51.100.0/24,--random"}, 0, "option", "--random-fully"},
		{"snat-add", []string{"192.0.2.12,198.51.100.0/40"}, 0, "internalCIDR", "CIDR"},
		{"eip-add", []string{"192.0.2.10/24"}, 0, "", "want 2"},
		{"eip-add", []string{"192.0.2.10/24,192.0.2.1", "192.0.2.11/24,192.0.2.2"}, 1, "", "contradicts an earlier rule"},
		{"subnet-route-add", []string{"10.0.0.0/8"}, 0, "", "want 2"},
		{"init", []string{"10.96.0.0/12"}, 0, "nextHop", "missing next hop"},
		{"eip-ingress-qos-add", []string{"192.0.2.10,1,0,1"}, 0, "rate", "at least 1"},
		{"eip-ingress-qos-add", []string{"192.0.2.10,1,1.5,1"}, 0, "rate", "whole number"},
		{"floating-ip-add", []string{"192.0.2.10,198.51.100.1", "192.0.2.10,198.51.100.2"}, 1, "", "contradicts"},
	}
	for _, tt := range tests {
		_, err := Parse(tt.op, tt.args)
		var ae *ArgError
		if !errors.As(err, &ae) {
			t.Errorf("Parse(%s %q) = %v, want *ArgError", tt.op, tt.args, err)
			continue
		}
		if ae.Index != tt.index || ae.Field != tt.field || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%s %q) = %v (index %d field %q), want index %d field %q mentioning %q", tt.op, tt.args, err, ae.Index, ae.Field, tt.index, tt.field, tt.want)
		}
	}
}

func TestApplyQoS(t *testing.T) {
	cur := []nat.Object{
		eipObj("192.0.2.10", 24, nil),
		{UID: "k8s-uid-1", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.11"), PrefixLen: 24, QoS: &nat.QoS{EgressRateMbps: 5}}},
		{UID: "f", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a("192.0.2.10"), InternalIP: a("10.0.0.1")}},
	}
	got, err := ApplyQoS(cur, []QoSChange{
		{EIP: a("192.0.2.10"), Direction: Ingress, RateMbps: 10, BurstMbit: 2},
		{EIP: a("192.0.2.10"), Direction: Egress, RateMbps: 3},
		{EIP: a("192.0.2.11"), Direction: Egress, Remove: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []nat.Object{
		eipObj("192.0.2.10", 24, &nat.QoS{IngressRateMbps: 10, IngressBurstMbit: 2, EgressRateMbps: 3}),
		{UID: "k8s-uid-1", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.11"), PrefixLen: 24}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ApplyQoS\n got %v\nwant %v", got, want)
	}
	if cur[1].EIP.QoS == nil || cur[1].EIP.QoS.EgressRateMbps != 5 {
		t.Fatal("ApplyQoS changed its input")
	}
	if _, err := ApplyQoS(cur, []QoSChange{{EIP: a("192.0.2.99"), Direction: Ingress, RateMbps: 1}}); err == nil {
		t.Fatal("QoS on an unknown EIP accepted")
	}
}

// addDel pairs each -add subcommand with the -del that undoes it.
var addDel = map[string]string{
	OpEIPAdd: OpEIPDel, OpFIPAdd: OpFIPDel, OpDNATAdd: OpDNATDel, OpSNATAdd: OpSNATDel, OpSubnetRouteAdd: OpSubnetRouteDel,
}

// FuzzParse: no input panics; every error is an *ArgError; every object is
// valid or fails validation with a *nat.FieldError (never anything else);
// every UID is a valid UID; and the -del of the same rules deletes exactly
// the UIDs the -add made (the shared default route of eip-add excepted).
// Seeds: testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add("eip-add", "192.0.2.10/24,192.0.2.1")
	f.Add("floating-ip-add", "192.0.2.10,198.51.100.10 192.0.2.11/24,198.51.100.11")
	f.Add("dnat-add", "192.0.2.11,8080,tcp,198.51.100.11,80")
	f.Add("snat-add", "192.0.2.12,198.51.100.0/24,--random-fully")
	f.Add("subnet-route-add", "10.0.1.0/24,198.51.100.1")
	f.Add("init", "10.96.0.0/12,198.51.100.1")
	f.Add("eip-ingress-qos-add", "192.0.2.10,1,10,5")
	f.Add("dnat-del", ",,,")
	f.Fuzz(func(t *testing.T, op, arg string) {
		p, err := Parse(op, []string{arg})
		if err != nil {
			var ae *ArgError
			if !errors.As(err, &ae) || ae.Error() == "" {
				t.Fatalf("error %v (%T), want *ArgError", err, err)
			}
			return
		}
		for _, o := range p.Apply {
			if err := nat.ValidateUID(o.UID); err != nil {
				t.Fatalf("object %v: bad UID: %v", o, err)
			}
			var fe *nat.FieldError
			if err := o.Validate(); err != nil && !errors.As(err, &fe) {
				t.Fatalf("object %v: %v", o, err)
			}
		}
		for _, uid := range p.Delete {
			if err := nat.ValidateUID(uid); err != nil {
				t.Fatalf("delete: bad UID %q: %v", uid, err)
			}
		}
		del, ok := addDel[op]
		if !ok {
			return
		}
		d, err := Parse(del, []string{arg})
		if err != nil {
			t.Fatalf("%s accepted %q but %s refused it: %v", op, arg, del, err)
		}
		var made []string
		for _, o := range p.Apply {
			if op == OpEIPAdd && o.Kind == nat.KindRoute {
				continue
			}
			made = append(made, o.UID)
		}
		if !reflect.DeepEqual(dedupe(made), d.Delete) {
			t.Fatalf("%s %q made %v but %s deletes %v", op, arg, made, del, d.Delete)
		}
	})
}
