package iptables

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/engine"
)

// Unit tests of rendering and parsing; no root needed.

var rd = renderer{extIf: "net1", intIf: "eth0"}

func mustPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func mustAddr(s string) netip.Addr     { return netip.MustParseAddr(s) }

func TestRules(t *testing.T) {
	cases := []struct {
		name string
		obj  nat.Object
		want []string // "table line"
	}{
		{"eip without qos",
			nat.Object{UID: "u1", Kind: nat.KindEIP, EIP: &nat.EIP{Address: mustAddr("192.0.2.10"), PrefixLen: 24}},
			[]string{`nat -A NATGW_OBJECTS -m comment --comment "u1 eip addr=192.0.2.10/24" -j RETURN`}},
		{"eip with ingress and egress qos",
			nat.Object{UID: "u2", Kind: nat.KindEIP, EIP: &nat.EIP{Address: mustAddr("192.0.2.10"), PrefixLen: 32, QoS: &nat.QoS{IngressRateMbps: 8, IngressBurstMbit: 16, EgressRateMbps: 80}}},
			[]string{
				`nat -A NATGW_OBJECTS -m comment --comment "u2 eip addr=192.0.2.10/32 qos=8/16/80/0" -j RETURN`,
				`mangle -A NATGW_QOS_INGRESS -d 192.0.2.10/32 -i net1 -m comment --comment "u2 eip addr=192.0.2.10/32 qos=8/16/80/0" -m hashlimit --hashlimit-above 1000000b/s --hashlimit-burst 1000000b --hashlimit-name ` + hashlimitName("in", mustAddr("192.0.2.10"), 1000000, 1) + ` -j DROP`,
				`mangle -A NATGW_QOS_EGRESS -o net1 -m comment --comment "u2 eip addr=192.0.2.10/32 qos=8/16/80/0" -m conntrack --ctorigdst 192.0.2.10 -m hashlimit --hashlimit-above 10000000b/s --hashlimit-name ` + hashlimitName("out", mustAddr("192.0.2.10"), 10000000, 0) + ` -j DROP`,
				`mangle -A NATGW_QOS_EGRESS -o net1 -m comment --comment "u2 eip addr=192.0.2.10/32 qos=8/16/80/0" -m conntrack --ctrepldst 192.0.2.10 -m hashlimit --hashlimit-above 10000000b/s --hashlimit-name ` + hashlimitName("out", mustAddr("192.0.2.10"), 10000000, 0) + ` -j DROP`,
			}},
		{"fip",
			nat.Object{UID: "u3", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: mustAddr("192.0.2.10"), InternalIP: mustAddr("10.0.0.5")}},
			[]string{
				`nat -A NATGW_EXCLUSIVE_DNAT -d 192.0.2.10/32 -m comment --comment "u3 fip eip=192.0.2.10 in=10.0.0.5" -j DNAT --to-destination 10.0.0.5`,
				`nat -A NATGW_EXCLUSIVE_SNAT -s 10.0.0.5/32 -o net1 -m comment --comment "u3 fip eip=192.0.2.10 in=10.0.0.5" -j SNAT --to-source 192.0.2.10`,
				`nat -A NATGW_HAIRPIN_SNAT -o eth0 -m comment --comment "u3 fip eip=192.0.2.10 in=10.0.0.5" -m mark --mark 0x20000/0x20000 -m conntrack --ctstate DNAT --ctorigdst 192.0.2.10 -j SNAT --to-source 192.0.2.10`,
			}},
		{"dnat udp",
			nat.Object{UID: "u4", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: mustAddr("192.0.2.11"), Protocol: nat.UDP, ExternalPort: 53, InternalIP: mustAddr("10.0.0.6"), InternalPort: 5353}},
			[]string{
				`nat -A NATGW_SHARED_DNAT -d 192.0.2.11/32 -p udp -m udp --dport 53 -m comment --comment "u4 dnat eip=192.0.2.11 proto=udp port=53 to=10.0.0.6:5353" -j DNAT --to-destination 10.0.0.6:5353`,
				`nat -A NATGW_HAIRPIN_SNAT -o eth0 -m comment --comment "u4 dnat eip=192.0.2.11 proto=udp port=53 to=10.0.0.6:5353" -m mark --mark 0x20000/0x20000 -m conntrack --ctstate DNAT --ctorigdst 192.0.2.11 -j SNAT --to-source 192.0.2.11`,
			}},
		{"snat random-fully",
			nat.Object{UID: "u5", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: mustAddr("192.0.2.12"), InternalCIDR: mustPrefix("10.0.0.0/16"), RandomFully: true}},
			[]string{`nat -A NATGW_SHARED_SNAT -s 10.0.0.0/16 -o net1 -m comment --comment "u5 snat eip=192.0.2.12 cidr=10.0.0.0/16 random-fully=1" -j SNAT --to-source 192.0.2.12 --random-fully`}},
		{"snat of everything has no -s (iptables-save omits 0.0.0.0/0)",
			nat.Object{UID: "u6", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: mustAddr("192.0.2.12"), InternalCIDR: mustPrefix("0.0.0.0/0")}},
			[]string{`nat -A NATGW_SHARED_SNAT -o net1 -m comment --comment "u6 snat eip=192.0.2.12 cidr=0.0.0.0/0" -j SNAT --to-source 192.0.2.12`}},
		{"route",
			nat.Object{UID: "u7", Kind: nat.KindRoute, Route: &nat.Route{Destination: mustPrefix("0.0.0.0/0"), NextHop: mustAddr("192.0.2.1"), Device: nat.DeviceExternal}},
			[]string{`nat -A NATGW_OBJECTS -m comment --comment "u7 route dst=0.0.0.0/0 via=192.0.2.1 dev=external" -j RETURN`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.obj.Validate(); err != nil {
				t.Fatalf("test object invalid: %v", err)
			}
			var got []string
			for _, r := range rd.rules(tc.obj) {
				got = append(got, r.Table+" "+r.Line("-A"))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("rules:\n got %s\nwant %s", strings.Join(got, "\n     "), strings.Join(tc.want, "\n     "))
			}
			// Every rule parses back (as iptables-save prints it) to
			// the same rule, and its comment to the same object.
			for _, r := range rd.rules(tc.obj) {
				args, err := splitArgs(r.Line("-A")[3:])
				if err != nil {
					t.Fatal(err)
				}
				if back := (Rule{r.Table, args[0], args[1:]}); back.key() != r.key() {
					t.Errorf("parse back: %q != %q", back.key(), r.key())
				}
				o, err := decodeComment(r.comment())
				if err != nil {
					t.Fatalf("decode %q: %v", r.comment(), err)
				}
				if !o.Equal(tc.obj) {
					t.Errorf("decode %q = %v, want %v", r.comment(), o, tc.obj)
				}
			}
		})
	}
}

