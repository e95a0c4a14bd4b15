package provision

import (
	"encoding/json"
	"flag"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/kubeovn"
	"github.com/natgw/natgw/internal/golden"
)

var update = flag.Bool("update", false, "rewrite testdata/*.json")

// fullGateway sets every spec field Build reads (placement, routes, user
// annotations) on gateway(), with one more VPC subnet and a service CIDR.
func fullGateway() (*v1.VpcNatGateway, map[string]kubeovn.Subnet) {
	g, subs := gateway(), subnets()
	g.Spec.Selector = []string{"kubernetes.io/os: linux"}
	g.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "nat", Effect: corev1.TaintEffectNoSchedule}}
	g.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}},
	}}}
	g.Spec.Routes = []v1.Route{{CIDR: "172.16.0.0/16", NextHopIP: "gateway"}}
	g.Spec.Annotations = map[string]string{"team": "net"}
	subs["b"] = kubeovn.Subnet{Name: "b", Vpc: "vpc1", Provider: "ovn", CIDRBlock: "10.0.2.0/24", Gateway: "10.0.2.1", Validated: true}
	return g, subs
}

// TestBuildGoldenSingle: the apply configuration Build sends for a
// single-replica gateway, byte for byte. testdata/statefulset-1.json was
// written by the Build of the commit before two-replica provisioning
// existed (--ha-gateways), so this proves replicas 1 (unset, or 0 in Inputs)
// sends exactly what it sent before.
func TestBuildGoldenSingle(t *testing.T) {
	g, subs := fullGateway()
	ac, err := Build(Inputs{Gateway: g, Subnets: subs, Namespace: testNS, Image: testImage, ServiceClusterIPRange: "10.96.0.0/12"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(ac, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("testdata", "statefulset-1.json"), string(b)+"\n", *update) // go test -update rewrites it
}

// TestBuildGoldenHA: the apply configuration of the same gateway with two
// replicas (written by this Build: a change to it shows in review).
func TestBuildGoldenHA(t *testing.T) {
	g, subs := fullGateway()
	ac, err := Build(Inputs{Gateway: g, Subnets: subs, Namespace: testNS, Image: testImage, ServiceClusterIPRange: "10.96.0.0/12", Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.MarshalIndent(ac, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, filepath.Join("testdata", "statefulset-2.json"), string(b)+"\n", *update) // go test -update rewrites it
}
