package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/transport"
	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/netlab"
)

// TestGatewayNotRunning: a gateway with Ready EIPs and FIPs whose pod goes
// away (StatefulSet scaled to 0). The controller reports it: the
// VpcNatGateway's Ready annotation, its EIPs and its rules turn NotReady
// with reason GatewayNotReady (a Warning Event says so); a FIP created
// while it is down is GatewayNotReady, never Ready; a FIP deleted while it
// is down keeps its finalizer. Scaled back to 1 (a new pod under the same
// name: new boot id), the controller reconnects with backoff, syncs, and
// everything is Ready again; the deleted FIP's finalizer is released only
// now, and the pod's kernel holds exactly the live objects (nothing of the
// deleted one), with traffic through the FIP that survived.
func TestGatewayNotRunning(t *testing.T) {
	fw.ForEachDataplane(t, func(t *testing.T, dp string) {
		name := "n-" + dp[:3]
		s, lab, g := readyGateway(t, dp, name, 1)
		gwObj := &v1.VpcNatGateway{}
		gwObj.Name = name
		cs, err := env.c.Clientset()
		if err != nil {
			t.Fatal(err)
		}
		eips := createEIPs(s, name, 20, 3)
		keep := fw.FIP(name+"-keep", eips[0].Name, g.VMs[0].Addr)
		del := fw.FIP(name+"-del", eips[2].Name, g.VMs[0].Addr)
		del.Spec.InternalIP = "10.251.0.2"
		s.Create(keep)
		s.Create(del)
		s.WaitReady(eips[0], eips[1], eips[2], keep, del)

		// The pod goes away.
		downAt := time.Now()
		scaleGateway(t, s.Ctx, cs, name, 0)
		s.WaitReason(gwObj, v1.ReasonGatewayNotReady, time.Minute)
		notReadyIn := time.Since(downAt)
		for _, o := range []client.Object{keep, del, eips[0], eips[1], eips[2]} {
			s.WaitReason(o, v1.ReasonGatewayNotReady, time.Minute)
		}
		added := fw.FIP(name+"-new", eips[1].Name, g.VMs[0].Addr)
		added.Spec.InternalIP = "10.251.0.1"
		s.Create(added)
		s.WaitReason(added, v1.ReasonGatewayNotReady, time.Minute)
		if err := s.Client.Delete(s.Ctx, del); err != nil {
			t.Fatal(err)
		}
		// While the gateway is down: the delete is held, nothing is Ready.
		time.Sleep(5 * time.Second)
		if err := s.Get(del); err != nil || del.DeletionTimestamp == nil {
			t.Errorf("FIP %s deleted while its gateway is down: want it terminating with its finalizer, got err %v", del.Name, err)
		}
		noneReady(t, s, "its gateway has no pod", gwObj, keep, added, eips[0], eips[1], eips[2])
		warnings := warningEvents(t, s.Ctx, cs, v1.ReasonGatewayNotReady, name, added.Name)

		// The pod comes back under the same name.
		upAt := time.Now()
		scaleGateway(t, s.Ctx, cs, name, 1)
		if err := g.Attach(s.Ctx, t, env.c, cs, lab, 1); err != nil {
			t.Fatal(err)
		}
		s.WaitReady(gwObj, eips[0], eips[1], eips[2], keep, added)
		recoveredIn := time.Since(upAt)
		s.WaitGone(time.Minute, del)
		releasedIn := time.Since(upAt)
		leaked := kernelHoldsExactly(t, s, g, eips[0], eips[1], eips[2], keep, added)
		s.CheckPaths(30*time.Second, g.ExtTo(fw.TCP, netlab.EIP(20), fw.VMPort, 0))

		left, _, stuck := deleteAll(t, s, g, 90*time.Second)
		clusterSummary(t, "gateway-not-running", dp, "pod", g.Pod.Name, "gateway_notready_in", notReadyIn,
			"warning_events", warnings, "recovered_in", recoveredIn, "delete_while_down_released_in", releasedIn,
			"leaked_kernel_entries", leaked+left, "stuck_terminating", stuck)
	})
}

