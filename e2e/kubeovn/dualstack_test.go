package kubeovn_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/controller/eipalloc"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testsummary"
)

// The objects of TestReplaceDualStack.
const (
	dualEIP  = "eip-dual"   // no v4ip, no v6ip: both from Kube-OVN's IPAM
	dualFIP4 = "fip-dual-4" // internalIp vm0's IPv4 address
	dualFIP6 = "fip-dual-6" // internalIp vm0's IPv6 address (netlab.VMAddr6(0))
)

// TestReplaceDualStack is the dual-stack lab: Kube-OVN v1.16.2's own
// controller (its VPC NAT gateway feature off) and natgw-controller in
// replace mode (--network-source=kube-ovn) on a dual-stack external subnet
// (netlab.ExtNet and netlab.ExtNet6, protocol Dual). It proves:
//   - an IptablesEIP without v4ip and v6ip gets both addresses from
//     Kube-OVN's IPAM: its Vip's status.v4ip (the EIP's status.ip) and
//     status.v6ip, both on the gateway's net1 with the subnet's prefix
//     lengths; the gateway's IPv6 default route goes via the subnet's IPv6
//     gateway;
//   - a FIP to a VPC host's IPv4 address and a FIP to its IPv6 address on
//     that EIP are Ready, the IPv6 one with status.v6ip the Vip's;
//   - real TCP passes through the gateway pod in both families, inbound
//     to the EIP's address of the family and outbound with it as the
//     source the external host sees; nothing passed before the rules;
//   - deleting the rules and the EIP stops the traffic, takes both
//     addresses off net1 and deletes natgw's Vip.
func TestReplaceDualStack(t *testing.T) {
	tStart := time.Now()
	e := startWith(t, netlab.ExtNet, netlab.ExtNet6)
	featureOffIn := e.kubeOVNFeatureOff()
	gp, podIn, gatewayIn := e.replaceDocGateway("dualvm", "ngwdualvm", 1)
	vm0 := e.vms[0]
	vm0v6 := netlab.VMAddr6(0)

	// The EIP without addresses.
	t0 := time.Now()
	e.mustKubectl(fmt.Sprintf("kind: IptablesEIP\napiVersion: kubeovn.io/v1\nmetadata:\n  name: %s\nspec:\n  natGwDp: %s\n", dualEIP, gwName), "apply", "-f", "-")
	if _, err := e.ready("iptables-eip", dualEIP); err != nil {
		t.Fatal(err)
	}
	vip := eipalloc.VipName(dualEIP)
	vipAddrs := strings.Fields(e.mustKubectl("", "get", "vip", vip, "-o", "jsonpath={.status.v4ip} {.status.v6ip}"))
	status := e.mustKubectl("", "get", "iptables-eip", dualEIP, "-o", "jsonpath={.status.ip}")
	if len(vipAddrs) != 2 {
		t.Fatalf("Vip %s: status.v4ip and status.v6ip %q, want both from Kube-OVN's IPAM on the dual-stack subnet", vip, vipAddrs)
	}
	v4, err4 := netip.ParseAddr(vipAddrs[0])
	v6, err6 := netip.ParseAddr(vipAddrs[1])
	switch {
	case err4 != nil || err6 != nil:
		t.Fatalf("Vip %s: status.v4ip %q (%v), status.v6ip %q (%v)", vip, vipAddrs[0], err4, vipAddrs[1], err6)
	case status != v4.String():
		t.Fatalf("IptablesEIP %s: status.ip %q, want the Vip's status.v4ip %s", dualEIP, status, v4)
	case !e.extNet.Contains(v4) || v4 == extHost || !e.extNet6.Contains(v6) || v6 == extHost6 || strings.Contains(","+gp.extIP+",", ","+v4.String()+",") || strings.Contains(","+gp.extIP+",", ","+v6.String()+","):
		t.Fatalf("IptablesEIP %s got %s and %s: not free addresses of the external subnet %s,%s (gateways %s,%s, net1 %s)", dualEIP, v4, v6, e.extNet, e.extNet6, extHost, extHost6, gp.extIP)
	}
	want4, want6 := netip.PrefixFrom(v4, e.extNet.Bits()), netip.PrefixFrom(v6, e.extNet6.Bits())
	onNet1 := func() (bool, bool, error) {
		a4, err := netlab.Addrs(gp.netns, "net1")
		if err != nil {
			return false, false, err
		}
		a6, err := netlab.Addrs6(gp.netns, "net1")
		return slices.Contains(a4, want4), slices.Contains(a6, want6), err
	}
	if err := eventually(e.ctx, 30*time.Second, func() error {
		has4, has6, err := onNet1()
		if err != nil || !has4 || !has6 {
			return fmt.Errorf("net1 holds %s: %v, %s: %v (%v)", want4, has4, want6, has6, err)
		}
		rs, err := netlab.Routes6(gp.netns)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(rs, func(r netlab.Route) bool {
			return r.Dst.Bits() == 0 && r.Via == extHost6 && r.Dev == "net1"
		}) {
			return fmt.Errorf("no IPv6 default route via %s dev net1: %+v", extHost6, rs)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	eipReadyIn := time.Since(t0)

	probes := append(e.fipProbes("vm0", vm0.NS, v4), e.fipProbes("vm0", vm0.NS, v6)...)
	for _, p := range probes {
		if err := e.blocked(p); err != nil {
			t.Fatalf("before the rules: %v", err)
		}
	}

	// A FIP per family on the EIP, and traffic through each.
	t0 = time.Now()
	e.mustKubectl(fipManifest(dualFIP4, dualEIP, vm0.Addr)+"---\n"+fipManifest(dualFIP6, dualEIP, vm0v6), "apply", "-f", "-")
	for _, f := range []struct{ name, v4ip, v6ip string }{{dualFIP4, v4.String(), v6.String()}, {dualFIP6, v4.String(), v6.String()}} {
		if _, err := e.ready("iptables-fip-rule", f.name); err != nil {
			t.Fatal(err)
		}
		if got := e.mustKubectl("", "get", "iptables-fip-rule", f.name, "-o", "jsonpath={.status.v4ip} {.status.v6ip}"); got != f.v4ip+" "+f.v6ip {
			t.Errorf("IptablesFIPRule %s: status.v4ip, status.v6ip %q, want the EIP's %s %s", f.name, got, f.v4ip, f.v6ip)
		}
	}
	if err := e.checkAll(probes, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	trafficIn := time.Since(t0)

	// Delete: traffic stops, net1 loses both addresses, the Vip goes.
	t0 = time.Now()
	e.mustKubectl("", "delete", "iptables-fip-rule/"+dualFIP4, "iptables-fip-rule/"+dualFIP6, "--timeout=2m")
	e.mustKubectl("", "delete", "iptables-eip/"+dualEIP, "--timeout=2m")
	for _, p := range probes {
		if err := eventually(e.ctx, 30*time.Second, func() error { return e.blocked(p) }); err != nil {
			t.Fatalf("after the rules and the EIP were deleted: %v", err)
		}
	}
	if err := eventually(e.ctx, 30*time.Second, func() error {
		has4, has6, err := onNet1()
		if err != nil || has4 || has6 {
			return fmt.Errorf("net1 still holds %s: %v, %s: %v (%v)", want4, has4, want6, has6, err)
		}
		if vips, err := e.natgwVips(); err != nil || len(vips) > 0 {
			return fmt.Errorf("natgw's Vips after its EIP was deleted: %v (%v)", vips, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	deleteIn := time.Since(t0)
	if err := e.k.Alive(); err != nil {
		t.Fatal(err)
	}

	testsummary.Scenario(t, "CLUSTER-SUMMARY", "replace-dual-stack", "nftables",
		"kube_ovn", "v1.16.2", "kube_ovn_feature", "off", "network_source", "kube-ovn",
		"external_subnet", e.extNet.String()+","+e.extNet6.String(), "eip_v4", v4, "eip_v6", v6,
		"kubeovn_feature_off", featureOffIn, "gateway_pod_running", podIn, "gateway_synced", gatewayIn,
		"eip_ready_both_families", eipReadyIn, "traffic_flowing", trafficIn, "probes", len(probes),
		"deleted_to_empty", deleteIn, "total", time.Since(tStart))
}
