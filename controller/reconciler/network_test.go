package reconciler

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/controller/eipalloc"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/internal/netlab"
)

// subnet creates a Kube-OVN Subnet of the test (upstream's CRD) with its
// status Validated, as Kube-OVN's controller leaves a subnet it accepted.
func (e *env) subnet(name, vpc, provider, cidr, gw string) *unstructured.Unstructured {
	e.t.Helper()
	u := kubeovn.NewSubnet()
	u.SetName(e.case_ + "-" + name)
	u.SetLabels(map[string]string{testLabel: e.case_})
	protocol := "IPv4"
	if strings.Contains(cidr, ",") {
		protocol = "Dual" // "v4cidr,v6cidr", as Kube-OVN formats a dual-stack subnet
	}
	spec := map[string]any{"cidrBlock": cidr, "gateway": gw, "protocol": protocol}
	if vpc != "" {
		spec["vpc"] = vpc
	}
	if provider != "" {
		spec["provider"] = provider
	}
	u.Object["spec"] = spec
	e.create(u)
	u.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Validated", "status": "True"}}}
	if err := e.c.Status().Update(e.ctx, u); err != nil {
		e.t.Fatalf("subnet %s status: %v", u.GetName(), err)
	}
	e.t.Cleanup(func() {
		if err := e.c.Delete(e.ctx, u); err != nil && !apierrors.IsNotFound(err) {
			e.t.Errorf("delete subnet %s: %v", u.GetName(), err)
		}
	})
	return u
}

// kernelRoutes are the gateway namespace's routes through its own
// interfaces, as "DST via VIA dev DEV", sorted.
func (e *env) kernelRoutes() []string {
	e.t.Helper()
	rs, err := netlab.Routes(e.gw.GW)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		if r.Via.IsValid() {
			out = append(out, fmt.Sprintf("%s via %s dev %s", r.Dst, r.Via, r.Dev))
		}
	}
	slices.Sort(out)
	return out
}

// TestKubeOVNNetwork: with --network-source=kube-ovn, an EIP's prefix length
// comes from its external Subnet, the gateway's default route from its
// external subnet's gateway and its routes to the VPC's other subnets
// from the VPC's Subnets (via the gateway subnet's gateway on eth0), all
// kept in step when the Subnets change; a missing external subnet is
// reported on the EIP without touching what is programmed.
func TestKubeOVNNetwork(t *testing.T) {
	e := newEnv(t, envOptions{crds: crdtest.Upstream, kubeOVNNetwork: true})
	vpc := e.case_ + "-vpc"
	// The gateway config says /24 and 192.0.2.1: the Subnets say otherwise.
	e.subnet("ext", "", "ext.kube-system", "192.0.2.0/26", "192.0.2.2")
	e.subnet("net1", vpc, "ovn", netlab.VPCNet.String(), "198.51.100.254")
	net2 := e.subnet("net2", vpc, "", "10.9.0.0/24", "10.9.0.1")
	e.subnet("other", e.case_+"-vpc2", "", "10.10.0.0/24", "10.10.0.1")
	g := e.gatewayObj()
	g.Spec.Vpc, g.Spec.Subnet, g.Spec.ExternalSubnets = vpc, e.case_+"-net1", []string{e.case_ + "-ext"}
	e.create(g)
	eip := e.eip("eip", netip.MustParseAddr("192.0.2.10"))
	eip.Spec.ExternalSubnet = e.case_ + "-ext"
	e.create(eip)
	e.kubeOVNReserves(eip.Name, netip.MustParseAddr("192.0.2.10"))
	e.waitReady(eip)

	wantRoutes := func(what string, want ...string) {
		t.Helper()
		slices.Sort(want)
		e.eventually(30*time.Second, what, func() error {
			if got := e.kernelRoutes(); !slices.Equal(got, want) {
				return fmt.Errorf("routes %q, want %q", got, want)
			}
			return nil
		})
	}
	e.waitNetHas(netip.MustParsePrefix("192.0.2.10/26")) // the external subnet's prefix length
	wantRoutes("routes from the Subnets",
		"0.0.0.0/0 via 192.0.2.2 dev net1", "10.9.0.0/24 via 198.51.100.254 dev eth0")

	// A new subnet in the VPC, the external gateway moved, a subnet gone.
	e.subnet("net3", vpc, "", "10.11.0.0/24", "10.11.0.1")
	wantRoutes("a new VPC subnet is routed",
		"0.0.0.0/0 via 192.0.2.2 dev net1", "10.9.0.0/24 via 198.51.100.254 dev eth0", "10.11.0.0/24 via 198.51.100.254 dev eth0")
	extObj := kubeovn.NewSubnet()
	extObj.SetName(e.case_ + "-ext")
	e.update(extObj, func() { _ = unstructured.SetNestedField(extObj.Object, "192.0.2.1", "spec", "gateway") })
	if err := e.c.Delete(e.ctx, net2); err != nil {
		t.Fatal(err)
	}
	wantRoutes("the default route follows the external subnet, a deleted subnet's route goes",
		"0.0.0.0/0 via 192.0.2.1 dev net1", "10.11.0.0/24 via 198.51.100.254 dev eth0")

	// An EIP whose external subnet does not exist: reported, and the
	// programmed EIP stays.
	bad := e.eip("eip2", netip.MustParseAddr("192.0.2.11"))
	bad.Spec.ExternalSubnet = e.case_ + "-nope"
	e.create(bad)
	e.waitReason(bad, v1.ReasonSubnetNotReady, 30*time.Second)
	if _, c, _ := readyOf(bad); c == nil || !strings.Contains(c.Message, `"`+e.case_+`-nope"`) {
		t.Errorf("condition %+v does not name the subnet", c)
	}
	if _, ok := hasUID(e.kernelObjects(e.dataplane), eip.UID); !ok {
		t.Errorf("the programmed EIP is gone")
	}
	e.subnet("nope", "", "nope.kube-system", "192.0.2.0/25", "192.0.2.1")
	e.kubeOVNReserves(bad.Name, netip.MustParseAddr("192.0.2.11"))
	e.waitReady(bad)
	e.waitNetHas(netip.MustParsePrefix("192.0.2.11/25")) // the late subnet's
}