func TestCommentRoundTripLimits(t *testing.T) {
	long := strings.Repeat("a", nat.MaxUIDLen)
	objs := []nat.Object{
		{UID: long, Kind: nat.KindEIP, EIP: &nat.EIP{Address: mustAddr("255.255.255.254"), PrefixLen: 32, QoS: &nat.QoS{IngressRateMbps: 100000, IngressBurstMbit: 4294967295, EgressRateMbps: 100000, EgressBurstMbit: 4294967295}}},
		{UID: long, Kind: nat.KindEIP, EIP: &nat.EIP{Address: mustAddr("192.0.2.1"), PrefixLen: 1, QoS: &nat.QoS{}}},
		{UID: long, Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: mustAddr("255.255.255.254"), Protocol: nat.TCP, ExternalPort: 65535, InternalIP: mustAddr("255.255.255.253"), InternalPort: 65535}},
		{UID: long, Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: mustAddr("255.255.255.254"), Protocol: nat.TCP, ExternalPort: 65535, InternalIP: mustAddr("255.255.255.253"), InternalPort: 65535, Type: nat.DNATShare}},
		{UID: long, Kind: nat.KindRoute, Route: &nat.Route{Destination: mustPrefix("255.255.255.255/32"), NextHop: mustAddr("255.255.255.254"), Device: nat.DeviceInternal}},
		{UID: "a.b_c:d-e", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: mustAddr("192.0.2.1"), InternalCIDR: mustPrefix("10.0.0.0/8")}},
	}
	for _, o := range objs {
		c := encodeComment(o)
		if len(c) > 255 {
			t.Errorf("comment of %v is %d characters, iptables allows 255", o, len(c))
		}
		back, err := decodeComment(c)
		if err != nil {
			t.Fatalf("decode %q: %v", c, err)
		}
		if !back.Equal(o) {
			t.Errorf("round trip of %q: %v != %v", c, back, o)
		}
		if (back.Kind == nat.KindEIP) && (back.EIP.QoS == nil) != (o.EIP.QoS == nil) {
			t.Errorf("round trip of %q lost whether QoS is set", c)
		}
	}
}

