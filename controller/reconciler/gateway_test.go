package reconciler

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// TestOrphanSweep: an object on the gateway whose owner does not exist is
// removed by the periodic sweep; one whose owner exists (but is invisible
// to the controller's cache) stays.
func TestOrphanSweep(t *testing.T) {
	e := newEnv(t, envOptions{sweepPeriod: 300 * time.Millisecond})
	eip := e.eip("eip", netlab.EIP(7))
	e.create(eip)
	e.waitReady(eip)

	// A FIP that exists in the API but lacks the test label: the cache
	// does not see it, a live read does.
	hidden := &v1.IptablesFIPRule{ObjectMeta: e.meta("hidden"), Spec: v1.IptablesFIPRuleSpec{EIP: eip.Name, InternalIP: "10.7.0.2"}}
	hidden.Labels = nil
	e.create(hidden)
	t.Cleanup(func() { _ = e.c.Delete(e.ctx, hidden) })

	orphan := nat.Object{UID: string(uuid.NewUUID()), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netlab.EIP(7), InternalIP: netip.MustParseAddr("10.7.0.1")}}
	orphanDNAT := nat.Object{UID: string(uuid.NewUUID()), Kind: nat.KindDNAT, DNAT: &nat.DNAT{EIP: netlab.EIP(8), Protocol: nat.UDP, ExternalPort: 53, InternalIP: netip.MustParseAddr("10.7.0.3"), InternalPort: 53}}
	kept := nat.Object{UID: string(hidden.UID), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netlab.EIP(12), InternalIP: netip.MustParseAddr("10.7.0.2")}}
	before := counterValue(metrics.SweepDeletions.WithLabelValues(e.gwName))
	e.natgwCLI(e.dataplane, "apply", orphan, orphanDNAT, kept)
	t.Logf("kernel after the out-of-band apply: %v", e.kernelObjects(e.dataplane))

	e.eventually(30*time.Second, "orphans swept", func() error {
		objs := e.kernelObjects(e.dataplane)
		for _, o := range []nat.Object{orphan, orphanDNAT} {
			if _, ok := hasUID(objs, typesUID(o.UID)); ok {
				return fmt.Errorf("orphan %s still on the gateway", o)
			}
		}
		return nil
	})
	if _, ok := hasUID(e.kernelObjects(e.dataplane), hidden.UID); !ok {
		t.Errorf("object %s whose owner exists was swept", kept)
	}
	if got := counterValue(metrics.SweepDeletions.WithLabelValues(e.gwName)) - before; got < 2 {
		t.Errorf("sweep deletions metric grew by %v, want ≥2", got)
	}
	if _, ok := hasUID(e.kernelObjects(e.dataplane), eip.UID); !ok {
		t.Errorf("the EIP was swept")
	}
}

// natgwCLI applies objects on the gateway behind the controller's back.
func (e *env) natgwCLI(dataplane, op string, objs ...nat.Object) {
	e.t.Helper()
	j, err := jsonMarshal(objs)
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(natgwBin, "--netns", e.gw.GW, "--dataplane", dataplane, op, "-f", "-")
	cmd.Stdin = strings.NewReader(string(j))
	if out, err := cmd.CombinedOutput(); err != nil {
		e.t.Fatalf("natgw %s: %v\n%s", op, err, out)
	}
}

// TestResyncOnNewBootID: the gateway loses its kernel state and its agent
// restarts (new boot id): the manager reconnects and syncs the desired set
// in one transaction.
func TestResyncOnNewBootID(t *testing.T) {
	e := newEnv(t, envOptions{})
	eip := e.eip("eip", netlab.EIP(9))
	e.create(eip)
	f := e.fip("fip", "eip", e.gw.VMs[0].Addr)
	e.create(f)
	e.waitReady(f)
	resyncs := counterValue(metrics.Resyncs.WithLabelValues(e.gwName, "bootid"))
	reconnects := counterValue(metrics.Reconnects.WithLabelValues(e.gwName))
	opened := e.tr.opened()

	if out, err := exec.Command("ip", "netns", "exec", e.gw.GW, "nft", "delete", "table", "ip", "natgw").CombinedOutput(); err != nil {
		t.Fatalf("nft delete table: %v\n%s", err, out)
	}
	e.tr.breakAll()
	e.eventually(30*time.Second, "FIP back in the kernel", func() error {
		if _, ok := hasUID(e.kernelObjects(e.dataplane), f.UID); !ok {
			return fmt.Errorf("FIP %s not in the kernel", f.UID)
		}
		return nil
	})
	if e.tr.opened() <= opened {
		t.Errorf("no new session opened")
	}
	if got := counterValue(metrics.Resyncs.WithLabelValues(e.gwName, "bootid")) - resyncs; got != 1 {
		t.Errorf("bootid resyncs grew by %v, want 1", got)
	}
	if got := counterValue(metrics.Reconnects.WithLabelValues(e.gwName)) - reconnects; got < 1 {
		t.Errorf("reconnects grew by %v, want ≥1", got)
	}
	if _, err := e.probe(e.gw.VMs[0], netlab.EIP(9)); err != nil {
		t.Errorf("packet after resync: %v", err)
	}
}

