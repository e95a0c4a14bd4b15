package cluster_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/netlab"
)

// TestUpstreamPodShapes: the natgw image in the three pod roles Kube-OVN
// makes from its vpcNatImage, in upstream's shapes, in the real cluster:
// the VPC LB Deployment (v1.16.2 vpc_lb.go: bash -c "sleep infinity" with
// the route and masquerade init containers), the LoadBalancer-Service pod
// (v1.16.2 service_lb.go: sleep infinity, then the controller's lb-svc.sh
// exec calls) and the NAT gateway StatefulSet of v1.13.4 (sleep infinity,
// no PostStart) with v1.13.4's exact nat-gateway.sh calls and real TCP
// through the EIPs they make. Every exec call must exit 0 with nothing on
// stderr, the controller's verdict.
func TestUpstreamPodShapes(t *testing.T) {
	const dp = "nftables"
	s := newStack(t, dp)
	lab := netlab.ForTest(t)
	cs, err := env.c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	image := gatewayImage(t, dp)
	ctx := s.Ctx
	start := time.Now()

	// 1. VPC LB Deployment.
	svcCIDR := netip.MustParsePrefix("10.109.77.0/24")
	lbGW, err := env.c.HostAddr(250) // an address of the pod's own subnet
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	vpcLB := vpcLBDeployment("vpc-lb-shapes", image, svcCIDR, lbGW)
	createDeployment(t, cs, vpcLB)
	pod, netNS, err := waitDeploymentPod(ctx, cs, vpcLB, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range pod.Status.InitContainerStatuses {
		if st.State.Terminated == nil || st.State.Terminated.ExitCode != 0 || st.RestartCount != 0 {
			t.Errorf("vpc-lb init container %s: state %+v, restarts %d", st.Name, st.State, st.RestartCount)
		}
	}
	if len(pod.Status.InitContainerStatuses) != 2 {
		t.Errorf("vpc-lb pod: %d init container statuses, want 2", len(pod.Status.InitContainerStatuses))
	}
	routes, err := netlab.Exec(ctx, netNS, "", "ip", "-4", "route", "show", svcCIDR.String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(routes, svcCIDR.String()+" via "+lbGW.String()) {
		t.Errorf("vpc-lb pod: route %s via %s missing: %q", svcCIDR, lbGW, routes)
	}
	ruleset, err := netlab.NftRuleset(ctx, netNS)
	if err != nil {
		t.Fatal(err)
	}
	if !masqueradeFor(ruleset, svcCIDR.String()) {
		t.Errorf("vpc-lb pod: no masquerade for %s in the pod's ruleset:\n%s", svcCIDR, ruleset)
	}
	vpcLBIn := time.Since(t0)
	vpcLBRes := okOrFail(t)

	// 2. LoadBalancer-Service pod.
	t0 = time.Now()
	failedBefore := t.Failed()
	lbSvc := lbSvcDeployment("lb-svc-shapes", image)
	createDeployment(t, cs, lbSvc)
	lbPod, lbNS, err := waitDeploymentPod(ctx, cs, lbSvc, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lbExt, err := lab.NS("lbext")
	if err != nil {
		t.Fatal(err)
	}
	// Multus's part: net1 without an address (eip-add puts the attachment
	// address on it), its gateway on the other end.
	extGW := netlab.ExtAddr
	if err := netlab.Veth(netlab.End{NS: lbNS, Name: "net1"},
		netlab.End{NS: lbExt, Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(extGW, netlab.ExtNet.Bits())}}); err != nil {
		t.Fatal(err)
	}
	lbIP := netlab.EIP(20)
	podGW := env.c.Config().PodCIDR
	podGWAddr := netip.MustParsePrefix(podGW).Addr().Next() // the bridge, the pods' gateway
	lbCalls := []string{
		"init ",
		fmt.Sprintf("eip-add %s,%s", netip.PrefixFrom(lbIP, netlab.ExtNet.Bits()), extGW),
		fmt.Sprintf("dnat-add %s,80,tcp,10.96.77.10,8080,%s", lbIP, podGWAddr),
		fmt.Sprintf("dnat-del %s,80,tcp,10.96.77.10,8080", lbIP),
	}
	for i, c := range lbCalls {
		podCall(ctx, t, lbPod, "lb-svc", "bash /kube-ovn/lb-svc.sh "+c)
		switch i {
		case 1: // the attachment address on net1
			addrs, err := netlab.Addrs(lbNS, "net1")
			if err != nil {
				t.Fatal(err)
			}
			if !containsPrefix(addrs, netip.PrefixFrom(lbIP, netlab.ExtNet.Bits())) {
				t.Errorf("lb-svc pod after eip-add: net1 has %v, want %s/%d", addrs, lbIP, netlab.ExtNet.Bits())
			}
		case 2, 3: // the DNAT to the cluster IP, then none
			rs, err := netlab.NftRuleset(ctx, lbNS)
			if err != nil {
				t.Fatal(err)
			}
			if has := strings.Contains(rs, "dnat to 10.96.77.10"); has != (i == 2) {
				t.Errorf("lb-svc pod after %q: DNAT to 10.96.77.10 in the ruleset = %v:\n%s", c, has, rs)
			}
		}
	}
	lbSvcIn := time.Since(t0)
	lbSvcRes := "ok"
	if t.Failed() && !failedBefore {
		lbSvcRes = "FAIL"
	}

	// 3. NAT gateway StatefulSet of v1.13.4.
	t0 = time.Now()
	failedBefore = t.Failed()
	name := "shapes-v113"
	sts := clusterstack.GatewayStatefulSet(name, image)
	sts.Spec.Template.Spec.Containers[0].Command = []string{"sleep", "infinity"}
	if _, err := cs.AppsV1().StatefulSets(gatewayNamespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create statefulset: %v", err)
	}
	t.Cleanup(func() { fw.DeleteStatefulSet(t, cs, sts.Name) })
	g := fw.NewPodGateway(name, dp)
	// attach also sets ip_forward=1 in the pod: v1.13.4's pod has no
	// PostStart, so this is the test's stand-in for the node's setting.
	if err := g.Attach(ctx, t, env.c, cs, lab, 2); err != nil {
		t.Fatal(err)
	}
	podIn := time.Since(t0)
	eFIP, eDNAT := netlab.EIP(21), netlab.EIP(22)
	bits := netlab.ExtNet.Bits()
	vm0, vm1 := g.VMs[0].Addr, g.VMs[1].Addr
	calls := 0
	nat := func(c string) {
		t.Helper()
		calls++
		podCall(ctx, t, g.Pod, "vpc-nat-gw", "bash /kube-ovn/nat-gateway.sh "+c)
	}
	nat("init ")
	nat(fmt.Sprintf("eip-add %s", netip.PrefixFrom(eFIP, bits)))
	nat(fmt.Sprintf("eip-add %s", netip.PrefixFrom(eDNAT, bits)))
	nat(fmt.Sprintf("floating-ip-add %s,%s", eFIP, vm0))
	s.CheckPaths(30*time.Second, g.ExtTo(fw.TCP, eFIP, fw.VMPort, 0))
	nat(fmt.Sprintf("dnat-add %s,80,tcp,%s,%d", eDNAT, vm1, fw.VMPort))
	s.CheckPaths(30*time.Second, g.ExtTo(fw.TCP, eDNAT, 80, 1))
	nat(fmt.Sprintf("dnat-del %s,80,tcp,%s,%d", eDNAT, vm1, fw.VMPort))
	nat(fmt.Sprintf("floating-ip-del %s,%s", eFIP, vm0))
	s.CheckPaths(10*time.Second, g.ExtTo(fw.TCP, eFIP, fw.VMPort, -1), g.ExtTo(fw.TCP, eDNAT, 80, -1))
	nat(fmt.Sprintf("eip-del %s", netip.PrefixFrom(eFIP, bits)))
	nat(fmt.Sprintf("eip-del %s", netip.PrefixFrom(eDNAT, bits)))
	v113In := time.Since(t0)
	v113Res := "ok"
	if t.Failed() && !failedBefore {
		v113Res = "FAIL"
	}

	clusterSummary(t, "upstream-pod-shapes", dp, "vpc_lb", vpcLBRes, "vpc_lb_in", vpcLBIn,
		"lb_svc", lbSvcRes, "lb_svc_calls", len(lbCalls), "lb_svc_in", lbSvcIn,
		"v1_13_4", v113Res, "v1_13_4_calls", calls, "v1_13_4_pod_running_in", podIn, "v1_13_4_in", v113In,
		"total", time.Since(start))
}

func containsPrefix(ps []netip.Prefix, p netip.Prefix) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}

func okOrFail(t *testing.T) string {
	if t.Failed() {
		return "FAIL"
	}
	return "ok"
}

// masqueradeFor reports whether an nft ruleset holds a masquerade rule
// for destination cidr.
func masqueradeFor(ruleset, cidr string) bool {
	for _, l := range strings.Split(ruleset, "\n") {
		if strings.Contains(l, "daddr "+cidr) && strings.Contains(l, "masquerade") {
			return true
		}
	}
	return false
}

// podCall runs the controller's exec (`/bin/bash -c CMD` in container c)
// and fails the test unless it exits 0 with nothing on stderr.
func podCall(ctx context.Context, t *testing.T, pod *corev1.Pod, c, cmdline string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(env.c.Config().BinDir, "kubectl"), "--kubeconfig", env.c.Kubeconfig(),
		"-n", pod.Namespace, "exec", pod.Name, "-c", c, "--", "/bin/bash", "-c", cmdline)
	out, stderr, code, err := netlab.Run(cmd)
	if err != nil {
		t.Errorf("exec %q in %s/%s: %v", cmdline, pod.Name, c, err)
		return
	}
	if code != 0 || stderr != "" {
		t.Errorf("exec %q in %s/%s: exit %d, stderr %q, stdout %q", cmdline, pod.Name, c, code, stderr, out)
		return
	}
	t.Logf("exec %q: exit 0, stdout %q", cmdline, strings.TrimSpace(out))
}

