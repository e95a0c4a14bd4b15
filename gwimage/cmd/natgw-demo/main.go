// Command natgw-demo shows natgw end to end on one machine, without a
// cluster (`make demo`, as root): it builds the standard gateway topology in
// network namespaces (internal/netlab), starts `natgw serve` in the gateway
// namespace as a child process and speaks the protocol to it over its
// stdin/stdout (gwimage/agentapi.Client), applies an EIP, a floating IP, a
// port DNAT and an SNAT, proves with real TCP connections that the external
// host reaches the VPC hosts through the EIPs and that their outbound
// traffic leaves as the EIPs, prints `natgw list` and the nft table, deletes
// everything, proves the connections stop and nothing is left, and removes
// the namespaces (also on Ctrl-C or failure). It exits non-zero when a check
// fails.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/syncbuf"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

func main() {
	natgw := flag.String("natgw", "gwimage/out/natgw", "the natgw binary")
	dataplane := nat.DataplaneNftables
	flag.Var(&dataplane, "dataplane", "data plane: nftables or iptables (default nftables)")
	flag.Parse()
	os.Exit(run(*natgw, dataplane))
}

// Addresses of the demo (the standard topology's).
var (
	fipEIP   = netlab.EIP(0) // 192.0.2.10 <-> vm1
	dnatEIP  = netlab.EIP(1) // 192.0.2.11:8080 -> vm2:80
	snatEIP  = netlab.EIP(2) // 198.51.100.0/24 -> 192.0.2.12
	vm1, vm2 = netlab.VMAddr(0), netlab.VMAddr(1)
)

func objects() []nat.Object {
	eip := func(uid string, a netip.Addr) nat.Object {
		return nat.Object{UID: uid, Kind: nat.KindEIP, EIP: &nat.EIP{Address: a, PrefixLen: netlab.ExtNet.Bits()}}
	}
	return []nat.Object{
		eip("demo-eip-fip", fipEIP),
		eip("demo-eip-dnat", dnatEIP),
		eip("demo-eip-snat", snatEIP),
		{UID: "demo-default-route", Kind: nat.KindRoute, Route: &nat.Route{Destination: netip.MustParsePrefix("0.0.0.0/0"), NextHop: netlab.ExtAddr, Device: nat.DeviceExternal}},
		{UID: "demo-fip-vm1", Kind: nat.KindFIP, FIP: &nat.FIP{EIP: fipEIP, InternalIP: vm1}},
		{UID: "demo-dnat-web", Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: dnatEIP, Protocol: nat.TCP, ExternalPort: 8080, InternalIP: vm2, InternalPort: 80}},
		{UID: "demo-snat-vpc", Kind: nat.KindSNAT, SNAT: &nat.SNAT{EIP: snatEIP, InternalCIDR: netlab.VPCNet}},
	}
}

// demo holds the running demo.
type demo struct {
	natgw     string
	dataplane nat.DataplaneName
	out       io.Writer
	start     time.Time
	lab       *netlab.Lab
	gw        *netlab.Gateway
	agent     *exec.Cmd
	agentDone chan error
	agentLog  *syncbuf.Buffer
	client    *agentapi.Client
	checks    int
}

func run(natgw string, dataplane nat.DataplaneName) int {
	d := &demo{natgw: natgw, dataplane: dataplane, out: os.Stdout, start: time.Now()}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	fmt.Fprintf(d.out, "natgw demo: a VPC NAT gateway in network namespaces, driven through the natgw protocol\n")
	err := d.run(ctx)
	if cerr := d.cleanup(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		if ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled) {
			fmt.Fprintf(d.out, "\n✘ interrupted: %v\n", err)
		} else {
			fmt.Fprintf(d.out, "\n✘ %v\n", err)
		}
		if d.agentLog != nil && d.agentLog.Len() > 0 {
			fmt.Fprintf(d.out, "\nagent log (stderr of natgw serve):\n%s", indent(d.agentLog.String()))
		}
		fmt.Fprintf(d.out, "\ndemo FAILED after %d checks (%.1fs)\n", d.checks, time.Since(d.start).Seconds())
		return 1
	}
	fmt.Fprintf(d.out, "\ndemo passed: %d checks in %.1fs\n", d.checks, time.Since(d.start).Seconds())
	return 0
}

func (d *demo) section(title string) { fmt.Fprintf(d.out, "\n▸ %s\n", title) }

func (d *demo) ok(format string, args ...any) {
	d.checks++
	fmt.Fprintf(d.out, "  ✔ %s\n", fmt.Sprintf(format, args...))
}

