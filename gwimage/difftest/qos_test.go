package difftest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testsummary"
	"github.com/natgw/natgw/internal/upstream"
)

// README rows (gwimage/README.md) that explain the QoS run's expected
// differences.
const (
	// Kube-OVN's gateway-wide matchall rule is a `tc filter ... matchall`,
	// a classifier this kernel does not have (CONFIG_NET_CLS_MATCHALL
	// unset): upstream's call fails after it made the class; natgw picks
	// classes with nftables and needs no tc classifier.
	explainMatchall = "Not the same: tc classifiers and leaves this kernel lacks"
	// Upstream's qos-add of a u32 rule first deletes any filter of the
	// same "match ip DIR CIDR" on that device with its class, the
	// EIP's own class included when CIDR is the EIP's /32; natgw keeps
	// the EIP's class, which wins over gateway-wide rules.
	explainSameCIDR = "Not the same: a gateway-wide rule on an EIP's own /32"
	// A call is one transaction (the deliberate improvement).
	explainTransaction = "a call is one transaction"
)

// qosCalls are EIP QoS and gateway-wide QoS as kube-ovn-controller v1.16.2
// sends them: `eip-ingress-qos-add` / `eip-egress-qos-add`
// "EIP,PRIORITY,RATE,BURST" (Mbit/s and MB, decimals allowed;
// vpc_nat_gw_eip.go addEipQoSInPod), their dels with the EIP alone
// (delEipQoSInPod), and `qos-add` / `qos-del`
// "DIRECTION,IFACE,PRIORITY,CLASSIFIER,MATCHTYPE,MATCHDIR,CIDR,RATE,BURST"
// (vpc_nat_gateway.go execNatGwQoSInPod; matchall with the match fields
// empty). Every limit has a rate of its own, so the classes compared
// after each call name the call that made them.
func qosCalls() []call {
	e := func(i int) string { return eips[i].String() }
	v := func(i int) string { return vms[i].String() }
	return []call{
		{Op: "init", Rules: []string{""}},
		{Op: "eip-add", Rules: []string{e(0) + "/24"}},
		{Op: "eip-add", Rules: []string{e(1) + "/24"}},
		{Op: "floating-ip-add", Rules: []string{e(0) + "," + v(0)}, Note: "traffic through the limited EIP keeps flowing (the probes)"},
		{Op: "eip-ingress-qos-add", Rules: []string{e(0) + ",1,10,1"}, Note: "10 Mbit/s, burst 1 MB"},
		{Op: "eip-egress-qos-add", Rules: []string{e(0) + ",1,20,0"}, Note: "burst 0: tc's default"},
		{Op: "eip-ingress-qos-add", Rules: []string{e(0) + ",1,15,0.5"}, Note: "an add replaces the EIP's class of that direction; decimal burst"},
		{Op: "eip-egress-qos-add", Rules: []string{e(1) + ",2,1.5,0.25"}, Note: "decimal rate"},
		{Op: "eip-ingress-qos-add", Rules: []string{e(2) + ",1,30,1"}, Note: "an address that is not an EIP yet"},
		{Op: "eip-ingress-qos-del", Rules: []string{e(2)}},
		{Op: "eip-ingress-qos-add", Rules: []string{e(0) + ",1,abc,1"}, Note: "malformed rate: both fail; upstream deleted the EIP's class before tc refused the new one, natgw keeps it",
			Improvement: explainTransaction},
		{Op: "eip-ingress-qos-add", Rules: []string{e(0) + ",1,15,0.5"}, Note: "the same class on both sides again"},
		{Op: "qos-add", Rules: []string{"egress,net1,3,u32,ip,src," + e(3) + "/32,40,1"}, Note: "gateway-wide, u32 src"},
		{Op: "qos-add", Rules: []string{"ingress,net1,4,u32,ip,dst," + e(3) + "/32,45,2"}, Note: "gateway-wide ingress (upstream: on an IFB of net1)"},
		{Op: "qos-add", Rules: []string{"egress,net1,6,u32,ip,src," + e(1) + "/32,35,1"}, Note: "gateway-wide rule on an EIP's own /32: upstream's replaces the EIP's egress class, natgw keeps both",
			Improvement: explainSameCIDR},
		{Op: "qos-del", Rules: []string{"egress,net1,6,u32,ip,src," + e(1) + "/32,35,1"}, Note: "upstream: the EIP's class stays gone",
			Improvement: explainSameCIDR},
		{Op: "eip-egress-qos-add", Rules: []string{e(1) + ",2,1.5,0.25"}, Note: "the controller's next EIP QoS add: the same classes again"},
		{Op: "qos-add", Rules: []string{"egress,net1,5,matchall,,,,50,1"}, Note: "gateway-wide matchall: upstream's tc has no matchall classifier in this kernel",
			Improvement: explainMatchall},
		{Op: "qos-del", Rules: []string{"egress,net1,5,matchall,,,,50,1"}},
		{Op: "qos-del", Rules: []string{"egress,net1,3,u32,ip,src," + e(3) + "/32,40,1"}},
		{Op: "qos-del", Rules: []string{"ingress,net1,4,u32,ip,dst," + e(3) + "/32,45,2"}, Note: "9 fields, as the controller sends it"},
		{Op: "eip-ingress-qos-del", Rules: []string{e(0)}},
		{Op: "eip-egress-qos-del", Rules: []string{e(0)}},
		{Op: "eip-egress-qos-del", Rules: []string{e(0)}, Note: "already gone: 0"},
		{Op: "eip-egress-qos-del", Rules: []string{e(1)}},
		{Op: "floating-ip-del", Rules: []string{e(0)}},
		{Op: "eip-del", Rules: []string{e(0) + "/24"}},
		{Op: "eip-del", Rules: []string{e(1) + "/24"}},
	}
}

