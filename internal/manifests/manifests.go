// Package manifests renders natgw-controller's two ways of deployment, the
// kustomization controller/config (`kubectl kustomize`) and the Helm chart
// charts/natgw-controller (`helm template`), into objects that tests compare
// (charts/chart_test.go) and install (e2e/firstrun). The binaries are the
// ones the repository builds: kubectl in .cache/cluster/bin (make
// cluster-assets), helm in .cache/helm/bin (make helm).
package manifests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Chart is the chart's directory, relative to the repository.
const Chart = "charts/natgw-controller"

// Helm is the helm binary `make helm` builds (hack/helm/build.sh), or
// $NATGW_HELM when set.
func Helm(repo string) string { return binary("NATGW_HELM", repo, ".cache/helm/bin/helm") }

// Kubectl is the kubectl binary `make cluster-assets` builds, or
// $NATGW_KUBECTL when set (e.g. while the cluster's build is still running).
func Kubectl(repo string) string { return binary("NATGW_KUBECTL", repo, ".cache/cluster/bin/kubectl") }

func binary(env, repo, rel string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	return filepath.Join(repo, rel)
}

// Missing names the binaries among helm and kubectl that are not built,
// with the make target that builds them; "" when both are there.
func Missing(repo string) string {
	var miss []string
	if _, err := os.Stat(Helm(repo)); err != nil {
		miss = append(miss, Helm(repo)+" (make helm)")
	}
	if _, err := os.Stat(Kubectl(repo)); err != nil {
		miss = append(miss, Kubectl(repo)+" (make cluster-assets)")
	}
	return strings.Join(miss, ", ")
}

// Object is one Kubernetes object as decoded from YAML.
type Object = map[string]any

// Key is an object's identity: kind/namespace/name (namespace empty for
// cluster-scoped objects).
func Key(o Object) string {
	md, _ := o["metadata"].(map[string]any)
	ns, _ := md["namespace"].(string)
	name, _ := md["name"].(string)
	kind, _ := o["kind"].(string)
	return kind + "/" + ns + "/" + name
}

// Decode reads a multi-document YAML stream into objects keyed by Key;
// empty documents are skipped, a repeated key is an error.
func Decode(b []byte) (map[string]Object, error) {
	out := map[string]Object{}
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	for {
		var o Object
		err := d.Decode(&o)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("decode manifests: %w", err)
		}
		if len(o) == 0 {
			continue
		}
		k := Key(o)
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("decode manifests: %s twice", k)
		}
		out[k] = o
	}
}

// Keys are the keys of objs, sorted.
func Keys(objs map[string]Object) []string {
	ks := make([]string, 0, len(objs))
	for k := range objs {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// Kustomize is `kubectl kustomize DIR` (DIR relative to repo) as objects.
func Kustomize(ctx context.Context, repo, dir string) (map[string]Object, error) {
	out, err := run(ctx, Kubectl(repo), "kustomize", filepath.Join(repo, dir))
	if err != nil {
		return nil, err
	}
	return Decode(out)
}

// Template is `helm template natgw-controller charts/natgw-controller
// --namespace NS` with each value of set as a --set flag, as objects.
func Template(ctx context.Context, repo, ns string, set ...string) (map[string]Object, error) {
	out, err := TemplateRaw(ctx, repo, ns, set...)
	if err != nil {
		return nil, err
	}
	return Decode(out)
}

// TemplateRaw is Template's YAML; a value the chart refuses is an error
// that holds helm's message.
func TemplateRaw(ctx context.Context, repo, ns string, set ...string) ([]byte, error) {
	args := []string{"template", "natgw-controller", filepath.Join(repo, Chart), "--namespace", ns}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return run(ctx, Helm(repo), args...)
}

// Lint is `helm lint charts/natgw-controller` with each value of set.
func Lint(ctx context.Context, repo string, set ...string) ([]byte, error) {
	args := []string{"lint", "--strict", filepath.Join(repo, Chart)}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return run(ctx, Helm(repo), args...)
}

func run(ctx context.Context, bin string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", filepath.Base(bin), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}