func (d *demo) run(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("the demo needs root (network namespaces, netfilter): run `sudo make demo`")
	}
	if reason := netlab.Unavailable(); reason != "" {
		return fmt.Errorf("cannot build namespaces here: %s", reason)
	}
	if _, err := os.Stat(d.natgw); err != nil {
		return fmt.Errorf("natgw binary: %w (run `make natgw`)", err)
	}
	if swept, err := netlab.SweepStale(time.Minute); err == nil && len(swept) > 0 {
		fmt.Fprintf(d.out, "(removed %d namespaces left by killed runs)\n", len(swept))
	}

	d.section("topology")
	var err error
	if d.lab, err = netlab.New(ctx); err != nil {
		return err
	}
	if d.gw, err = d.lab.Gateway(netlab.GatewayOptions{VMs: 2}); err != nil {
		return err
	}
	fmt.Fprintf(d.out, "  ext %s ── net1 %s [gw] eth0 %s ── bridge ── vm1 %s, vm2 %s\n",
		netlab.ExtAddr, netlab.GWExtAddr, netlab.GWVPCAddr, vm1, vm2)
	d.ok("namespaces: %s", strings.Join(d.lab.Namespaces(), " "))

	d.section("agent")
	if err := d.startAgent(); err != nil {
		return err
	}
	info, err := d.client.Info(ctx)
	if err != nil {
		return fmt.Errorf("info: %w", err)
	}
	d.ok("natgw serve runs in %s: version %s, data plane %s, boot id %s", d.gw.GW, info.Version, info.Dataplane, info.BootID)

	d.section("apply through the protocol (one transaction)")
	objs := objects()
	t0 := time.Now()
	if err := d.client.Apply(ctx, objs...); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	for _, o := range objs {
		fmt.Fprintf(d.out, "    %s\n", o)
	}
	d.ok("applied %d objects in %v", len(objs), time.Since(t0).Round(time.Millisecond))
	got, err := d.client.List(ctx, true)
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	if len(got) != len(objs) {
		return fmt.Errorf("agent lists %d objects after apply, want %d", len(got), len(objs))
	}
	d.ok("the agent re-read the kernel and lists the same %d objects", len(got))

	d.section("real TCP through the gateway")
	if err := d.servers(ctx); err != nil {
		return err
	}
	if err := d.expectReach(ctx, d.gw.Ext.NS, netip.AddrPortFrom(fipEIP, 80), "vm1", netip.AddrPortFrom(vm1, 80), netlab.ExtAddr); err != nil {
		return fmt.Errorf("FIP inbound: %w", err)
	}
	d.ok("FIP inbound: ext → %s:80 reached vm1 %s:80, which saw the client %s", fipEIP, vm1, netlab.ExtAddr)
	if err := d.expectReach(ctx, d.gw.Ext.NS, netip.AddrPortFrom(dnatEIP, 8080), "vm2", netip.AddrPortFrom(vm2, 80), netlab.ExtAddr); err != nil {
		return fmt.Errorf("DNAT: %w", err)
	}
	d.ok("DNAT: ext → %s:8080 reached vm2 %s:80, which saw the client %s", dnatEIP, vm2, netlab.ExtAddr)
	extSrv := netip.AddrPortFrom(netlab.ExtAddr, 9000)
	if err := d.expectReach(ctx, d.gw.VMs[0].NS, extSrv, "ext", extSrv, fipEIP); err != nil {
		return fmt.Errorf("FIP outbound: %w", err)
	}
	d.ok("FIP outbound: vm1 → ext %s: ext saw the client %s (vm1's EIP)", extSrv, fipEIP)
	if err := d.expectReach(ctx, d.gw.VMs[1].NS, extSrv, "ext", extSrv, snatEIP); err != nil {
		return fmt.Errorf("SNAT: %w", err)
	}
	d.ok("SNAT: vm2 → ext %s: ext saw the client %s (the SNAT EIP)", extSrv, snatEIP)
	held, _, err := netlab.Connect(ctx, d.gw.Ext.NS, netip.AddrPortFrom(fipEIP, 80).String(), netlab.DialTimeout)
	if err != nil {
		return fmt.Errorf("open a lasting connection through the FIP: %w", err)
	}
	defer held.Close()
	if err := echo(held, "before"); err != nil {
		return fmt.Errorf("lasting connection through the FIP: %w", err)
	}
	d.ok("a lasting connection ext → %s:80 → vm1 is open and echoes", fipEIP)

	d.section("state on the gateway")
	list, err := exec.CommandContext(ctx, d.natgw, "--netns", d.gw.GW, "--dataplane", string(d.dataplane), "list").CombinedOutput()
	if err != nil {
		return fmt.Errorf("natgw list: %w\n%s", err, list)
	}
	fmt.Fprintf(d.out, "  $ natgw --netns %s list\n%s", d.gw.GW, indent(string(list)))
	table, err := d.filterState(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "  $ %s\n%s", d.filterCommand(), indent(table))

	d.section("delete everything through the protocol")
	uids := nat.UIDs(objs)
	natted, err := d.eipFlows(ctx)
	if err != nil {
		return err
	}
	if natted = translated(natted); len(natted) == 0 {
		return errors.New("conntrack shows no NATed flow through the EIPs before delete (the lasting connection should be one)")
	}
	t0 = time.Now()
	if err := d.client.Delete(ctx, uids...); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	d.ok("deleted %d objects by UID in %v", len(uids), time.Since(t0).Round(time.Millisecond))
	if got, err := d.client.List(ctx, true); err != nil || len(got) != 0 {
		return fmt.Errorf("after delete the agent lists %v (%v), want nothing", got, err)
	}
	d.ok("the agent re-read the kernel: no objects")
	// Every flow NATed through the EIPs is gone. (A packet still in
	// flight, such as the lasting connection's delayed ACK, may already
	// have made a new, untranslated entry: the rules are gone.)
	if flows, err := d.eipFlows(ctx); err != nil {
		return err
	} else if left := translated(flows); len(left) > 0 {
		return fmt.Errorf("conntrack still has NATed flows of the EIPs: %v", left)
	}
	d.ok("conntrack holds no NATed flow of the EIPs any more (%d before the delete)", len(natted))
	if err := echo(held, "after"); err == nil {
		return errors.New("the lasting connection through the deleted FIP still works")
	}
	d.ok("the lasting connection through the FIP is cut (its conntrack entry went with the FIP)")
	for _, p := range []struct {
		ns, what string
		to       netip.AddrPort
	}{
		{d.gw.Ext.NS, "ext → FIP " + fipEIP.String() + ":80", netip.AddrPortFrom(fipEIP, 80)},
		{d.gw.Ext.NS, "ext → DNAT " + dnatEIP.String() + ":8080", netip.AddrPortFrom(dnatEIP, 8080)},
		{d.gw.VMs[0].NS, "vm1 → ext", extSrv},
		{d.gw.VMs[1].NS, "vm2 → ext", extSrv},
	} {
		if r, err := netlab.Dial(ctx, p.ns, p.to.String(), netlab.FailTimeout*3); err == nil {
			return fmt.Errorf("%s still connects after delete (server saw %s)", p.what, r.Client)
		}
	}
	d.ok("new connections fail: ext → both EIPs, vm1 and vm2 → ext")
	if err := d.expectClean(ctx); err != nil {
		return err
	}
	return nil
}

