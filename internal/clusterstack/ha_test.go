package clusterstack

import (
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestWithoutCRDs: StartKubeOVN keeps the CRDs the cluster already has
// (natgw's NAT kinds from controller/config) and applies Kube-OVN's others;
// a document that is not YAML is an error, not dropped.
func TestWithoutCRDs(t *testing.T) {
	doc := func(name string) string {
		return "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: " + name + "\nspec:\n  group: kubeovn.io\n"
	}
	all := doc("vpc-nat-gateways.kubeovn.io") + "---\n" + doc("subnets.kubeovn.io") + "\n---\n" + doc("vips.kubeovn.io")
	have := []string{"customresourcedefinition.apiextensions.k8s.io/vpc-nat-gateways.kubeovn.io", "customresourcedefinition.apiextensions.k8s.io/iptables-eips.kubeovn.io"}
	for _, tc := range []struct {
		name string
		in   string
		have []string
		want []string
		err  bool
	}{
		{"natgw's kept", all, have, []string{"subnets.kubeovn.io", "vips.kubeovn.io"}, false},
		{"none installed", all, nil, []string{"vpc-nat-gateways.kubeovn.io", "subnets.kubeovn.io", "vips.kubeovn.io"}, false},
		{"empty documents", "---\n" + doc("subnets.kubeovn.io") + "\n---\n\n", have, []string{"subnets.kubeovn.io"}, false},
		{"not YAML", doc("subnets.kubeovn.io") + "\n---\nmetadata: [\n", nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := withoutCRDs(tc.in, tc.have)
			if tc.err {
				if err == nil || !strings.Contains(err.Error(), "Kube-OVN's CRDs") {
					t.Fatalf("err %v, want one naming Kube-OVN's CRDs", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, d := range strings.Split(out, "\n---") {
				var m struct {
					Metadata struct{ Name string } `json:"metadata"`
				}
				if err := yaml.Unmarshal([]byte(d), &m); err != nil {
					t.Fatalf("output document %q: %v", d, err)
				}
				if m.Metadata.Name != "" {
					got = append(got, m.Metadata.Name)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("kept %v, want %v", got, tc.want)
			}
		})
	}
}

// TestTaskPid: a container's pid is its RUNNING task's in `ctr tasks ls`
// (the containerd:// prefix of a pod's containerID stripped); a stopped
// task or an unknown id is 0.
func TestTaskPid(t *testing.T) {
	tasks := "TASK    PID     STATUS\nabc     1234    RUNNING\ndef     99      STOPPED\n"
	for _, tc := range []struct {
		id   string
		want int
	}{
		{"containerd://abc", 1234},
		{"abc", 1234},
		{"containerd://def", 0},
		{"containerd://xyz", 0},
		{"", 0},
	} {
		if got := TaskPID(tasks, tc.id, true); got != tc.want {
			t.Errorf("TaskPID(%q) = %d, want %d", tc.id, got, tc.want)
		}
	}
}

// TestMeasurePacedArgs: MeasurePaced refuses, before it creates anything,
// a call without targets and a target with fewer EIPs than paced FIPs
// (naming the gateway).
func TestMeasurePacedArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		tgs  []Target
		want string
	}{
		{"no target", nil, "no target"},
		{"too few EIPs", []Target{{Gateway: "a", EIPs: []string{"e0", "e1", "e2"}}, {Gateway: "b", EIPs: []string{"e0"}}}, "gateway b: 1 EIPs for 3 paced FIPs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := MeasurePaced(t.Context(), 3, tc.tgs...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one saying %q", err, tc.want)
			}
		})
	}
}
