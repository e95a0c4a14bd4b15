package compat

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
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

// Versions of Kube-OVN whose controller call formats the tables below carry
// (gwimage/README.md, "Per version": facts read at v1.13.4 and v1.16.2; the
// v1.14 and v1.15 controllers send one of the two shapes of each call, and
// both are accepted).
const (
	v113 = "v1.13"
	v114 = "v1.14"
	v115 = "v1.15"
	v116 = "v1.16"
	// vMaster is Kube-OVN master at 1533681d7 (the coming v1.17): v1.16's
	// formats (floating-ip-del EIP at vpc_nat_gw_nat.go:2069, dnat-del
	// EIP,PORT,PROTO at :2128) plus nft-dnat-map-add
	// EIP,PORT,PROTO,IP1:PORT1@IP2:PORT2 (nft_dnat.go:99-100, called at
	// vpc_nat_gw_nat.go:593,766,847 and nft_dnat.go:252 with the remaining
	// backends after one goes) and nft-dnat-map-del EIP,PORT,PROTO
	// (nft_dnat.go:125, called at :246 when none remain).
	vMaster = "master"
)

var allVersions = []string{v113, v114, v115, v116, vMaster}

// masterOnly are the subcommands only master's controller sends.
var masterOnly = []string{OpNftDNATMapAdd, OpNftDNATMapDel}

func share(eip string, port uint16, proto nat.Protocol, in string, inPort uint16) nat.Object {
	id := ShareIdentity{a(eip), proto, port}
	return nat.Object{UID: ShareUID(id, a(in), inPort), Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a(eip), Protocol: proto, ExternalPort: port, InternalIP: a(in), InternalPort: inPort, Type: nat.DNATShare}}
}

func fip(eip, in string) nat.Object {
	return nat.Object{UID: "compat-fip-" + eip, Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a(eip), InternalIP: a(in)}}
}

func dnatObj(eip string, port uint16, proto nat.Protocol, in string, inPort uint16) nat.Object {
	return nat.Object{UID: DNATUID(a(eip), proto, port), Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a(eip), Protocol: proto, ExternalPort: port, InternalIP: a(in), InternalPort: inPort}}
}

func snatObj(eip, cidr string, random bool) nat.Object {
	return nat.Object{UID: SNATUID(a(eip), pfx(cidr)), Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a(eip), InternalCIDR: pfx(cidr), RandomFully: random}}
}

func presence(p Presence, objs ...nat.Object) map[string]Presence {
	m := map[string]Presence{}
	for _, o := range objs {
		m[o.UID] = p
	}
	return m
}