// eipFlows returns the gateway's conntrack entries that involve an EIP.
func (d *demo) eipFlows(ctx context.Context) ([]netlab.Flow, error) {
	flows, err := netlab.ConntrackEntries(ctx, d.gw.GW)
	if err != nil {
		return nil, err
	}
	var out []netlab.Flow
	for _, a := range []netip.Addr{fipEIP, dnatEIP, snatEIP} {
		out = append(out, netlab.FlowsWith(flows, a)...)
	}
	return out, nil
}

// translated keeps the NATed flows.
func translated(flows []netlab.Flow) []netlab.Flow {
	var out []netlab.Flow
	for _, f := range flows {
		if f.Translated() {
			out = append(out, f)
		}
	}
	return out
}

// startAgent starts `natgw serve` in the gateway namespace with a Client on
// its pipes.
func (d *demo) startAgent() error {
	cmd := exec.Command(d.natgw, "--netns", d.gw.GW, "--dataplane", string(d.dataplane), "serve")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	d.agentLog = &syncbuf.Buffer{}
	cmd.Stderr = d.agentLog
	// Its own process group: Ctrl-C reaches the demo, which ends the agent
	// by closing its stdin.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start natgw serve: %w", err)
	}
	d.agent, d.agentDone = cmd, make(chan error, 1)
	go func() { d.agentDone <- cmd.Wait() }()
	d.client = agentapi.NewClient(stdout, stdin)
	return nil
}

// servers starts the probe servers: web on vm1:80 and vm2:80, one on ext:9000.
func (d *demo) servers(ctx context.Context) error {
	for _, s := range []struct{ ns, addr string }{
		{d.gw.VMs[0].NS, netip.AddrPortFrom(vm1, 80).String()},
		{d.gw.VMs[1].NS, netip.AddrPortFrom(vm2, 80).String()},
		{d.gw.Ext.NS, netip.AddrPortFrom(netlab.ExtAddr, 9000).String()},
	} {
		if _, err := d.lab.ServeTCP(ctx, s.ns, s.addr); err != nil {
			return err
		}
	}
	return nil
}

