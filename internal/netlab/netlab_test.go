package netlab

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/internal/procfs"
	"github.com/natgw/natgw/nat/netns"
)

func exists(t *testing.T, name string) bool {
	t.Helper()
	_, err := os.Stat(filepath.Join(netns.RunDir, name))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

func TestNamespaceLifecycle(t *testing.T) {
	lab := ForTest(t)
	ns, err := lab.NS("a")
	if err != nil {
		t.Fatal(err)
	}
	if want := Prefix + lab.ID() + "-a"; ns != want {
		t.Errorf("NS name = %q, want %q", ns, want)
	}
	if !exists(t, ns) {
		t.Fatalf("%s not under %s", ns, netns.RunDir)
	}
	if _, err := lab.NS("a"); err == nil {
		t.Errorf("second NS with the same role: no error")
	}
	// iproute2 sees it, and lo is up inside.
	out, err := Exec(context.Background(), "", "", "ip", "netns", "list")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, ns) {
		t.Errorf("ip netns list does not show %s:\n%s", ns, out)
	}
	out, err = Exec(context.Background(), ns, "", "ip", "-o", "link", "show", "lo")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "UP") {
		t.Errorf("lo not up in %s: %s", ns, out)
	}
	// A TCP probe on lo inside the namespace.
	srv, err := lab.ServeTCP(context.Background(), ns, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := Dial(context.Background(), ns, srv.Addr.String(), DialTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if r.Client.Addr() != netip.MustParseAddr("127.0.0.1") || !strings.HasPrefix(r.Server, ns+"/") {
		t.Errorf("reply %+v", r)
	}
	// The same address is not listening in the caller's namespace.
	if _, err := Dial(context.Background(), "", srv.Addr.String(), FailTimeout); err == nil {
		t.Errorf("probe server in %s answered from the host namespace", ns)
	}

	// A client that keeps its connection open does not hold Close up.
	held, _, err := Connect(context.Background(), ns, srv.Addr.String(), DialTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	start := time.Now()
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v with a client connected", d)
	}
	if exists(t, ns) {
		t.Errorf("%s still present after Close", ns)
	}
	if err := lab.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := lab.NS("b"); err == nil {
		t.Errorf("NS after Close: no error")
	}
}

func TestGatewayTopology(t *testing.T) {
	ctx := context.Background()
	lab := ForTest(t)
	gws := map[string]*Gateway{}
	for _, name := range []string{"", "two"} {
		g, err := lab.Gateway(GatewayOptions{Name: name})
		if err != nil {
			t.Fatal(err)
		}
		gws[name] = g
	}
	for name, g := range gws {
		t.Run("gw"+name, func(t *testing.T) {
			if len(g.VMs) != 3 {
				t.Fatalf("%d VMs", len(g.VMs))
			}
			cfg := g.Config()
			if cfg.NetNS != g.GW || cfg.ExternalInterface != "net1" || cfg.InternalInterface != "eth0" {
				t.Errorf("Config() = %+v", cfg)
			}
			for dev, want := range map[string]string{"net1": "192.0.2.254/24", "eth0": "198.51.100.1/24"} {
				as, err := Addrs(g.GW, dev)
				if err != nil {
					t.Fatal(err)
				}
				if len(as) != 1 || as[0].String() != want {
					t.Errorf("%s addresses %v, want %s", dev, as, want)
				}
			}
			fwd, err := Exec(ctx, g.GW, "", "cat", "/proc/sys/net/ipv4/ip_forward")
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(fwd) != "1" {
				t.Errorf("ip_forward in gw = %q", fwd)
			}
			rs, err := Routes(g.VMs[0].NS)
			if err != nil {
				t.Fatal(err)
			}
			def := Route{Dst: netip.MustParsePrefix("0.0.0.0/0"), Via: GWVPCAddr, Dev: "eth0"}
			found := false
			for _, r := range rs {
				found = found || r == def
			}
			if !found {
				t.Errorf("vm1 routes %v lack %s", rs, def)
			}

			for i, vm := range g.VMs {
				if vm.Addr != VMAddr(i) {
					t.Errorf("vm%d address %s", i+1, vm.Addr)
				}
				if _, err := lab.ServeTCP(ctx, vm.NS, fmt.Sprintf("%s:8080", vm.Addr)); err != nil {
					t.Fatal(err)
				}
				if _, err := lab.ServeUDP(ctx, vm.NS, fmt.Sprintf("%s:8081", vm.Addr)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := lab.ServeTCP(ctx, g.Ext.NS, "0.0.0.0:9090"); err != nil {
				t.Fatal(err)
			}
			type hop struct {
				from   string
				to     string
				client netip.Addr
			}
			for _, h := range []hop{
				{g.GW, "198.51.100.10:8080", GWVPCAddr},        // gw -> vm1
				{g.GW, "198.51.100.12:8080", GWVPCAddr},        // gw -> vm3
				{g.VMs[0].NS, "198.51.100.11:8080", VMAddr(0)}, // vm1 -> vm2 over the bridge
			} {
				r, err := Dial(ctx, h.from, h.to, DialTimeout)
				if err != nil {
					t.Errorf("tcp %s -> %s: %v", h.from, h.to, err)
					continue
				}
				if r.Client.Addr() != h.client {
					t.Errorf("tcp %s -> %s: server saw %s, want %s", h.from, h.to, r.Client, h.client)
				}
			}
			r, err := DialUDP(ctx, g.GW, "198.51.100.11:8081", DialTimeout)
			if err != nil {
				t.Errorf("udp gw -> vm2: %v", err)
			} else if r.Client.Addr() != GWVPCAddr || !strings.HasPrefix(r.Server, g.VMs[1].NS+"/") {
				t.Errorf("udp gw -> vm2: reply %+v", r)
			}
			// Bulk transfers both ways over the bridge.
			for _, size := range []int64{0, 1 << 20} {
				if r, d, err := Upload(ctx, g.GW, "198.51.100.10:8080", size, 10*time.Second); err != nil || r.Client.Addr() != GWVPCAddr || d <= 0 {
					t.Errorf("upload %d bytes gw -> vm1: %+v, %v, %v", size, r, d, err)
				}
				if r, d, err := Download(ctx, g.GW, "198.51.100.10:8080", size, 10*time.Second); err != nil || r.Client.Addr() != GWVPCAddr || d <= 0 {
					t.Errorf("download %d bytes vm1 -> gw: %+v, %v, %v", size, r, d, err)
				}
			}
			// gw reaches ext on net1.
			r, err = Dial(ctx, g.GW, "192.0.2.1:9090", DialTimeout)
			if err != nil {
				t.Errorf("tcp gw -> ext: %v", err)
			} else if r.Client.Addr() != GWExtAddr {
				t.Errorf("tcp gw -> ext: server saw %s", r.Client)
			}
			// Without NAT a VM cannot talk to ext (ext has no route back), and
			// ext cannot reach the VPC.
			start := time.Now()
			if _, err := Dial(ctx, g.VMs[0].NS, "192.0.2.1:9090", FailTimeout); err == nil {
				t.Errorf("vm1 reached ext without NAT")
			}
			if d := time.Since(start); d > FailTimeout+time.Second {
				t.Errorf("failing dial took %v", d)
			}
			if _, err := Dial(ctx, g.Ext.NS, "198.51.100.10:8080", FailTimeout); err == nil {
				t.Errorf("ext reached vm1 without NAT")
			}
		})
	}
	if gws[""].GW == gws["two"].GW {
		t.Errorf("two topologies share the gateway namespace %s", gws[""].GW)
	}
	if names := lab.Namespaces(); len(names) != 12 {
		t.Errorf("namespaces %v, want 12", names)
	}
	closeLab(t, lab)
}

// closeLab closes lab and checks that none of its namespaces is left.
func closeLab(t *testing.T, lab *Lab) {
	t.Helper()
	names := lab.Namespaces()
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if exists(t, n) {
			t.Errorf("%s left after Close", n)
		}
	}
}

func TestRecreateGW(t *testing.T) {
	ctx := context.Background()
	lab := ForTest(t)
	g, err := lab.Gateway(GatewayOptions{Name: "r", VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Exec(ctx, g.GW, "table ip t { chain c { type filter hook input priority 0; }; }\n", "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	if _, err := lab.ServeTCP(ctx, g.VMs[0].NS, "0.0.0.0:8080"); err != nil {
		t.Fatal(err)
	}
	// vm1 learns the gateway's MAC before the restart (over UDP: a TCP
	// connection's TIME_WAIT would keep the old namespace alive).
	srv, err := ServeUDP(ctx, g.GW, "0.0.0.0:7070")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DialUDP(ctx, g.VMs[0].NS, "198.51.100.1:7070", DialTimeout); err != nil {
		t.Fatalf("vm1 -> gw: %v", err)
	}
	srv.Close()
	if err := g.RecreateGW(ctx); err != nil {
		t.Fatal(err)
	}
	// The recreated gateway has the same MACs: vm1's ARP cache, still
	// fresh, stays right, and vm1 reaches it at once.
	if _, err := lab.ServeUDP(ctx, g.GW, "0.0.0.0:7070"); err != nil {
		t.Fatal(err)
	}
	if _, err := DialUDP(ctx, g.VMs[0].NS, "198.51.100.1:7070", DialTimeout); err != nil {
		t.Errorf("vm1 -> recreated gw with its ARP cache of before: %v", err)
	}
	if rs, err := NftRuleset(ctx, g.GW); err != nil || strings.TrimSpace(rs) != "" {
		t.Errorf("recreated gateway is not empty: %q, %v", rs, err)
	}
	if r, err := Dial(ctx, g.GW, "198.51.100.10:8080", DialTimeout); err != nil || r.Client.Addr() != GWVPCAddr {
		t.Errorf("gw -> vm1 after recreate: %+v, %v", r, err)
	}
	if _, err := lab.ServeTCP(ctx, g.Ext.NS, "0.0.0.0:9090"); err != nil {
		t.Fatal(err)
	}
	if r, err := Dial(ctx, g.GW, "192.0.2.1:9090", DialTimeout); err != nil || r.Client.Addr() != GWExtAddr {
		t.Errorf("gw -> ext after recreate: %+v, %v", r, err)
	}
	if err := lab.RemoveNS("ngw-not-mine"); err == nil {
		t.Errorf("RemoveNS of a foreign name: no error")
	}
	closeLab(t, lab)
}

func TestKernelReaders(t *testing.T) {
	ctx := context.Background()
	lab := ForTest(t)
	g, err := lab.Gateway(GatewayOptions{Name: "k", VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := NftRuleset(ctx, g.GW)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(rs) != "" {
		t.Errorf("fresh namespace has a ruleset:\n%s", rs)
	}
	if _, err := Exec(ctx, g.GW, "table ip t { chain c { type filter hook input priority 0; }; }\n", "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	if rs, err = NftRuleset(ctx, g.GW); err != nil || !strings.Contains(rs, "table ip t") {
		t.Errorf("ruleset after adding a table: %q, %v", rs, err)
	}
	if rs, err = NftRuleset(ctx, g.Ext.NS); err != nil || strings.TrimSpace(rs) != "" {
		t.Errorf("table leaked into ext: %q, %v", rs, err)
	}
	if _, err := Exec(ctx, g.GW, "", "iptables-legacy", "-t", "nat", "-A", "POSTROUTING", "-s", "203.0.113.0/24", "-j", "MASQUERADE"); err != nil {
		t.Fatal(err)
	}
	save1, err := IptablesSave(ctx, g.GW, true)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(save1, "-A POSTROUTING -s 203.0.113.0/24 -j MASQUERADE") || strings.Contains(save1, "#") || strings.Contains(save1, "[0:0]") {
		t.Errorf("iptables-legacy-save:\n%s", save1)
	}
	// Traffic through the chain does not change the dump (no counters).
	if _, err := lab.ServeUDP(ctx, g.Ext.NS, "0.0.0.0:9091"); err != nil {
		t.Fatal(err)
	}
	if _, err := DialUDP(ctx, g.GW, "192.0.2.1:9091", DialTimeout); err != nil {
		t.Fatal(err)
	}
	if save2, err := IptablesSave(ctx, g.GW, true); err != nil || save2 != save1 {
		t.Errorf("dump changed after traffic: %v\n%s\n---\n%s", err, save1, save2)
	}
	flows, err := ConntrackEntries(ctx, g.GW)
	if err != nil {
		t.Fatal(err)
	}
	got := FlowsWith(flows, ExtAddr)
	if len(got) != 1 || got[0].Proto != 17 || got[0].OrigSrc.Addr() != GWExtAddr || got[0].OrigDst != netip.MustParseAddrPort("192.0.2.1:9091") {
		t.Errorf("conntrack flows with ext: %v (all: %v)", got, flows)
	}
	if other, err := ConntrackEntries(ctx, g.VMs[0].NS); err != nil || len(other) != 0 {
		t.Errorf("conntrack of vm1: %v, %v", other, err)
	}
	// Command runs in the namespace too (e.g. a long-running agent).
	cmd := Command(ctx, g.GW, "ip", "-o", "link", "show", "net1")
	if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), "net1") {
		t.Errorf("Command in gw: %q, %v", out, err)
	}
	if _, err := Exec(ctx, g.GW, ""); err == nil {
		t.Errorf("Exec without a command: no error")
	}
	ctx2, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := NftRuleset(ctx2, g.GW); err == nil {
		t.Errorf("NftRuleset with a cancelled context: no error")
	}
}

// deadPid returns a pid no process has.
func deadPid(t *testing.T) int {
	for pid := 4194000; pid > 4000000; pid-- {
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
			return pid
		}
	}
	t.Fatal("no free pid found")
	return 0
}

func TestSweepStale(t *testing.T) {
	if reason := Unavailable(); reason != "" {
		t.Skip(reason)
	}
	live := ForTest(t)
	liveNS, err := live.NS("live")
	if err != nil {
		t.Fatal(err)
	}
	dead := deadPid(t)
	old := time.Now().Add(-2 * time.Hour).Unix()
	name := func(pid int, created int64, role string) string {
		return fmt.Sprintf("%s%d.%08x.abcd-%s", Prefix, pid, created, role)
	}
	names := map[string]bool{ // name -> must be swept
		name(dead, old, "gw"):                    true,
		name(dead, old, "ext"):                   true,
		name(dead, time.Now().Unix(), "gw"):      false, // too young
		name(os.Getpid(), old, "reused"):         true,  // pid reused: this process started after the lab
		Prefix + "not-a-lab-" + fmt.Sprint(dead): false, // not a lab's
	}
	if start, err := procfs.StartTime(1); err != nil {
		t.Fatal(err)
	} else if time.Since(start) > 2*time.Minute {
		names[name(1, start.Unix()+1, "alive")] = false // owner alive
	}
	for n := range names {
		if err := createNamed(n); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deleteNamed(n) })
	}
	removed, err := SweepStale(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, n := range removed {
		got[n] = true
	}
	for n, want := range names {
		if got[n] != want {
			t.Errorf("%s: swept=%v, want %v", n, got[n], want)
		}
		if exists(t, n) == want {
			t.Errorf("%s: present=%v after sweep", n, !want)
		}
	}
	if got[liveNS] || !exists(t, liveNS) {
		t.Errorf("live lab namespace %s swept", liveNS)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		line string
		ok   bool
		want Reply
	}{
		{"natgw-probe client=192.0.2.1:4000 server=ns/1.2.3.4:80\n", true, Reply{netip.MustParseAddrPort("192.0.2.1:4000"), "ns/1.2.3.4:80"}},
		{"natgw-probe client=[::ffff:192.0.2.1]:4000 server=x", true, Reply{netip.MustParseAddrPort("192.0.2.1:4000"), "x"}},
		{"natgw-probe server=x", false, Reply{}},
		{"hello", false, Reply{}},
		{"natgw-probe client=nope", false, Reply{}},
	} {
		r, err := parseReply(tc.line)
		if (err == nil) != tc.ok || r != tc.want {
			t.Errorf("parseReply(%q) = %+v, %v", tc.line, r, err)
		}
	}
	for _, tc := range []struct {
		name string
		ok   bool
		pid  int
		sec  int64
	}{
		{"ngw-123.0000000a.ffff-gw", true, 123, 10},
		{"ngw-123.0000000a.ffff-a-gw", true, 123, 10},
		{"ngw-x.0000000a.ffff-gw", false, 0, 0},
		{"ngw-123.zz.ffff-gw", false, 0, 0},
		{"ngw-123-gw", false, 0, 0},
		{"other-123.0000000a.ffff-gw", false, 0, 0},
	} {
		li, ok := parseName(tc.name)
		if ok != tc.ok || (ok && (li.pid != tc.pid || li.created.Unix() != tc.sec)) {
			t.Errorf("parseName(%q) = %+v, %v", tc.name, li, ok)
		}
	}
}

// TestGatewayTopologyIPv6: a dual-stack topology has every role's IPv6
// address beside its IPv4 one (not tentative: no DAD), the VMs an IPv6
// default route, accept_ra off everywhere and IPv6 forwarding on in gw,
// and real TCP over IPv6 between neighbours (vm1 to gw's eth0, ext to gw's
// net1; through gw needs NAT: ext has no route to the VPC, as in IPv4).
func TestGatewayTopologyIPv6(t *testing.T) {
	ctx := context.Background()
	lab := ForTest(t)
	g, err := lab.Gateway(GatewayOptions{IPv6: true, VMs: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ns, dev string
		want    netip.Prefix
	}{
		{g.GW, "net1", netip.PrefixFrom(GWExtAddr6, 64)},
		{g.GW, "eth0", netip.PrefixFrom(GWVPCAddr6, 64)},
		{g.Ext.NS, "eth0", netip.PrefixFrom(ExtAddr6, 64)},
		{g.VMs[1].NS, "eth0", netip.PrefixFrom(VMAddr6(1), 64)},
	} {
		as, err := Addrs6(c.ns, c.dev)
		if err != nil {
			t.Fatal(err)
		}
		if len(as) != 1 || as[0] != c.want {
			t.Errorf("%s %s: IPv6 addresses %v, want %s", c.ns, c.dev, as, c.want)
		}
		if as4, err := Addrs(c.ns, c.dev); err != nil || len(as4) != 1 {
			t.Errorf("%s %s: IPv4 addresses %v (%v), want one", c.ns, c.dev, as4, err)
		}
	}
	if g.VMs[0].Addr6 != VMAddr6(0) || g.Ext.Addr6 != ExtAddr6 || VMAddr6(0).String() != "2001:db8:100::a" || EIP6(0).String() != "2001:db8:2::100" {
		t.Errorf("hosts %+v %+v, EIP6(0) %s", g.VMs[0], g.Ext, EIP6(0))
	}
	for ns, want := range map[string]map[string]string{
		g.GW:        {"all/forwarding": "1", "all/accept_ra": "0", "default/accept_ra": "0"},
		g.VMs[0].NS: {"all/accept_ra": "0", "default/accept_ra": "0"},
		g.Ext.NS:    {"all/accept_ra": "0"},
	} {
		for key, v := range want {
			got, err := Exec(ctx, ns, "", "cat", "/proc/sys/net/ipv6/conf/"+key)
			if err != nil || strings.TrimSpace(got) != v {
				t.Errorf("%s: %s = %q (%v), want %s", ns, key, got, err, v)
			}
		}
	}
	if out, err := Exec(ctx, g.VMs[0].NS, "", "ip", "-6", "route", "show", "default"); err != nil || !strings.Contains(out, "via 2001:db8:100::1 dev eth0") {
		t.Errorf("vm1 IPv6 default route: %q (%v)", out, err)
	}
	for _, c := range []struct {
		client, server string
		addr           netip.Addr
	}{
		{g.VMs[0].NS, g.GW, GWVPCAddr6},
		{g.Ext.NS, g.GW, GWExtAddr6},
	} {
		target := netip.AddrPortFrom(c.addr, 7070).String()
		srv, err := lab.ServeTCP(ctx, c.server, target)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Dial(ctx, c.client, target, DialTimeout); err != nil {
			t.Errorf("TCP %s -> %s: %v", c.client, target, err)
		}
		srv.Close()
	}
}