// vpcLBDeployment is upstream v1.16.2's VPC LB Deployment shape
// (vpc_lb.go): container vpc-lb with bash -c "sleep infinity", IPv4 init
// containers for the service route and its masquerade, all privileged.
func vpcLBDeployment(name, image string, svc netip.Prefix, gw netip.Addr) *appsv1.Deployment {
	priv := func() *corev1.SecurityContext {
		return &corev1.SecurityContext{Privileged: ptr.To(true), AllowPrivilegeEscalation: ptr.To(true)}
	}
	d := deployment(name, image)
	spec := &d.Spec.Template.Spec
	spec.Containers[0].Name = "vpc-lb"
	spec.Containers[0].Command = []string{"bash"}
	spec.Containers[0].Args = []string{"-c", "sleep infinity"}
	spec.Containers[0].SecurityContext = priv()
	spec.InitContainers = []corev1.Container{
		{Name: "init-ipv4-route", Image: image, ImagePullPolicy: corev1.PullNever, Command: []string{"ip"},
			Args: strings.Fields(fmt.Sprintf("-4 route replace %s via %s", svc, gw)), SecurityContext: priv()},
		{Name: "init-ipv4-iptables", Image: image, ImagePullPolicy: corev1.PullNever, Command: []string{"iptables"},
			Args: strings.Fields(fmt.Sprintf("-t nat -I POSTROUTING -d %s -j MASQUERADE", svc)), SecurityContext: priv()},
	}
	return d
}

