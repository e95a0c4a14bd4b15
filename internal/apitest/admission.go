package apitest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// AdmissionDir is the checkout's controller/config/admission: the
// MutatingAdmissionPolicy (and its binding) that puts natgw's finalizer on
// NAT objects at creation.
func AdmissionDir() string {
	return filepath.Join(RepoRoot(), "controller", "config", "admission")
}

// AdmissionFinalizer is the finalizer the policy adds (the controller's
// reconciler.Finalizer; this package cannot import the controller).
const AdmissionFinalizer = "natgw.kubeovn.io/finalizer"

// AdmissionOptions shape InstallAdmission.
type AdmissionOptions struct {
	// Dir holds the manifests (default AdmissionDir()).
	Dir string
	// BindingSuffix and Selector, when set, rename the binding (name +
	// "-" + suffix) and limit it to objects with these labels: tests that
	// share one API server install the policy as shipped and a binding of
	// their own, so tests without the policy see none of it.
	BindingSuffix string
	Selector      map[string]string
	// Wait bounds how long InstallAdmission waits for the policy to take
	// effect (default 30 s).
	Wait time.Duration
}

// InstallAdmission creates the admission manifests (every YAML document of
// Dir except kustomization.yaml) as kubectl apply -k would, and waits until
// the API server enforces them: a dry-run create of an IptablesEIP that the
// binding matches comes back with the finalizer. The kubeovn.io CRDs must be
// installed. Objects that already exist are left as they are.
func InstallAdmission(ctx context.Context, cfg *rest.Config, o AdmissionOptions) error {
	if o.Dir == "" {
		o.Dir = AdmissionDir()
	}
	if o.Wait <= 0 {
		o.Wait = 30 * time.Second
	}
	objs, err := readManifests(o.Dir)
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return fmt.Errorf("admission: client: %w", err)
	}
	bindings := 0
	for _, u := range objs {
		if u.GetKind() == "MutatingAdmissionPolicyBinding" {
			bindings++
			if o.BindingSuffix != "" {
				u.SetName(u.GetName() + "-" + o.BindingSuffix)
			}
			if len(o.Selector) > 0 {
				sel := map[string]any{}
				for k, v := range o.Selector {
					sel[k] = v
				}
				if err := unstructured.SetNestedMap(u.Object, map[string]any{"matchLabels": sel}, "spec", "matchResources", "objectSelector"); err != nil {
					return fmt.Errorf("admission: binding selector: %w", err)
				}
			}
		}
		if err := c.Create(ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("admission: create %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	if bindings == 0 {
		return fmt.Errorf("admission: no MutatingAdmissionPolicyBinding in %s", o.Dir)
	}
	// The API server loads policies asynchronously (and serves freshly
	// installed CRDs after a moment): probe until the policy applies.
	var last error
	probe := func() (bool, error) {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("kubeovn.io/v1")
		u.SetKind("IptablesEIP")
		u.SetGenerateName("natgw-admission-probe-")
		u.SetLabels(o.Selector)
		u.Object["spec"] = map[string]any{"natGwDp": "natgw-admission-probe"}
		if err := c.Create(ctx, u, client.DryRunAll); err != nil {
			last = fmt.Errorf("dry-run create of a probe IptablesEIP: %w", err)
			return false, nil
		}
		if slices.Contains(u.GetFinalizers(), AdmissionFinalizer) {
			return true, nil
		}
		last = errors.New("a dry-run create of a probe IptablesEIP came back without the finalizer")
		return false, nil
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, o.Wait, true, func(context.Context) (bool, error) { return probe() }); err != nil {
		return fmt.Errorf("admission: policy from %s not in effect within %v: %w", o.Dir, o.Wait, errors.Join(err, last))
	}
	return nil
}

// readManifests decodes every YAML document of dir's *.yaml files but the
// kustomization.
func readManifests(dir string) ([]*unstructured.Unstructured, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("admission: %w", err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("admission: %s: %w", f, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			u := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(doc, &u.Object); err != nil {
				return nil, fmt.Errorf("admission: %s: %w", f, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			out = append(out, u)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("admission: no manifests in %s", dir)
	}
	return out, nil
}
