package reconciler

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
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
	spec := map[string]any{"cidrBlock": cidr, "gateway": gw, "protocol": "IPv4"}
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
	e.eventually(30*time.Second, "EIP with the external subnet's prefix length", func() error {
		addrs, err := netlab.Addrs(e.gw.GW, e.gw.ExternalInterface)
		if err != nil {
			return err
		}
		if !slices.Contains(addrs, netip.MustParsePrefix("192.0.2.10/26")) {
			return fmt.Errorf("net1 has %v, want 192.0.2.10/26", addrs)
		}
		return nil
	})
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
	e.waitReady(bad)
	e.eventually(30*time.Second, "the late subnet's prefix length", func() error {
		addrs, err := netlab.Addrs(e.gw.GW, e.gw.ExternalInterface)
		if err != nil {
			return err
		}
		if !slices.Contains(addrs, netip.MustParsePrefix("192.0.2.11/25")) {
			return fmt.Errorf("net1 has %v, want 192.0.2.11/25", addrs)
		}
		return nil
	})
}
