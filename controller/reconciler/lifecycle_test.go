package reconciler

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

var dataplanes = nat.DataplaneNames

// probeFIP checks with a real TCP connection from the external host to
// eip that the gateway forwards it to vm, and returns the address vm saw.
func (e *env) probe(vm netlab.Host, eip netip.Addr) (string, error) {
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	srv, err := e.lab.ServeTCP(ctx, vm.NS, vm.Addr.String()+":8080")
	if err != nil {
		return "", err
	}
	defer srv.Close()
	reply, err := netlab.Dial(ctx, e.gw.Ext.NS, eip.String()+":8080", 3*time.Second)
	if err != nil {
		return "", err
	}
	return reply.Server, nil
}

// TestFIPLifecycle: create → Ready and in the kernel (and forwarding real
// packets); spec update → one apply moves it; delete → gone from the kernel
// and the finalizer removed. On both data planes.
func TestFIPLifecycle(t *testing.T) {
	for _, dp := range dataplanes {
		t.Run(string(dp), func(t *testing.T) {
			e := newEnv(t, envOptions{dataplane: dp})
			g := e.gatewayObj()
			e.create(g)
			e.waitReady(g)
			eip := e.eip("eip", netlab.EIP(0))
			e.create(eip)
			e.waitReady(eip)

			f := e.fip("fip", "eip", e.gw.VMs[0].Addr)
			e.create(f)
			e.waitReady(f)
			if f.Status.V4ip != netlab.EIP(0).String() || f.Status.NatGwDp != e.gwName || f.Status.InternalIP != e.gw.VMs[0].Addr.String() {
				t.Errorf("status = %+v", f.Status)
			}
			// Upstream's labels are written with --rule-labels only.
			if _, ok := f.Labels[v1.LabelEIPV4IP]; ok {
				t.Errorf("labels = %v: %s written without --rule-labels", f.Labels, v1.LabelEIPV4IP)
			}
			if !containsString(f.Finalizers, Finalizer) {
				t.Errorf("finalizers = %v", f.Finalizers)
			}
			objs := e.kernelObjects(dp)
			got, ok := hasUID(objs, f.UID)
			if !ok || got.Kind != nat.KindFIP || got.FIP.EIP != netlab.EIP(0) || got.FIP.InternalIP != e.gw.VMs[0].Addr {
				t.Fatalf("FIP %s not in the kernel as expected: %v", f.UID, objs)
			}
			if _, ok := hasUID(objs, eip.UID); !ok {
				t.Errorf("EIP %s not in the kernel: %v", eip.UID, objs)
			}
			e.eventually(10*time.Second, "eip status.nat", func() error {
				if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(eip), eip); err != nil {
					return err
				}
				if eip.Status.Nat != "fip" {
					return fmt.Errorf("status.nat = %q", eip.Status.Nat)
				}
				return nil
			})
			if seen, err := e.probe(e.gw.VMs[0], netlab.EIP(0)); err != nil {
				t.Fatalf("packet to the EIP: %v", err)
			} else {
				t.Logf("ext → %s reached %s", netlab.EIP(0), seen)
			}

			// Spec update: one apply replaces the rule.
			e.update(f, func() { f.Spec.InternalIP = e.gw.VMs[1].Addr.String() })
			e.waitReady(f)
			if f.Status.InternalIP != e.gw.VMs[1].Addr.String() {
				t.Errorf("status.internalIp = %q after update", f.Status.InternalIP)
			}
			got, _ = hasUID(e.kernelObjects(dp), f.UID)
			if got.FIP == nil || got.FIP.InternalIP != e.gw.VMs[1].Addr {
				t.Errorf("kernel holds %v after update", got)
			}
			if _, err := e.probe(e.gw.VMs[1], netlab.EIP(0)); err != nil {
				t.Errorf("packet to the EIP after update: %v", err)
			}

			// Delete: gone from the kernel, finalizer removed.
			if err := e.c.Delete(e.ctx, f); err != nil {
				t.Fatal(err)
			}
			e.waitGone(f, 30*time.Second)
			if _, ok := hasUID(e.kernelObjects(dp), f.UID); ok {
				t.Errorf("FIP %s still in the kernel after delete", f.UID)
			}
			e.eventually(10*time.Second, "eip status.nat cleared", func() error {
				if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(eip), eip); err != nil {
					return err
				}
				if eip.Status.Nat != "" {
					return fmt.Errorf("status.nat = %q", eip.Status.Nat)
				}
				return nil
			})
			// And the EIP too.
			if err := e.c.Delete(e.ctx, eip); err != nil {
				t.Fatal(err)
			}
			e.waitGone(eip, 30*time.Second)
			if _, ok := hasUID(e.kernelObjects(dp), eip.UID); ok {
				t.Errorf("EIP %s still in the kernel after delete", eip.UID)
			}
		})
	}
}

