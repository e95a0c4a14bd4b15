package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/planes"
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
	before := metrics.CounterValue(metrics.SweepDeletions.WithLabelValues(e.gwName))
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
	if got := metrics.CounterValue(metrics.SweepDeletions.WithLabelValues(e.gwName)) - before; got < 2 {
		t.Errorf("sweep deletions metric grew by %v, want ≥2", got)
	}
	if _, ok := hasUID(e.kernelObjects(e.dataplane), eip.UID); !ok {
		t.Errorf("the EIP was swept")
	}
}

// natgwCLI applies objects on the gateway behind the controller's back.
func (e *env) natgwCLI(dataplane nat.DataplaneName, op string, objs ...nat.Object) {
	e.t.Helper()
	j, err := jsonMarshal(objs)
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(natgwBin, "--netns", e.gw.GW, "--dataplane", string(dataplane), op, "-f", "-")
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
	f := e.readyFIP(netlab.EIP(9))
	resyncs := metrics.CounterValue(metrics.Resyncs.WithLabelValues(e.gwName, "bootid"))
	reconnects := metrics.CounterValue(metrics.Reconnects.WithLabelValues(e.gwName))
	opened := e.tr.opened()

	if out, err := exec.Command("ip", "netns", "exec", e.gw.GW, "nft", "delete", "table", "inet", "natgw").CombinedOutput(); err != nil {
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
	if got := metrics.CounterValue(metrics.Resyncs.WithLabelValues(e.gwName, "bootid")) - resyncs; got != 1 {
		t.Errorf("bootid resyncs grew by %v, want 1", got)
	}
	if got := metrics.CounterValue(metrics.Reconnects.WithLabelValues(e.gwName)) - reconnects; got < 1 {
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
	f := e.readyFIP(netlab.EIP(10))
	drift := metrics.CounterValue(metrics.Resyncs.WithLabelValues(e.gwName, "drift"))
	// Another agent removes the FIP (as if someone flushed it).
	cmd := exec.Command(natgwBin, "--netns", e.gw.GW, "--dataplane", string(e.dataplane), "delete", string(f.UID))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("natgw delete: %v\n%s", err, out)
	}
	// With a 500 ms drift period a loaded machine may repair the FIP
	// before this read (CI saw it): then a drift resync must be counted.
	if _, ok := hasUID(e.kernelObjects(e.dataplane), f.UID); ok {
		e.eventually(10*time.Second, "a drift resync counted for the FIP found in the kernel after its out-of-band delete", func() error {
			if metrics.CounterValue(metrics.Resyncs.WithLabelValues(e.gwName, "drift")) == drift {
				return errors.New("no drift resync")
			}
			return nil
		})
	}
	e.eventually(30*time.Second, "FIP repaired", func() error {
		if _, ok := hasUID(e.kernelObjects(e.dataplane), f.UID); !ok {
			return fmt.Errorf("FIP %s not in the kernel", f.UID)
		}
		return nil
	})
	if got := metrics.CounterValue(metrics.Resyncs.WithLabelValues(e.gwName, "drift")) - drift; got < 1 {
		t.Errorf("drift resyncs grew by %v, want ≥1", got)
	}
}

// TestDataplaneSwitch: annotating the VpcNatGateway moves its rules from
// nftables to iptables (synced on the new agent, cleaned from the old), and
// back; traffic flows after each switch.
func TestDataplaneSwitch(t *testing.T) {
	e := newEnv(t, envOptions{dataplane: nat.DataplaneNftables})
	g := e.gatewayObj()
	e.create(g)
	f := e.readyFIP(netlab.EIP(11))

	for _, to := range []nat.DataplaneName{nat.DataplaneIptables, nat.DataplaneNftables} {
		from := map[nat.DataplaneName]nat.DataplaneName{nat.DataplaneIptables: nat.DataplaneNftables, nat.DataplaneNftables: nat.DataplaneIptables}[to]
		e.update(g, func() {
			if g.Annotations == nil {
				g.Annotations = map[string]string{}
			}
			g.Annotations[DataplaneAnnotation] = string(to)
		})
		e.eventually(30*time.Second, "rules on "+string(to), func() error {
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
		// (natgw list would create the old data plane's table: not used.)
		if e.holds(from) {
			t.Errorf("%s still holds natgw state after switching to %s", from, to)
		}
		if _, err := e.probe(e.gw.VMs[0], netlab.EIP(11)); err != nil {
			t.Errorf("packet after switching to %s: %v", to, err)
		}
	}
}

// holds reports whether data plane dp holds natgw state (table or chains)
// in the gateway's namespace (read without creating anything).
func (e *env) holds(dp nat.DataplaneName) bool {
	e.t.Helper()
	ok, err := planes.Holds(e.ctx, dp, e.gw.Config())
	if err != nil {
		e.t.Fatal(err)
	}
	return ok
}

// unreachable checks that TCP from ext to eip:8080 reaches nothing (a
// server listens on every VM).
func (e *env) unreachable(eip netip.Addr) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	for _, vm := range e.gw.VMs {
		srv, err := e.lab.ServeTCP(ctx, vm.NS, vm.Addr.String()+":8080")
		if err != nil {
			e.t.Fatal(err)
		}
		defer srv.Close()
	}
	if r, err := netlab.Dial(ctx, e.gw.Ext.NS, eip.String()+":8080", 2*time.Second); err == nil {
		e.t.Errorf("TCP to %s (its FIP is deleted) reaches %s", eip, r.Server)
	}
}

// TestDataplaneChangedWhileAway: iptables holds natgw state (the
// controller's --dataplane changed while no controller ran): an EIP and FIP
// of live objects, and an EIP and FIP whose objects were deleted meanwhile.
// A controller started on nftables (its agent empties iptables as it
// starts, whatever the API says) programs the live objects on nftables;
// nothing of iptables remains and the deleted FIP's EIP reaches nothing.
// With and without a VpcNatGateway object, on natgw's and upstream's CRDs
// (upstream's status has no field to record a data plane in; nothing needs
// one).
func TestDataplaneChangedWhileAway(t *testing.T) {
	for _, set := range crdtest.Sets {
		for _, withGW := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/gateway-object=%v", set, withGW), func(t *testing.T) {
				o := envOptions{dataplane: nat.DataplaneNftables, noManager: true, crds: set}
				e := newEnv(t, o)
				if withGW {
					e.create(e.gatewayObj())
				}
				eip := e.eip("eip", netlab.EIP(12))
				e.create(eip)
				f := e.fip("fip", "eip", e.gw.VMs[0].Addr)
				e.create(f)
				left := []nat.Object{
					{UID: string(eip.UID), Kind: nat.KindEIP, EIP: &nat.EIP{Address: netlab.EIP(12), PrefixLen: 24}},
					{UID: string(f.UID), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netlab.EIP(12), InternalIP: e.gw.VMs[1].Addr}},
					{UID: string(uuid.NewUUID()), Kind: nat.KindEIP, EIP: &nat.EIP{Address: netlab.EIP(13), PrefixLen: 24}},
					{UID: string(uuid.NewUUID()), Kind: nat.KindFIP, FIP: &nat.FIP{EIP: netlab.EIP(13), InternalIP: e.gw.VMs[2].Addr}},
				}
				e.natgwCLI(nat.DataplaneIptables, "apply", left...)
				if got, err := e.probe(e.gw.VMs[2], netlab.EIP(13)); err != nil || !strings.Contains(got, e.gw.VMs[2].NS) {
					t.Fatalf("before: the stale FIP does not forward (%q, %v): the test proves nothing", got, err)
				}

				e.startManager(e.cfg, o)
				e.waitReady(f)
				if e.holds(nat.DataplaneIptables) {
					t.Error("iptables still holds natgw state")
				}
				if _, ok := hasUID(e.kernelObjects(nat.DataplaneNftables), f.UID); !ok {
					t.Error("FIP not on nftables")
				}
				if got, err := e.probe(e.gw.VMs[0], netlab.EIP(12)); err != nil || !strings.Contains(got, e.gw.VMs[0].NS) {
					t.Errorf("TCP through nftables: %q, %v", got, err)
				}
				e.unreachable(netlab.EIP(13))
			})
		}
	}
}

