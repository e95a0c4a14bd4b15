package cluster_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/reconciler"
	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/netlab"
)

// podGateway is one gateway pod with its Multus-style net1, the external
// host and the VPC hosts on the pod network behind its eth0.
type podGateway struct {
	*fw.Topology
	Pod   *corev1.Pod
	PodIP netip.Addr
	// NetNS is the pod's network namespace (/proc/PID/ns/net of its
	// container's init).
	NetNS string
	dp    string
}

// newStack returns a framework Stack (its helpers only need the test, a
// context and a client) on the cluster's API server as the admin.
func newStack(t *testing.T, dp string) *fw.Stack {
	t.Helper()
	cfg, err := env.c.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 500, 1000 // the storm, not client-go's default 5/s, sets the pace
	cl, err := client.New(cfg, client.Options{Scheme: fw.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &fw.Stack{T: t, Ctx: ctx, Dataplane: dp, Client: cl}
}

// gatewayImage is the image of data plane dp's gateways as the CRI finds
// it (clusterstack.GatewayImage).
func gatewayImage(t *testing.T, dp string) string {
	t.Helper()
	img, err := clusterstack.GatewayImage(env.repo, dp)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// startGateway creates the VpcNatGateway (with the data plane annotation)
// and its StatefulSet, waits for the pod, and wires it: net1 on the
// external network with an external host, VPC hosts on the pod network
// routed through the pod's eth0, probe servers everywhere. Everything is
// removed by t.Cleanup.
func startGateway(t *testing.T, s *fw.Stack, lab *netlab.Lab, name string, vms int) *podGateway {
	t.Helper()
	return startGatewayImage(t, s, lab, name, vms, gatewayImage(t, s.Dataplane))
}

// startGatewayImage is startGateway with the pod's container running
// image (e.g. one without natgw, whose agent cannot start).
func startGatewayImage(t *testing.T, s *fw.Stack, lab *netlab.Lab, name string, vms int, image string) *podGateway {
	t.Helper()
	cs, err := env.c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	sts := clusterstack.GatewayStatefulSet(name, image)
	if _, err := cs.AppsV1().StatefulSets(gatewayNamespace).Create(s.Ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create statefulset: %v", err)
	}
	t.Cleanup(func() { deleteStatefulSet(t, cs, sts.Name) })

	g := &podGateway{dp: s.Dataplane, Topology: &fw.Topology{Name: name, Gateway: &netlab.Gateway{
		Name: name, ExternalInterface: "net1", InternalInterface: "eth0"}}}
	if err := g.attach(s.Ctx, t, cs, lab, vms); err != nil {
		t.Fatal(err)
	}
	s.Create(&v1.VpcNatGateway{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{reconciler.DataplaneAnnotation: s.Dataplane}},
		Spec:       v1.VpcNatGatewaySpec{Vpc: "vpc-" + name, Subnet: "subnet-" + name},
	})
	return g
}

// attach waits for the gateway's running pod and wires it (see
// startGateway). Called again after the pod was replaced, it wires the new
// pod to the same external host and VPC hosts.
func (g *podGateway) attach(ctx context.Context, t *testing.T, cs kubernetes.Interface, lab *netlab.Lab, vms int) error {
	pod, err := clusterstack.WaitGatewayPod(ctx, cs, g.Name, g.Pod, 2*time.Minute)
	if err != nil {
		return err
	}
	pid, err := clusterstack.ContainerPid(ctx, env.c, pod)
	if err != nil {
		return err
	}
	g.Pod, g.NetNS = pod, fmt.Sprintf("/proc/%d/ns/net", pid)
	g.PodIP, err = netip.ParseAddr(pod.Status.PodIP)
	if err != nil {
		return fmt.Errorf("pod %s IP %q: %w", pod.Name, pod.Status.PodIP, err)
	}
	g.GW = g.NetNS
	// The pod's forwarding is upstream's PostStart hook (sysctl -w
	// net.ipv4.ip_forward=1); the natgw image has no shell to run it.
	if err := netlab.Sysctl(g.NetNS, "net.ipv4.ip_forward", "1"); err != nil {
		return err
	}
	if g.Ext.NS == "" {
		ns, err := lab.NS("ext-" + g.dp)
		if err != nil {
			return err
		}
		g.Ext = netlab.Host{NS: ns, Addr: netlab.ExtAddr}
		for _, proto := range []string{"tcp", "udp"} {
			if err := serve(ctx, lab, proto, ns, fw.ExtPort); err != nil {
				return err
			}
		}
	} else if _, err := netlab.Exec(ctx, g.Ext.NS, "", "ip", "link", "del", "eth0"); err != nil && !strings.Contains(err.Error(), "Cannot find") {
		return err
	}
	// Multus's part: a veth whose one end becomes the pod's net1 on the
	// external subnet.
	if err := netlab.Veth(
		netlab.End{NS: g.NetNS, Name: "net1", Addrs: []netip.Prefix{netip.PrefixFrom(netlab.GWExtAddr, netlab.ExtNet.Bits())}},
		netlab.End{NS: g.Ext.NS, Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(netlab.ExtAddr, netlab.ExtNet.Bits())}},
	); err != nil {
		return err
	}
	// VPC hosts: namespaces on the pod bridge (the VPC's switch) with the
	// gateway pod's eth0 as their default route.
	bits := 24
	for i := 0; i < vms; i++ {
		if i < len(g.VMs) {
			if err := replaceDefault(ctx, g.VMs[i].NS, g.PodIP); err != nil {
				return err
			}
			continue
		}
		n := int(vmCount.Add(1)) - 1 // a fresh address and host link name per VPC host of the package run
		addr, err := env.c.HostAddr(cluster.PodRangeEnd + 1 + n)
		if err != nil {
			return err
		}
		ns, err := lab.NS(fmt.Sprintf("vm%d-%s", i, g.dp))
		if err != nil {
			return err
		}
		host := fmt.Sprintf("ngwvm%d", n)
		if err := netlab.Veth(netlab.End{NS: ns, Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(addr, bits)}}, netlab.End{NS: "", Name: host}); err != nil {
			return err
		}
		if err := netlab.Enslave("", host, cluster.BridgeName); err != nil {
			return err
		}
		if err := netlab.AddRoute(ns, netip.MustParsePrefix("0.0.0.0/0"), g.PodIP, "eth0"); err != nil {
			return err
		}
		for _, proto := range []string{"tcp", "udp"} {
			if err := serve(ctx, lab, proto, ns, fw.VMPort); err != nil {
				return err
			}
		}
		g.VMs = append(g.VMs, netlab.Host{NS: ns, Addr: addr})
	}
	return nil
}