func TestDecodeCommentRejects(t *testing.T) {
	for _, c := range []string{
		"",
		"uid",
		"uid fip",
		"uid fip eip=192.0.2.10",
		"uid fip eip=192.0.2.10 in=nonsense",
		"uid fip eip=192.0.2.10 in=10.0.0.1 extra=1",
		"uid fip eip=192.0.2.10 eip=192.0.2.11 in=10.0.0.1",
		"uid fip in=10.0.0.1 eip=192.0.2.10", // valid fields, not canonical
		"uid fip eip=192.0.2.10 in=192.0.2.10",
		"uid dnat eip=192.0.2.10 proto=icmp port=1 to=10.0.0.1:1",
		"uid dnat eip=192.0.2.10 proto=tcp port=70000 to=10.0.0.1:1",
		"uid dnat eip=192.0.2.10 proto=tcp port=80 to=10.0.0.1",
		"uid dnat eip=192.0.2.10 proto=tcp port=80 to=10.0.0.1:1 type=exclusive", // the default is not written
		"uid dnat eip=192.0.2.10 proto=tcp port=80 to=10.0.0.1:1 type=roundrobin",
		"uid snat eip=192.0.2.10 cidr=10.0.0.1/8",
		"uid eip addr=192.0.2.10/24 qos=1/2/3",
		"uid eip addr=192.0.2.10/33",
		"uid route dst=10.0.0.0/8 via=10.0.0.1 dev=sideways",
		"uid teleport x=1",
		"@natgw-boot 0123456789abcdef",
		"bad\"uid fip eip=192.0.2.10 in=10.0.0.1",
	} {
		if o, err := decodeComment(c); err == nil {
			t.Errorf("decodeComment(%q) = %v, want an error", c, o)
		}
	}
}

