package kubeovn_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/natgw/natgw/controller/eipalloc"
	"github.com/natgw/natgw/internal/kubeovn"
	"github.com/natgw/natgw/internal/netlab"
)

// autoEIP is an IptablesEIP without spec.v4ip on the replace-mode gateway.
const autoEIP = "eip-" + gwName + "-auto"

// networkResult is what kubeOVNNetwork measured.
type networkResult struct {
	vpcRoutes              int
	reservedIn, releasedIn time.Duration
	refused                bool
	others                 int
}

// vipManifest is a Vip of the test's own in the external subnet (v4ip ""
// asks Kube-OVN for any address).
func vipManifest(name, v4ip string) string {
	m := fmt.Sprintf("apiVersion: kubeovn.io/v1\nkind: Vip\nmetadata:\n  name: %s\nspec:\n  subnet: %s\n", name, kubeovn.ExternalNetwork)
	if v4ip != "" {
		m += "  v4ip: " + v4ip + "\n"
	}
	return m
}

// kubeOVNNetwork checks replace mode's network from Kube-OVN's own objects
// on natgw's gateway pod gp (net1 attached), with Kube-OVN v1.16.2's
// controller running (its VPC NAT gateway feature off):
//   - the pod's routes: the VPC's other subnet via the gateway subnet's
//     gateway on eth0, the default route via the external subnet's gateway
//     on net1;
//   - an IptablesEIP without spec.v4ip gets its address from Kube-OVN's
//     IPAM (natgw's Vip, reserved by Kube-OVN's own vip controller), on
//     net1 with the external subnet's prefix length;
//   - Kube-OVN does not hand that address to anything else (a Vip asking
//     for it gets nothing, other Vips get other addresses);
//   - deleting the EIP takes the address off net1 and releases it (a Vip
//     asking for it then gets it).
func (e *env) kubeOVNNetwork(gp gwPod) networkResult {
	t := e.t
	t.Helper()
	var r networkResult
	vpcGW := e.mustKubectl("", "get", "subnet", "subnet-"+gwName, "-o", "jsonpath={.spec.gateway}")
	wantRoutes := []string{
		"10.245.0.0/24 via " + vpcGW + " dev eth0",
		"0.0.0.0/0 via " + extHost.String() + " dev net1",
	}
	if err := eventually(e.ctx, time.Minute, func() error {
		rs, err := netlab.Routes(gp.netns)
		if err != nil {
			return err
		}
		var got []string
		for _, rt := range rs {
			got = append(got, fmt.Sprintf("%s via %s dev %s", rt.Dst, rt.Via, rt.Dev))
		}
		for _, w := range wantRoutes {
			if !slices.Contains(got, w) {
				return fmt.Errorf("gateway pod routes %q lack %q", got, w)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r.vpcRoutes = 1

	// An EIP without an address.
	t0 := time.Now()
	e.mustKubectl(fmt.Sprintf("apiVersion: kubeovn.io/v1\nkind: IptablesEIP\nmetadata:\n  name: %s\nspec:\n  natGwDp: %s\n", autoEIP, gwName), "apply", "-f", "-")
	if _, err := e.ready("iptables-eip", autoEIP); err != nil {
		t.Fatal(err)
	}
	r.reservedIn = time.Since(t0)
	ip := e.mustKubectl("", "get", "iptables-eip", autoEIP, "-o", "jsonpath={.status.ip}")
	vipName := eipalloc.VipName(autoEIP)
	vipIP := e.mustKubectl("", "get", "vip", vipName, "-o", "jsonpath={.status.v4ip}")
	addr, err := netip.ParseAddr(ip)
	switch {
	case err != nil:
		t.Fatalf("IptablesEIP %s status.ip %q: %v", autoEIP, ip, err)
	case ip != vipIP:
		t.Fatalf("IptablesEIP %s status.ip %s, but Kube-OVN reserved %q in Vip %s", autoEIP, ip, vipIP, vipName)
	case !e.extNet.Contains(addr) || addr == extHost || ip == gp.extIP:
		t.Fatalf("IptablesEIP %s got %s: not a free address of the external subnet %s", autoEIP, ip, e.extNet)
	}
	onNet1 := func() (bool, error) {
		addrs, err := netlab.Addrs(gp.netns, "net1")
		return slices.Contains(addrs, netip.PrefixFrom(addr, e.extNet.Bits())), err
	}
	if err := eventually(e.ctx, 30*time.Second, func() error {
		if ok, err := onNet1(); err != nil || !ok {
			return fmt.Errorf("%s/%d not on net1 (%v)", addr, e.extNet.Bits(), err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// Kube-OVN's IPAM gives the address to nothing else.
	vips := []string{"ngw-test-taken", "ngw-test-0", "ngw-test-1", "ngw-test-2"}
	defer func() {
		_, _ = e.kubectl("", append([]string{"delete", "vip", "--ignore-not-found", "--wait=false", "ngw-test-again"}, vips...)...)
	}()
	e.mustKubectl(vipManifest(vips[0], ip), "apply", "-f", "-")
	for _, v := range vips[1:] {
		e.mustKubectl(vipManifest(v, ""), "apply", "-f", "-")
	}
	if err := eventually(e.ctx, time.Minute, func() error {
		for _, v := range vips[1:] {
			got, err := e.kubectl("", "get", "vip", v, "-o", "jsonpath={.status.v4ip}")
			if err != nil {
				return err
			}
			if got == "" {
				return fmt.Errorf("vip %s: no address yet", v)
			}
			if got == ip {
				return fmt.Errorf("%w: Kube-OVN gave vip %s the address %s reserved for IptablesEIP %s", errStop, v, ip, autoEIP)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r.others = len(vips) - 1
	time.Sleep(2 * time.Second)
	if got := e.mustKubectl("", "get", "vip", vips[0], "-o", "jsonpath={.status.v4ip}"); got != "" {
		t.Fatalf("Kube-OVN gave vip %s the address %s reserved for IptablesEIP %s", vips[0], got, autoEIP)
	}
	r.refused = true

	// Delete: off net1, natgw's Vip gone, the address free again.
	t0 = time.Now()
	e.mustKubectl("", "delete", "iptables-eip", autoEIP, "--timeout=2m")
	if out, err := e.kubectl("", "get", "vip", vipName, "--ignore-not-found", "-o", "name"); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("natgw's Vip %s after its EIP was deleted: %q, %v", vipName, out, err)
	}
	if ok, err := onNet1(); err != nil || ok {
		t.Fatalf("%s still on net1 after its EIP was deleted (%v)", addr, err)
	}
	e.mustKubectl("", "delete", "vip", vips[0], "--timeout=1m")
	e.mustKubectl(vipManifest("ngw-test-again", ip), "apply", "-f", "-")
	if err := eventually(e.ctx, time.Minute, func() error {
		got, err := e.kubectl("", "get", "vip", "ngw-test-again", "-o", "jsonpath={.status.v4ip}")
		if err != nil {
			return err
		}
		if got != ip {
			return fmt.Errorf("vip ngw-test-again: status.v4ip %q, want the released %s", got, ip)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r.releasedIn = time.Since(t0)
	return r
}
