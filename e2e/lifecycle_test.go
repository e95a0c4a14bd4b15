package e2e

import (
	"fmt"
	"net/netip"
	"time"

	"testing"

	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/netlab"
)

// lifecycleObjects are scenario 1's objects on gateway g: three EIPs, a
// FIP (EIP 0 → vm1), port DNATs (EIP 1 tcp/80 and udp/53 → vm2:8080) and a
// CIDR SNAT (EIP 2, the whole VPC).
type lifecycleObjects struct {
	eips                 []*v1.IptablesEIP
	fip                  *v1.IptablesFIPRule
	dnatTCP, dnatUDP     *v1.IptablesDnatRule
	snat                 *v1.IptablesSnatRule
	eFIP, eDNAT, eSNAT   netip.Addr
	fipVM, dnatVM, snVMs int
	family               fw.Family
}

func newLifecycleObjects(gw string, f fw.Family) *lifecycleObjects {
	o := &lifecycleObjects{eFIP: f.EIP(0), eDNAT: f.EIP(1), eSNAT: f.EIP(2), fipVM: 0, dnatVM: 1, family: f}
	o.eips = []*v1.IptablesEIP{fw.EIP("e-fip", gw, o.eFIP), fw.EIP("e-dnat", gw, o.eDNAT), fw.EIP("e-snat", gw, o.eSNAT)}
	o.fip = fw.FIP("fip1", "e-fip", f.VMAddr(o.fipVM))
	o.dnatTCP = fw.DNAT("dnat-tcp", "e-dnat", "tcp", 80, f.VMAddr(o.dnatVM), fw.VMPort)
	o.dnatUDP = fw.DNAT("dnat-udp", "e-dnat", "udp", 53, f.VMAddr(o.dnatVM), fw.VMPort)
	o.snat = fw.SNAT("snat-vpc", "e-snat", f.VPCNet().String())
	return o
}

func (o *lifecycleObjects) all() []client.Object {
	return []client.Object{o.eips[0], o.eips[1], o.eips[2], o.fip, o.dnatTCP, o.dnatUDP, o.snat}
}

// paths are the probes that must pass while the objects are programmed:
// both directions of every rule, and what must not answer.
func (o *lifecycleObjects) paths(g *fw.Topology) []fw.Path {
	return []fw.Path{
		g.ExtTo(fw.TCP, o.eFIP, fw.VMPort, o.fipVM), // FIP inbound
		g.ExtTo(fw.UDP, o.eFIP, fw.VMPort, o.fipVM),
		g.VMOut(fw.TCP, o.fipVM, o.eFIP), // FIP outbound: source is the EIP
		g.VMOut(fw.UDP, o.fipVM, o.eFIP),
		g.ExtTo(fw.TCP, o.eDNAT, 80, o.dnatVM), // port DNAT
		g.ExtTo(fw.UDP, o.eDNAT, 53, o.dnatVM),
		g.ExtTo(fw.TCP, o.eDNAT, fw.VMPort, -1), // only the DNATed ports
		g.VMOut(fw.TCP, o.dnatVM, o.eSNAT),      // CIDR SNAT (no FIP on vm2)
		g.VMOut(fw.UDP, 2, o.eSNAT),
		g.ExtTo(fw.TCP, o.eSNAT, fw.VMPort, -1), // an SNAT EIP takes no inbound connections
	}
}

// noPaths are the probes that must fail once everything is deleted.
func (o *lifecycleObjects) noPaths(g *fw.Topology) []fw.Path {
	return []fw.Path{
		g.ExtTo(fw.TCP, o.eFIP, fw.VMPort, -1),
		g.ExtTo(fw.UDP, o.eDNAT, 53, -1),
		g.VMOutIn(o.family, fw.TCP, 0, netip.Addr{}),
		g.VMOutIn(o.family, fw.UDP, 2, netip.Addr{}),
	}
}

// checkProgrammed asserts that every object's UID has entries in the
// gateway's kernel state and that its EIPs are on the external interface.
func checkProgrammed(t *testing.T, s *fw.Stack, g *fw.Topology, objs []client.Object) fw.Kernel {
	t.Helper()
	k, err := fw.ReadKernel(s.Ctx, g, s.Dataplane)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if len(k.Entries[string(o.GetUID())]) == 0 {
			t.Errorf("%T %s (uid %s): no entry in the kernel:\n%s", o, o.GetName(), o.GetUID(), k.Dump)
		}
	}
	return k
}

// checkEmpty asserts that gateway g holds nothing of natgw's: no tagged
// entry, no EIP address, the empty nft layout, no conntrack flow of the
// EIPs.
func checkEmpty(t *testing.T, s *fw.Stack, g *fw.Topology, eips []netip.Addr) int {
	t.Helper()
	k, err := fw.ReadKernel(s.Ctx, g, s.Dataplane)
	if err != nil {
		t.Fatal(err)
	}
	if k.Count() > 0 {
		t.Errorf("%d entries left on %s: %v", k.Count(), g.Name, k.Entries)
	}
	if a := k.EIPAddrs(); len(a) > 0 {
		t.Errorf("EIP addresses left on %s: %v", g.Name, a)
	}
	if s.Dataplane == "nftables" {
		if err := fw.EmptyNftTable(k.Dump); err != nil {
			t.Error(err)
		}
	}
	flows, err := netlab.ConntrackEntries(s.Ctx, g.GW)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range eips {
		if f := netlab.FlowsWith(flows, e); len(f) > 0 {
			t.Errorf("conntrack flows of deleted EIP %s left: %v", e, f)
		}
	}
	return k.Count() + len(k.EIPAddrs())
}

