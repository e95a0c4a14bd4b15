package main

import (
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

// TestAgentEIPQoSModes: `natgw serve` shapes EIP QoS by default on nftables
// (HTB classes and table natgw_shape, no limit in the NAT table; List and
// `natgw list` give the QoS back); with --eip-qos=police the agent removes
// the shaping at start and polices in the NAT table; a bad --eip-qos is
// refused naming the value.
func TestAgentEIPQoSModes(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 2*time.Minute)
	q := &nat.QoS{IngressRateMbps: 10, IngressBurstMbit: 8, EgressRateMbps: 20}
	eip := nat.Object{UID: "eip-1", Kind: nat.KindEIP, EIP: &nat.EIP{Address: netlab.EIP(0), PrefixLen: 24, QoS: q}}
	ruleset := func() string {
		t.Helper()
		rs, err := netlab.NftRuleset(ctx, gw.GW)
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}

	a := startAgent(t, gw.GW)
	if err := a.Apply(ctx, eip); err != nil {
		t.Fatal(err)
	}
	rs := ruleset()
	if !strings.Contains(rs, "table inet "+string(nftconn.ShapeTable)) || strings.Contains(rs, "qos_in_") {
		t.Errorf("default mode: want table %s and no limit in the NAT table:\n%s", nftconn.ShapeTable, rs)
	}
	objs, err := a.List(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || !objs[0].Equal(eip) {
		t.Errorf("agent List = %v, want %v", objs, eip)
	}
	out, errOut, code := cli(t, "natgw", "--netns", gw.GW, "list", "-o", "json")
	if code != 0 || !strings.Contains(out, `"ingressRateMbps": 10`) && !strings.Contains(out, `"ingressRateMbps":10`) {
		t.Errorf("natgw list: exit %d, %s%s: want the EIP's QoS", code, out, errOut)
	}
	a.stop(t)

	p := startAgent(t, gw.GW, "--eip-qos", "police")
	if _, err := p.Info(ctx); err != nil {
		t.Fatal(err)
	}
	if rs := ruleset(); strings.Contains(rs, string(nftconn.ShapeTable)) {
		t.Errorf("--eip-qos=police: table %s still there after start:\n%s", nftconn.ShapeTable, rs)
	}
	if err := p.Sync(ctx, []nat.Object{eip}); err != nil {
		t.Fatal(err)
	}
	if rs := ruleset(); !strings.Contains(rs, "qos_in_") {
		t.Errorf("--eip-qos=police: no limit in the NAT table:\n%s", rs)
	}
	p.stop(t)

	_, errOut, code = cli(t, "natgw", "--netns", gw.GW, "--eip-qos", "fast", "list")
	if code == 0 || !strings.Contains(errOut, `"fast"`) {
		t.Errorf("--eip-qos=fast: exit %d, stderr %q: want a refusal naming the value", code, errOut)
	}
}
