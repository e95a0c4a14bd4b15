package link

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
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

// TestPlumberDualStack: a dual-stack EIP puts both addresses on net1 with
// their prefix lengths, the IPv6 one usable at once (no DAD, not
// tentative) and announced by an unsolicited neighbour advertisement (a
// real packet, read on net1's peer); IPv6 forwarding is on; an update that
// drops the IPv6 address leaves the IPv4 one alone, and a delete removes
// what is left.
func TestPlumberDualStack(t *testing.T) {
	ns := gatewayNS(t)
	sh(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_ra=0", "net.ipv6.conf.default.accept_ra=0")
	p, err := New(nat.Config{NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got := strings.TrimSpace(sh(t, "ip", "netns", "exec", ns, "cat", "/proc/sys/net/ipv6/conf/all/forwarding")); got != "1" {
		t.Fatalf("IPv6 forwarding = %q, want 1", got)
	}
	v4, v6 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8:1::10")
	dual := nat.Object{UID: "e1", Kind: nat.KindEIP, EIP: &nat.EIP{Address: v4, PrefixLen: 24, V6Address: v6, V6PrefixLen: 64}}
	v4only := nat.Object{UID: "e1", Kind: nat.KindEIP, EIP: &nat.EIP{Address: v4, PrefixLen: 24}}
	if err := dual.Validate(); err != nil {
		t.Fatal(err)
	}
	nsh, err := netns.Open(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	na := make(chan []byte, 1)
	var fd int
	if err := nsh.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IPV6)))
		if err != nil {
			return err
		}
		ifi, err := net.InterfaceByName("net1p")
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IPV6), Ifindex: ifi.Index})
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5})
	go func() {
		b := make([]byte, 1500)
		for {
			n, _, err := unix.Recvfrom(fd, b, 0)
			if err != nil {
				close(na)
				return
			}
			// IPv6 header (40 bytes), next header ICMPv6 (58), type 136.
			if n >= 64 && b[6] == 58 && b[40] == 136 && netip.AddrFrom16([16]byte(b[48:64])) == v6 {
				na <- append([]byte(nil), b[:n]...)
				return
			}
		}
	}()
	ctx := context.Background()
	if err := p.Apply(ctx, nil, []nat.Object{dual}); err != nil {
		t.Fatal(err)
	}
	a6 := sh(t, "ip", "-n", ns, "-6", "addr", "show", "dev", "net1")
	line := ""
	for l := range strings.Lines(a6) {
		if strings.Contains(l, "2001:db8:1::10/64") {
			line = l
		}
	}
	if line == "" || strings.Contains(line, "tentative") || !strings.Contains(line, "nodad") {
		t.Fatalf("IPv6 EIP address missing, tentative or with DAD:\n%s", a6)
	}
	if a4 := sh(t, "ip", "-n", ns, "-4", "addr", "show", "dev", "net1"); !strings.Contains(a4, "192.0.2.10/24") {
		t.Fatalf("IPv4 EIP address missing:\n%s", a4)
	}
	pkt, ok := <-na
	if !ok {
		t.Fatal("no neighbour advertisement of the IPv6 EIP on net1's peer within 5 s")
	}
	src := netip.AddrFrom16([16]byte(pkt[8:24]))
	dst := netip.AddrFrom16([16]byte(pkt[24:40]))
	if src != v6 || dst != netip.IPv6LinkLocalAllNodes() || pkt[7] != 255 || pkt[44]&0x20 == 0 || pkt[44]&0x40 != 0 {
		t.Fatalf("advertisement from %s to %s, hop limit %d, flags %#x: want from the EIP to ff02::1, hop limit 255, override, not solicited", src, dst, pkt[7], pkt[44])
	}
	// The IPv6 default route via the external gateway, onlink like the IPv4 one.
	def6 := nat.Object{UID: "r6", Kind: nat.KindRoute, Route: &nat.Route{Destination: netip.MustParsePrefix("::/0"), NextHop: netip.MustParseAddr("2001:db8:1::1"), Device: nat.DeviceExternal}}
	if err := p.Apply(ctx, nil, []nat.Object{def6}); err != nil {
		t.Fatal(err)
	}
	if r := sh(t, "ip", "-n", ns, "-6", "route", "show", "default"); !strings.Contains(r, "default via 2001:db8:1::1 dev net1") || !strings.Contains(r, "onlink") {
		t.Fatalf("IPv6 default route missing:\n%s", r)
	}
	if err := p.Apply(ctx, []nat.Object{def6}, nil); err != nil {
		t.Fatal(err)
	}
	if r := sh(t, "ip", "-n", ns, "-6", "route", "show", "default"); strings.Contains(r, "2001:db8:1::1") {
		t.Fatalf("IPv6 default route left after delete:\n%s", r)
	}
	// Dropping the IPv6 address keeps the IPv4 one (same key), removes the IPv6 one.
	if err := p.Apply(ctx, []nat.Object{dual}, []nat.Object{v4only}); err != nil {
		t.Fatal(err)
	}
	if a6 := sh(t, "ip", "-n", ns, "-6", "addr", "show", "dev", "net1"); strings.Contains(a6, "2001:db8:1::10") {
		t.Fatalf("IPv6 address left after the update:\n%s", a6)
	}
	if a4 := sh(t, "ip", "-n", ns, "-4", "addr", "show", "dev", "net1"); !strings.Contains(a4, "192.0.2.10/24") {
		t.Fatalf("IPv4 address lost by the update:\n%s", a4)
	}
	if err := p.Apply(ctx, []nat.Object{v4only}, nil); err != nil {
		t.Fatal(err)
	}
	if a4 := sh(t, "ip", "-n", ns, "-4", "addr", "show", "dev", "net1"); strings.Contains(a4, "192.0.2.10") {
		t.Fatalf("IPv4 address left after delete:\n%s", a4)
	}
}
