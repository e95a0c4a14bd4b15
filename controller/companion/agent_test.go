package companion

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/gwimage/compat"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testlog"
	"github.com/natgw/natgw/nat"
)

// TestRealAgent: the sweeper against the real agent (`natgw serve` over the
// local transport) in a gateway namespace whose state the real compat path
// (`natgw compat`, what nat-gateway.sh runs) programmed, with real packets:
// a leaked FIP forwards until the sweeper removes it, a leaked EIP's address
// leaves the external interface, the claimed EIP and an object with a
// Kubernetes UID stay. The API side is a fake reader here; e2e/kubeovn's
// TestCompanion runs it against a real API server and Kube-OVN's controller.
func TestRealAgent(t *testing.T) {
	if why := netlab.Unavailable(); why != "" {
		t.Skip(why)
	}
	bin := filepath.Join(t.TempDir(), "natgw")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/natgw/natgw/gwimage/cmd/natgw").CombinedOutput(); err != nil {
		t.Fatalf("go build natgw: %v\n%s", err, out)
	}
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{Name: "cmp", VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const port = 7302
	if _, err := lab.ServeTCP(ctx, gw.VMs[0].NS, net.JoinHostPort("0.0.0.0", strconv.Itoa(port))); err != nil {
		t.Fatal(err)
	}
	claimed, leakedEIP, k8sEIP := netlab.EIP(0), netlab.EIP(1), netlab.EIP(2)
	state := t.TempDir()
	call := func(op, rule string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, "compat", op, rule)
		cmd.Env = append(os.Environ(), "NATGW_NETNS="+gw.GW, "NATGW_STATE_DIR_FOR_TEST="+state)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("natgw compat %s %s: %v\n%s", op, rule, err, out)
		}
	}
	call(compat.OpEIPAdd, fmt.Sprintf("%s/%d", claimed, netlab.ExtNet.Bits()))
	call(compat.OpFIPAdd, fmt.Sprintf("%s,%s", claimed, gw.VMs[0].Addr)) // leaked: no FIP CR
	call(compat.OpEIPAdd, fmt.Sprintf("%s/%d", leakedEIP, netlab.ExtNet.Bits()))

	tr := &transport.Local{Binary: bin, Log: testlog.New(t, 0)}
	ep := transport.Endpoint{Name: "gw", Dataplane: nat.DataplaneNftables, NetNS: gw.GW}
	s, err := tr.Open(ctx, ep)
	if err != nil {
		t.Fatal(err)
	}
	k8s := nat.Object{UID: "5d0c6c2e-8f1b-4f7a-9e0c-3b2a1d0e9f87", Kind: nat.KindEIP, EIP: &nat.EIP{Address: k8sEIP, PrefixLen: netlab.ExtNet.Bits()}}
	if err := s.Apply(ctx, k8s); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	fipProbe := func() error {
		_, err := netlab.Dial(ctx, gw.Ext.NS, net.JoinHostPort(claimed.String(), strconv.Itoa(port)), 2*time.Second)
		return err
	}
	if err := fipProbe(); err != nil {
		t.Fatalf("the leaked FIP does not forward: %v", err)
	}

	scheme := runtime.NewScheme()
	if err := v1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		&v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: "gw"}},
		&v1.IptablesEIP{ObjectMeta: metav1.ObjectMeta{Name: "e"}, Spec: v1.IptablesEIPSpec{V4ip: claimed.String(), NatGwDp: "gw"}},
	).Build()
	now := time.Unix(2_000_000, 0)
	sw := New(api, api, Options{
		Transport: tr, Config: &gwconfig.Config{Gateways: []gwconfig.Entry{{Name: "gw", NetNS: gw.GW}}},
		Grace: grace, Log: testlog.New(t, 0), Now: func() time.Time { return now },
	})
	r, err := sw.Sweep(ctx)
	if err != nil || r.Suspected != 2 || len(r.Removed) != 0 {
		t.Fatalf("first sweep: %+v, %v; want the FIP and the leaked EIP suspected, nothing removed", r, err)
	}
	now = now.Add(grace)
	r, err = sw.Sweep(ctx)
	if err != nil || len(r.Removed) != 2 {
		t.Fatalf("second sweep: %+v, %v; want 2 removed", r, err)
	}

	s, err = tr.Open(ctx, ep)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	objs, err := s.List(ctx, true)
	if err != nil {
		t.Fatal(err)
	}
	have := byUID(objs)
	for _, uid := range []string{compat.FIPUID(claimed), compat.EIPUID(leakedEIP)} {
		if _, ok := have[uid]; ok {
			t.Errorf("%s still on the gateway", uid)
		}
	}
	for _, uid := range []string{compat.EIPUID(claimed), k8s.UID} {
		if _, ok := have[uid]; !ok {
			t.Errorf("%s was removed", uid)
		}
	}
	addrs, err := netlab.Addrs(gw.GW, gw.ExternalInterface)
	if err != nil {
		t.Fatal(err)
	}
	on := map[netip.Addr]bool{}
	for _, p := range addrs {
		on[p.Addr()] = true
	}
	if on[leakedEIP] || !on[claimed] || !on[k8sEIP] {
		t.Errorf("%s addresses %v: want %s and %s, not %s", gw.ExternalInterface, addrs, claimed, k8sEIP, leakedEIP)
	}
	if err := fipProbe(); err == nil {
		t.Error("the leaked FIP still forwards after its removal")
	}
}
