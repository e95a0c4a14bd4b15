package kubeovn_test

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/controller/eipalloc"
	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/internal/kubeovn"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testsummary"
	"github.com/natgw/natgw/nat"
)

// The objects of TestReplaceDocNAT, shaped like the examples of Kube-OVN's
// documentation ("VPC NAT gateway": a gateway with lanIp, selector and
// externalSubnets; EIPs with natGwDp, one with v4ip; a FIP with eip and
// internalIp; a DNAT with eip, externalPort, internalIp, internalPort and
// protocol tcp; an SNAT with eip and internalCIDR).
const (
	docEIPFIP  = "eip-doc-fip"  // no v4ip: Kube-OVN's IPAM picks it
	docEIPDNAT = "eip-doc-dnat" // v4ip docStatic
	docEIPSNAT = "eip-doc-snat" // no v4ip
	docFIP     = "fip-doc"
	docDNAT    = "dnat-doc"
	docSNAT    = "snat-doc"
)

// docStatic is the EIP address asked for explicitly (spec.v4ip).
var docStatic = netip.MustParseAddr("192.0.2.50")

// docEIPs is the table of the scenario's EIPs (v4ip "" asks for any).
var docEIPs = []struct{ name, v4ip string }{
	{docEIPFIP, ""},
	{docEIPDNAT, docStatic.String()},
	{docEIPSNAT, ""},
}

// docRules is the table of the scenario's NAT rules: resource, name, and
// the kind of object natgw programs for it.
var docRules = []struct {
	resource, name string
	kind           nat.Kind
}{
	{"iptables-fip-rule", docFIP, nat.KindFIP},
	{"iptables-dnat-rule", docDNAT, nat.KindDNAT},
	{"iptables-snat-rule", docSNAT, nat.KindSNAT},
}

// docGateway is the VpcNatGateway, as the documentation's example with the
// lab's VPC, subnet and external network (the selector fits the node).
var docGateway = fmt.Sprintf(`kind: VpcNatGateway
apiVersion: kubeovn.io/v1
metadata:
  name: %[1]s
spec:
  vpc: vpc-%[1]s
  subnet: subnet-%[1]s
  lanIp: %[2]s
  selector:
    - "kubernetes.io/os: linux"
  externalSubnets:
    - %[3]s
`, gwName, lanIP, kubeovn.ExternalNetwork)

// ovnEipManifest is a Kube-OVN OvnEip in the external subnet (v4ip ""
// asks Kube-OVN's IPAM for any address).
func ovnEipManifest(name, v4ip string) string {
	m := fmt.Sprintf("kind: OvnEip\napiVersion: kubeovn.io/v1\nmetadata:\n  name: %s\nspec:\n  externalSubnet: %s\n", name, kubeovn.ExternalNetwork)
	if v4ip != "" {
		m += "  v4Ip: " + v4ip + "\n"
	}
	return m
}

// waitGone waits until none of the objects kind/name exists.
func (e *env) waitGone(limit time.Duration, objs ...string) error {
	return eventually(e.ctx, limit, func() error {
		out, err := e.kubectl("", append([]string{"get", "--ignore-not-found", "-o", "name"}, objs...)...)
		if err != nil {
			return err
		}
		if s := strings.TrimSpace(out); s != "" {
			return fmt.Errorf("still there: %s", strings.ReplaceAll(s, "\n", " "))
		}
		return nil
	})
}

// kubeOVNLogLines counts the lines of kube-ovn-controller's output that
// contain every one of subs.
func (e *env) kubeOVNLogLines(subs ...string) int {
	b, err := os.ReadFile(e.k.OutputPath())
	if err != nil {
		return 0
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(l, s)
		}
		if ok {
			n++
		}
	}
	return n
}

// conflictLine is what kube-ovn-controller logs when its IPAM refuses a
// static request for a in the external subnet because another owner holds
// it (acquireStaticIPAddress, pkg/controller/ip.go; ipam.ErrConflict).
func conflictLine(a netip.Addr) []string {
	return []string{"failed to get static virtual ip '" + a.String() + "'", "subnet '" + kubeovn.ExternalNetwork + "'", "AddressConflict"}
}

