package clusterstack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/natgw/natgw/controller/provision"
	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/kubeovn"
	"github.com/natgw/natgw/internal/netlab"
)

// ReplicaPod is one running pod of a provisioned gateway (one or two
// replicas) as a test reaches it: its network namespace (the gateway
// container's task) and, for a two-replica gateway, the host pid of its
// natgw-ha container's process.
type ReplicaPod struct {
	Name, UID, IP string
	// ExtIP is Kube-OVN's external address annotation
	// (kubeovn.ExternalIPAnnotation): what Multus would give net1.
	ExtIP string
	NetNS string
	// HAPID and HARestarts are the natgw-ha container's (0 without one).
	HAPID, HARestarts int
	// Ready: every container Ready.
	Ready bool
}

// ReplicaPods lists gateway gw's pods in namespace that run (not being
// deleted) with exactly containers containers started (1: a single
// gateway; 2: the gateway and natgw-ha), each with its namespace and
// natgw-ha pid, sorted by name.
func ReplicaPods(ctx context.Context, c *cluster.Cluster, namespace, gw string, containers int) ([]ReplicaPod, error) {
	cs, err := c.Clientset()
	if err != nil {
		return nil, err
	}
	pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + transport.GatewayAppPrefix + gw})
	if err != nil {
		return nil, fmt.Errorf("gateway %s: list pods: %w", gw, err)
	}
	tasks, err := c.Ctr(ctx, "tasks", "ls")
	if err != nil {
		return nil, err
	}
	var ps []ReplicaPod
	for _, it := range pods.Items {
		if it.DeletionTimestamp != nil || it.Status.Phase != corev1.PodRunning || len(it.Status.ContainerStatuses) != containers {
			continue
		}
		p := ReplicaPod{Name: it.Name, UID: string(it.UID), IP: it.Status.PodIP, ExtIP: it.Annotations[kubeovn.ExternalIPAnnotation], Ready: true}
		for _, st := range it.Status.ContainerStatuses {
			p.Ready = p.Ready && st.Ready
			if st.State.Running == nil {
				p.Ready = false
				continue
			}
			pid := TaskPID(tasks, st.ContainerID, true)
			switch st.Name {
			case provision.HAContainer:
				p.HAPID, p.HARestarts = pid, int(st.RestartCount)
			default:
				if pid != 0 {
					p.NetNS = fmt.Sprintf("/proc/%d/ns/net", pid)
				}
			}
		}
		if p.NetNS == "" || p.IP == "" || (containers == 2 && p.HAPID == 0) {
			continue
		}
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b ReplicaPod) int { return strings.Compare(a.Name, b.Name) })
	return ps, nil
}

// TaskPID returns the host pid of the task of the container containerID
// (a container status's, "containerd://" prefixed or not) in tasks (the
// output of `ctr tasks ls`), 0 when there is none; with running, only a
// task in state RUNNING counts.
func TaskPID(tasks, containerID string, running bool) int {
	id := strings.TrimPrefix(containerID, "containerd://")
	for _, line := range strings.Split(tasks, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == id && (!running || f[2] == "RUNNING") {
			var pid int
			if _, err := fmt.Sscan(f[1], &pid); err == nil {
				return pid
			}
		}
	}
	return 0
}

// AttachBridge does Multus's part for one replica: net1 in the pod with
// the address Kube-OVN's annotation names (prefix length bits), its peer
// port in namespace ext enslaved to bridge there (the shared external
// network the replicas of a gateway sit on, as OVN's external logical
// switch would be).
func AttachBridge(p ReplicaPod, bits int, ext, port, bridge string) error {
	a, err := netip.ParseAddr(p.ExtIP)
	if err != nil {
		return fmt.Errorf("pod %s: annotation %s=%q: %w", p.Name, kubeovn.ExternalIPAnnotation, p.ExtIP, err)
	}
	if err := netlab.Veth(netlab.End{NS: p.NetNS, Name: "net1", Addrs: []netip.Prefix{netip.PrefixFrom(a, bits)}}, netlab.End{NS: ext, Name: port}); err != nil {
		return fmt.Errorf("pod %s: attach net1: %w", p.Name, err)
	}
	return netlab.Enslave(ext, port, bridge)
}