// TestExecStartFails: a gateway whose pod runs but cannot start the agent
// (its container is the pause image: no /natgw, so every exec fails to
// start). The controller retries with backoff and reports the gateway,
// its EIP and a FIP GatewayNotReady (Warning Events), never Ready. The
// StatefulSet then gets the natgw image: its pod is replaced under the
// same name, the controller reconnects and everything becomes Ready, held
// by the new pod's kernel, with traffic through the FIP.
func TestExecStartFails(t *testing.T) {
	fw.ForEachDataplane(t, func(t *testing.T, dp string) {
		s := newStack(t, dp)
		lab := netlab.ForTest(t)
		name := "x-" + dp[:3]
		g := startGatewayImage(t, s, lab, name, 1, cluster.PauseImage)
		cs, err := env.c.Clientset()
		if err != nil {
			t.Fatal(err)
		}
		gwObj := &v1.VpcNatGateway{}
		gwObj.Name = name
		eip := fw.EIP(name+"-e0", name, netlab.EIP(30))
		fip := fw.FIP(name+"-f0", eip.Name, g.VMs[0].Addr)
		s.Create(eip)
		s.Create(fip)
		start := time.Now()
		for _, o := range []client.Object{gwObj, eip} {
			s.WaitReason(o, v1.ReasonGatewayNotReady, time.Minute)
		}
		notReadyIn := time.Since(start)
		// The FIP waits for its EIP, which waits for the gateway.
		s.WaitReason(fip, v1.ReasonGatewayNotReady, time.Minute)
		time.Sleep(3 * time.Second) // retries keep failing
		noneReady(t, s, "the agent cannot start", gwObj, eip, fip)
		warnings := warningEvents(t, s.Ctx, cs, v1.ReasonGatewayNotReady, name, eip.Name)

		// The pod replaced under the same name, now with natgw.
		fixAt := time.Now()
		patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"containers":[{"name":%q,"image":%q}]}}}}`, transport.GatewayContainer, gatewayImage(t, dp))
		if _, err := cs.AppsV1().StatefulSets(gatewayNamespace).Patch(s.Ctx, transport.GatewayAppPrefix+name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		old := g.Pod
		if err := g.Attach(s.Ctx, t, env.c, cs, lab, 1); err != nil {
			t.Fatal(err)
		}
		if g.Pod.Name != old.Name || g.Pod.UID == old.UID {
			t.Errorf("pod %s (uid %s) after the image change, want a new pod named %s", g.Pod.Name, g.Pod.UID, old.Name)
		}
		s.WaitReady(gwObj, eip, fip)
		recoveredIn := time.Since(fixAt)
		leaked := kernelHoldsExactly(t, s, g, eip, fip)
		s.CheckPaths(30*time.Second, g.ExtTo(fw.TCP, netlab.EIP(30), fw.VMPort, 0))

		left, _, stuck := deleteAll(t, s, g, 90*time.Second)
		clusterSummary(t, "exec-start-fails", dp, "gateway_notready_in", notReadyIn, "warning_events", warnings,
			"recovered_in", recoveredIn, "leaked_kernel_entries", leaked+left, "stuck_terminating", stuck)
	})
}

// scaleGateway sets the gateway StatefulSet's replicas and, for 0, waits
// for its pods to be gone.
func scaleGateway(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string, n int) {
	t.Helper()
	sts := transport.GatewayAppPrefix + name
	patch := fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)
	if _, err := cs.AppsV1().StatefulSets(gatewayNamespace).Patch(ctx, sts, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("scale %s to %d: %v", sts, n, err)
	}
	if n > 0 {
		return
	}
	fw.Eventually(t, ctx, 2*time.Minute, sts+" pods gone", func() error {
		pods, err := cs.CoreV1().Pods(gatewayNamespace).List(ctx, metav1.ListOptions{LabelSelector: transport.GatewayPodSelector(name).String()})
		if err != nil {
			return err
		}
		if len(pods.Items) > 0 {
			return fmt.Errorf("%d pods left", len(pods.Items))
		}
		return nil
	})
}

// noneReady reads objs afresh and reports each that is Ready while it
// should not be (while says why).
func noneReady(t *testing.T, s *fw.Stack, while string, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := s.Get(o); err != nil {
			t.Fatal(err)
		}
		if r := fw.ReadyOf(o); r.Status == metav1.ConditionTrue {
			t.Errorf("%T %s Ready while %s: %s", o, o.GetName(), while, r)
		}
	}
}

// warningEvents waits until every named object has a Warning Event with
// reason and returns how many times such Events were recorded for them.
func warningEvents(t *testing.T, ctx context.Context, cs kubernetes.Interface, reason string, names ...string) int {
	t.Helper()
	var n int
	fw.Eventually(t, ctx, 30*time.Second, "Warning Events "+reason, func() error {
		evs, err := cs.EventsV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		seen := map[string]bool{}
		n = 0
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == reason && slices.Contains(names, e.Regarding.Name) {
				seen[e.Regarding.Name] = true
				c := max(1, int(e.DeprecatedCount))
				if e.Series != nil { // repeats of one Event are counted in its series
					c = max(c, int(e.Series.Count))
				}
				n += c
			}
		}
		for _, name := range names {
			if !seen[name] {
				return fmt.Errorf("no Warning Event %s for %s", reason, name)
			}
		}
		return nil
	})
	return n
}

// kernelHoldsExactly checks that the pod's kernel state has entries for
// every one of objs and for nothing else; it returns the entries of other
// objects (leaks).
func kernelHoldsExactly(t *testing.T, s *fw.Stack, g *podGateway, objs ...client.Object) int {
	t.Helper()
	var leaked int
	fw.Eventually(t, s.Ctx, 30*time.Second, "kernel holds exactly the live objects", func() error {
		k, err := fw.ReadKernel(s.Ctx, g.Topology, s.Dataplane)
		if err != nil {
			return err
		}
		want := map[string]bool{}
		for _, o := range objs {
			want[string(o.GetUID())] = true
			if len(k.Entries[string(o.GetUID())]) == 0 {
				return fmt.Errorf("%T %s (uid %s) Ready but not in the pod's kernel state:\n%s", o, o.GetName(), o.GetUID(), k.Dump)
			}
		}
		leaked = 0
		for uid, e := range k.Entries {
			if !want[uid] {
				leaked += len(e)
			}
		}
		if leaked > 0 {
			return fmt.Errorf("%d entries of objects that are not live in the pod's kernel state:\n%s", leaked, k.Dump)
		}
		return nil
	})
	return leaked
}
