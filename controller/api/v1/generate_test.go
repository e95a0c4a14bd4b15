package v1_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// repoRoot is the root of the natgw module (this package is controller/api/v1).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "hack", "tools", "go.mod")); err != nil {
		t.Fatalf("repo root not found from %s: %v", root, err)
	}
	return root
}

// TestGeneratedFilesUpToDate re-runs controller-gen (as `make generate` does)
// into a temporary directory and fails when the committed deepcopy code or
// CRD manifests differ from what the types produce.
func TestGeneratedFilesUpToDate(t *testing.T) {
	root := repoRoot(t)
	tmp := t.TempDir()

	gen := filepath.Join(tmp, "controller-gen")
	build := exec.Command("go", "build", "-C", filepath.Join(root, "hack", "tools"),
		"-o", gen, "sigs.k8s.io/controller-tools/cmd/controller-gen")
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly")
	if out, err := build.CombinedOutput(); err != nil {
		t.Skipf("SKIP: cannot build controller-gen from hack/tools/go.mod (module cache cold and no module proxy?): %v\n%s", err, out)
	}

	objDir, crdDir := filepath.Join(tmp, "obj"), filepath.Join(tmp, "crd")
	run := exec.Command(filepath.Join(root, "hack", "tools", "generate.sh"), objDir, crdDir)
	run.Env = append(os.Environ(), "CONTROLLER_GEN="+gen)
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("hack/tools/generate.sh: %v\n%s", err, out)
	}

	const stale = "is stale: run `make generate` and commit the result"

	compare := func(fresh, committed string) {
		t.Helper()
		want, err := os.ReadFile(fresh)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(committed)
		if err != nil {
			t.Errorf("%s: %v; run `make generate`", rel(root, committed), err)
			return
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s %s", rel(root, committed), stale)
		}
	}

	compare(filepath.Join(objDir, "zz_generated.deepcopy.go"),
		filepath.Join(root, "controller", "api", "v1", "zz_generated.deepcopy.go"))

	fresh := yamlFiles(t, crdDir)
	if len(fresh) == 0 {
		t.Fatal("controller-gen wrote no CRDs")
	}
	committedDir := filepath.Join(root, "controller", "config", "crd")
	for _, name := range fresh {
		compare(filepath.Join(crdDir, name), filepath.Join(committedDir, name))
	}
	committed := yamlFiles(t, committedDir)
	for _, name := range committed {
		if !slices.Contains(fresh, name) {
			t.Errorf("controller/config/crd/%s is not generated from any type: remove it", name)
		}
	}

	// The CRD kustomization must list exactly the generated files.
	raw, err := os.ReadFile(filepath.Join(committedDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(raw, &k); err != nil {
		t.Fatal(err)
	}
	slices.Sort(k.Resources)
	if !slices.Equal(k.Resources, fresh) {
		t.Errorf("controller/config/crd/kustomization.yaml resources = %v, want %v", k.Resources, fresh)
	}
}

// yamlFiles lists the sorted *.yaml names in dir, without kustomization.yaml.
func yamlFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if strings.HasSuffix(n, ".yaml") && n != "kustomization.yaml" {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

func rel(root, path string) string {
	if r, err := filepath.Rel(root, path); err == nil {
		return r
	}
	return path
}