// kubeOVNReserves plays Kube-OVN's vip controller for the Vip of EIP eip
// once it exists: writes each of addrs to its status (and spec, as
// Kube-OVN does), v4ip or v6ip by family, and holds it with Kube-OVN's
// finalizer. Logic only: the proof with Kube-OVN's own controller is
// e2e/kubeovn's replace-mode tests.
func (e *env) kubeOVNReserves(eip string, addrs ...netip.Addr) *unstructured.Unstructured {
	e.t.Helper()
	vip := eipalloc.NewVipObject()
	vip.SetName(eipalloc.VipName(eip))
	e.eventually(30*time.Second, "natgw creates the Vip of "+eip, func() error {
		return e.c.Get(e.ctx, client.ObjectKeyFromObject(vip), vip)
	})
	e.update(vip, func() {
		for _, a := range addrs {
			field := "v4ip"
			if a.Is6() {
				field = "v6ip"
			}
			_ = unstructured.SetNestedField(vip.Object, a.String(), "spec", field)
			_ = unstructured.SetNestedField(vip.Object, a.String(), "status", field)
		}
		_ = unstructured.SetNestedField(vip.Object, "00:00:00:aa:bb:cc", "status", "mac")
		vip.SetFinalizers([]string{v1.Finalizer})
	})
	return vip
}

// netHas says whether the gateway's external interface holds p (of
// either family).
func (e *env) netHas(p netip.Prefix) bool {
	e.t.Helper()
	list := netlab.Addrs
	if p.Addr().Is6() {
		list = netlab.Addrs6
	}
	addrs, err := list(e.gw.GW, e.gw.ExternalInterface)
	if err != nil {
		e.t.Fatal(err)
	}
	return slices.Contains(addrs, p)
}

// waitNetHas waits until the gateway's external interface holds p.
func (e *env) waitNetHas(p netip.Prefix) {
	e.t.Helper()
	e.eventually(30*time.Second, "net1 holds "+p.String(), func() error {
		if !e.netHas(p) {
			return fmt.Errorf("not yet")
		}
		return nil
	})
}

// newExternalSubnetEnv is an env with --network-source=kube-ovn on
// upstream's CRDs, the external subnet <case>-ext (192.0.2.0/26) and the
// gateway on it.
func newExternalSubnetEnv(t *testing.T) *env {
	e := newEnv(t, envOptions{crds: crdtest.Upstream, kubeOVNNetwork: true})
	e.subnet("ext", "", "ext.kube-system", "192.0.2.0/26", "192.0.2.1")
	g := e.gatewayObj()
	g.Spec.ExternalSubnets = []string{e.case_ + "-ext"}
	e.create(g)
	return e
}