// TestSwitchKilled: the controller switches a gateway from nftables to
// iptables (annotation) and is stopped at once, somewhere in the switch;
// the FIP is deleted while no controller runs; the next controller starts
// with --dataplane iptables. Afterwards nftables holds nothing, the live FIP
// forwards on iptables and the deleted FIP's EIP reaches nothing. On
// upstream's CRDs.
func TestSwitchKilled(t *testing.T) {
	o := envOptions{dataplane: nat.DataplaneNftables, noManager: true, crds: crdtest.Upstream}
	e := newEnv(t, o)
	mctx, stop := context.WithCancel(e.ctx)
	first := *e
	first.ctx, first.cancel = mctx, stop
	first.startManager(e.cfg, o)
	g := e.gatewayObj()
	e.create(g)
	for i, name := range []string{"a", "b"} {
		eip := e.eip("eip-"+name, netlab.EIP(20+i))
		e.create(eip)
		f := e.fip("fip-"+name, "eip-"+name, e.gw.VMs[i].Addr)
		e.create(f)
		e.waitReady(f)
	}
	opened := e.tr.opened()
	patch := []byte(`{"metadata":{"annotations":{"` + DataplaneAnnotation + `":"iptables"}}}`)
	if err := e.c.Patch(e.ctx, g, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	e.eventually(30*time.Second, "the iptables agent opened", func() error {
		if e.tr.opened() == opened {
			return errors.New("not yet")
		}
		return nil
	})
	stop() // the controller dies in the middle of the switch
	time.Sleep(200 * time.Millisecond)

	gone := &v1.IptablesFIPRule{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: e.case_ + "-fip-b"}, gone); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Delete(e.ctx, gone); err != nil {
		t.Fatal(err)
	}

	o.dataplane = nat.DataplaneIptables
	e.startManager(e.cfg, o)
	e.waitGone(gone, time.Minute)
	live := &v1.IptablesFIPRule{}
	if err := e.c.Get(e.ctx, client.ObjectKey{Name: e.case_ + "-fip-a"}, live); err != nil {
		t.Fatal(err)
	}
	e.eventually(time.Minute, "the live FIP on iptables", func() error {
		if _, ok := hasUID(e.kernelObjects(nat.DataplaneIptables), live.UID); !ok {
			return errors.New("not there")
		}
		return nil
	})
	if e.holds(nat.DataplaneNftables) {
		t.Error("nftables still holds natgw state")
	}
	if got, err := e.probe(e.gw.VMs[0], netlab.EIP(20)); err != nil || !strings.Contains(got, e.gw.VMs[0].NS) {
		t.Errorf("TCP through iptables: %q, %v", got, err)
	}
	e.unreachable(netlab.EIP(21))
}