// qosClasses is the limits the kernel holds in s's gateway: every HTB
// class on every interface, as "DIR: rate R ceil C burst B cburst CB"
// (tc's own rounding), sorted, DIR egress for a class on net1 and ingress
// for one elsewhere: upstream shapes traffic to the gateway on an IFB of
// net1, natgw where it leaves the gateway (eth0). Left out: upstream's
// catch-all class 1:9999 (10 Gbit/s, "unlimited", for unclassified
// traffic; natgw's root sends unclassified traffic to HTB's direct queue
// instead). Class ids are not compared: their numbering differs
// (gwimage/README.md "eip-*-qos-add").
func (s *side) qosClasses(ctx context.Context, t *testing.T) string {
	t.Helper()
	out, err := netlab.Exec(ctx, s.gw.GW, "", "ip", "-o", "link", "show")
	if err != nil {
		t.Fatalf("%s: ip link show: %v", s.name, err)
	}
	var classes []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		dev, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		cs, err := netlab.Exec(ctx, s.gw.GW, "", "tc", "class", "show", "dev", dev)
		if err != nil {
			t.Fatalf("%s: tc class show dev %s: %v", s.name, dev, err)
		}
		for _, c := range strings.Split(cs, "\n") {
			if l, ok := htbLimit(c); ok {
				dir := "ingress"
				if dev == s.gw.ExternalInterface {
					dir = "egress"
				}
				classes = append(classes, dir+": "+l)
			}
		}
	}
	slices.Sort(classes)
	if len(classes) == 0 {
		return "none"
	}
	return strings.Join(classes, "; ")
}

// htbLimit reads one line of `tc class show`: an HTB class's rate, ceil,
// burst and cburst (ok false for other lines and upstream's 1:9999).
func htbLimit(line string) (string, bool) {
	f := strings.Fields(line)
	if len(f) < 3 || f[0] != "class" || f[1] != "htb" || strings.HasSuffix(f[2], ":9999") {
		return "", false
	}
	var out []string
	for i := 3; i+1 < len(f); i++ {
		switch f[i] {
		case "rate", "ceil", "burst", "cburst":
			out = append(out, f[i]+" "+f[i+1])
			i++
		}
	}
	if len(out) != 4 {
		return "", false
	}
	return strings.Join(out, " "), true
}

// TestHTBLimit: the parser keeps a class's four limits and skips what is
// not an HTB class or is upstream's catch-all.
func TestHTBLimit(t *testing.T) {
	for _, tc := range []struct {
		line string
		want string
		ok   bool
	}{
		{"class htb 1:473b root leaf 8001: prio 0 rate 15Mbit ceil 15Mbit burst 512Kb cburst 512Kb ", "rate 15Mbit ceil 15Mbit burst 512Kb cburst 512Kb", true},
		{"class htb 4e47:2 root prio 0 rate 1500Kbit ceil 1500Kbit burst 256Kb cburst 256Kb", "rate 1500Kbit ceil 1500Kbit burst 256Kb cburst 256Kb", true},
		{"class htb 1:9999 root prio 0 rate 10Gbit ceil 10Gbit burst 0b cburst 0b ", "", false},
		{"class fq_codel 8001:1 parent 8001:", "", false},
		{"class htb 1:10 root prio 0 rate 10Mbit", "", false},
		{"", "", false},
	} {
		got, ok := htbLimit(tc.line)
		if got != tc.want || ok != tc.ok {
			t.Errorf("htbLimit(%q) = %q, %v; want %q, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

// TestQoSAgainstUpstream: EIP and gateway-wide QoS calls, upstream
// v1.16.2's nat-gateway.sh and natgw's image side by side (both exec
// forms), each call judged as in TestAgainstUpstream (verdict, addresses
// and routes, probes) and by the limits the kernel then holds
// (qosClasses). Upstream's side runs its script with a `tc` that skips the
// fq_codel leaf this kernel lacks (upstreamRoot), as natgw's shaper falls
// back to HTB's default leaf.
func TestQoSAgainstUpstream(t *testing.T) {
	for _, form := range []execForm{formBashC, formArgv} {
		t.Run(form.String(), func(t *testing.T) {
			start := time.Now()
			ctx, up, ng, tl := startRun(t, 5*time.Minute, form)
			tl.qos = true
			for i, c := range qosCalls() {
				step(t, ctx, up, ng, tl, fmt.Sprintf("qos %02d", i+1), c, nil)
			}
			explained := tl.report(t)
			testsummary.Record(t, fmt.Sprintf("DIFFTEST-SUMMARY script=nat-gateway.sh calls=qos form=%s upstream=%s@%s calls=%d probes=%d answered=%d differences=%d explained=%d unexplained=%d elapsed=%s",
				strings.ReplaceAll(form.String(), " ", ""), upstream.Module, upstream.Version, tl.calls, tl.probes, tl.answered, len(tl.differences), explained, len(tl.differences)-explained, time.Since(start).Round(time.Second)))
		})
	}
}