// TestContractFormats: every subcommand in every call shape the controllers
// of v1.13 to v1.16 send (the contract file's table), as the controller
// builds the argument list, parses to the plan natgw carries out.
func TestContractFormats(t *testing.T) {
	f10, d11, s12 := fip("192.0.2.10", "198.51.100.10"), dnatObj("192.0.2.11", 8080, nat.TCP, "198.51.100.11", 80), snatObj("192.0.2.12", "198.51.100.0/24", true)
	tests := []struct {
		versions []string
		name     string
		op       string
		args     []string
		want     Plan
	}{
		{allVersions, "init without rules (trailing blank)", "init", []string{""}, Plan{Init: true}},
		{[]string{v116, vMaster}, "init with VPC_IFACE,EXT_IFACE (non-primary CNI)", "init", []string{"net2,net1"}, Plan{Init: true, Interfaces: &Interfaces{VPC: "net2", External: "net1"}}},
		{[]string{v116, vMaster}, "init, blanks around the comma", "init", []string{"net2", ",", "net1"}, Plan{Init: true, Interfaces: &Interfaces{VPC: "net2", External: "net1"}}},
		{allVersions, "subnet routes, several per call", "subnet-route-add", []string{"10.0.1.0/24,198.51.100.1", "10.0.2.0/24,198.51.100.1"}, Plan{Apply: []nat.Object{
			route("compat-route-10.0.1.0-24", "10.0.1.0/24", "198.51.100.1", nat.DeviceInternal),
			route("compat-route-10.0.2.0-24", "10.0.2.0/24", "198.51.100.1", nat.DeviceInternal)}}},
		{allVersions, "subnet route del", "subnet-route-del", []string{"10.0.1.0/24"}, Plan{Delete: []string{"compat-route-10.0.1.0-24"}, MustExist: []string{"compat-route-10.0.1.0-24"}}},
		{allVersions, "eip add EIP/LEN", "eip-add", []string{"192.0.2.10/24"}, Plan{Apply: []nat.Object{eipObj("192.0.2.10", 24, nil)}, DefaultRouteFromEnv: true}},
		{allVersions, "eip del EIP/LEN", "eip-del", []string{"192.0.2.10/24"}, Plan{Delete: []string{"compat-eip-192.0.2.10"}}},
		{allVersions, "ingress qos: u32 dst EIP on the external interface, burst in MB", "eip-ingress-qos-add", []string{"192.0.2.10,1,10,5"}, Plan{EIPQoS: true, GatewayQoS: []GatewayQoS{
			{Add: true, Rule: gwqos.Rule{Direction: Ingress, Priority: 1, Classifier: "u32", MatchDir: "dst", CIDR: pfx("192.0.2.10/32"), RateMbps: 10, BurstMB: 5}}}}},
		{allVersions, "egress qos: u32 src EIP, decimal rate and burst", "eip-egress-qos-add", []string{"192.0.2.10,2,1.5,0.5"}, Plan{EIPQoS: true, GatewayQoS: []GatewayQoS{
			{Add: true, Rule: gwqos.Rule{Direction: Egress, Priority: 2, Classifier: "u32", MatchDir: "src", CIDR: pfx("192.0.2.10/32"), RateMbps: 1.5, BurstMB: 0.5}}}}},
		{allVersions, "ingress qos del", "eip-ingress-qos-del", []string{"192.0.2.10"}, Plan{EIPQoS: true, GatewayQoS: []GatewayQoS{
			{Rule: gwqos.Rule{Direction: Ingress, Classifier: "u32", MatchDir: "dst", CIDR: pfx("192.0.2.10/32")}}}}},
		{allVersions, "egress qos del", "eip-egress-qos-del", []string{"192.0.2.10"}, Plan{EIPQoS: true, GatewayQoS: []GatewayQoS{
			{Rule: gwqos.Rule{Direction: Egress, Classifier: "u32", MatchDir: "src", CIDR: pfx("192.0.2.10/32")}}}}},
		{allVersions, "fip add", "floating-ip-add", []string{"192.0.2.10,198.51.100.10"}, Plan{Apply: []nat.Object{f10}, IfPresent: presence(Refuse, f10)}},
		{[]string{v113, v114, v115}, "fip del EIP,INTERNAL_IP", "floating-ip-del", []string{"192.0.2.10,198.51.100.10"}, Plan{Delete: []string{"compat-fip-192.0.2.10"}}},
		{[]string{v116, vMaster}, "fip del EIP", "floating-ip-del", []string{"192.0.2.10"}, Plan{Delete: []string{"compat-fip-192.0.2.10"}}},
		{allVersions, "dnat add", "dnat-add", []string{"192.0.2.11,8080,tcp,198.51.100.11,80"}, Plan{Apply: []nat.Object{d11}, IfPresent: presence(Refuse, d11)}},
		{[]string{v113, v114, v115}, "dnat del, five fields", "dnat-del", []string{"192.0.2.11,8080,tcp,198.51.100.11,80"}, Plan{Delete: []string{"compat-dnat-192.0.2.11-tcp-8080"}}},
		{[]string{v116, vMaster}, "dnat del, identity triplet", "dnat-del", []string{"192.0.2.11,53,udp"}, Plan{Delete: []string{"compat-dnat-192.0.2.11-udp-53"}}},
		{allVersions, "dnat add sctp", "dnat-add", []string{"192.0.2.11,9000,sctp,198.51.100.11,9000"}, Plan{Apply: []nat.Object{dnatObj("192.0.2.11", 9000, nat.SCTP, "198.51.100.11", 9000)}, IfPresent: presence(Refuse, dnatObj("192.0.2.11", 9000, nat.SCTP, "198.51.100.11", 9000))}},
		{[]string{v116, vMaster}, "dnat del sctp", "dnat-del", []string{"192.0.2.11,9000,sctp"}, Plan{Delete: []string{"compat-dnat-192.0.2.11-sctp-9000"}}},
		{allVersions, "snat add --random-fully (iptables above 1.6.2)", "snat-add", []string{"192.0.2.12,198.51.100.0/24,--random-fully"}, Plan{Apply: []nat.Object{s12}, IfPresent: presence(Keep, s12)}},
		{allVersions, "snat add", "snat-add", []string{"192.0.2.12,198.51.100.7"}, Plan{Apply: []nat.Object{snatObj("192.0.2.12", "198.51.100.7/32", false)}, IfPresent: presence(Keep, snatObj("192.0.2.12", "198.51.100.7/32", false))}},
		{allVersions, "snat del", "snat-del", []string{"192.0.2.12,198.51.100.0/24"}, Plan{Delete: []string{"compat-snat-192.0.2.12-198.51.100.0-24"}}},
		{allVersions, "get-iptables-version (no trailing blank)", "get-iptables-version", nil, Plan{PrintVersion: true}},
		{[]string{vMaster}, "nft-dnat-map-add, two backends", "nft-dnat-map-add", []string{"192.0.2.11,443,tcp,198.51.100.11:8443@198.51.100.12:8443"}, Plan{
			Apply:           []nat.Object{share("192.0.2.11", 443, nat.TCP, "198.51.100.11", 8443), share("192.0.2.11", 443, nat.TCP, "198.51.100.12", 8443)},
			ShareIdentities: []ShareIdentity{{a("192.0.2.11"), nat.TCP, 443}}}},
		{[]string{vMaster}, "nft-dnat-map-add, one backend, protocol in capitals", "nft-dnat-map-add", []string{"192.0.2.11,53,UDP,198.51.100.11:53"}, Plan{
			Apply:           []nat.Object{share("192.0.2.11", 53, nat.UDP, "198.51.100.11", 53)},
			ShareIdentities: []ShareIdentity{{a("192.0.2.11"), nat.UDP, 53}}}},
		{[]string{vMaster}, "nft-dnat-map-del", "nft-dnat-map-del", []string{"192.0.2.11,443,tcp"}, Plan{ShareIdentities: []ShareIdentity{{a("192.0.2.11"), nat.TCP, 443}}}},
	}
	seen := map[string]map[string]bool{}
	for _, tt := range tests {
		for _, v := range tt.versions {
			if seen[v] == nil {
				seen[v] = map[string]bool{}
			}
			seen[v][tt.op] = true
		}
		t.Run(tt.name, func(t *testing.T) {
			got := parseWant(t, tt.op, tt.args, tt.want)
			for _, o := range got.Apply {
				if err := o.Validate(); err != nil {
					t.Errorf("object %s invalid: %v", o, err)
				}
			}
		})
	}
	// Every subcommand the controllers send is covered for every version
	// (gateway-wide QoS, the same 9 fields in every version: TestGatewayQoS).
	for _, v := range allVersions {
		for _, op := range Ops {
			if op == OpQoSAdd || op == OpQoSDel || (v != vMaster && slices.Contains(masterOnly, op)) {
				continue
			}
			if !seen[v][op] {
				t.Errorf("%s: no row for %s", v, op)
			}
		}
	}
}