func TestSplitArgs(t *testing.T) {
	cases := []struct {
		in   string
		want []string
		err  bool
	}{
		{`X -d 1.2.3.4/32 -j DNAT`, []string{"X", "-d", "1.2.3.4/32", "-j", "DNAT"}, false},
		{`X -m comment --comment "a b  c" -j RETURN`, []string{"X", "-m", "comment", "--comment", "a b  c", "-j", "RETURN"}, false},
		{`X --comment "q\"uote\\" -j A`, []string{"X", "--comment", `q"uote\`, "-j", "A"}, false},
		{`X --comment ""`, []string{"X", "--comment", ""}, false},
		{"X\t-j  A ", []string{"X", "-j", "A"}, false},
		{`X --comment "open`, nil, true},
	}
	for _, tc := range cases {
		got, err := splitArgs(tc.in)
		if (err != nil) != tc.err || !slices.Equal(got, tc.want) {
			t.Errorf("splitArgs(%q) = %q, %v; want %q, err %v", tc.in, got, err, tc.want, tc.err)
		}
		if err == nil {
			// quote is the inverse of splitArgs.
			var q []string
			for _, a := range got {
				q = append(q, quote(a))
			}
			if back, _ := splitArgs(strings.Join(q, " ")); !slices.Equal(back, got) {
				t.Errorf("quote/splitArgs round trip of %q: %q", got, back)
			}
		}
	}
}

const sampleSave = `# Generated by iptables-save v1.8.9 on Wed Dec  2 14:12:53 2026
*nat
:PREROUTING ACCEPT [10:600]
:POSTROUTING ACCEPT [0:0]
:NATGW_OBJECTS - [0:0]
:FOREIGN - [0:0]
-A PREROUTING -j NATGW_DNAT_FILTER
-A PREROUTING -s 10.0.0.0/8 -j FOREIGN
-A NATGW_OBJECTS -m comment --comment "@natgw-boot 0123456789abcdef" -j RETURN
-A NATGW_OBJECTS -m comment --comment "u1 eip addr=192.0.2.10/24" -j RETURN
COMMIT
# Completed on Wed Dec  2 14:12:53 2026
*filter
:INPUT ACCEPT [0:0]
COMMIT
`

func TestParseSave(t *testing.T) {
	d, err := parseSave(sampleSave)
	if err != nil {
		t.Fatal(err)
	}
	n := d.table("nat")
	for _, ch := range []string{"PREROUTING", "POSTROUTING", "NATGW_OBJECTS", "FOREIGN"} {
		if !n.chains[ch] {
			t.Errorf("chain %s not declared", ch)
		}
	}
	if got := len(n.rules["PREROUTING"]); got != 2 {
		t.Errorf("PREROUTING has %d rules, want 2", got)
	}
	if got := n.rules["NATGW_OBJECTS"][1].comment(); got != "u1 eip addr=192.0.2.10/24" {
		t.Errorf("comment = %q", got)
	}
	if !d.table("filter").chains["INPUT"] || len(d.table("mangle").chains) != 0 {
		t.Errorf("filter/mangle tables parsed wrong: %+v", d)
	}
	for _, bad := range []string{"-A X -j Y\n", "*nat\n-A X --comment \"open\nCOMMIT\n", "*nat\n-Z\nCOMMIT\n", "*nat\n-A\nCOMMIT\n"} {
		if _, err := parseSave(bad); err == nil {
			t.Errorf("parseSave(%q) accepted", bad)
		}
	}
}

func TestDecodeDropsBadAndConflictingObjects(t *testing.T) {
	r := &Backend{rd: rd, log: logr.Discard()}
	fip := func(uid, eip, in string) nat.Object {
		return nat.Object{UID: uid, Kind: nat.KindFIP, FIP: &nat.FIP{EIP: mustAddr(eip), InternalIP: mustAddr(in)}}
	}
	good := fip("a", "192.0.2.10", "10.0.0.1")
	conflicting := fip("b", "192.0.2.10", "10.0.0.2") // same EIP as a
	disagreeing := fip("c", "192.0.2.12", "10.0.0.3")
	var lines []string
	add := func(rules []Rule) {
		for _, rule := range rules {
			lines = append(lines, "-A "+rule.Line("-A")[3:])
		}
	}
	add(rd.skeleton("0123456789abcdef"))
	add(rd.rules(good))
	add(rd.rules(conflicting))
	cr := rd.rules(disagreeing)
	i := slices.Index(cr[0].Args, "--comment")
	cr[0].Args[i+1] = "c fip eip=192.0.2.13 in=10.0.0.3" // the DNAT rule says otherwise
	add(cr)
	lines = append(lines, `-A NATGW_SHARED_DNAT -m comment --comment "garbage" -j RETURN`)
	d, err := parseSave("*nat\n" + strings.Join(lines, "\n") + "\nCOMMIT\n")
	if err != nil {
		t.Fatal(err)
	}
	boot, objs := r.decode(d)
	if boot != "0123456789abcdef" {
		t.Errorf("boot = %q", boot)
	}
	if len(objs) != 1 || !objs[0].Equal(good) {
		t.Errorf("decoded %v, want only %v", objs, good)
	}
	// The kernel then differs from what the kept objects render to, so
	// Load rewrites the chains.
	if chainsMatch(d.table(tableNAT), tableNAT, r.desired(objs, boot)[tableNAT]) {
		t.Error("chains with stray rules reported as matching")
	}
}

func TestChainsMatch(t *testing.T) {
	r := &Backend{rd: rd, log: logr.Discard()}
	snat := func(uid, cidr string) nat.Object {
		return nat.Object{UID: uid, Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: mustAddr("192.0.2.10"), InternalCIDR: mustPrefix(cidr)}}
	}
	objs := []nat.Object{
		{UID: "f1", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: mustAddr("192.0.2.11"), InternalIP: mustAddr("10.0.0.1")}},
		{UID: "f2", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: mustAddr("192.0.2.12"), InternalIP: mustAddr("10.0.0.2")}},
		snat("s8", "10.0.0.0/8"), snat("s24", "10.1.0.0/24"), snat("s16", "10.1.0.0/16"),
	}
	want := r.desired(objs, "0123456789abcdef")
	if got := want[tableNAT][chainSharedSNAT]; len(got) != 3 || !strings.Contains(got[0].comment(), "s24") || !strings.Contains(got[2].comment(), "s8") {
		t.Fatalf("SHARED_SNAT not longest prefix first: %v", got)
	}
	render := func(mod func(map[string][]Rule)) *tableDump {
		td := &tableDump{chains: map[string]bool{}, rules: map[string][]Rule{}}
		for ch, rules := range want[tableNAT] {
			td.rules[ch] = slices.Clone(rules)
		}
		for _, ch := range ownChains[tableNAT] {
			td.chains[ch] = true
		}
		mod(td.rules)
		return td
	}
	cases := []struct {
		name string
		mod  func(map[string][]Rule)
		want bool
	}{
		{"identical", func(map[string][]Rule) {}, true},
		{"unordered chain in another order", func(m map[string][]Rule) { slices.Reverse(m[chainExclusiveDNAT]) }, true},
		{"SHARED_SNAT in another order", func(m map[string][]Rule) { slices.Reverse(m[chainSharedSNAT]) }, false},
		{"dispatch in another order", func(m map[string][]Rule) { slices.Reverse(m[chainSNATFilter]) }, false},
		{"rule missing", func(m map[string][]Rule) { m[chainExclusiveSNAT] = m[chainExclusiveSNAT][1:] }, false},
		{"rule duplicated", func(m map[string][]Rule) { m[chainHairpinSNAT] = append(m[chainHairpinSNAT], m[chainHairpinSNAT][0]) }, false},
	}
	for _, tc := range cases {
		if got := chainsMatch(render(tc.mod), tableNAT, want[tableNAT]); got != tc.want {
			t.Errorf("%s: chainsMatch = %v, want %v", tc.name, got, tc.want)
		}
	}
	missing := render(func(map[string][]Rule) {})
	delete(missing.chains, chainObjects)
	if chainsMatch(missing, tableNAT, want[tableNAT]) {
		t.Error("missing chain reported as matching")
	}
}