// expectReach connects from ns to to and checks which server answered
// (host, listening on at) and which client address it saw.
func (d *demo) expectReach(ctx context.Context, ns string, to netip.AddrPort, host string, at netip.AddrPort, client netip.Addr) error {
	r, err := netlab.Dial(ctx, ns, to.String(), netlab.DialTimeout)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", to, err)
	}
	if !strings.HasSuffix(r.Server, "/"+at.String()) || !strings.HasSuffix(r.Server, "-"+host+"/"+at.String()) {
		return fmt.Errorf("connect to %s: answered by %s, want %s at %s", to, r.Server, host, at)
	}
	if r.Client.Addr() != client {
		return fmt.Errorf("connect to %s: the server saw client %s, want %s", to, r.Client, client)
	}
	return nil
}

// echo sends a line on a probe connection and expects it back within a second.
func echo(c net.Conn, word string) error {
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := fmt.Fprintf(c, "%s\n", word); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(line) != word {
		return fmt.Errorf("echo %q, want %q", line, word)
	}
	return nil
}

func (d *demo) filterCommand() string {
	if d.dataplane == nat.DataplaneIptables {
		return "iptables-legacy-save -t nat"
	}
	return "nft list table inet natgw"
}

func (d *demo) filterState(ctx context.Context) (string, error) {
	if d.dataplane == nat.DataplaneIptables {
		return netlab.Exec(ctx, d.gw.GW, "", "iptables-legacy-save", "-t", "nat")
	}
	return netlab.NftTable(ctx, d.gw.GW, "inet", string(nftconn.MainTable))
}

// expectClean checks that nothing of the demo's objects is left: not in the
// packet filter, not on net1, not in the routes, not in conntrack.
func (d *demo) expectClean(ctx context.Context) error {
	state, err := d.filterState(ctx)
	if err != nil {
		return err
	}
	for _, o := range objects() {
		if strings.Contains(state, o.UID) {
			return fmt.Errorf("%s still holds %s:\n%s", d.filterCommand(), o.UID, state)
		}
	}
	for _, a := range []netip.Addr{fipEIP, dnatEIP, snatEIP} {
		if strings.Contains(state, a.String()) {
			return fmt.Errorf("%s still mentions %s:\n%s", d.filterCommand(), a, state)
		}
	}
	d.ok("%s holds no object, no EIP (natgw's empty skeleton stays)", d.filterCommand())
	addrs, err := netlab.Addrs(d.gw.GW, d.gw.ExternalInterface)
	if err != nil {
		return err
	}
	for _, p := range addrs {
		if p.Addr() != netlab.GWExtAddr {
			return fmt.Errorf("net1 still has %s", p)
		}
	}
	routes, err := netlab.Routes(d.gw.GW)
	if err != nil {
		return err
	}
	for _, r := range routes {
		if strings.HasPrefix(r.String(), "0.0.0.0/0") {
			return fmt.Errorf("the default route is still there: %s", r)
		}
	}
	d.ok("net1 holds only the gateway's own address, the default route is gone")
	return nil
}

// cleanup stops the agent (EOF: a clean shutdown) and removes the namespaces.
func (d *demo) cleanup() error {
	var errs []error
	if d.client != nil {
		d.section("cleanup")
		d.client.Close()
		select {
		case err := <-d.agentDone:
			if err != nil {
				errs = append(errs, fmt.Errorf("natgw serve exit: %w", err))
			} else {
				d.ok("natgw serve exited cleanly on EOF")
			}
		case <-time.After(10 * time.Second):
			d.agent.Process.Kill()
			<-d.agentDone
			errs = append(errs, errors.New("natgw serve did not exit on EOF: killed"))
		}
	}
	if d.lab != nil {
		names := d.lab.Namespaces()
		if err := d.lab.Close(); err != nil {
			errs = append(errs, err)
		} else {
			left := 0
			for _, n := range names {
				if _, err := os.Stat("/run/netns/" + n); err == nil {
					left++
				}
			}
			if left > 0 {
				errs = append(errs, fmt.Errorf("%d namespaces left behind", left))
			} else {
				d.ok("removed %d namespaces", len(names))
			}
		}
	}
	return errors.Join(errs...)
}

func indent(s string) string {
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString("    " + l + "\n")
	}
	return b.String()
}