// TestKubeOVNEIPAddress: with --network-source=kube-ovn an EIP's address
// is reserved through a Vip in its external subnet before it is
// programmed (spec.v4ip or not), status.ip is the reserved address, and
// on delete the Vip is released only after the gateway dropped the
// address, the EIP's finalizer only after Kube-OVN released the Vip.
func TestKubeOVNEIPAddress(t *testing.T) {
	e := newExternalSubnetEnv(t)

	dyn := e.eip("dyn", netip.Addr{})
	dyn.Spec.V4ip, dyn.Spec.ExternalSubnet = "", e.case_+"-ext"
	e.create(dyn)
	e.waitReason(dyn, v1.ReasonAddressPending, 30*time.Second)
	vip := e.kubeOVNReserves(dyn.Name, netip.MustParseAddr("192.0.2.20"))
	if ref := metav1.GetControllerOf(vip); ref == nil || ref.UID != dyn.UID || ref.Kind != "IptablesEIP" {
		t.Errorf("Vip owner %+v, want IptablesEIP %s", ref, dyn.UID)
	}
	if sub, _, _ := unstructured.NestedString(vip.Object, "spec", "subnet"); sub != e.case_+"-ext" {
		t.Errorf("Vip spec.subnet %q", sub)
	}
	e.waitReady(dyn)
	if dyn.Status.IP != "192.0.2.20" {
		t.Errorf("status.ip %q, want the reserved 192.0.2.20", dyn.Status.IP)
	}
	if !e.netHas(netip.MustParsePrefix("192.0.2.20/26")) {
		t.Errorf("the reserved address is not on net1")
	}

	// A static address waits for its reservation too.
	static := e.eip("static", netip.MustParseAddr("192.0.2.21"))
	static.Spec.ExternalSubnet = e.case_ + "-ext"
	e.create(static)
	e.waitReason(static, v1.ReasonAddressPending, 30*time.Second)
	time.Sleep(time.Second)
	if e.netHas(netip.MustParsePrefix("192.0.2.21/26")) {
		t.Fatalf("a static EIP was programmed before Kube-OVN reserved its address")
	}
	e.kubeOVNReserves(static.Name, netip.MustParseAddr("192.0.2.21"))
	e.waitReady(static)

	// Delete: address off the gateway, then the Vip deleted, then (once
	// Kube-OVN released it) the EIP gone.
	if err := e.c.Delete(e.ctx, dyn); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "the Vip is being deleted", func() error {
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(vip), vip); err != nil {
			return err
		}
		if vip.GetDeletionTimestamp() == nil {
			return fmt.Errorf("not deleted yet")
		}
		return nil
	})
	if e.netHas(netip.MustParsePrefix("192.0.2.20/26")) {
		t.Errorf("the Vip was released while the gateway still held its address")
	}
	time.Sleep(time.Second)
	if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(dyn), dyn); err != nil {
		t.Fatalf("the EIP went before Kube-OVN released its Vip: %v", err)
	}
	e.update(vip, func() { vip.SetFinalizers(nil) })
	e.waitGone(dyn, 30*time.Second)
}