func TestRuleKeyIgnoresHashlimitRounding(t *testing.T) {
	e := &nat.EIP{Address: mustAddr("192.0.2.10"), PrefixLen: 24, QoS: &nat.QoS{IngressRateMbps: 10}}
	r := rd.qosRules(e, "c")[0]
	printed := slices.Clone(r.Args)
	for i, a := range printed {
		switch a {
		case "--hashlimit-above":
			printed[i+1] = "1250016b/s" // as the kernel rounds it
		case "--hashlimit-burst":
			printed[i+1] = "1mb"
		}
	}
	if (Rule{r.Table, r.Chain, printed}).key() != r.key() {
		t.Error("key depends on the printed hashlimit rate")
	}
	other := rd.qosRules(&nat.EIP{Address: e.Address, PrefixLen: 24, QoS: &nat.QoS{IngressRateMbps: 11}}, "c")[0]
	if other.key() == r.key() {
		t.Error("a changed rate keeps the same key (hashlimit name must change)")
	}
	if n := hashlimitName("out", netip.MustParseAddr("255.255.255.255"), 1<<40, 1<<41); len(n) > 15 {
		t.Errorf("hashlimit name %q longer than 15", n)
	}
}

func TestHashlimitQuantum(t *testing.T) {
	// Rates as iptables-legacy 1.8.9 printed them back (or named them in
	// "burst cannot be smaller than" errors) on this kernel.
	for rate, want := range map[uint64]uint64{
		125_000:        124_992,
		1_250_000:      1_250_016,
		12_500_000:     12_501_248,
		1_250_000_000:  1_272_582_880,
		12_500_000_000: 13_743_895_328,
	} {
		if got := hashlimitQuantum(rate); got != want {
			t.Errorf("hashlimitQuantum(%d) = %d, want %d", rate, got, want)
		}
	}
}

func TestHashlimitBurst(t *testing.T) {
	q := hashlimitQuantum(2_000_000) // 16 Mbit/s
	cases := []struct {
		rate, burst uint32 // Mbit/s, Mbit
		want        string // --hashlimit-burst argument, "" for none
	}{
		{16, 0, ""},
		{16, 1, ""},  // within the first second of credit
		{16, 16, ""}, // exactly one second
		{16, 17, strconv.FormatUint(q, 10) + "b"},
		{16, 32, strconv.FormatUint(q, 10) + "b"},
		{16, 33, strconv.FormatUint(2*q, 10) + "b"},
	}
	for _, tc := range cases {
		args := hashlimitArgs("in", mustAddr("192.0.2.10"), tc.rate, tc.burst)
		got := ""
		if i := slices.Index(args, "--hashlimit-burst"); i >= 0 {
			got = args[i+1]
		}
		if got != tc.want {
			t.Errorf("rate %d burst %d: --hashlimit-burst %q, want %q (%q)", tc.rate, tc.burst, got, tc.want, args)
		}
	}
	if a, b := hashlimitArgs("in", mustAddr("192.0.2.10"), 16, 17), hashlimitArgs("in", mustAddr("192.0.2.10"), 16, 33); slices.Equal(a, b) {
		t.Error("different bursts render the same rule")
	}
}

func TestScriptAndFailureClassification(t *testing.T) {
	sc := newScript()
	sc.add(tableMangle, "-A M x")
	sc.add(tableNAT, "-A N a")
	sc.add(tableNAT, "-A N b")
	text, commits := sc.render()
	want := "*nat\n-A N a\n-A N b\nCOMMIT\n*mangle\n-A M x\nCOMMIT\n"
	if text != want || !slices.Equal(commits, []int{4, 7}) {
		t.Fatalf("render = %q %v", text, commits)
	}
	cases := []struct {
		msg     string
		commits []int
		want    bool
	}{
		{"iptables-restore: line 3 failed", []int{4}, true},
		{"anything", []int{4}, true},
		{"iptables-restore: line 3 failed", []int{4, 7}, true},
		{"Error occurred at line: 4", []int{4, 7}, true},
		{"iptables-restore: line 6 failed", []int{4, 7}, false},
		{"killed", []int{4, 7}, false},
	}
	for _, tc := range cases {
		if got := nothingCommitted(tc.msg, tc.commits); got != tc.want {
			t.Errorf("nothingCommitted(%q, %v) = %v, want %v", tc.msg, tc.commits, got, tc.want)
		}
	}
}

