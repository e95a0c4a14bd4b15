package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/natgw/natgw/controller/crdtest"
	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/planes"
)

// TestLeaderHandover: two natgw-controller replicas with leader election
// on upstream's CRDs; the leader is stopped cleanly (SIGTERM) and gives its
// lease back, so the other one programs a new FIP at once instead of
// waiting for the lease to expire (15 s). The figure is the time from the
// leader's exit to the new FIP being Ready and forwarding TCP.
func TestLeaderHandover(t *testing.T) {
	const dp = "nftables"
	s := fw.New(t, fw.Options{Dataplane: dp, NoController: true, CRDs: crdtest.Upstream,
		Controller: fw.ControllerOptions{LeaderElect: true}})
	g := s.Order[0]
	opts := fw.ControllerOptions{Dataplane: dp, LeaderElect: true}
	ctrls := []*fw.Controller{
		fw.StartController(t, s.Bin, s.API, s.GatewayConfigs(), opts),
		fw.StartController(t, s.Bin, s.API, s.GatewayConfigs(), opts),
	}
	eip1 := fw.EIP("eip1", g.Name, netlab.EIP(40))
	fip1 := fw.FIP("fip1", "eip1", netlab.VMAddr(0))
	s.Create(eip1)
	s.Create(fip1)
	s.WaitReady(eip1, fip1)

	leader, follower := -1, -1
	for i, c := range ctrls {
		if acquired(c) {
			leader, follower = i, 1-i
		}
	}
	if leader < 0 {
		t.Fatal("no controller logged acquiring the lease")
	}
	if acquired(ctrls[follower]) {
		t.Fatal("both controllers hold the lease")
	}
	stopAt := time.Now()
	if err := ctrls[leader].Stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(stopAt)
	exitAt := time.Now()
	eip2 := fw.EIP("eip2", g.Name, netlab.EIP(41))
	fip2 := fw.FIP("fip2", "eip2", netlab.VMAddr(1))
	s.Create(eip2)
	s.Create(fip2)
	s.WaitReady(eip2, fip2)
	readyIn := time.Since(exitAt)
	pathIn := readyIn + s.CheckPaths(10*time.Second, g.ExtTo(fw.TCP, netlab.EIP(41), fw.VMPort, 1))
	if !acquired(ctrls[follower]) {
		t.Error("the follower did not log acquiring the lease")
	}
	// The lease lasts 15 s: a hand-over that waited for it to expire
	// would take longer than this.
	if readyIn > 10*time.Second {
		t.Errorf("hand-over took %v: the lease was not released", readyIn)
	}
	fw.Summary(t, "leader-handover", dp, "crds", crdtest.Upstream, "leader_stop_took", stopped,
		"handover_fip_ready_in", readyIn, "handover_tcp_ok_in", pathIn)
}

// acquired reports whether c logged acquiring the leader lease.
func acquired(c *fw.Controller) bool {
	return strings.Contains(strings.ToLower(c.Log()), "successfully acquired lease")
}

// TestDataplaneSwitchKilled: a gateway programmed on one data plane, the
// controller killed (SIGKILL, agents included) and started again with the
// other --dataplane, with a FIP deleted in between; once more killed right
// after the new agents started and started again. On upstream's CRDs,
// whose VpcNatGateway status has no field to record a data plane in, and
// without a VpcNatGateway object. Afterwards the old data plane holds no
// natgw state, the live FIP forwards TCP and the deleted FIP's EIP reaches
// nothing.
func TestDataplaneSwitchKilled(t *testing.T) {
	for _, pair := range [][2]string{{"nftables", "iptables"}, {"iptables", "nftables"}} {
		from, to := pair[0], pair[1]
		t.Run(from+"-to-"+to, func(t *testing.T) {
			s := fw.New(t, fw.Options{Dataplane: from, CRDs: crdtest.Upstream, NoGatewayObjects: true})
			g := s.Order[0]
			live, gone := netlab.EIP(50), netlab.EIP(51)
			eipA, fipA := fw.EIP("eip-a", g.Name, live), fw.FIP("fip-a", "eip-a", netlab.VMAddr(0))
			eipB, fipB := fw.EIP("eip-b", g.Name, gone), fw.FIP("fip-b", "eip-b", netlab.VMAddr(1))
			for _, o := range []client.Object{eipA, fipA, eipB, fipB} {
				s.Create(o)
			}
			s.WaitReady(eipA, fipA, eipB, fipB)
			s.CheckPaths(10*time.Second, g.ExtTo(fw.TCP, gone, fw.VMPort, 1))

			s.Ctrl.Kill()
			s.Delete(fipB)
			s.Delete(eipB)
			s.Ctrl.SetDataplane(to)
			if err := s.Ctrl.Start(); err != nil {
				t.Fatal(err)
			}
			// Killed again as soon as an agent of the new data plane runs.
			fw.Eventually(t, s.Ctx, 30*time.Second, "an agent of the new data plane", func() error {
				pids, err := s.Ctrl.AgentPIDs(g.GW)
				if err != nil || len(pids) == 0 {
					return fmt.Errorf("no agent yet (%v)", err)
				}
				return nil
			})
			if err := s.Ctrl.Restart(); err != nil {
				t.Fatal(err)
			}
			took := s.WaitGone(time.Minute, fipB, eipB)
			s.WaitReady(fipA)
			pathIn := s.CheckPaths(30*time.Second, g.ExtTo(fw.TCP, live, fw.VMPort, 0))
			held, err := planes.Holds(s.Ctx, nat.DataplaneName(from), g.Config())
			if err != nil {
				t.Fatal(err)
			}
			if held {
				t.Errorf("%s still holds natgw state after the switch to %s", from, to)
			}
			s.CheckPaths(10*time.Second, g.ExtTo(fw.TCP, gone, fw.VMPort, -1))
			k, err := fw.ReadKernel(s.Ctx, g, to)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range k.Addrs {
				if p.Addr() == gone {
					t.Errorf("the deleted EIP's address %s is still on %s", p, g.ExternalInterface)
				}
			}
			warnings := checkUnknownFields(t, s)
			fw.Summary(t, "dataplane-switch-killed", to, "from", from, "crds", crdtest.Upstream,
				"deleted_gone_in", took, "live_tcp_ok_in", pathIn, "old_plane_holds", held, "unknown_field_warnings", warnings)
		})
	}
}
