package link

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/natgw/natgw/nat"
)

func sh(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// gatewayNS makes a namespace with two up interfaces named net1 and eth0.
func gatewayNS(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace")
	}
	name := fmt.Sprintf("ngw-link-%d", os.Getpid())
	sh(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	// This kernel has no dummy driver: veth pairs with both ends inside.
	for _, dev := range []string{"net1", "eth0"} {
		sh(t, "ip", "-n", name, "link", "add", "name", dev, "type", "veth", "peer", "name", dev+"p")
		sh(t, "ip", "-n", name, "link", "set", dev, "up")
		sh(t, "ip", "-n", name, "link", "set", dev+"p", "up")
	}
	sh(t, "ip", "-n", name, "addr", "add", "192.0.2.254/24", "dev", "net1")
	sh(t, "ip", "-n", name, "addr", "add", "198.51.100.1/24", "dev", "eth0")
	return name
}

func TestPlumberAddressesAndRoutes(t *testing.T) {
	ns := gatewayNS(t)
	p, err := New(nat.Config{NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got := strings.TrimSpace(sh(t, "ip", "netns", "exec", ns, "cat", "/proc/sys/net/ipv4/ip_forward")); got != "1" {
		t.Fatalf("ip_forward = %q, want 1", got)
	}
	eip := nat.Object{UID: "e1", Kind: nat.KindEIP, EIP: &nat.EIP{Address: netip.MustParseAddr("192.0.2.10"), PrefixLen: 24}}
	eipQoS := eip
	eipQoS.EIP = &nat.EIP{Address: eip.EIP.Address, PrefixLen: 24, QoS: &nat.QoS{IngressRateMbps: 10}}
	def := nat.Object{UID: "r1", Kind: nat.KindRoute, Route: &nat.Route{Destination: netip.MustParsePrefix("0.0.0.0/0"), NextHop: netip.MustParseAddr("192.0.2.1"), Device: nat.DeviceExternal}}
	sub := nat.Object{UID: "r2", Kind: nat.KindRoute, Route: &nat.Route{Destination: netip.MustParsePrefix("10.9.0.0/16"), NextHop: netip.MustParseAddr("198.51.100.20"), Device: nat.DeviceInternal}}
	ctx := context.Background()

	addrs := func() string { return sh(t, "ip", "-n", ns, "-4", "addr", "show", "dev", "net1") }
	routes := func() string { return sh(t, "ip", "-n", ns, "-4", "route") }

	if err := p.Check([]nat.Object{eip, def, sub}); err != nil {
		t.Fatal(err)
	}
	if err := p.Apply(ctx, nil, []nat.Object{eip, def, sub}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(addrs(), "192.0.2.10/24") {
		t.Fatalf("EIP address missing:\n%s", addrs())
	}
	r := routes()
	if !strings.Contains(r, "default via 192.0.2.1 dev net1 onlink") || !strings.Contains(r, "10.9.0.0/16 via 198.51.100.20 dev eth0") {
		t.Fatalf("routes missing:\n%s", r)
	}
	// Idempotent.
	if err := p.Apply(ctx, nil, []nat.Object{eip, def, sub}); err != nil {
		t.Fatal(err)
	}
	// An update that keeps the address leaves it in place.
	if err := p.Apply(ctx, []nat.Object{eip}, []nat.Object{eipQoS}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(addrs(), "192.0.2.10/24") {
		t.Fatalf("EIP address lost by a QoS update:\n%s", addrs())
	}
	if err := p.Apply(ctx, []nat.Object{eipQoS, def, sub}, nil); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(addrs(), "192.0.2.10") {
		t.Fatalf("EIP address left after delete:\n%s", addrs())
	}
	if r := routes(); strings.Contains(r, "default") || strings.Contains(r, "10.9.0.0") {
		t.Fatalf("routes left after delete:\n%s", r)
	}
	// Deleting again is a no-op.
	if err := p.Apply(ctx, []nat.Object{eipQoS, def, sub}, nil); err != nil {
		t.Fatalf("second delete: %v", err)
	}
	bad := def
	bad.Route = &nat.Route{Destination: def.Route.Destination, NextHop: def.Route.NextHop, Device: nat.DeviceExternal}
	p2, err := New(nat.Config{NetNS: ns, ExternalInterface: "nosuch0"})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if err := p2.Check([]nat.Object{bad}); err == nil || !strings.Contains(err.Error(), "nosuch0") {
		t.Fatalf("Check with a missing interface = %v, want an error naming it", err)
	}
}