func containsString(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// TestRulesWaitForTheirEIP: a rule whose EIP is missing says EIPNotFound
// (with an Event) and is programmed when the EIP appears; a second FIP on
// an EIP in use says EIPInUse and takes over when the first goes.
func TestRulesWaitForTheirEIP(t *testing.T) {
	e := newEnv(t, envOptions{})
	f := e.fip("early", "late-eip", e.gw.VMs[0].Addr)
	e.create(f)
	e.waitReason(f, v1.ReasonEIPNotFound, 30*time.Second)
	e.eventually(10*time.Second, "EIPNotFound event", func() error { return e.hasEvent(f, v1.ReasonEIPNotFound) })

	eip := e.eip("late-eip", netlab.EIP(1))
	e.create(eip)
	e.waitReady(eip)
	e.waitReady(f)

	second := e.fip("second", "late-eip", e.gw.VMs[1].Addr)
	e.create(second)
	e.waitReason(second, v1.ReasonEIPInUse, 30*time.Second)
	if !strings.Contains(readyMsg(second), "floating IP") {
		t.Errorf("EIPInUse message %q does not say why", readyMsg(second))
	}
	if _, ok := hasUID(e.kernelObjects(e.dataplane), second.UID); ok {
		t.Errorf("refused FIP %s is in the kernel", second.UID)
	}
	if err := e.c.Delete(e.ctx, f); err != nil {
		t.Fatal(err)
	}
	e.waitGone(f, 30*time.Second)
	e.waitReady(second)

	// DNAT and SNAT through the same flow.
	dnatEIP := e.eip("dnat-eip", netlab.EIP(2))
	e.create(dnatEIP)
	d := &v1.IptablesDnatRule{ObjectMeta: e.meta("dnat"), Spec: v1.IptablesDnatRuleSpec{
		EIP: dnatEIP.Name, ExternalPort: "8080", Protocol: "tcp", InternalIP: e.gw.VMs[2].Addr.String(), InternalPort: "8080"}}
	e.create(d)
	s := &v1.IptablesSnatRule{ObjectMeta: e.meta("snat"), Spec: v1.IptablesSnatRuleSpec{EIP: dnatEIP.Name, InternalCIDR: netlab.VPCNet.String()}}
	e.create(s)
	e.waitReady(d)
	e.waitReady(s)
	if seen, err := e.probe(e.gw.VMs[2], netlab.EIP(2)); err != nil {
		t.Errorf("DNAT packet: %v", err)
	} else {
		t.Logf("DNAT reached %s", seen)
	}
	e.eventually(10*time.Second, "eip status.nat", func() error {
		if err := e.c.Get(e.ctx, client.ObjectKeyFromObject(dnatEIP), dnatEIP); err != nil {
			return err
		}
		if dnatEIP.Status.Nat != "dnat,snat" {
			return fmt.Errorf("status.nat = %q", dnatEIP.Status.Nat)
		}
		return nil
	})
}

func readyMsg(obj client.Object) string {
	_, c, _ := readyOf(obj)
	if c == nil {
		return ""
	}
	return c.Message
}

// hasEvent finds a Warning Event with reason about obj.
func (e *env) hasEvent(obj client.Object, reason string) error {
	list := &eventsv1.EventList{}
	if err := e.c.List(e.ctx, list); err != nil {
		return err
	}
	for _, ev := range list.Items {
		if ev.Regarding.UID == obj.GetUID() && ev.Reason == reason && ev.Type == corev1.EventTypeWarning {
			return nil
		}
	}
	return fmt.Errorf("no %s event for %s among %d events", reason, obj.GetName(), len(list.Items))
}

// TestInvalid: the API server rejects bad specs at admission; a spec that
// passes admission but that the gateway cannot program (internal IP equal
// to the EIP) says Invalid with an Event, and nothing is programmed.
func TestInvalid(t *testing.T) {
	e := newEnv(t, envOptions{})
	bad := e.fip("bad-ip", "eip", netip.Addr{})
	bad.Spec.InternalIP = "10.0.1.256"
	err := e.c.Create(e.ctx, bad)
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.internalIp") {
		t.Fatalf("create FIP with internalIp 10.0.1.256: %v, want Invalid naming spec.internalIp", err)
	}
	badPort := &v1.IptablesDnatRule{ObjectMeta: e.meta("bad-port"), Spec: v1.IptablesDnatRuleSpec{
		EIP: "x", ExternalPort: "0", Protocol: "tcp", InternalIP: "10.0.0.1", InternalPort: "80"}}
	if err := e.c.Create(e.ctx, badPort); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.externalPort") {
		t.Fatalf("create DNAT with port 0: %v, want Invalid naming spec.externalPort", err)
	}

	eip := e.eip("eip", netlab.EIP(3))
	e.create(eip)
	e.waitReady(eip)
	same := e.fip("same", "eip", netlab.EIP(3))
	e.create(same)
	e.waitReason(same, v1.ReasonInvalid, 30*time.Second)
	if !strings.Contains(readyMsg(same), "fip.internalIP") {
		t.Errorf("Invalid message %q does not name the field", readyMsg(same))
	}
	e.eventually(10*time.Second, "Invalid event", func() error { return e.hasEvent(same, v1.ReasonInvalid) })
	if _, ok := hasUID(e.kernelObjects(e.dataplane), same.UID); ok {
		t.Errorf("invalid FIP %s is in the kernel", same.UID)
	}
	if err := e.c.Delete(e.ctx, same); err != nil {
		t.Fatal(err)
	}
	e.waitGone(same, 30*time.Second)
}