// vmCount numbers the VPC hosts of the package run: each gets its own
// address of the pod CIDR above the pods' range and its own host link (a
// namespace removed by an earlier test may still be going away).
var vmCount atomic.Int32

func replaceDefault(ctx context.Context, ns string, via netip.Addr) error {
	_, err := netlab.Exec(ctx, ns, "", "ip", "route", "replace", "default", "via", via.String(), "dev", "eth0")
	return err
}

func serve(ctx context.Context, lab *netlab.Lab, proto, ns string, port int) error {
	addr := net.JoinHostPort("0.0.0.0", strconv.Itoa(port))
	var err error
	if proto == "tcp" {
		_, err = lab.ServeTCP(ctx, ns, addr)
	} else {
		_, err = lab.ServeUDP(ctx, ns, addr)
	}
	return err
}

// deleteStatefulSet deletes a gateway's StatefulSet and waits for its pods
// to be gone (their network namespaces with them).
func deleteStatefulSet(t *testing.T, cs kubernetes.Interface, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := cs.AppsV1().StatefulSets(gatewayNamespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete statefulset %s: %v", name, err)
		return
	}
	for {
		pods, err := cs.CoreV1().Pods(gatewayNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err == nil && len(pods.Items) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Errorf("statefulset %s: pods not gone: %v", name, ctx.Err())
			return
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// readyGateway starts a stack on dp and gateway name (a pod of the natgw
// image with vms VPC hosts) and waits until the VpcNatGateway is Ready.
func readyGateway(t *testing.T, dp, name string, vms int) (*fw.Stack, *netlab.Lab, *podGateway) {
	t.Helper()
	s := newStack(t, dp)
	lab := netlab.ForTest(t)
	g := startGateway(t, s, lab, name, vms)
	gw := &v1.VpcNatGateway{}
	gw.Name = name
	s.WaitReady(gw)
	return s, lab, g
}

// createEIPs creates n IptablesEIPs <gateway>-e<i> on gateway with the
// addresses netlab.EIP(first+i).
func createEIPs(s *fw.Stack, gateway string, first, n int) []*v1.IptablesEIP {
	eips := make([]*v1.IptablesEIP, n)
	for i := range eips {
		eips[i] = fw.EIP(fmt.Sprintf("%s-e%d", gateway, i), gateway, netlab.EIP(first+i))
		s.Create(eips[i])
	}
	return eips
}

// deleteAll deletes every object and reports what the gateway pod's
// namespace still holds afterwards (kernel entries plus EIP addresses,
// also as a test error), how long the delete took, and how many objects
// are stuck terminating.
func deleteAll(t *testing.T, s *fw.Stack, g *podGateway, timeout time.Duration) (left int, took time.Duration, stuck int) {
	t.Helper()
	took = s.DeleteAll(timeout)
	k, err := fw.ReadKernel(s.Ctx, g.Topology, s.Dataplane)
	if err != nil {
		t.Fatal(err)
	}
	left = k.Count() + len(k.EIPAddrs())
	if left > 0 {
		t.Errorf("after deleting everything: %d entries, EIP addresses %v in the pod's namespace:\n%s", k.Count(), k.EIPAddrs(), k.Dump)
	}
	uids, err := s.ObjectUIDs()
	if err != nil {
		t.Fatal(err)
	}
	return left, took, len(uids)
}