func TestCommitScript(t *testing.T) {
	// An update is old out then new in within one nat section, and an
	// SNAT change rewrites SHARED_SNAT, longest prefix first, after the
	// deletes.
	s8 := nat.Object{UID: "s8", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: mustAddr("192.0.2.11"), InternalCIDR: mustPrefix("10.0.0.0/8")}}
	s16 := nat.Object{UID: "s16", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: mustAddr("192.0.2.11"), InternalCIDR: mustPrefix("10.1.0.0/16")}}
	r := &Backend{rd: rd, log: logr.Discard(), snats: map[string]nat.Object{"s8": s8}}
	old := nat.Object{UID: "f", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: mustAddr("192.0.2.10"), InternalIP: mustAddr("10.0.0.1")}}
	nw := nat.Object{UID: "f", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: mustAddr("192.0.2.10"), InternalIP: mustAddr("10.0.0.2")}}
	sc, snats, _ := r.commitScript(engine.Commit{Removed: []nat.Object{old}, Added: []nat.Object{nw, s16}})
	text, commits := sc.render()
	var want []string
	want = append(want, "*nat")
	for _, rule := range rd.rules(old) {
		want = append(want, rule.Line("-D"))
	}
	for _, rule := range rd.rules(nw) {
		want = append(want, rule.Line("-A"))
	}
	want = append(want, "-F "+chainSharedSNAT, rd.rules(s16)[0].Line("-A"), rd.rules(s8)[0].Line("-A"), "COMMIT")
	if text != strings.Join(want, "\n")+"\n" || len(commits) != 1 {
		t.Fatalf("script:\n%s\nwant:\n%s", text, strings.Join(want, "\n"))
	}
	if len(snats) != 2 || len(r.snats) != 1 {
		t.Errorf("SNAT mirror: next %v, current %v (must change only after the restore)", snats, r.snats)
	}
	sc, snats, _ = r.commitScript(engine.Commit{Removed: []nat.Object{s8}})
	if text, _ := sc.render(); text != "*nat\n-F "+chainSharedSNAT+"\nCOMMIT\n" || len(snats) != 0 {
		t.Errorf("deleting the last SNAT: %q, %v", text, snats)
	}
	eip := nat.Object{UID: "e", Kind: nat.KindEIP, EIP: &nat.EIP{Address: mustAddr("192.0.2.10"), PrefixLen: 24, QoS: &nat.QoS{EgressRateMbps: 1}}}
	sc, _, _ = r.commitScript(engine.Commit{Added: []nat.Object{eip}})
	if got := sc.tableNames(); !slices.Equal(got, []string{tableNAT, tableMangle}) {
		t.Errorf("EIP with QoS touches %v, want nat then mangle", got)
	}
}

func TestDecodeNATTableWins(t *testing.T) {
	// A restore that committed nat and failed in mangle leaves an EIP whose
	// nat record is new and whose QoS rules are old: the nat record wins
	// and the mangle chains no longer match, so Load rewrites them.
	r := &Backend{rd: rd, log: logr.Discard()}
	eip := func(rate uint32) nat.Object {
		return nat.Object{UID: "e", Kind: nat.KindEIP, EIP: &nat.EIP{Address: mustAddr("192.0.2.10"), PrefixLen: 24, QoS: &nat.QoS{IngressRateMbps: rate}}}
	}
	newer, older := eip(20), eip(10)
	text := "*nat\n"
	for _, rule := range append(rd.skeleton("0123456789abcdef"), rd.rules(newer)...) {
		if rule.Table == tableNAT {
			text += rule.Line("-A") + "\n"
		}
	}
	text += "COMMIT\n*mangle\n:" + chainQoSIngress + " - [0:0]\n:" + chainQoSEgress + " - [0:0]\n"
	for _, rule := range rd.rules(older) {
		if rule.Table == tableMangle {
			text += rule.Line("-A") + "\n"
		}
	}
	text += "COMMIT\n"
	d, err := parseSave(text)
	if err != nil {
		t.Fatal(err)
	}
	_, objs := r.decode(d)
	if len(objs) != 1 || !objs[0].Equal(newer) {
		t.Fatalf("decoded %v, want %v", objs, newer)
	}
	if !chainsMatch(d.table(tableMangle), tableMangle, r.desired([]nat.Object{older}, "0123456789abcdef")[tableMangle]) {
		t.Fatal("test setup: mangle chains do not hold the older QoS rules")
	}
	if chainsMatch(d.table(tableMangle), tableMangle, r.desired(objs, "0123456789abcdef")[tableMangle]) {
		t.Error("stale QoS rules reported as matching")
	}
}

// shareDNAT is share backend uid of 192.0.2.20 tcp/port to 10.0.0.<last>:80.
func shareDNAT(uid string, port uint16, last byte) nat.Object {
	return nat.Object{UID: uid, Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: mustAddr("192.0.2.20"), Protocol: nat.TCP, ExternalPort: port,
		InternalIP: netip.AddrFrom4([4]byte{10, 0, 0, last}), InternalPort: 80, Type: nat.DNATShare}}
}

