package main

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
	"github.com/natgw/natgw/nat/nftconn"
	"github.com/natgw/natgw/nat/shape"
)

// TestCompatQoSUnits checks EIP QoS set through nat-gateway.sh against
// upstream's documented units (rate in Mbit/s, burst in MB of 2^20 bytes)
// with measured TCP throughput through a FIP (upstream's own tc QoS cannot
// run on this kernel, so this is the reference instead), shaped (HTB
// classes of nat/shape, the default, as upstream's script) and policed
// (NATGW_EIP_QOS=police, natgw_gwqos):
//   - at 12.5 Mbit/s with a 1 MB burst, 6 MiB take at least 80% of what the
//     bytes beyond the bucket need at that rate (the shaper's bucket is the
//     burst; the policer's one second of rate plus the burst), and finish
//     (a rate read in a smaller unit would not);
//   - at 8 Mbit/s with a 4 MB burst, 4 MiB fit in the bucket and pass in
//     under 1.5 s (a burst read in Mbit, 0.5 MB, leaves 3.5 MB for the
//     rate: about 3.7 s shaped, 2.6 s policed).
//
// Each add lands where the mode says and nowhere else: a police-mode add
// takes the EIP's class away, a shape-mode add its policer rule.
func TestCompatQoSUnits(t *testing.T) {
	ctx, gw, eip := qosGateway(t)
	target := eip + ":80"
	xfers := []struct {
		dir string
		run func(n int64) (time.Duration, error)
	}{
		{"ingress", func(n int64) (time.Duration, error) {
			_, d, err := netlab.Upload(ctx, gw.Ext.NS, target, n, 30*time.Second)
			return d, err
		}},
		{"egress", func(n int64) (time.Duration, error) {
			_, d, err := netlab.Download(ctx, gw.Ext.NS, target, n, 30*time.Second)
			return d, err
		}},
	}
	const mb = 1 << 20
	for _, mode := range []struct {
		name   string
		bucket int64 // bytes of rate the bucket holds beyond the burst, per byte/s of rate
	}{{"shape", 0}, {"police", 1}} {
		t.Run(mode.name, func(t *testing.T) {
			t.Setenv("NATGW_EIP_QOS", mode.name)
			where := func(want int) {
				t.Helper()
				shaped, err := shape.Get(t.Context(), nat.Config{NetNS: gw.GW})
				if err != nil {
					t.Fatal(err)
				}
				policed, err := gwqos.List(t.Context(), nat.Config{NetNS: gw.GW})
				if err != nil {
					t.Fatal(err)
				}
				got := [2]int{len(shaped), len(policed)}
				exp := [2]int{want, 0}
				if mode.name == "police" {
					exp = [2]int{0, want}
				}
				if got != exp {
					t.Fatalf("%s: EIP QoS shaped %v, policed %v; want %d shaped, %d policed", mode.name, shaped, policed, exp[0], exp[1])
				}
			}
			for _, x := range xfers {
				// Rate: 12.5 Mbit/s (decimals, as upstream allows), burst 1 MB.
				compatCLI(t, gw.GW, "nftables", true, "eip-"+x.dir+"-qos-add", eip+",1,12.5,1")
				where(1)
				const size, rate int64 = 6 * mb, 12_500_000 / 8
				d, err := x.run(size)
				if err != nil {
					t.Fatalf("%s at 12.5 Mbit/s: %v", x.dir, err)
				}
				floor := time.Duration((size - mb - mode.bucket*rate) * 8 / 10 * int64(time.Second) / rate)
				t.Logf("%s %s, 12.5 Mbit/s burst 1 MB: %d bytes in %v (%.1f Mbit/s; at least %v)", mode.name, x.dir, size, d, float64(size)*8/d.Seconds()/1e6, floor)
				if d < floor {
					t.Errorf("%s: %d bytes in %v, faster than 12.5 Mbit/s with a 1 MB burst allows (%v)", x.dir, size, d, floor)
				}
				// Burst: 8 Mbit/s, burst 4 MB; 4 MiB fit in the bucket.
				compatCLI(t, gw.GW, "nftables", true, "eip-"+x.dir+"-qos-add", eip+",1,8,4")
				time.Sleep(5500 * time.Millisecond) // the bucket refills (5.2 MB at 1 MB/s)
				d, err = x.run(4 * mb)
				if err != nil {
					t.Fatalf("%s at 8 Mbit/s burst 4 MB: %v", x.dir, err)
				}
				t.Logf("%s %s, 8 Mbit/s burst 4 MB: %d bytes in %v", mode.name, x.dir, 4*mb, d)
				if d > 1500*time.Millisecond {
					t.Errorf("%s: 4 MiB in %v with a 4 MB burst: the burst was not read in MB", x.dir, d)
				}
				compatCLI(t, gw.GW, "nftables", true, "eip-"+x.dir+"-qos-del", eip)
				where(0)
			}
		})
	}
	// Switching modes: the later add's mode holds the EIP's QoS alone.
	t.Setenv("NATGW_EIP_QOS", "police")
	compatCLI(t, gw.GW, "nftables", true, "eip-egress-qos-add", eip+",1,10,1")
	t.Setenv("NATGW_EIP_QOS", "shape")
	compatCLI(t, gw.GW, "nftables", true, "eip-egress-qos-add", eip+",1,10,1")
	if p, err := gwqos.List(t.Context(), nat.Config{NetNS: gw.GW}); err != nil || len(p) > 0 {
		t.Fatalf("shaped after policed: natgw_gwqos still holds %v (%v)", p, err)
	}
	t.Setenv("NATGW_EIP_QOS", "police")
	compatCLI(t, gw.GW, "nftables", true, "eip-egress-qos-add", eip+",1,10,1")
	if s, err := shape.Get(t.Context(), nat.Config{NetNS: gw.GW}); err != nil || len(s) > 0 {
		t.Fatalf("policed after shaped: natgw_shape still holds %v (%v)", s, err)
	}
	compatCLI(t, gw.GW, "nftables", true, "eip-egress-qos-del", eip)
	t.Setenv("NATGW_EIP_QOS", "shape")
	// The controller deletes an EIP's QoS after the EIP.
	compatCLI(t, gw.GW, "nftables", true, "eip-egress-qos-add", eip+",1,10,1")
	compatCLI(t, gw.GW, "nftables", true, "floating-ip-del", eip)
	compatCLI(t, gw.GW, "nftables", true, "eip-del", eip+"/24")
	if s, err := shape.Get(t.Context(), nat.Config{NetNS: gw.GW}); err != nil || len(s) != 1 {
		t.Fatalf("eip-del took the EIP's class (upstream's leaves its tc class to the -qos-del): %v (%v)", s, err)
	}
	compatCLI(t, gw.GW, "nftables", true, "eip-ingress-qos-del", eip)
	compatCLI(t, gw.GW, "nftables", true, "eip-egress-qos-del", eip)
	if s, err := shape.Get(t.Context(), nat.Config{NetNS: gw.GW}); err != nil || len(s) > 0 {
		t.Fatalf("after the -qos-del calls: %v (%v)", s, err)
	}
}