// KubeOVNSetup is what StartKubeOVN brings up: Kube-OVN's controller on
// the cluster, with the objects of Network (external subnet, VPC and its
// subnet) for gateways running image.
type KubeOVNSetup struct {
	Repo    string
	Cluster cluster.Config // NodeName, NodeIP (cluster.Defaults)
	Image   string
	Network kubeovn.Network
}

// KubeOVNConfig is the kube-ovn-controller configuration of s (the binary
// hack/kubeovn/build.sh builds, its run directory in .cache).
func (s KubeOVNSetup) KubeOVNConfig(c *cluster.Cluster) kubeovn.Config {
	kc := kubeovn.Config{
		Controller: s.Repo + "/.cache/kubeovn/bin/kube-ovn-controller",
		NodeName:   s.Cluster.NodeName, NodeIP: s.Cluster.NodeIP,
		Dir: s.Repo + "/.cache/kubeovn/run",
		Log: s.Cluster.Log,
	}
	if c != nil {
		kc.Kubeconfig = c.Kubeconfig()
	}
	return kc
}

// StartKubeOVN is InstallKubeOVN, RunKubeOVN and KubeOVNFeatureOff: Kube-OVN's
// controller running for natgw-controller --provision-gateways. The caller
// stops the returned controller; on error nothing is left running.
func StartKubeOVN(ctx context.Context, c *cluster.Cluster, s KubeOVNSetup) (*kubeovn.KubeOVN, error) {
	if err := InstallKubeOVN(ctx, c, s); err != nil {
		return nil, err
	}
	k, err := RunKubeOVN(ctx, c, s)
	if err == nil {
		err = KubeOVNFeatureOff(ctx, c)
	}
	if err != nil && k != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		return nil, errors.Join(err, k.Stop(sctx))
	}
	return k, err
}

// InstallKubeOVN installs what kube-ovn-controller needs before it starts:
// Kube-OVN's CRDs (those of kinds the cluster does not define yet: natgw's
// own CRDs of the NAT kinds, when controller/config installed them, stay),
// the NAD CRD, and s.Network's objects for gateways of s.Image.
func InstallKubeOVN(ctx context.Context, c *cluster.Cluster, s KubeOVNSetup) error {
	if why := kubeovn.Missing(s.KubeOVNConfig(c)); why != "" {
		return fmt.Errorf("%s (`make kubeovn-assets` builds it)", why)
	}
	crds, err := kubeovn.CRDs(ctx)
	if err != nil {
		return err
	}
	have, err := c.Kubectl(ctx, nil, "get", "crd", "-o", "name")
	if err != nil {
		return fmt.Errorf("list CRDs: %w\n%s", err, have)
	}
	crds, err = withoutCRDs(crds, strings.Fields(have))
	if err != nil {
		return err
	}
	apply := func(what, y string) error {
		if out, err := c.Kubectl(ctx, strings.NewReader(y), "apply", "--server-side", "-f", "-"); err != nil {
			return fmt.Errorf("apply %s: %w\n%s", what, err, out)
		}
		return nil
	}
	if err := apply("Kube-OVN's CRDs", crds); err != nil {
		return err
	}
	if err := apply("the NAD CRD", kubeovn.Prerequisites()); err != nil {
		return err
	}
	if out, err := c.Kubectl(ctx, nil, "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"); err != nil {
		return fmt.Errorf("CRDs not Established: %w\n%s", err, out)
	}
	return apply("Kube-OVN's objects", kubeovn.Objects(s.Image, s.Network))
}

