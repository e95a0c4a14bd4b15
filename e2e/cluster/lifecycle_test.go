package cluster_test

import (
	"net/netip"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testsummary"
)

// clusterSummary records one CLUSTER-SUMMARY line (internal/testsummary).
func clusterSummary(t *testing.T, scenario, dp string, kv ...any) {
	t.Helper()
	testsummary.Scenario(t, "CLUSTER-SUMMARY", scenario, dp, kv...)
}

// TestLifecycle: EIP, FIP, DNAT and SNAT objects on a gateway pod, through
// the deployed controller and the pod-exec transport; real connections from
// the external namespace through the pod's net1 to VPC hosts behind its
// eth0 and back out with the EIPs as source; deleting everything leaves
// nothing in the pod's namespace.
func TestLifecycle(t *testing.T) {
	fw.ForEachDataplane(t, func(t *testing.T, dp string) {
		s := newStack(t, dp)
		lab := netlab.ForTest(t)
		name := "c-" + dp[:3]
		t0 := time.Now()
		g := startGateway(t, s, lab, name, 3)
		podIn := time.Since(t0)
		gwObj := &v1.VpcNatGateway{}
		gwObj.Name = name
		s.WaitReady(gwObj)
		gwReady := time.Since(t0)

		eFIP, eDNAT, eSNAT := netlab.EIP(0), netlab.EIP(1), netlab.EIP(2)
		eips := []*v1.IptablesEIP{fw.EIP(name+"-fip", name, eFIP), fw.EIP(name+"-dnat", name, eDNAT), fw.EIP(name+"-snat", name, eSNAT)}
		fip := fw.FIP(name+"-fip", name+"-fip", g.VMs[0].Addr)
		dnatTCP := fw.DNAT(name+"-dnat-tcp", name+"-dnat", "tcp", 80, g.VMs[1].Addr, fw.VMPort)
		dnatUDP := fw.DNAT(name+"-dnat-udp", name+"-dnat", "udp", 53, g.VMs[1].Addr, fw.VMPort)
		vpc := netip.PrefixFrom(g.VMs[0].Addr, 24).Masked()
		snat := fw.SNAT(name+"-snat", name+"-snat", vpc.String())
		objs := []client.Object{eips[0], eips[1], eips[2], fip, dnatTCP, dnatUDP, snat}
		start := time.Now()
		for _, o := range objs {
			s.Create(o)
		}
		s.WaitReady(append(objs, gwObj)...)
		readyIn := time.Since(start)

		paths := []fw.Path{
			g.ExtTo(fw.TCP, eFIP, fw.VMPort, 0), // FIP inbound
			g.ExtTo(fw.UDP, eFIP, fw.VMPort, 0),
			g.VMOut(fw.TCP, 0, eFIP), // FIP outbound: source is the EIP
			g.VMOut(fw.UDP, 0, eFIP),
			g.ExtTo(fw.TCP, eDNAT, 80, 1), // port DNAT
			g.ExtTo(fw.UDP, eDNAT, 53, 1),
			g.ExtTo(fw.TCP, eDNAT, fw.VMPort, -1), // only the DNATed ports
			g.VMOut(fw.TCP, 1, eSNAT),             // CIDR SNAT
			g.VMOut(fw.UDP, 2, eSNAT),
			g.ExtTo(fw.TCP, eSNAT, fw.VMPort, -1), // an SNAT EIP takes no inbound connections
		}
		pathsIn := s.CheckPaths(30*time.Second, paths...)
		k, err := fw.ReadKernel(s.Ctx, g.Topology, dp)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs { // the VpcNatGateway has no routes: no entries of its own
			if len(k.Entries[string(o.GetUID())]) == 0 {
				t.Errorf("%T %s (uid %s): no entry in the pod's kernel state:\n%s", o, o.GetName(), o.GetUID(), k.Dump)
			}
		}
		entries := k.Count()

		delIn := s.DeleteAll(60 * time.Second)
		k, err = fw.ReadKernel(s.Ctx, g.Topology, dp)
		if err != nil {
			t.Fatal(err)
		}
		leaked := k.Count() + len(k.EIPAddrs())
		if leaked > 0 {
			t.Errorf("%d entries and EIP addresses %v left in the pod's namespace after delete:\n%s", k.Count(), k.EIPAddrs(), k.Dump)
		}
		if dp == "nftables" {
			if err := fw.EmptyNftTable(k.Dump); err != nil {
				t.Error(err)
			}
		}
		s.CheckPaths(10*time.Second,
			g.ExtTo(fw.TCP, eFIP, fw.VMPort, -1), g.ExtTo(fw.UDP, eDNAT, 53, -1),
			g.VMOut(fw.TCP, 0, netip.Addr{}), g.VMOut(fw.UDP, 2, netip.Addr{}))
		stuck, err := s.ObjectUIDs()
		if err != nil {
			t.Fatal(err)
		}
		clusterSummary(t, "lifecycle", dp, "pod", g.Pod.Name, "pod_running_in", podIn, "gateway_ready_in", gwReady,
			"objects", len(objs), "kernel_entries", entries, "rules_ready_in", readyIn, "paths_ok_in", pathsIn,
			"delete_all_in", delIn, "leaked_kernel_entries", leaked, "stuck_terminating", len(stuck))
	})
}