// parseWant checks that Parse(op, args) succeeds with want (its Op set to
// op) and returns the plan.
func parseWant(t *testing.T, op string, args []string, want Plan) Plan {
	t.Helper()
	got, err := Parse(op, args)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want.Op = op
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Parse(%s %q)\n got %+v\nwant %+v", op, args, got, want)
	}
	return got
}

// TestParseMore: the script's word splitting and other shapes.
func TestParseMore(t *testing.T) {
	tests := []struct {
		name string
		op   string
		args []string
		want Plan
	}{
		{"rules split on whitespace like the script", "floating-ip-del", []string{"192.0.2.10 192.0.2.11"}, Plan{Delete: []string{"compat-fip-192.0.2.10", "compat-fip-192.0.2.11"}}},
		{"duplicate deletes collapse", "eip-del", []string{"192.0.2.10", "192.0.2.10/24"}, Plan{Delete: []string{"compat-eip-192.0.2.10"}}},
		{"eip without length is a /32", "eip-add", []string{"192.0.2.10"}, Plan{Apply: []nat.Object{eipObj("192.0.2.10", 32, nil)}, DefaultRouteFromEnv: true}},
		{"two eips in one call", "eip-add", []string{"192.0.2.10/24", "192.0.2.11/24"}, Plan{Apply: []nat.Object{eipObj("192.0.2.10", 24, nil), eipObj("192.0.2.11", 24, nil)}, DefaultRouteFromEnv: true}},
		{"protocol in capitals", "dnat-del", []string{"192.0.2.11,53,UDP"}, Plan{Delete: []string{"compat-dnat-192.0.2.11-udp-53"}}},
		{"fip del stateless form", "floating-ip-del", []string{"192.0.2.10,"}, Plan{Delete: []string{"compat-fip-192.0.2.10"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { parseWant(t, tt.op, tt.args, tt.want) })
	}
}

// TestGatewayQoS: qos-add's 9 fields and qos-del's 7 (or 9) with u32 and
// matchall semantics, for every version (the same 9 fields since v1.13);
// a malformed rule names its field.
func TestGatewayQoS(t *testing.T) {
	good := []struct {
		op, rule string
		want     GatewayQoS
		key      string
	}{
		{"qos-add", "egress,net1,2,u32,ip,dst,192.168.1.1/32,25,25", GatewayQoS{Add: true, Rule: gwqos.Rule{Direction: Egress, Iface: "net1", Priority: 2, Classifier: "u32", MatchDir: "dst", CIDR: pfx("192.168.1.1/32"), RateMbps: 25, BurstMB: 25}}, "egress net1 u32 dst 192.168.1.1/32"},
		{"qos-add", "ingress,net1,3,matchall,,,,1.5,0.5", GatewayQoS{Add: true, Rule: gwqos.Rule{Direction: Ingress, Iface: "net1", Priority: 3, Classifier: "matchall", RateMbps: 1.5, BurstMB: 0.5}}, "ingress net1 matchall"},
		{"qos-del", "egress,net1,2,u32,ip,src,10.0.0.0/24", GatewayQoS{Rule: gwqos.Rule{Direction: Egress, Iface: "net1", Priority: 2, Classifier: "u32", MatchDir: "src", CIDR: pfx("10.0.0.0/24")}}, "egress net1 u32 src 10.0.0.0/24"},
		{"qos-del", "egress,net1,3,matchall,,,", GatewayQoS{Rule: gwqos.Rule{Direction: Egress, Iface: "net1", Priority: 3, Classifier: "matchall"}}, "egress net1 matchall"},
		{"qos-del", "egress,net1,3,matchall,,,,30,30", GatewayQoS{Rule: gwqos.Rule{Direction: Egress, Iface: "net1", Priority: 3, Classifier: "matchall"}}, "egress net1 matchall"},
	}
	for _, tt := range good {
		p, err := Parse(tt.op, []string{tt.rule})
		if err != nil || len(p.GatewayQoS) != 1 || !reflect.DeepEqual(p.GatewayQoS[0], tt.want) || p.GatewayQoS[0].Key() != tt.key {
			t.Errorf("Parse(%s %q) = %+v, %v; want %+v key %q", tt.op, tt.rule, p.GatewayQoS, err, tt.want, tt.key)
		}
	}
	bad := []struct {
		op, rule, field, want string
	}{
		{"qos-add", "sideways,net1,2,u32,ip,dst,192.168.1.1/32,25,25", "direction", "ingress or egress"},
		{"qos-add", "egress,net1,2,u32,ip,up,192.168.1.1/32,25,25", "matchDirection", "src or dst"},
		{"qos-add", "egress,net1,2,u32,ip,dst,192.168.1.300/32,25,25", "cidr", "CIDR"},
		{"qos-add", "egress,net1,2,u32,ip,dst,192.168.1.1/24,25,25", "cidr", "host bits"},
		{"qos-add", "egress,net1,3,matchall,ip,,,30,30", "matchType", "empty for matchall"},
		{"qos-add", "egress,net1,3,flower,,,,30,30", "classifier", "u32 or matchall"},
		{"qos-add", "egress,net1,3,matchall,,,,fast,30", "rate", "decimal"},
		{"qos-add", "egress,net1,3,matchall,,,,0,30", "rate", "above 0"},
		{"qos-add", "egress,net/1,3,matchall,,,,1,30", "iface", "interface name"},
		{"qos-add", "egress,net1,3,matchall,,,,30", "", "want 9"},
	}
	for _, tt := range bad {
		_, err := Parse(tt.op, []string{tt.rule})
		var ae *ArgError
		if !errors.As(err, &ae) || ae.Field != tt.field || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%s %q) = %v, want field %q mentioning %q", tt.op, tt.rule, err, tt.field, tt.want)
		}
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
		{"ext-subnet-route-add", []string{"192.0.2.0/24,192.0.2.1"}, -1, "", "unknown subcommand"},
		{"floating-ip-add", []string{"192.0.2.10"}, 0, "", "want 2 comma-separated fields"},
		{"floating-ip-add", []string{"192.0.2.10,198.51.100.1", "192.0.2.300,198.51.100.2"}, 1, "eip", "not an IPv4 address"},
		{"floating-ip-add", []string{"2001:db8::1,198.51.100.1"}, 0, "eip", "not an IPv4"},
		{"floating-ip-del", []string{"192.0.2.10,bad"}, 0, "internalIP", "not an IPv4"},
		{"dnat-add", []string{"192.0.2.11,0,tcp,198.51.100.11,80"}, 0, "externalPort", "1 to 65535"},
		{"dnat-add", []string{"192.0.2.11,80,icmp,198.51.100.11,80"}, 0, "protocol", "tcp, udp or sctp"},
		{"dnat-add", []string{"192.0.2.11,80,tcp,198.51.100.11,65536"}, 0, "internalPort", "1 to 65535"},
		{"dnat-add", []string{"192.0.2.11,080,tcp,198.51.100.11,80"}, 0, "externalPort", "no leading zero"}, // iptables: invalid port/service
		{"dnat-del", []string{"192.0.2.11,80,tcp,198.51.100.11"}, 0, "internalPort", "3 or 5"},
		{"snat-add", []string{"192.0.2.12,198.51.100.0/24,--random"}, 0, "option", "--random-fully"},
		{"snat-add", []string{"192.0.2.12,198.51.100.0/40"}, 0, "internalCIDR", "CIDR"},
		{"eip-add", []string{"192.0.2.10/24,192.0.2.1"}, 0, "", "at most 1"},
		{"eip-add", []string{"192.0.2.10/33"}, 0, "eip", "prefix length"},
		{"subnet-route-add", []string{"10.0.0.0/8"}, 0, "", "want 2"},
		{"init", []string{"net1"}, 0, "", "two interface names"},
		{"init", []string{"net1,net2,net3"}, 0, "", "two interface names"},
		{"init", []string{"10.96.0.0/12,198.51.100.1"}, 0, "vpcInterface", "not an interface name"},
		{"init", []string{",net1"}, 0, "vpcInterface", "empty"},
		{"eip-ingress-qos-add", []string{"192.0.2.10,1,0,1"}, 0, "rate", "above 0"},
		{"eip-ingress-qos-add", []string{"192.0.2.10,1,1.5.1,1"}, 0, "rate", "decimal"},
		{"eip-ingress-qos-add", []string{"192.0.2.10,1,10"}, 0, "", "want 4"},
		{"eip-ingress-qos-add", []string{"192.0.2.10,1,10,1e3"}, 0, "burst", "decimal"},
		{"floating-ip-add", []string{"192.0.2.10,198.51.100.1", "192.0.2.10,198.51.100.2"}, 1, "", "contradicts"},
		{"nft-dnat-map-add", []string{"192.0.2.11,443,tcp"}, 0, "", "want 4"},
		{"nft-dnat-map-add", []string{"192.0.2.11,443,sctp,198.51.100.11:443"}, 0, "protocol", "tcp or udp"},
		{"nft-dnat-map-add", []string{"192.0.2.11,443,Tcp,198.51.100.11:443"}, 0, "protocol", "tcp or udp"},
		{"nft-dnat-map-add", []string{"192.0.2.11/24,443,tcp,198.51.100.11:443"}, 0, "eip", "IPv4"},
		{"nft-dnat-map-add", []string{"192.0.2.11,443,tcp,198.51.100.11:0"}, 0, "backends", "IPv4:PORT"},
		{"nft-dnat-map-add", []string{"192.0.2.11,443,tcp,198.51.100.11"}, 0, "backends", "IPv4:PORT"},
		{"nft-dnat-map-add", []string{"192.0.2.11,443,tcp,198.51.100.11:80@"}, 0, "backends", "IPv4:PORT"},
		{"nft-dnat-map-add", []string{"192.0.2.11,443,tcp,198.51.100.11:80@198.51.100.11:80"}, 0, "backends", "twice"},
		{"nft-dnat-map-add", []string{"192.0.2.11,443,tcp,198.51.100.11:80", "192.0.2.11,443,tcp,198.51.100.12:80"}, 1, "", "twice in one call"},
		{"nft-dnat-map-del", []string{"192.0.2.11,443"}, 0, "", "want 3"},
		{"nft-dnat-map-del", []string{"192.0.2.11,443,tcp,198.51.100.11:80"}, 0, "", "at most 3"},
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

// addDel pairs each -add subcommand with the -del that undoes it.
var addDel = map[string]string{
	OpEIPAdd: OpEIPDel, OpFIPAdd: OpFIPDel, OpDNATAdd: OpDNATDel, OpSNATAdd: OpSNATDel, OpSubnetRouteAdd: OpSubnetRouteDel,
}

// FuzzParse: no input panics; every error is an *ArgError; every object is
// valid or fails validation with a *nat.FieldError (never anything else);
// every UID is a valid UID; and the -del of the same rules deletes exactly
// the UIDs the -add made.
// Seeds: testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add("eip-add", "192.0.2.10/24")
	f.Add("floating-ip-add", "192.0.2.10,198.51.100.10 192.0.2.11/24,198.51.100.11")
	f.Add("dnat-add", "192.0.2.11,8080,tcp,198.51.100.11,80")
	f.Add("snat-add", "192.0.2.12,198.51.100.0/24,--random-fully")
	f.Add("subnet-route-add", "10.0.1.0/24,198.51.100.1")
	f.Add("init", "net2,net1")
	f.Add("qos-add", "egress,net1,3,matchall,,,,30,30")
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
			made = append(made, o.UID)
		}
		if !reflect.DeepEqual(dedupe(made), d.Delete) {
			t.Fatalf("%s %q made %v but %s deletes %v", op, arg, made, del, d.Delete)
		}
	})
}
