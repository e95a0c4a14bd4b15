package clusterstack

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/cluster"
)

// TestCRDNames: the names DeployController waits for are natgw's CRDs as
// controller/config/crd holds them (controller-gen's GROUP_PLURAL.yaml).
func TestCRDNames(t *testing.T) {
	repo, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	got, err := crdNames(filepath.Join(repo, "controller/config/crd"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"crd/iptables-dnat-rules.kubeovn.io", "crd/iptables-eips.kubeovn.io", "crd/iptables-fip-rules.kubeovn.io",
		"crd/iptables-snat-rules.kubeovn.io", "crd/qos-policies.kubeovn.io", "crd/vpc-nat-gateways.kubeovn.io"}
	if !slices.Equal(got, want) {
		t.Errorf("crdNames = %v, want %v", got, want)
	}
	if _, err := crdNames(t.TempDir()); err == nil {
		t.Error("an empty directory gave no error")
	}
}

// TestWaitAdmissionNoCRDs: WaitAdmission reads the CRDs from the repo it
// is given and says so when there are none (before any kubectl call).
func TestWaitAdmissionNoCRDs(t *testing.T) {
	dir := t.TempDir()
	err := WaitAdmission(t.Context(), nil, dir, time.Second)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "controller/config/crd")) {
		t.Fatalf("WaitAdmission without CRDs: %v, want the crd folder named", err)
	}
}