// TestLifecycle is scenario 1: EIP, FIP, DNAT and SNAT through CRs, real
// connections both ways, a FIP moved to another host under continuous
// probing, and deleting everything restores the empty table; on each data
// plane with IPv4 objects, and with IPv6 ones on a dual-stack topology.
func TestLifecycle(t *testing.T) {
	forEachRun(t, fw.Options{}, lifecycle)
}

// forEachRun runs a scenario on a Stack made from o for each data plane
// with IPv4 objects, then on the nftables data plane with IPv6
// objects on a dual-stack topology (subtest "nftables-ipv6"; the
// iptables-legacy data plane refuses IPv6). label names the run in
// summaries: the data plane, with "/ipv6" for the IPv6 run.
func forEachRun(t *testing.T, o fw.Options, fn func(t *testing.T, s *fw.Stack, f fw.Family, label string)) {
	fw.ForEachDataplane(t, func(t *testing.T, dp string) {
		o := o
		o.Dataplane = dp
		fn(t, fw.New(t, o), fw.IPv4, dp)
	})
	t.Run("nftables-ipv6", func(t *testing.T) {
		o := o
		o.Dataplane, o.IPv6 = "nftables", true
		fn(t, fw.New(t, o), fw.IPv6, "nftables/ipv6")
	})
}

// lifecycle runs scenario 1 on s with objects of family f; dp names the
// run in its summary.
func lifecycle(t *testing.T, s *fw.Stack, f fw.Family, dp string) {
	g := s.Order[0]
	o := newLifecycleObjects(g.Name, f)
	start := time.Now()
	for _, obj := range o.all() {
		s.Create(obj)
	}
	gwObj := &v1.VpcNatGateway{}
	gwObj.Name = g.Name
	s.WaitReady(append(o.all(), gwObj)...)
	readyIn := time.Since(start)
	pathsIn := s.CheckPaths(30*time.Second, o.paths(g)...)
	k := checkProgrammed(t, s, g, append(o.all(), gwObj))
	entries := k.Count()

	// Move the FIP from vm1 to vm3 while new connections keep
	// arriving over TCP and UDP.
	const newVM = 2
	streams := []*fw.Stream{
		fw.StartStream(s.Ctx, g.ExtTo(fw.TCP, o.eFIP, fw.VMPort, o.fipVM), 2*time.Second),
		fw.StartStream(s.Ctx, g.ExtTo(fw.UDP, o.eFIP, fw.VMPort, o.fipVM), 2*time.Second),
	}
	fw.Eventually(t, s.Ctx, 20*time.Second, "probes before the move", func() error {
		for _, st := range streams {
			if n := len(st.Results()); n < 20 {
				return fmt.Errorf("%d probes so far", n)
			}
		}
		return nil
	})
	moveAt := time.Now()
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := s.Get(o.fip); err != nil {
			return err
		}
		o.fip.Spec.InternalIP = f.VMAddr(newVM).String()
		return s.Client.Update(s.Ctx, o.fip)
	}); err != nil {
		t.Fatalf("update FIP: %v", err)
	}
	s.WaitReady(o.fip)
	moveReady := time.Since(moveAt)
	readyAt := time.Now()
	fw.Eventually(t, s.Ctx, 30*time.Second, "probes after the move", func() error {
		for _, st := range streams {
			if n := st.CountSince(readyAt); n < 20 {
				return fmt.Errorf("%d probes since Ready", n)
			}
		}
		return nil
	})
	var sw [2]fw.Switch
	for i, st := range streams {
		sw[i] = fw.AnalyzeSwitch(st.Stop(), g.VMs[o.fipVM].NS, g.VMs[newVM].NS, readyAt)
		if err := sw[i].OK(); err != nil {
			t.Errorf("%s during the FIP move: %v", []string{"tcp", "udp"}[i], err)
		}
	}
	// Outbound from the new host carries the FIP's EIP; the old one
	// falls back to the VPC's CIDR SNAT.
	s.CheckPaths(10*time.Second, g.VMOut(fw.TCP, newVM, o.eFIP), g.VMOut(fw.TCP, o.fipVM, o.eSNAT))

	// Delete everything: the gateway is empty again.
	delIn := s.DeleteAll(60 * time.Second)
	left := checkEmpty(t, s, g, []netip.Addr{o.eFIP, o.eDNAT, o.eSNAT})
	s.CheckPaths(10*time.Second, o.noPaths(g)...)

	fw.Summary(t, "1-lifecycle", dp,
		"objects", len(o.all())+1, "kernel_entries", entries, "ready_in", readyIn, "paths_ok_in", pathsIn,
		"move_ready_in", moveReady,
		"move_tcp_probes", sw[0].Probes, "move_tcp_failed", sw[0].Failed, "move_tcp_inflight_cut", sw[0].Cut, "move_tcp_old_after_new", sw[0].Back,
		"move_tcp_switch_after", since(sw[0].FirstNew, moveAt),
		"move_udp_probes", sw[1].Probes, "move_udp_failed", sw[1].Failed, "move_udp_inflight_cut", sw[1].Cut, "move_udp_old_after_new", sw[1].Back, "move_udp_same_tuple_before_cleanup", sw[1].SameTuple,
		"delete_all_in", delIn, "left_after_delete", left)
}

func since(t, from time.Time) time.Duration {
	if t.IsZero() {
		return -1
	}
	return t.Sub(from)
}