// RunKubeOVN starts kube-ovn-controller (InstallKubeOVN done) and waits
// (2 min) until it handles the VPC (its status.standby). Once the
// controller started it is returned, also with a wait's error, so that
// the caller can read its output (OutputPath) before it stops it.
func RunKubeOVN(ctx context.Context, c *cluster.Cluster, s KubeOVNSetup) (*kubeovn.KubeOVN, error) {
	k, err := kubeovn.Start(ctx, s.KubeOVNConfig(c))
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if err := k.Alive(); err != nil {
			return k, err
		}
		out, err := c.Kubectl(ctx, nil, "get", "vpc", s.Network.VPC, "-o", "jsonpath={.status.standby}")
		if err == nil && out == "true" {
			return k, nil
		}
		if time.Now().After(deadline) {
			return k, fmt.Errorf("kube-ovn-controller: vpc %s status.standby=%q after 2m (%v)", s.Network.VPC, out, err)
		}
		select {
		case <-ctx.Done():
			return k, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// KubeOVNFeatureOff turns Kube-OVN's own VPC NAT gateway feature off
// (natgw-controller --provision-gateways provisions the gateways), as
// controller/docs/operations.md tells users to.
func KubeOVNFeatureOff(ctx context.Context, c *cluster.Cluster) error {
	if out, err := c.Kubectl(ctx, nil, "-n", GatewayNamespace, "patch", "configmap", "ovn-vpc-nat-gw-config", "--type=merge",
		"-p", `{"data":{"enable-vpc-nat-gw":"false"}}`); err != nil {
		return fmt.Errorf("turn Kube-OVN's VPC NAT gateway off: %w\n%s", err, out)
	}
	return nil
}

// withoutCRDs drops from the YAML stream y the CRDs named in have
// ("customresourcedefinition.apiextensions.k8s.io/NAME", kubectl's -o name).
func withoutCRDs(y string, have []string) (string, error) {
	skip := map[string]bool{}
	for _, h := range have {
		_, name, _ := strings.Cut(h, "/")
		skip[name] = true
	}
	var keep []string
	for _, doc := range strings.Split(y, "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var m struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			return "", fmt.Errorf("Kube-OVN's CRDs: %w", err)
		}
		if m.Metadata.Name == "" || skip[m.Metadata.Name] {
			continue
		}
		keep = append(keep, doc)
	}
	return strings.Join(keep, "\n---"), nil
}

// EnableHAProvisioning turns the natgw-controller DeployController
// deployed into the two-replica provisioner the product documents
// (controller/docs/operations.md, "Two-replica gateways"): its Deployment
// gets --provision-gateways --ha-gateways --gateway-image=image, and
// controller/config/ha (the gateway pods' ServiceAccount and Lease RBAC) is
// applied; it waits for the rollout and a lease holder.
func EnableHAProvisioning(ctx context.Context, c *cluster.Cluster, repo, image string) error {
	if out, err := c.Kubectl(ctx, nil, "apply", "-k", repo+"/controller/config/ha"); err != nil {
		return fmt.Errorf("kubectl apply -k controller/config/ha: %w\n%s", err, out)
	}
	var ops []string
	for _, a := range []string{"--provision-gateways", "--ha-gateways", "--gateway-image=" + image} {
		ops = append(ops, fmt.Sprintf(`{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":%q}`, a))
	}
	if out, err := c.Kubectl(ctx, nil, "-n", ControllerNS, "patch", "deployment", ControllerName, "--type=json", "-p", "["+strings.Join(ops, ",")+"]"); err != nil {
		return fmt.Errorf("patch natgw-controller's arguments: %w\n%s", err, out)
	}
	if out, err := c.Kubectl(ctx, nil, "-n", ControllerNS, "rollout", "status", "deployment/"+ControllerName, "--timeout=3m"); err != nil {
		return fmt.Errorf("natgw-controller rollout: %w\n%s", err, out)
	}
	return WaitController(ctx, c, 2, 3*time.Minute)
}

// WaitReplicaPods waits (up to limit) until gateway gw has n running pods
// (containers each), every one Ready when ready is set.
func WaitReplicaPods(ctx context.Context, c *cluster.Cluster, namespace, gw string, n, containers int, ready bool, limit time.Duration) ([]ReplicaPod, error) {
	deadline := time.Now().Add(limit)
	for {
		ps, err := ReplicaPods(ctx, c, namespace, gw, containers)
		if err == nil {
			ok := len(ps) == n
			for _, p := range ps {
				ok = ok && (p.Ready || !ready) && p.ExtIP != ""
			}
			if ok {
				return ps, nil
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("gateway %s: want %d running pods (%d containers, ready=%v, with %s) after %v, have %+v (%v)",
				gw, n, containers, ready, kubeovn.ExternalIPAnnotation, limit, ps, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
