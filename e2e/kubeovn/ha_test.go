package kubeovn_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestHAGatewayPods (issue 23, step 2): natgw-controller with
// --provision-gateways --ha-gateways and controller/config/ha applied turns
// a VpcNatGateway asking for two replicas into two Running pods in
// Kube-OVN's network: neither given the lanIp as its own address (it
// floats; which address Kube-OVN's IPAM gives each pod is not checked: this
// lab's kube-ovn-controller did not annotate the pods with one), the
// ServiceAccount natgw-gateway, the preferred
// hostname anti-affinity; the annotation changed to 1 on the live gateway
// leaves both pods (refused, Warning ReplicasChangeRefused) and restarts
// neither; deleting the VpcNatGateway removes them. What it does not
// check, because it is not built: `natgw ha` running in the pods, both
// pods programmed, the lanIp reachable through the active.
func TestHAGatewayPods(t *testing.T) {
	e := start(t)
	// Kube-OVN's own feature off (no gateway exists yet: nothing deleted).
	e.mustKubectl("", "-n", ns, "patch", "configmap", "ovn-vpc-nat-gw-config", "--type=merge", "-p", `{"data":{"enable-vpc-nat-gw":"false"}}`)
	e.mustKubectl("", "apply", "-k", filepath.Join(e.repo, "controller", "config", "ha"))
	e.haGateways = true
	e.startReplace(nil)
	e.mustKubectl(haManifest, "apply", "-f", "-")

	type podInfo struct {
		Metadata struct {
			Name        string            `json:"name"`
			UID         string            `json:"uid"`
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
		Spec struct {
			ServiceAccountName string `json:"serviceAccountName"`
			Affinity           struct {
				PodAntiAffinity *struct {
					Preferred []struct {
						Weight int `json:"weight"`
						Term   struct {
							TopologyKey string `json:"topologyKey"`
						} `json:"podAffinityTerm"`
					} `json:"preferredDuringSchedulingIgnoredDuringExecution"`
				} `json:"podAntiAffinity"`
			} `json:"affinity"`
		} `json:"spec"`
		Status struct {
			Phase        string `json:"phase"`
			ContainerSts []struct {
				RestartCount int `json:"restartCount"`
			} `json:"containerStatuses"`
		} `json:"status"`
	}
	pods := func() ([]podInfo, error) {
		out, err := e.kubectl("", "-n", ns, "get", "pods", "-l", "app="+stsName, "-o", "json")
		if err != nil {
			return nil, err
		}
		var l struct {
			Items []podInfo `json:"items"`
		}
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			return nil, err
		}
		return l.Items, nil
	}
	var running []podInfo
	t0 := time.Now()
	if err := eventually(e.ctx, 4*time.Minute, func() error {
		ps, err := pods()
		if err != nil {
			return err
		}
		running = running[:0]
		for _, p := range ps {
			if p.Status.Phase == "Running" {
				running = append(running, p)
			}
		}
		if len(running) != 2 {
			return fmt.Errorf("%d of %d gateway pods Running, want 2", len(running), len(ps))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("two gateway pods Running %v after the VpcNatGateway", time.Since(t0).Round(time.Millisecond))
	uids := map[string]string{}
	for _, p := range running {
		name := p.Metadata.Name
		uids[name] = p.Metadata.UID
		if p.Spec.ServiceAccountName != provision.GatewayServiceAccount {
			t.Errorf("%s: serviceAccountName %q, want %s", name, p.Spec.ServiceAccountName, provision.GatewayServiceAccount)
		}
		anti := p.Spec.Affinity.PodAntiAffinity
		if anti == nil || len(anti.Preferred) != 1 || anti.Preferred[0].Weight != 100 || anti.Preferred[0].Term.TopologyKey != "kubernetes.io/hostname" {
			t.Errorf("%s: pod anti-affinity %+v", name, anti)
		}
		// natgw gives neither pod a fixed eth0 address: the lanIp floats
		// with the active replica. (Which address Kube-OVN's IPAM gives
		// each pod is Kube-OVN's: this lab's kube-ovn-controller did not
		// annotate the pods with one, so it is not checked here.)
		if a, ok := p.Metadata.Annotations["ovn.kubernetes.io/ip_address"]; ok && a == lanIP {
			t.Errorf("%s: eth0 address is the lanIp %s (it must float, not be a pod's own)", name, lanIP)
		}
	}

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
		if uids[p.Metadata.Name] != p.Metadata.UID {
			t.Errorf("pod %s replaced after the refused change", p.Metadata.Name)
		}
	}

	e.mustKubectl("", "delete", "vpc-nat-gw", gwName, "--timeout=2m")
	if err := e.waitGone(2*time.Minute, "-n", ns, "pods", "-l", "app="+stsName); err != nil {
		t.Error(err)
	}
}