// qosGateway is the QoS tests' gateway: a topology with one VM serving TCP
// on port 80, and through nat-gateway.sh (nftables) init, EIP 0 and a FIP
// from it to the VM. It returns the tests' context and the EIP.
func qosGateway(t *testing.T) (context.Context, *netlab.Gateway, string) {
	t.Helper()
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 3*time.Minute)
	if _, err := lab.ServeTCP(ctx, gw.VMs[0].NS, "0.0.0.0:80"); err != nil {
		t.Fatal(err)
	}
	eip := netlab.EIP(0).String()
	for _, c := range [][]string{{"init", ""}, {"eip-add", eip + "/24"}, {"floating-ip-add", eip + "," + gw.VMs[0].Addr.String()}} {
		compatCLI(t, gw.GW, "nftables", true, c[0], c[1:]...)
	}
	return ctx, gw, eip
}

// TestCompatGatewayQoS: gateway-wide qos-add/qos-del (VpcNatGateway
// qosPolicy) through nat-gateway.sh, shaped with HTB classes as upstream's
// script shapes it, checked with measured TCP throughput through a FIP, in
// upstream's units (Mbit/s, MB): a matchall egress rule on net1 holds
// downloads at its rate (6 MiB with a 1 MB burst take 90% to 150% of what
// the 5 MiB beyond the burst need at 16 Mbit/s); a u32 ingress rule on the
// EIP holds uploads the same way; a u32 rule of lower priority that
// matches takes precedence over the matchall (tc's first matching
// filter); an EIP's own class (eip-*-qos-add) takes precedence over the
// gateway-wide rules, both directions; qos-del lifts each.
func TestCompatGatewayQoS(t *testing.T) {
	ctx, gw, eip := qosGateway(t)
	sh := func(op string, rules ...string) { compatCLI(t, gw.GW, "nftables", true, op, rules...) }
	const mb = 1 << 20
	const size, rate int64 = 6 * mb, 16_000_000 / 8
	// What the bytes beyond the 1 MB burst need at 16 Mbit/s: the shaped
	// transfers take 90% (floor) to 150% (ceiling) of it.
	need := time.Duration((size - mb) * int64(time.Second) / rate)
	floor, ceiling := need*9/10, need*3/2
	held := func(what string, d time.Duration) {
		t.Helper()
		if d < floor {
			t.Errorf("%s: %v, faster than 16 Mbit/s with a 1 MB burst allows (%v)", what, d, floor)
		}
		if d > ceiling {
			t.Errorf("%s: %v, slower than a 16 Mbit/s class should make it (%v)", what, d, ceiling)
		}
	}
	measure := func(what string, upload bool) time.Duration {
		t.Helper()
		var d time.Duration
		var err error
		if upload {
			_, d, err = netlab.Upload(ctx, gw.Ext.NS, eip+":80", size, 30*time.Second)
		} else {
			_, d, err = netlab.Download(ctx, gw.Ext.NS, eip+":80", size, 30*time.Second)
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("%s: %d bytes in %v (%.1f Mbit/s)", what, size, d, float64(size)*8/d.Seconds()/1e6)
		return d
	}
	// heldAt measures what and checks that a 16 Mbit/s class held it.
	heldAt := func(what string, upload bool) {
		t.Helper()
		held(what, measure(what, upload))
	}
	// notHeld measures what and checks that no 16 Mbit/s class held it
	// (why: what holding it would mean).
	notHeld := func(what string, upload bool, why string) {
		t.Helper()
		if d := measure(what, upload); d >= floor {
			t.Errorf("%s: %v: %s", what, d, why)
		}
	}
	// eipClassWins: with the dir matchall in place, the EIP's own
	// 1000 Mbit/s class (eip-<dir>-qos-add) takes precedence over it, and
	// the matchall holds again once the class is deleted.
	eipClassWins := func(dir string, upload bool) {
		t.Helper()
		way := "download"
		if upload {
			way = "upload"
		}
		sh("eip-"+dir+"-qos-add", eip+",1,1000,10")
		notHeld(way+", EIP class 1000 Mbit/s and the "+dir+" matchall", upload, "the gateway-wide "+dir+" matchall applied although the EIP has its own class")
		sh("eip-"+dir+"-qos-del", eip)
		heldAt(way+", EIP class deleted: the "+dir+" matchall again", upload)
	}
	free := measure("download, no QoS", false)
	if free > floor/2 {
		t.Logf("unpoliced download is slow on this machine (%v); the checks below still hold", free)
	}
	sh("qos-add", "egress,net1,3,matchall,,,,16,1")
	heldAt("download, egress matchall 16 Mbit/s", false)
	notHeld("upload, egress matchall only", true, "held by an egress rule")
	// A u32 rule of lower priority matching ext's traffic takes precedence.
	sh("qos-add", "egress,net1,1,u32,ip,dst,"+netlab.ExtAddr.String()+"/32,1000,10")
	notHeld("download, egress u32 1000 Mbit/s before the matchall", false, "the matchall (priority 3) applied although the u32 rule (priority 1) matched first")
	sh("qos-del", "egress,net1,1,u32,ip,dst,"+netlab.ExtAddr.String()+"/32")
	heldAt("download, u32 deleted: the matchall again", false)
	// The EIP's own class wins over the gateway-wide matchall.
	eipClassWins("egress", false)
	sh("qos-del", "egress,net1,3,matchall,,,")
	// Egress sees addresses after source NAT: the FIP's EIP.
	sh("qos-add", "egress,net1,2,u32,ip,src,"+eip+"/32,16,1")
	heldAt("download, egress u32 src EIP 16 Mbit/s", false)
	sh("qos-del", "egress,net1,2,u32,ip,src,"+eip+"/32")
	sh("qos-add", "ingress,net1,2,u32,ip,dst,"+eip+"/32,16,1")
	heldAt("upload, ingress u32 dst EIP 16 Mbit/s", true)
	sh("qos-del", "ingress,net1,2,u32,ip,dst,"+eip+"/32")
	notHeld("upload, ingress rule deleted", true, "still held after qos-del")
	// An ingress matchall, and the EIP's own class winning over it. (An
	// eip-ingress-qos-add/-del replaces/deletes a gateway-wide u32 rule on
	// dst EIP/32, as upstream's script deletes the filter of that match.)
	sh("qos-add", "ingress,net1,3,matchall,,,,16,1")
	heldAt("upload, ingress matchall 16 Mbit/s", true)
	eipClassWins("ingress", true)
	sh("qos-del", "ingress,net1,3,matchall,,,")
	notHeld("upload, ingress rule deleted", true, "still held after qos-del")
	// No rule left: no table.
	if rules, err := gwqos.List(t.Context(), nat.Config{NetNS: gw.GW}); err != nil || len(rules) > 0 {
		t.Fatalf("after the deletes the gateway still holds %v (%v)", rules, err)
	}
	if table, err := netlab.NftTable(context.Background(), gw.GW, "ip", nftconn.GatewayQoSTable); err == nil {
		t.Fatalf("after the deletes table %s is still there:\n%s", nftconn.GatewayQoSTable, table)
	}
	for _, dev := range []string{"eth0", "net1"} {
		if out, err := netlab.Exec(ctx, gw.GW, "", "tc", "qdisc", "show", "dev", dev); err != nil || strings.Contains(out, "4e47:") {
			t.Errorf("after the deletes dev %s still has natgw's qdisc (%v):\n%s", dev, err, out)
		}
	}
}

// TestAgentGatewayQoS: the agent's gwqos request (natgw-controller's form of
// gateway-wide QoS) on a real `natgw serve` in a gateway namespace: the
// whole list replaces what the gateway held (compat's qos-add rules too),
// a rule without interface is on the external interface (--external-iface),
// a refused rule names its field and changes nothing, and an empty list
// removes the table; the NAT table is untouched throughout.
func TestAgentGatewayQoS(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, time.Minute)
	compatCLI(t, gw.GW, "nftables", true, "qos-add", "ingress,net1,7,matchall,,,,5,1")
	a := startAgent(t, gw.GW, "--external-iface", gw.ExternalInterface)
	// The agent makes its table as it starts serving, not before
	// startAgent returns: wait for it (CI once read it too early).
	var natBefore string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if natBefore, err = netlab.NftTable(ctx, gw.GW, "inet", "natgw"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	rules := []gwqos.Rule{
		{Direction: gwqos.Egress, Priority: 2, Classifier: gwqos.U32, MatchDir: "src", CIDR: netip.MustParsePrefix("10.0.1.0/24"), RateMbps: 10, BurstMB: 1},
		{Direction: gwqos.Ingress, Iface: gw.InternalInterface, Priority: 1, Classifier: gwqos.MatchAll, RateMbps: 100, BurstMB: 2},
	}
	if changed, err := a.SetGatewayQoS(ctx, rules); err != nil || !changed {
		t.Fatalf("gwqos = %v, %v; want written", changed, err)
	}
	want := []gwqos.Rule{rules[1], rules[0]}
	want[1].Iface = gw.ExternalInterface
	if got, err := gwqos.List(t.Context(), nat.Config{NetNS: gw.GW}); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("after gwqos: %+v, %v; want %+v (compat's rule gone, the default interface filled in)", got, err, want)
	}
	// The same rules again (a drift check): nothing written; after a rule
	// deleted by hand, written again.
	if changed, err := a.SetGatewayQoS(ctx, rules); err != nil || changed {
		t.Fatalf("the same gwqos again = %v, %v; want nothing written", changed, err)
	}
	if _, err := netlab.Exec(ctx, gw.GW, "", "nft", "flush", "chain", "ip", string(nftconn.GatewayQoSTable), "egress"); err != nil {
		t.Fatal(err)
	}
	if changed, err := a.SetGatewayQoS(ctx, rules); err != nil || !changed {
		t.Fatalf("gwqos after a hand edit = %v, %v; want written", changed, err)
	}
	if got, err := gwqos.List(t.Context(), nat.Config{NetNS: gw.GW}); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("after the repair: %+v, %v; want %+v", got, err, want)
	}
	bad := rules[0]
	bad.RateMbps = 0
	_, err = a.SetGatewayQoS(ctx, []gwqos.Rule{rules[1], bad})
	var pe *agentapi.Error
	if !errors.As(err, &pe) || pe.Code != agentapi.CodeInvalid || pe.Field != "qos[1].rateMbps" || pe.Value != "0" {
		t.Fatalf("gwqos with a zero rate = %v, want Invalid naming qos[1].rateMbps = 0", err)
	}
	if got, _ := gwqos.List(t.Context(), nat.Config{NetNS: gw.GW}); !reflect.DeepEqual(got, want) {
		t.Fatalf("a refused gwqos changed the rules: %+v", got)
	}
	if _, err := a.SetGatewayQoS(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if out, err := netlab.NftTable(ctx, gw.GW, "ip", nftconn.GatewayQoSTable); err == nil {
		t.Fatalf("an empty gwqos left the table:\n%s", out)
	}
	if natAfter, err := netlab.NftTable(ctx, gw.GW, "inet", "natgw"); err != nil || natAfter != natBefore {
		t.Fatalf("the NAT table changed (%v):\n%s\nwas:\n%s", err, natAfter, natBefore)
	}
	a.stop(t)
}