// lbSvcDeployment is upstream v1.16.2's LoadBalancer-Service Deployment
// shape (service_lb.go): container lb-svc, sleep infinity, privileged.
func lbSvcDeployment(name, image string) *appsv1.Deployment {
	d := deployment(name, image)
	c := &d.Spec.Template.Spec.Containers[0]
	c.Name = "lb-svc"
	c.Command = []string{"sleep", "infinity"}
	c.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true), AllowPrivilegeEscalation: ptr.To(true)}
	d.Spec.Template.Spec.TerminationGracePeriodSeconds = ptr.To[int64](0)
	return d
}

func deployment(name, image string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](2),
					DNSPolicy:                     corev1.DNSDefault,
					Containers:                    []corev1.Container{{Name: "main", Image: image, ImagePullPolicy: corev1.PullNever}},
				},
			},
		},
	}
}

// createDeployment creates d; t.Cleanup deletes it and waits for its pods
// to be gone.
func createDeployment(t *testing.T, cs kubernetes.Interface, d *appsv1.Deployment) {
	t.Helper()
	if _, err := cs.AppsV1().Deployments(d.Namespace).Create(context.Background(), d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create deployment %s: %v", d.Name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := cs.AppsV1().Deployments(d.Namespace).Delete(ctx, d.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)}); err != nil {
			t.Errorf("delete deployment %s: %v", d.Name, err)
			return
		}
		for {
			pods, err := cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + d.Name})
			if err == nil && len(pods.Items) == 0 {
				return
			}
			select {
			case <-ctx.Done():
				t.Errorf("deployment %s: pods not gone: %v", d.Name, ctx.Err())
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	})
}

// waitDeploymentPod waits for d's pod to run with its container running
// and returns it with its network namespace path.
func waitDeploymentPod(ctx context.Context, cs kubernetes.Interface, d *appsv1.Deployment, limit time.Duration) (*corev1.Pod, string, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last string
	for {
		pods, err := cs.CoreV1().Pods(d.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + d.Name})
		if err == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				last = fmt.Sprintf("%s %s init %+v containers %+v", p.Name, p.Status.Phase, p.Status.InitContainerStatuses, p.Status.ContainerStatuses)
				if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" &&
					len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil {
					pid, err := clusterstack.ContainerPid(ctx, env.c, p)
					if err != nil {
						return nil, "", err
					}
					return p, fmt.Sprintf("/proc/%d/ns/net", pid), nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, "", fmt.Errorf("deployment %s: no running pod: %w (last: %s)", d.Name, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
