package kubeovn_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/natgw/natgw/controller/provision"
)

// haManifest is a VpcNatGateway asking for two replicas through natgw's
// annotation (Kube-OVN v1.16.2's CRDs prune spec.replicas).
var haManifest = fmt.Sprintf(`apiVersion: kubeovn.io/v1
kind: VpcNatGateway
metadata:
  name: %[1]s
  annotations:
    %[3]s: "2"
spec:
  vpc: vpc-%[1]s
  subnet: subnet-%[1]s
  lanIp: %[2]s
`, gwName, lanIP, provision.ReplicasAnnotation)

// TestHAGatewayPods: natgw-controller with
// --provision-gateways --ha-gateways and controller/config/ha applied turns
// a VpcNatGateway asking for two replicas into two Running pods in
// Kube-OVN's network: neither given the lanIp as its own address (it
// floats; Kube-OVN's IPAM annotates each pod with another address once the
// lanIp is reserved in the Vip, which the provisioner waits for), the
// ServiceAccount natgw-gateway, the preferred
// hostname anti-affinity; the annotation changed to 1 on the live gateway
// leaves both pods (refused, Warning ReplicasChangeRefused) and restarts
// neither; deleting the VpcNatGateway removes them (and the lanIp Vip).
// Both containers of each pod (the gateway and natgw-ha) come up Ready and
// do not restart. The lanIp: natgw's Vip
// provision.LanVipName is listed in both pods' ovn.kubernetes.io/aaps and
// Kube-OVN's own controller gives it the lanIp in its status and makes it
// an OVN virtual port (checkLanVip). What it does not check: the lanIp
// reachable through the active (the lab has no OVN data path), which
// replica holds the Lease (natgw-ha's log tail is printed, not checked;
// neither pod has net1 here, so neither is healthy enough to lead):
// TestHAFailoverCluster does both, with its own external bridge and the
// lanIp on the pods' bridge network.
func TestHAGatewayPods(t *testing.T) {
	e := start(t)
	// Kube-OVN's own feature off (no gateway exists yet: nothing deleted).
	e.mustKubectl("", "-n", ns, "patch", "configmap", "ovn-vpc-nat-gw-config", "--type=merge", "-p", `{"data":{"enable-vpc-nat-gw":"false"}}`)
	e.mustKubectl("", "apply", "-k", filepath.Join(e.repo, "controller", "config", "ha"))
	e.haGateways = true
	e.startReplace(nil)
	e.mustKubectl(haManifest, "apply", "-f", "-")

	pods := func() ([]corev1.Pod, error) { return e.listPods("app=" + stsName) }
	var running []corev1.Pod
	t0 := time.Now()
	if err := eventually(e.ctx, 4*time.Minute, func() error {
		ps, err := pods()
		if err != nil {
			return err
		}
		running = running[:0]
		for _, p := range ps {
			ready := p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 2
			for _, c := range p.Status.ContainerStatuses {
				ready = ready && c.Ready
			}
			if ready {
				running = append(running, p)
			}
		}
		if len(running) != 2 {
			var st []string
			for _, p := range ps {
				st = append(st, fmt.Sprintf("%s %s %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses))
			}
			return fmt.Errorf("%d of %d gateway pods Running with both containers (vpc-nat-gw, %s) Ready, want 2: %v", len(running), len(ps), provision.HAContainer, st)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("two gateway pods Running and Ready %v after the VpcNatGateway", time.Since(t0).Round(time.Millisecond))
	uids := map[string]string{}
	for _, p := range running {
		name := p.Name
		uids[name] = string(p.UID)
		if p.Spec.ServiceAccountName != provision.GatewayServiceAccount {
			t.Errorf("%s: serviceAccountName %q, want %s", name, p.Spec.ServiceAccountName, provision.GatewayServiceAccount)
		}
		var anti *corev1.PodAntiAffinity
		var pref []corev1.WeightedPodAffinityTerm
		if p.Spec.Affinity != nil && p.Spec.Affinity.PodAntiAffinity != nil {
			anti = p.Spec.Affinity.PodAntiAffinity
			pref = anti.PreferredDuringSchedulingIgnoredDuringExecution
		}
		if anti == nil || len(pref) != 1 || pref[0].Weight != 100 || pref[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
			t.Errorf("%s: pod anti-affinity %+v", name, anti)
		}
		for _, c := range p.Status.ContainerStatuses {
			if c.RestartCount != 0 {
				t.Errorf("%s: container %s restarted %d times", name, c.Name, c.RestartCount)
			}
		}
		if a := p.Annotations[provision.AAPsAnnotation]; a != provision.LanVipName(gwName) {
			t.Errorf("%s: %s %q, want %s", name, provision.AAPsAnnotation, a, provision.LanVipName(gwName))
		}
	}
	// natgw gives neither pod a fixed eth0 address: the lanIp floats
	// with the active replica, and it is reserved in natgw's Vip before
	// the pods exist, so Kube-OVN's IPAM gives each another. (The lab's
	// pods run before kube-ovn-controller annotates them: its CNI is not
	// Kube-OVN's, which would wait for the annotation.)
	if err := eventually(e.ctx, time.Minute, func() error {
		ps, err := pods()
		if err != nil {
			return err
		}
		for _, p := range ps {
			a, ok := p.Annotations["ovn.kubernetes.io/ip_address"]
			if !ok {
				return fmt.Errorf("%s: Kube-OVN gave no eth0 address (no ovn.kubernetes.io/ip_address)", p.Name)
			}
			if a == lanIP {
				return fmt.Errorf("%s: eth0 address is the lanIp %s (it must float, not be a pod's own)", p.Name, lanIP)
			}
			t.Logf("%s: eth0 address %s from Kube-OVN's IPAM", p.Name, a)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	e.checkLanVip(t, t0)
	// What natgw-ha says in this lab (not asserted: whether a pod reaches
	// the API server for its Lease depends on the lab's pod network).
	for _, p := range running {
		out, _ := e.kubectl("", "-n", ns, "logs", p.Name, "-c", provision.HAContainer, "--tail", "3")
		t.Logf("%s %s log tail:\n%s", p.Name, provision.HAContainer, out)
	}
	active, _ := e.kubectl("", "get", "vpc-nat-gw", gwName, "-o", "jsonpath={.metadata.annotations}")
	t.Logf("VpcNatGateway annotations: %s", active)

	// 2 -> 1 on the live gateway: refused, both pods kept, none restarted.
	e.mustKubectl("", "annotate", "--overwrite", "vpc-nat-gw", gwName, provision.ReplicasAnnotation+"=1")
	if err := eventually(e.ctx, time.Minute, func() error {
		out, err := e.kubectl("", "-n", "default", "get", "events", "--field-selector", "involvedObject.name="+gwName, "-o", "jsonpath={.items[*].reason}")
		if err != nil {
			return err
		}
		if !strings.Contains(out, provision.ReasonReplicasChangeRefused) {
			return fmt.Errorf("events %q lack %s", out, provision.ReasonReplicasChangeRefused)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	if n := e.mustKubectl("", "-n", ns, "get", "sts", stsName, "-o", "jsonpath={.spec.replicas}"); n != "2" {
		t.Errorf("StatefulSet replicas %s after the refused change, want 2", n)
	}
	ps, err := pods()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if uids[p.Name] != string(p.UID) {
			t.Errorf("pod %s replaced after the refused change", p.Name)
		}
	}

	e.mustKubectl("", "delete", "vpc-nat-gw", gwName, "--timeout=2m")
	if err := e.waitGone(2*time.Minute, "-n", ns, "pods", "-l", "app="+stsName); err != nil {
		t.Error(err)
	}
	if err := eventually(e.ctx, 2*time.Minute, func() error {
		out, err := e.kubectl("", "get", "vips", "-o", "name")
		if err != nil {
			return err
		}
		if strings.Contains(out, provision.LanVipName(gwName)) {
			return fmt.Errorf("vip %s still there after its VpcNatGateway was deleted", provision.LanVipName(gwName))
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// checkLanVip: natgw's lanIp Vip (provision.NewLanVip) is controlled by the
// VpcNatGateway; Kube-OVN's own controller reserves the lanIp for it
// (status.v4ip, status.mac) and creates the OVN virtual logical switch port
// named after it (type virtual, options:virtual-ip the lanIp) whose
// virtual parents are both gateway pods' ports.
func (e *env) checkLanVip(t *testing.T, t0 time.Time) {
	t.Helper()
	name := provision.LanVipName(gwName)
	var vip struct {
		Metadata struct {
			OwnerReferences []struct {
				Kind       string `json:"kind"`
				Name       string `json:"name"`
				Controller bool   `json:"controller"`
			} `json:"ownerReferences"`
		} `json:"metadata"`
		Spec struct {
			V4ip string `json:"v4ip"`
		} `json:"spec"`
		Status struct {
			V4ip string `json:"v4ip"`
			Mac  string `json:"mac"`
		} `json:"status"`
	}
	if err := eventually(e.ctx, 2*time.Minute, func() error {
		out, err := e.kubectl("", "get", "vip", name, "-o", "json")
		if err != nil {
			return err
		}
		if err := json.Unmarshal([]byte(out), &vip); err != nil {
			return err
		}
		if vip.Status.V4ip != lanIP || vip.Status.Mac == "" {
			return fmt.Errorf("vip %s status v4ip %q mac %q, want the lanIp %s and a MAC from Kube-OVN", name, vip.Status.V4ip, vip.Status.Mac, lanIP)
		}
		return nil
	}); err != nil {
		t.Error(err)
		return
	}
	t.Logf("vip %s: Kube-OVN reserved %s (MAC %s) %v after the VpcNatGateway", name, vip.Status.V4ip, vip.Status.Mac, time.Since(t0).Round(time.Millisecond))
	if o := vip.Metadata.OwnerReferences; len(o) != 1 || o[0].Kind != "VpcNatGateway" || o[0].Name != gwName || !o[0].Controller {
		t.Errorf("vip %s owner references %+v, want the VpcNatGateway %s as controller", name, o, gwName)
	}
	nb := func(args ...string) (string, error) {
		out, err := exec.CommandContext(e.ctx, "ovn-nbctl", append([]string{"--db=" + e.k.NBAddr(), "--timeout=10"}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	want := []string{podName + "." + ns, stsName + "-1." + ns}
	if err := eventually(e.ctx, time.Minute, func() error {
		typ, err := nb("get", "Logical_Switch_Port", name, "type")
		if err != nil {
			return fmt.Errorf("ovn-nbctl get Logical_Switch_Port %s: %v: %s", name, err, typ)
		}
		ip, _ := nb("get", "Logical_Switch_Port", name, "options:virtual-ip")
		parents, _ := nb("get", "Logical_Switch_Port", name, "options:virtual-parents")
		parents = strings.Trim(parents, `"`)
		got := strings.Split(parents, ",")
		if typ != "virtual" || strings.Trim(ip, `"`) != lanIP || len(got) != 2 || !slices.Contains(got, want[0]) || !slices.Contains(got, want[1]) {
			return fmt.Errorf("OVN port %s: type %q virtual-ip %s virtual-parents %q, want virtual, %s, %v", name, typ, ip, parents, lanIP, want)
		}
		return nil
	}); err != nil {
		t.Error(err)
		return
	}
	t.Logf("OVN virtual port %s (virtual-ip %s, virtual-parents %v) made by Kube-OVN's controller", name, lanIP, want)
}