// natgwVips lists the Vips natgw made (eipalloc.NamePrefix).
func (e *env) natgwVips() ([]string, error) {
	out, err := e.kubectl("", "get", "vip", "-o", `jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}`)
	if err != nil {
		return nil, err
	}
	var vips []string
	for _, n := range strings.Fields(out) {
		if strings.HasPrefix(n, eipalloc.NamePrefix) {
			vips = append(vips, n)
		}
	}
	return vips, nil
}

// kubeOVNFeatureOff switches Kube-OVN's VPC NAT gateway feature off and
// waits until its controller logged the end of its cleanup (before any
// gateway exists); it returns how long that took.
func (e *env) kubeOVNFeatureOff() time.Duration {
	e.t.Helper()
	t0 := time.Now()
	cleaned := e.kubeOVNLogCount("finish clean up vpc nat gateway")
	e.mustKubectl("", "-n", ns, "patch", "configmap", "ovn-vpc-nat-gw-config", "--type=merge", "-p", `{"data":{"enable-vpc-nat-gw":"false"}}`)
	if err := eventually(e.ctx, 2*time.Minute, func() error {
		if n := e.kubeOVNLogCount("finish clean up vpc nat gateway"); n <= cleaned {
			return fmt.Errorf("kube-ovn-controller has not switched its VPC NAT gateway feature off (%d cleanups logged)", n)
		}
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	return time.Since(t0)
}

// replaceDocGateway runs natgw-controller in replace mode
// (--network-source=kube-ovn) and the documentation-shaped VpcNatGateway
// (docGateway): the external host, n VPC hosts (addVMs with vmName and
// hostName), the gateway pod natgw made with net1 attached, one sync. It
// returns the pod, when it ran and when natgw-controller had synced it
// (both from the manifest's apply).
func (e *env) replaceDocGateway(vmName, hostName string, n int) (gp gwPod, podIn, syncedIn time.Duration) {
	t := e.t
	t.Helper()
	if err := e.addExtHost(); err != nil {
		t.Fatal(err)
	}
	bootSyncs := metrics.CounterValue(metrics.Resyncs.WithLabelValues(gwName, "bootid"))
	e.startReplace(nil)
	t0 := time.Now()
	e.mustKubectl(docGateway, "apply", "-f", "-")
	gp, err := e.waitPod("")
	if err != nil {
		t.Fatal(err)
	}
	if img := e.mustKubectl("", "-n", ns, "get", "pod", podName, "-o", "jsonpath={.spec.containers[0].image}"); img != e.image {
		t.Fatalf("gateway pod runs image %q, want natgw's %q", img, e.image)
	}
	if owner := e.mustKubectl("", "-n", ns, "get", "sts", stsName, "-o", "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}"); owner != "VpcNatGateway/"+gwName {
		t.Fatalf("StatefulSet %s owned by %q, want natgw's VpcNatGateway/%s", stsName, owner, gwName)
	}
	podIn = time.Since(t0)
	if err := e.addVMs(vmName, hostName, n); err != nil {
		t.Fatal(err)
	}
	if err := e.attach(gp); err != nil {
		t.Fatal(err)
	}
	e.pod = gp
	if err := waitSyncs(e.ctx, bootSyncs+1); err != nil {
		t.Fatal(err)
	}
	return gp, podIn, time.Since(t0)
}

// TestReplaceDocNAT is replace mode's acceptance test. In the
// single-node cluster, with Kube-OVN v1.16.2's own controller running and
// its VPC NAT gateway feature off, natgw-controller in replace mode
// (--provision-gateways, --network-source=kube-ovn) runs a VpcNatGateway
// and its EIPs, FIP, DNAT and SNAT created from manifests shaped like
// Kube-OVN's documentation examples. It proves:
//   - the gateway comes up (natgw's StatefulSet and pod, one sync through
//     pod exec), the EIPs and rules become Ready as natgw programmed them,
//     and the gateway's kernel holds each under its CR's UID;
//   - real TCP flows through every rule: FIP inbound and outbound, DNAT
//     inbound to the internal port, SNAT outbound with the EIP as the
//     source the external host sees; inbound was refused before the rules;
//   - EIPs without v4ip get the address Kube-OVN's IPAM reserved in
//     natgw's Vip; OvnEips (Kube-OVN's own controller allocates them with
//     the feature off: its OvnEip workers run unconditionally,
//     pkg/controller/controller.go startWorkers, and handleAddOvnEip of
//     pkg/controller/ovn_eip.go acquires from the same IPAM) created
//     afterwards without v4Ip never get an EIP's address, and OvnEips
//     asking for an EIP's address get nothing while the EIP exists;
//   - deleting the rules, the EIPs, then the gateway stops the traffic,
//     empties the gateway's kernel (natgw list, nft ruleset, net1) before
//     the pod goes, deletes natgw's Vips, the StatefulSet and the pod, and
//     leaves no IptablesEIP or rule; Kube-OVN then hands every former EIP
//     address to an OvnEip asking for it (its reservation is gone).
func TestReplaceDocNAT(t *testing.T) {
	tStart := time.Now()
	e := start(t)
	ctx := e.ctx

	featureOffIn := e.kubeOVNFeatureOff()
	gp, podIn, gatewayIn := e.replaceDocGateway("docvm", "ngwdocvm", 2)
	vm0, vm1 := e.vms[0], e.vms[1]
	t0 := time.Now()

	// 2. The EIPs.
	t0 = time.Now()
	var eipYAML strings.Builder
	for _, x := range docEIPs {
		fmt.Fprintf(&eipYAML, "---\nkind: IptablesEIP\napiVersion: kubeovn.io/v1\nmetadata:\n  name: %s\nspec:\n  natGwDp: %s\n", x.name, gwName)
		if x.v4ip != "" {
			fmt.Fprintf(&eipYAML, "  v4ip: %s\n", x.v4ip)
		}
	}
	e.mustKubectl(eipYAML.String(), "apply", "-f", "-")
	eipAddr := map[string]netip.Addr{}
	var eipAddrs []netip.Addr
	for _, x := range docEIPs {
		if _, err := e.ready("iptables-eip", x.name); err != nil {
			t.Fatal(err)
		}
		ip := e.mustKubectl("", "get", "iptables-eip", x.name, "-o", "jsonpath={.status.ip}")
		vip := eipalloc.VipName(x.name)
		vipIP := e.mustKubectl("", "get", "vip", vip, "-o", "jsonpath={.status.v4ip}")
		a, err := netip.ParseAddr(ip)
		switch {
		case err != nil:
			t.Fatalf("IptablesEIP %s: status.ip %q: %v", x.name, ip, err)
		case ip != vipIP:
			t.Fatalf("IptablesEIP %s: status.ip %s, but Kube-OVN reserved %q in natgw's Vip %s", x.name, ip, vipIP, vip)
		case x.v4ip != "" && ip != x.v4ip:
			t.Fatalf("IptablesEIP %s: status.ip %s, want spec.v4ip %s", x.name, ip, x.v4ip)
		case !e.extNet.Contains(a) || a == extHost || ip == gp.extIP || slices.Contains(eipAddrs, a):
			t.Fatalf("IptablesEIP %s got %s: not a free address of the external subnet %s (gateway %s, net1 %s, other EIPs %v)", x.name, ip, e.extNet, extHost, gp.extIP, eipAddrs)
		}
		eipAddr[x.name] = a
		eipAddrs = append(eipAddrs, a)
	}
	if err := eventually(ctx, 30*time.Second, func() error {
		addrs, err := netlab.Addrs(gp.netns, "net1")
		if err != nil {
			return err
		}
		for _, a := range eipAddrs {
			if !slices.Contains(addrs, netip.PrefixFrom(a, e.extNet.Bits())) {
				return fmt.Errorf("EIP %s/%d not on the gateway's net1 (%v)", a, e.extNet.Bits(), addrs)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	eipReadyIn := time.Since(t0)

	fip, dnat, snat := eipAddr[docEIPFIP], eipAddr[docEIPDNAT], eipAddr[docEIPSNAT]
	probes := append(e.fipProbes("vm0", vm0.NS, fip), []probe{
		{"ext->DNAT", e.ext, net.JoinHostPort(dnat.String(), strconv.Itoa(dnatPort)), vm1.NS, extHost},
		{"SNAT vm1->ext", vm1.NS, net.JoinHostPort(extHost.String(), strconv.Itoa(extPort)), e.ext, snat},
	}...)
	// Before the rules nothing answers at the EIPs' ports, and the VPC hosts
	// do not reach the external host.
	for _, p := range probes {
		if err := e.blocked(p); err != nil {
			t.Fatalf("before the rules: %v", err)
		}
	}

	// 3. The rules, and traffic through each.
	t0 = time.Now()
	e.mustKubectl(fmt.Sprintf(`kind: IptablesFIPRule
apiVersion: kubeovn.io/v1
metadata:
  name: %s
spec:
  eip: %s
  internalIp: %s
---
kind: IptablesDnatRule
apiVersion: kubeovn.io/v1
metadata:
  name: %s
spec:
  eip: %s
  externalPort: "%d"
  internalIp: %s
  internalPort: "%d"
  protocol: tcp
---
kind: IptablesSnatRule
apiVersion: kubeovn.io/v1
metadata:
  name: %s
spec:
  eip: %s
  internalCIDR: %s
`, docFIP, docEIPFIP, vm0.Addr, docDNAT, docEIPDNAT, dnatPort, vm1.Addr, vmPort, docSNAT, docEIPSNAT, e.podCIDR), "apply", "-f", "-")
	for _, r := range docRules {
		if _, err := e.ready(r.resource, r.name); err != nil {
			t.Fatal(err)
		}
		reason := e.mustKubectl("", "get", r.resource, r.name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].reason}`)
		if reason != "Programmed" {
			t.Errorf("%s %s: Ready reason %q, want natgw's Programmed", r.resource, r.name, reason)
		}
	}
	rulesReadyIn := time.Since(t0)
	if err := e.checkAll(probes, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	trafficIn := time.Since(t0)

	// The gateway's kernel holds every object under its CR's UID.
	want := map[string]nat.Kind{}
	for _, x := range docEIPs {
		want[e.mustKubectl("", "get", "iptables-eip", x.name, "-o", "jsonpath={.metadata.uid}")] = nat.KindEIP
	}
	for _, r := range docRules {
		want[e.mustKubectl("", "get", r.resource, r.name, "-o", "jsonpath={.metadata.uid}")] = r.kind
	}
	objs, err := e.gatewayObjects()
	if err != nil {
		t.Fatal(err)
	}
	kernelObjects := 0
	for uid, k := range want {
		if o, ok := objs[uid]; !ok || o.Kind != k {
			t.Errorf("the gateway's kernel lacks the %s of UID %s (natgw list: %v)", k, uid, objs)
			continue
		}
		kernelObjects++
	}
	for uid, o := range objs {
		if _, ok := want[uid]; !ok && o.Kind != nat.KindRoute {
			t.Errorf("the gateway's kernel holds %s, which is none of the test's objects", o.String())
		}
	}

	// The nftables ruleset in the pod names every object (its elements
	// carry the CR's UID) and every address the rules use: what must be
	// gone after the cleanup.
	needles := []string{vm0.Addr.String(), vm1.Addr.String()}
	for _, a := range eipAddrs {
		needles = append(needles, a.String())
	}
	for uid := range want {
		needles = append(needles, uid)
	}
	ruleset, err := netlab.NftRuleset(ctx, gp.netns)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range needles {
		if !strings.Contains(ruleset, n) {
			t.Errorf("the gateway's nftables ruleset does not name %s while the rules exist:\n%s", n, ruleset)
		}
	}

	// 4. Kube-OVN's IPAM: OvnEips created now get other addresses; OvnEips
	// asking for an EIP's address get nothing.
	others := []string{"ngw-doc-any-0", "ngw-doc-any-1", "ngw-doc-any-2"}
	var taken []string
	var ovnYAML strings.Builder
	for _, n := range others {
		ovnYAML.WriteString("---\n" + ovnEipManifest(n, ""))
	}
	for i, a := range eipAddrs {
		n := fmt.Sprintf("ngw-doc-taken-%d", i)
		taken = append(taken, n)
		ovnYAML.WriteString("---\n" + ovnEipManifest(n, a.String()))
	}
	all := append(append([]string{}, others...), taken...)
	ovnEipObjs := func(names []string) []string {
		var o []string
		for _, n := range names {
			o = append(o, "ovn-eip/"+n)
		}
		return o
	}
	t.Cleanup(func() {
		_, _ = e.kubectl("", append([]string{"delete", "--ignore-not-found", "--wait=false"}, ovnEipObjs(all)...)...)
	})
	conflicts := map[netip.Addr]int{}
	for _, a := range eipAddrs {
		conflicts[a] = e.kubeOVNLogLines(conflictLine(a)...)
	}
	e.mustKubectl(ovnYAML.String(), "apply", "-f", "-")
	otherAddrs := map[string]string{}
	if err := eventually(ctx, time.Minute, func() error {
		for _, n := range others {
			got, err := e.kubectl("", "get", "ovn-eip", n, "-o", "jsonpath={.status.v4Ip}")
			if err != nil {
				return err
			}
			if got == "" {
				return fmt.Errorf("OvnEip %s: no address from Kube-OVN yet", n)
			}
			a, err := netip.ParseAddr(got)
			if err != nil {
				return fmt.Errorf("%w: OvnEip %s: status.v4Ip %q: %v", errStop, n, got, err)
			}
			if slices.Contains(eipAddrs, a) {
				return fmt.Errorf("%w: Kube-OVN gave OvnEip %s the address %s of an IptablesEIP (%v)", errStop, n, a, eipAddr)
			}
			otherAddrs[n] = got
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("Kube-OVN gave the OvnEips created after the IptablesEIPs %v (EIPs: %v, gateway net1: %s)", otherAddrs, eipAddr, gp.extIP)
	// Kube-OVN refused each request for a taken address: its IPAM logged
	// the conflict for that address since the requests were made.
	if err := eventually(ctx, time.Minute, func() error {
		for _, a := range eipAddrs {
			if n := e.kubeOVNLogLines(conflictLine(a)...); n <= conflicts[a] {
				return fmt.Errorf("kube-ovn-controller has not refused %s yet (%d conflicts logged, %d before)", a, n, conflicts[a])
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	refused := 0
	for i, n := range taken {
		if got := e.mustKubectl("", "get", "ovn-eip", n, "-o", "jsonpath={.status.v4Ip}"); got != "" {
			t.Errorf("Kube-OVN gave OvnEip %s the address %s while IptablesEIP %s holds %s", n, got, docEIPs[i].name, eipAddrs[i])
			continue
		}
		refused++
	}
	e.mustKubectl("", append([]string{"delete", "--timeout=2m"}, ovnEipObjs(all)...)...)
	if err := e.waitGone(time.Minute, ovnEipObjs(all)...); err != nil {
		t.Fatal(err)
	}
	// Traffic still flows after Kube-OVN's IPAM was asked.
	if err := e.checkAll(probes, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	// 5. Delete everything: rules, EIPs, then the gateway.
	t0 = time.Now()
	var ruleObjs []string
	for _, r := range docRules {
		ruleObjs = append(ruleObjs, r.resource+"/"+r.name)
	}
	e.mustKubectl("", append([]string{"delete", "--timeout=2m"}, ruleObjs...)...)
	for _, p := range probes {
		if err := eventually(ctx, 30*time.Second, func() error { return e.blocked(p) }); err != nil {
			t.Fatalf("after the rules were deleted: %v", err)
		}
	}
	var eipObjs []string
	for _, x := range docEIPs {
		eipObjs = append(eipObjs, "iptables-eip/"+x.name)
	}
	e.mustKubectl("", append([]string{"delete", "--timeout=2m"}, eipObjs...)...)
	// The gateway's kernel is empty of them while the pod still runs.
	if err := eventually(ctx, 30*time.Second, func() error {
		objs, err := e.gatewayObjects()
		if err != nil {
			return err
		}
		var left []string
		for _, o := range objs {
			if o.Kind != nat.KindRoute {
				left = append(left, "natgw list: "+o.String())
			}
		}
		ruleset, err := netlab.NftRuleset(ctx, gp.netns)
		if err != nil {
			return err
		}
		for _, s := range needles {
			if strings.Contains(ruleset, s) {
				left = append(left, "nft ruleset names "+s)
			}
		}
		addrs, err := netlab.Addrs(gp.netns, "net1")
		if err != nil {
			return err
		}
		for _, p := range addrs {
			if slices.Contains(eipAddrs, p.Addr()) {
				left = append(left, "net1 has "+p.String())
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("the gateway's kernel after its rules and EIPs were deleted: %s", strings.Join(left, "; "))
		}
		return nil
	}); err != nil {
		t.Logf("nft ruleset in the pod:\n%s", func() string { s, _ := netlab.NftRuleset(ctx, gp.netns); return s }())
		t.Fatal(err)
	}
	if vips, err := e.natgwVips(); err != nil || len(vips) > 0 {
		t.Fatalf("natgw's Vips after its EIPs were deleted: %v (%v)", vips, err)
	}
	e.mustKubectl("", "delete", "vpc-nat-gw", gwName, "--timeout=2m")
	if err := e.waitWorkloadGone(ctx, "the VpcNatGateway was deleted"); err != nil {
		t.Fatal(err)
	}
	cleanupIn := time.Since(t0)
	if out := strings.TrimSpace(e.mustKubectl("", "get", "vpc-nat-gw,iptables-eip,iptables-fip-rule,iptables-dnat-rule,iptables-snat-rule", "-o", "name")); out != "" {
		t.Errorf("objects left after the cleanup: %s", strings.ReplaceAll(out, "\n", " "))
	}
	if vips, err := e.natgwVips(); err != nil || len(vips) > 0 {
		t.Errorf("natgw's Vips after the cleanup: %v (%v)", vips, err)
	}

	// 6. Kube-OVN's reservation is gone: an OvnEip asking for each former
	// EIP address gets it.
	t0 = time.Now()
	var again []string
	ovnYAML.Reset()
	for i, a := range eipAddrs {
		n := fmt.Sprintf("ngw-doc-again-%d", i)
		again = append(again, n)
		ovnYAML.WriteString("---\n" + ovnEipManifest(n, a.String()))
	}
	t.Cleanup(func() {
		_, _ = e.kubectl("", append([]string{"delete", "--ignore-not-found", "--wait=false"}, ovnEipObjs(again)...)...)
	})
	e.mustKubectl(ovnYAML.String(), "apply", "-f", "-")
	if err := eventually(ctx, time.Minute, func() error {
		for i, n := range again {
			got, err := e.kubectl("", "get", "ovn-eip", n, "-o", "jsonpath={.status.v4Ip}")
			if err != nil {
				return err
			}
			if got != eipAddrs[i].String() {
				return fmt.Errorf("OvnEip %s: status.v4Ip %q, want the released %s", n, got, eipAddrs[i])
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	releasedIn := time.Since(t0)
	e.mustKubectl("", append([]string{"delete", "--timeout=2m"}, ovnEipObjs(again)...)...)
	if err := e.waitGone(time.Minute, ovnEipObjs(again)...); err != nil {
		t.Fatal(err)
	}
	if err := e.k.Alive(); err != nil {
		t.Fatal(err)
	}

	auto := 0
	for _, x := range docEIPs {
		if x.v4ip == "" {
			auto++
		}
	}
	testsummary.Scenario(t, "CLUSTER-SUMMARY", "replace-doc-nat", "nftables",
		"kube_ovn", "v1.16.2", "kube_ovn_feature", "off", "network_source", "kube-ovn",
		"cluster_up", e.upIn, "kubeovn_controller_ready", e.controllerIn, "kubeovn_feature_off", featureOffIn,
		"eips", len(docEIPs), "eips_ipam", auto, "rules", len(docRules), "probes", len(probes),
		"gateway_pod_running", podIn, "gateway_synced", gatewayIn, "eip_ready", eipReadyIn, "rules_ready", rulesReadyIn, "traffic_flowing", trafficIn,
		"kernel_objects", kernelObjects, "ipam_probe", "ovn-eip", "ipam_other_addresses", len(otherAddrs), "ipam_refused_eip_addresses", refused,
		"cleanup", cleanupIn, "released_addresses", len(again), "release_proved", releasedIn,
		"total", time.Since(tStart))
}