func TestShareRules(t *testing.T) {
	// Three backends, given out of order: UID order, probabilities 1/3
	// and 1/2 as iptables-legacy-save prints them, the last unmatched.
	got := shareRules([]nat.Object{shareDNAT("c", 80, 3), shareDNAT("a", 80, 1), shareDNAT("b", 80, 2)})
	want := []string{
		`-A NATGW_SHARED_DNAT -d 192.0.2.20/32 -p tcp -m tcp --dport 80 -m statistic --mode random --probability 0.33333333349 -m comment --comment "a dnat eip=192.0.2.20 proto=tcp port=80 to=10.0.0.1:80 type=share" -j DNAT --to-destination 10.0.0.1:80`,
		`-A NATGW_SHARED_DNAT -d 192.0.2.20/32 -p tcp -m tcp --dport 80 -m statistic --mode random --probability 0.50000000000 -m comment --comment "b dnat eip=192.0.2.20 proto=tcp port=80 to=10.0.0.2:80 type=share" -j DNAT --to-destination 10.0.0.2:80`,
		`-A NATGW_SHARED_DNAT -d 192.0.2.20/32 -p tcp -m tcp --dport 80 -m comment --comment "c dnat eip=192.0.2.20 proto=tcp port=80 to=10.0.0.3:80 type=share" -j DNAT --to-destination 10.0.0.3:80`,
	}
	if len(got) != len(want) {
		t.Fatalf("%d rules, want %d", len(got), len(want))
	}
	for i := range got {
		if l := got[i].Line("-A"); l != want[i] {
			t.Errorf("rank %d:\n got %s\nwant %s", i, l, want[i])
		}
	}
	if len(shareRules(nil)) != 0 {
		t.Error("an identity without backends renders rules")
	}
	// Every rank of N gets 1/N of new connections: rank i is reached with
	// the probability that ranks before it did not match.
	for _, n := range []int{1, 2, 8, 64} {
		var bs []nat.Object
		for i := range n {
			bs = append(bs, shareDNAT(fmt.Sprintf("u%03d", i), 80, byte(i+1)))
		}
		reach := 1.0
		for i, r := range shareRules(bs) {
			p := 1.0
			for j, a := range r.Args {
				if a == "--probability" {
					var err error
					if p, err = strconv.ParseFloat(r.Args[j+1], 64); err != nil {
						t.Fatal(err)
					}
				}
			}
			if i == n-1 && p != 1 {
				t.Errorf("%d backends: last rank has a statistic match", n)
			}
			if share := reach * p; math.Abs(share-1/float64(n)) > 1e-6 {
				t.Errorf("%d backends: rank %d gets %.9f, want %.9f", n, i, share, 1/float64(n))
			}
			reach *= 1 - p
		}
	}
	// A share backend's own rules are its hairpin rule only.
	if rs := rd.rules(shareDNAT("a", 80, 1)); len(rs) != 1 || rs[0].Chain != chainHairpinSNAT {
		t.Errorf("rules of a share DNAT: %v, want its hairpin rule only", rs)
	}
}

func TestRuleKeyNormalizesProbability(t *testing.T) {
	r := shareRules([]nat.Object{shareDNAT("a", 80, 1), shareDNAT("b", 80, 2), shareDNAT("c", 80, 3)})[0]
	for _, printed := range []string{"0.33333333349", "0.3333333333333333", "0.33333333333"} {
		p := slices.Clone(r.Args)
		p[slices.Index(p, "--probability")+1] = printed
		if (Rule{r.Table, r.Chain, p}).key() != r.key() {
			t.Errorf("probability printed %s: key differs", printed)
		}
	}
	p := slices.Clone(r.Args)
	p[slices.Index(p, "--probability")+1] = "0.5"
	if (Rule{r.Table, r.Chain, p}).key() == r.key() {
		t.Error("another probability has the same key")
	}
}

