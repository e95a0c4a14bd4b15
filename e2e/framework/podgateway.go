package framework

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

	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/netlab"
)

// PodGateway is one gateway pod of the test cluster (internal/cluster)
// with its Multus-style net1, the external host and the VPC hosts on the
// pod network behind its eth0 (shared by e2e/cluster and e2e/firstrun).
type PodGateway struct {
	*Topology
	Pod   *corev1.Pod
	PodIP netip.Addr
	// NetNS is the pod's network namespace (/proc/PID/ns/net of its
	// container's init).
	NetNS string
	// Dataplane is the gateway's data plane (names its namespaces).
	Dataplane string
}

// NewPodGateway is gateway name's unwired PodGateway (Attach wires it).
func NewPodGateway(name, dp string) *PodGateway {
	return &PodGateway{Dataplane: dp, Topology: &Topology{Name: name, Gateway: &netlab.Gateway{
		Name: name, ExternalInterface: "net1", InternalInterface: "eth0"}}}
}

// StartPodGateway creates gateway name's StatefulSet in upstream's shape
// running image (clusterstack.GatewayStatefulSet), waits for its pod and
// wires it with vms VPC hosts (Attach). The StatefulSet is deleted by
// t.Cleanup; the caller creates the VpcNatGateway.
func StartPodGateway(t *testing.T, s *Stack, c *cluster.Cluster, cs kubernetes.Interface, lab *netlab.Lab, name string, vms int, image string) *PodGateway {
	t.Helper()
	sts := clusterstack.GatewayStatefulSet(name, image)
	if _, err := cs.AppsV1().StatefulSets(clusterstack.GatewayNamespace).Create(s.Ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create statefulset: %v", err)
	}
	t.Cleanup(func() { DeleteStatefulSet(t, cs, sts.Name) })
	g := NewPodGateway(name, s.Dataplane)
	if err := g.Attach(s.Ctx, t, c, cs, lab, vms); err != nil {
		t.Fatal(err)
	}
	return g
}

// Attach waits for the gateway's running pod and wires it: net1 on the
// external network with an external host, VPC hosts on the pod network
// routed through the pod's eth0, probe servers everywhere. Called again
// after the pod was replaced, it wires the new pod to the same external
// host and VPC hosts.
func (g *PodGateway) Attach(ctx context.Context, t *testing.T, c *cluster.Cluster, cs kubernetes.Interface, lab *netlab.Lab, vms int) error {
	pod, err := clusterstack.WaitGatewayPod(ctx, cs, g.Name, g.Pod, 2*time.Minute)
	if err != nil {
		return err
	}
	pid, err := clusterstack.ContainerPid(ctx, c, pod)
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
		ns, err := lab.NS("ext-" + g.Dataplane)
		if err != nil {
			return err
		}
		g.Ext = netlab.Host{NS: ns, Addr: netlab.ExtAddr}
		for _, proto := range []string{"tcp", "udp"} {
			if err := serve(ctx, lab, proto, ns, ExtPort); err != nil {
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
		addr, err := c.HostAddr(cluster.PodRangeEnd + 1 + n)
		if err != nil {
			return err
		}
		ns, err := lab.NS(fmt.Sprintf("vm%d-%s", i, g.Dataplane))
		if err != nil {
			return err
		}
		host := fmt.Sprintf("ngwvm%d", n)
		if err := netlab.Veth(netlab.End{NS: ns, Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(addr, bits)}}, netlab.End{NS: "", Name: host}); err != nil {
			return err
		}
		// The host end is in the host's namespace: deleted by lab.Close
		// itself, not left to the asynchronous destruction of ns (a
		// clean-clone run saw ngwvm0 outlive lab.Close by over 15 s).
		lab.DeleteLinkOnClose("", host)
		if err := netlab.Enslave("", host, cluster.BridgeName); err != nil {
			return err
		}
		if err := netlab.AddRoute(ns, netip.MustParsePrefix("0.0.0.0/0"), g.PodIP, "eth0"); err != nil {
			return err
		}
		for _, proto := range []string{"tcp", "udp"} {
			if err := serve(ctx, lab, proto, ns, VMPort); err != nil {
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

// DeleteStatefulSet deletes a gateway's StatefulSet and waits for its
// pods to be gone (their network namespaces with them).
func DeleteStatefulSet(t *testing.T, cs kubernetes.Interface, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := cs.AppsV1().StatefulSets(clusterstack.GatewayNamespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete statefulset %s: %v", name, err)
		return
	}
	for {
		pods, err := cs.CoreV1().Pods(clusterstack.GatewayNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
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