// TestDriftRepair: the kernel loses a rule behind the running agent's back;
// the periodic fresh list finds the difference and one sync repairs it.
func TestDriftRepair(t *testing.T) {
	e := newEnv(t, envOptions{driftPeriod: 500 * time.Millisecond})
	eip := e.eip("eip", netlab.EIP(10))
	e.create(eip)
	f := e.fip("fip", "eip", e.gw.VMs[0].Addr)
	e.create(f)
	e.waitReady(f)
	drift := counterValue(metrics.Resyncs.WithLabelValues(e.gwName, "drift"))
	// Another agent removes the FIP (as if someone flushed it).
	cmd := exec.Command(natgwBin, "--netns", e.gw.GW, "--dataplane", e.dataplane, "delete", string(f.UID))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("natgw delete: %v\n%s", err, out)
	}
	if _, ok := hasUID(e.kernelObjects(e.dataplane), f.UID); ok {
		t.Fatal("the FIP is still in the kernel after an out-of-band delete")
	}
	e.eventually(30*time.Second, "FIP repaired", func() error {
		if _, ok := hasUID(e.kernelObjects(e.dataplane), f.UID); !ok {
			return fmt.Errorf("FIP %s not in the kernel", f.UID)
		}
		return nil
	})
	if got := counterValue(metrics.Resyncs.WithLabelValues(e.gwName, "drift")) - drift; got < 1 {
		t.Errorf("drift resyncs grew by %v, want ≥1", got)
	}
}

// TestDataplaneSwitch: annotating the VpcNatGateway moves its rules from
// nftables to iptables (synced on the new agent, cleaned from the old), and
// back; traffic flows after each switch.
func TestDataplaneSwitch(t *testing.T) {
	e := newEnv(t, envOptions{dataplane: transport.DataplaneNftables})
	g := e.gatewayObj()
	e.create(g)
	eip := e.eip("eip", netlab.EIP(11))
	e.create(eip)
	f := e.fip("fip", "eip", e.gw.VMs[0].Addr)
	e.create(f)
	e.waitReady(f)

	for _, to := range []string{transport.DataplaneIptables, transport.DataplaneNftables} {
		from := map[string]string{transport.DataplaneIptables: transport.DataplaneNftables, transport.DataplaneNftables: transport.DataplaneIptables}[to]
		e.update(g, func() {
			if g.Annotations == nil {
				g.Annotations = map[string]string{}
			}
			g.Annotations[DataplaneAnnotation] = to
		})
		e.eventually(30*time.Second, "rules on "+to, func() error {
			gw, err := e.reg.Get(e.gwName)
			if err != nil {
				return err
			}
			if dp := gw.Dataplane(); dp != to {
				return fmt.Errorf("manager runs %q", dp)
			}
			if _, ok := hasUID(e.kernelObjects(to), f.UID); !ok {
				return fmt.Errorf("FIP not on %s", to)
			}
			return nil
		})
		if objs := e.kernelObjects(from); len(objs) != 0 {
			t.Errorf("%d objects left on %s after switching to %s: %v", len(objs), from, to, objs)
		}
		e.eventually(10*time.Second, "data plane recorded", func() error {
			if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(g), g); err != nil {
				return err
			}
			if g.Status.Dataplane != to {
				return fmt.Errorf("status.dataplane %q", g.Status.Dataplane)
			}
			return nil
		})
		if _, err := e.probe(e.gw.VMs[0], netlab.EIP(11)); err != nil {
			t.Errorf("packet after switching to %s: %v", to, err)
		}
	}
}

// TestDataplaneChangedWhileAway: the gateway's status says it was last
// programmed with iptables, and its iptables chains still hold an EIP and a
// FIP (the annotation changed, or the controller's --dataplane, while no
// controller ran): the controller that starts on nftables empties iptables
// first, programs nftables, records nftables, and traffic flows.
func TestDataplaneChangedWhileAway(t *testing.T) {
	o := envOptions{dataplane: transport.DataplaneNftables, noManager: true}
	e := newEnv(t, o)
	g := e.gatewayObj()
	e.create(g)
	g.Status.Dataplane = transport.DataplaneIptables
	if err := e.c.Status().Update(e.ctx, g); err != nil {
		t.Fatal(err)
	}
	eip := e.eip("eip", netlab.EIP(12))
	e.create(eip)
	f := e.fip("fip", "eip", e.gw.VMs[0].Addr)
	e.create(f)
	// What the iptables agent programmed before: the same EIP and FIP
	// (their UIDs) and a FIP whose object is gone.
	left := []nat.Object{
		{UID: string(eip.UID), Kind: nat.KindEIP, EIP: &nat.EIP{Address: netlab.EIP(12), PrefixLen: 24}},
		{UID: string(f.UID), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netlab.EIP(12), InternalIP: e.gw.VMs[1].Addr}},
	}
	e.natgwCLI(transport.DataplaneIptables, "apply", left...)
	if n := len(e.kernelObjects(transport.DataplaneIptables)); n != len(left) {
		t.Fatalf("iptables holds %d objects before the controller starts, want %d", n, len(left))
	}

	e.startManager(apiServer(t), o)
	e.waitReady(f)
	if objs := e.kernelObjects(transport.DataplaneIptables); len(objs) != 0 {
		t.Errorf("iptables still holds %v", objs)
	}
	if _, ok := hasUID(e.kernelObjects(transport.DataplaneNftables), f.UID); !ok {
		t.Error("FIP not on nftables")
	}
	e.eventually(10*time.Second, "nftables recorded", func() error {
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(g), g); err != nil {
			return err
		}
		if g.Status.Dataplane != transport.DataplaneNftables {
			return fmt.Errorf("status.dataplane %q", g.Status.Dataplane)
		}
		return nil
	})
	if _, err := e.probe(e.gw.VMs[0], netlab.EIP(12)); err != nil {
		t.Errorf("packet through nftables: %v", err)
	}
}

// counterValue reads a counter.
func counterValue(c prometheus.Counter) float64 {
	m := &dto.Metric{}
	if err := c.Write(m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}