func TestChainsMatchShare(t *testing.T) {
	r := &Backend{rd: rd, log: logr.Discard()}
	objs := []nat.Object{shareDNAT("a", 80, 1), shareDNAT("b", 80, 2), shareDNAT("c", 80, 3), shareDNAT("d", 443, 4), shareDNAT("e", 443, 5),
		{UID: "x", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: mustAddr("192.0.2.20"), Protocol: nat.TCP, ExternalPort: 22, InternalIP: mustAddr("10.0.0.9"), InternalPort: 22}}}
	want := r.desired(objs, "0123456789abcdef")[tableNAT]
	if n := len(want[chainSharedDNAT]); n != 6 {
		t.Fatalf("SHARED_DNAT holds %d rules, want 6", n)
	}
	td := func(rules []Rule) *tableDump {
		d := &tableDump{chains: map[string]bool{}, rules: map[string][]Rule{}}
		for ch, rs := range want {
			d.rules[ch] = slices.Clone(rs)
		}
		for _, ch := range ownChains[tableNAT] {
			d.chains[ch] = true
		}
		d.rules[chainSharedDNAT] = rules
		return d
	}
	w := want[chainSharedDNAT] // port 22 first, then 80 (a, b, c), then 443 (d, e)
	for _, tc := range []struct {
		name  string
		rules []Rule
		want  bool
	}{
		{"identical", slices.Clone(w), true},
		{"identities in another order", []Rule{w[4], w[5], w[1], w[2], w[3], w[0]}, true},
		{"identities interleaved, each in order", []Rule{w[1], w[4], w[2], w[0], w[5], w[3]}, true},
		{"one identity's ranks swapped", []Rule{w[0], w[2], w[1], w[3], w[4], w[5]}, false},
		{"a rank missing", []Rule{w[0], w[1], w[3], w[4], w[5]}, false},
	} {
		if got := chainsMatch(td(tc.rules), tableNAT, want); got != tc.want {
			t.Errorf("%s: chainsMatch = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestCommitScriptShare(t *testing.T) {
	// Adding backend c to identity {a, b} deletes a's and b's rules and
	// appends the three in rank order; c's hairpin rule is its own.
	a, b, c := shareDNAT("a", 80, 1), shareDNAT("b", 80, 2), shareDNAT("c", 80, 3)
	other := shareDNAT("z", 443, 9)
	r := &Backend{rd: rd, log: logr.Discard(), shares: map[string]nat.Object{"a": a, "b": b, "z": other}}
	sc, _, shares := r.commitScript(engine.Commit{Added: []nat.Object{c}})
	text, _ := sc.render()
	want := []string{"*nat", rd.rules(c)[0].Line("-A")}
	for _, rule := range shareRules([]nat.Object{a, b}) {
		want = append(want, rule.Line("-D"))
	}
	for _, rule := range shareRules([]nat.Object{a, b, c}) {
		want = append(want, rule.Line("-A"))
	}
	want = append(want, "COMMIT")
	if text != strings.Join(want, "\n")+"\n" {
		t.Fatalf("script:\n%s\nwant:\n%s", text, strings.Join(want, "\n"))
	}
	if len(shares) != 4 || len(r.shares) != 3 {
		t.Errorf("share mirror: next %d, current %d (must change only after the restore)", len(shares), len(r.shares))
	}
	// Removing the last backend of an identity deletes its rule and adds none.
	r.shares = shares
	sc, _, shares = r.commitScript(engine.Commit{Removed: []nat.Object{other}})
	text, _ = sc.render()
	want = []string{"*nat", rd.rules(other)[0].Line("-D"), shareRules([]nat.Object{other})[0].Line("-D"), "COMMIT"}
	if text != strings.Join(want, "\n")+"\n" || len(shares) != 3 {
		t.Errorf("removing the last backend:\n%s\nwant:\n%s", text, strings.Join(want, "\n"))
	}
}

// TestRefuseIPv6: every IPv6 object is refused before anything runs, with
// a *nat.FieldError naming the field, the value and the reason.
func TestRefuseIPv6(t *testing.T) {
	a := netip.MustParseAddr
	for _, tt := range []struct {
		obj   nat.Object
		field string // "": accepted
	}{
		{nat.Object{UID: "f4", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a("192.0.2.10"), InternalIP: a("10.0.0.5")}}, ""},
		{nat.Object{UID: "e4", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.10"), PrefixLen: 24}}, ""},
		{nat.Object{UID: "e6", Kind: nat.KindEIP, EIP: &nat.EIP{V6Address: a("2001:db8::10"), V6PrefixLen: 64}}, "eip.v6Address"},
		{nat.Object{UID: "e46", Kind: nat.KindEIP, EIP: &nat.EIP{Address: a("192.0.2.10"), PrefixLen: 24, V6Address: a("2001:db8::10"), V6PrefixLen: 64}}, "eip.v6Address"},
		{nat.Object{UID: "f6", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: a("2001:db8::10"), InternalIP: a("fd00::5")}}, "fip.eip"},
		{nat.Object{UID: "d6", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: a("2001:db8::10"), Protocol: nat.TCP, ExternalPort: 80, InternalIP: a("fd00::5"), InternalPort: 80}}, "dnat.eip"},
		{nat.Object{UID: "s6", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: a("2001:db8::10"), InternalCIDR: netip.MustParsePrefix("fd00::/64")}}, "snat.eip"},
		{nat.Object{UID: "r6", Kind: nat.KindRoute, Route: &nat.Route{Destination: netip.MustParsePrefix("2001:db8::10/128"), NextHop: a("2001:db8::1"), Device: nat.DeviceExternal}}, "route.destination"},
	} {
		if err := tt.obj.Validate(); err != nil {
			t.Fatalf("%s: not valid: %v", tt.obj, err)
		}
		err := refuseIPv6([]nat.Object{tt.obj})
		if tt.field == "" {
			if err != nil {
				t.Errorf("%s: refused: %v", tt.obj, err)
			}
			continue
		}
		var fe *nat.FieldError
		if !errors.As(err, &fe) || fe.UID != tt.obj.UID || fe.Field != tt.field || !strings.Contains(fe.Value, "2001:db8::10") ||
			!strings.Contains(err.Error(), "ip6tables-legacy") || !errors.Is(err, nat.ErrInvalid) {
			t.Errorf("%s: %v, want a *nat.FieldError of %s", tt.obj, err, tt.field)
		}
	}
}