// TestKubeOVNAllocatedEIP: an EIP whose address Kube-OVN's own handler
// allocated (a gateway migrated from Kube-OVN's feature: its finalizer and
// status.ip on the EIP) is programmed with that address and no Vip: the
// address is already Kube-OVN's reservation under the EIP's name. On
// delete natgw takes the address off the gateway and removes its own
// finalizer but leaves Kube-OVN's, whose deletion path releases the
// address in its IPAM before it removes it. A rule's upstream finalizer is
// still removed (nothing of Kube-OVN's waits on it).
func TestKubeOVNAllocatedEIP(t *testing.T) {
	e := newExternalSubnetEnv(t)

	mig := e.eip("migrated", netip.MustParseAddr("192.0.2.30"))
	mig.Spec.ExternalSubnet = e.case_ + "-ext"
	mig.Finalizers = []string{v1.Finalizer}
	e.create(mig)
	e.updateStatus(mig, func() { mig.Status.IP, mig.Status.Ready = "192.0.2.30", true })
	fip := e.fip("migrated", "migrated", netip.MustParseAddr("10.0.0.30"))
	fip.Finalizers = []string{v1.Finalizer}
	e.create(fip)
	e.waitReady(mig)
	e.waitReady(fip)
	if !e.netHas(netip.MustParsePrefix("192.0.2.30/26")) {
		t.Errorf("Kube-OVN's address is not on net1")
	}
	vip := eipalloc.NewVipObject()
	vip.SetName(eipalloc.VipName(mig.Name))
	e.eventually(10*time.Second, "no Vip for an address Kube-OVN holds", func() error {
		err := e.c.Get(e.ctx, client.ObjectKeyFromObject(vip), vip)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return err
		case vip.GetDeletionTimestamp() != nil:
			return fmt.Errorf("vip %s being withdrawn", vip.GetName())
		}
		return fmt.Errorf("vip %s exists (created before status.ip was read?) and is not withdrawn", vip.GetName())
	})

	if err := e.c.Delete(e.ctx, fip); err != nil {
		t.Fatal(err)
	}
	e.waitGone(fip, 30*time.Second) // natgw removed both finalizers
	if err := e.c.Delete(e.ctx, mig); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "natgw's finalizer removed, Kube-OVN's kept", func() error {
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(mig), mig); err != nil {
			return err
		}
		if got := mig.GetFinalizers(); !slices.Equal(got, []string{v1.Finalizer}) {
			return fmt.Errorf("finalizers %v, want only %s", got, v1.Finalizer)
		}
		return nil
	})
	if e.netHas(netip.MustParsePrefix("192.0.2.30/26")) {
		t.Errorf("the address is still on net1 after natgw finished the EIP's deletion")
	}
	e.update(mig, func() { mig.SetFinalizers(nil) }) // Kube-OVN's deletion path
	e.waitGone(mig, 30*time.Second)
}

// TestKubeOVNVipV6Follows: with --network-source=kube-ovn on a dual-stack
// external subnet, an EIP without addresses takes both of its Vip's
// (status.v4ip, status.v6ip), and a rule follows the Vip's IPv6 address
// when only that changes. Here Kube-OVN's part (played by the test)
// first reserves the IPv4 address alone: the EIP is programmed IPv4-only
// and an IPv6 FIP on it is refused (Invalid, the EIP has no IPv6
// address). Then status.v6ip appears on the Vip: the EIP's object does not
// change (status.ip stays the IPv4 address), yet the EIP gets the IPv6
// address on net1 and the FIP becomes Ready with it (before the rules
// watched the Vip, the FIP stayed refused).
func TestKubeOVNVipV6Follows(t *testing.T) {
	e := newEnv(t, envOptions{crds: crdtest.Upstream, kubeOVNNetwork: true})
	e.subnet("ext", "", "ext.kube-system", "192.0.2.0/26,"+netlab.ExtNet6.String(), "192.0.2.1,"+netlab.ExtAddr6.String())
	g := e.gatewayObj()
	g.Spec.ExternalSubnets = []string{e.case_ + "-ext"}
	e.create(g)

	v4, v6 := netip.MustParseAddr("192.0.2.20"), netlab.EIP6(20)
	dyn := e.eip("dyn", netip.Addr{})
	dyn.Spec.V4ip, dyn.Spec.ExternalSubnet = "", e.case_+"-ext"
	e.create(dyn)
	e.kubeOVNReserves(dyn.Name, v4)
	e.waitReady(dyn)
	fip6 := e.fip("fip6", "dyn", netlab.VMAddr6(0))
	e.create(fip6)
	e.waitReason(fip6, v1.ReasonInvalid, 30*time.Second)
	if _, c, _ := readyOf(fip6); c == nil || !strings.Contains(c.Message, "no IPv6 address") {
		t.Fatalf("IPv6 FIP on an IPv4-only EIP: condition %+v, want the missing IPv6 address named", c)
	}

	e.kubeOVNReserves(dyn.Name, v4, v6)
	e.waitNetHas(netip.PrefixFrom(v6, netlab.ExtNet6.Bits()))
	e.waitReady(fip6)
	if fip6.Status.V4ip != v4.String() || fip6.Status.V6ip != v6.String() {
		t.Errorf("FIP status.v4ip %q, status.v6ip %q; want the Vip's %s, %s", fip6.Status.V4ip, fip6.Status.V6ip, v4, v6)
	}
	if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(dyn), dyn); err != nil {
		t.Fatal(err)
	}
	if dyn.Status.IP != v4.String() {
		t.Errorf("EIP status.ip %q, want the IPv4 address %s", dyn.Status.IP, v4)
	}
	if !e.netHas(netip.PrefixFrom(v4, 26)) {
		t.Errorf("the IPv4 address left net1")
	}
}
