package main

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
)

// TestVPCLBInitContainers runs the VPC LB pod's init containers (vpc_lb.go:
// `ip -4|-6 route replace CIDR via GW`, `iptables|ip6tables -t nat -I
// POSTROUTING -d CIDR -j MASQUERADE`) through the image's link names inside
// a gateway namespace, and checks them with real packets and the kernel's
// routes; other forms are refused and program nothing.
func TestVPCLBInitContainers(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 2*time.Minute)
	dir := t.TempDir()
	for _, name := range []string{"ip", "iptables", "ip6tables"} {
		if err := os.Symlink(natgwBin, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	run := func(name string, args ...string) (int, string) {
		t.Helper()
		_, errb, code := runCmd(t, exec.Command("nsenter", append([]string{"--net=" + netns.Path(gw.GW), "--", filepath.Join(dir, name)}, args...)...))
		return code, errb
	}
	if _, err := lab.ServeTCP(ctx, gw.Ext.NS, "0.0.0.0:80"); err != nil {
		t.Fatal(err)
	}
	// ext has no route back to the VPC: without the masquerade, nothing.
	if r, err := netlab.Dial(ctx, gw.VMs[0].NS, "192.0.2.1:80", netlab.FailTimeout); err == nil {
		t.Fatalf("vm1 reached ext before the masquerade: %+v", r)
	}
	for _, bad := range [][]string{
		{"iptables", "-t", "nat", "-A", "POSTROUTING", "-d", "192.0.2.0/24", "-j", "MASQUERADE"},
		{"iptables", "-t", "nat", "-I", "POSTROUTING", "-d", "2001:db8::/64", "-j", "MASQUERADE"},
		{"iptables", "-t", "nat", "-I", "POSTROUTING", "-d", "192.0.2.1/24", "-j", "MASQUERADE"},
		{"iptables", "-F"},
		{"ip", "route", "add", "203.0.113.0/24", "via", "192.0.2.1"},
		{"ip", "-4", "route", "replace", "203.0.113.0/24", "via", "2001:db8::1"},
	} {
		if code, stderr := run(bad[0], bad[1:]...); code == 0 || stderr == "" {
			t.Errorf("%q: exit %d stderr %q, want a refusal", bad, code, stderr)
		}
	}
	if r, err := netlab.Dial(ctx, gw.VMs[0].NS, "192.0.2.1:80", netlab.FailTimeout); err == nil {
		t.Fatalf("a refused form programmed something: %+v", r)
	}
	if code, stderr := run("iptables", "-t", "nat", "-I", "POSTROUTING", "-d", "192.0.2.0/24", "-j", "MASQUERADE"); code != 0 || stderr != "" {
		t.Fatalf("iptables: exit %d stderr %q", code, stderr)
	}
	r, err := netlab.Dial(ctx, gw.VMs[0].NS, "192.0.2.1:80", netlab.DialTimeout)
	if err != nil || r.Client.Addr() != netlab.GWExtAddr {
		t.Fatalf("vm1 -> ext through the masquerade: %+v, %v (want source %s)", r, err, netlab.GWExtAddr)
	}
	if code, stderr := run("ip", "-4", "route", "replace", "203.0.113.0/24", "via", "192.0.2.1"); code != 0 || stderr != "" {
		t.Fatalf("ip route replace: exit %d stderr %q", code, stderr)
	}
	routes, err := netlab.Routes(gw.GW)
	if err != nil {
		t.Fatal(err)
	}
	want := netlab.Route{Dst: netip.MustParsePrefix("203.0.113.0/24"), Via: netlab.ExtAddr, Dev: gw.ExternalInterface}
	found := false
	for _, rt := range routes {
		found = found || rt.String() == want.String()
	}
	if !found {
		t.Fatalf("routes %v, want %s", routes, want)
	}
	// The -6 forms.
	if err := netlab.AddAddr(gw.GW, gw.ExternalInterface, netip.MustParsePrefix("2001:db8:2::1/64")); err != nil {
		t.Fatal(err)
	}
	if code, stderr := run("ip", "-6", "route", "replace", "2001:db8:1::/64", "via", "2001:db8:2::fe"); code != 0 || stderr != "" {
		t.Fatalf("ip -6 route replace: exit %d stderr %q", code, stderr)
	}
	if out, err := netlab.Exec(context.Background(), gw.GW, "", "ip", "-6", "route", "show", "2001:db8:1::/64"); err != nil || !strings.Contains(out, "via 2001:db8:2::fe") {
		t.Fatalf("ip -6 route: %q, %v", out, err)
	}
	if code, stderr := run("ip6tables", "-t", "nat", "-I", "POSTROUTING", "-d", "2001:db8:1::/64", "-j", "MASQUERADE"); code != 0 || stderr != "" {
		t.Fatalf("ip6tables: exit %d stderr %q", code, stderr)
	}
	if out, err := netlab.NftTable(context.Background(), gw.GW, "ip6", nftconn.VPCLBTable); err != nil || !strings.Contains(out, "ip6 daddr 2001:db8:1::/64 masquerade") {
		t.Fatalf("ip6 table: %q, %v", out, err)
	}
}
