// Package clusterstack is natgw deployed in the cluster fixture
// (internal/cluster) as users deploy it, shared by the cluster e2e
// (e2e/cluster) and bench scenario 7: the controller applied from
// controller/config, gateway pods in upstream's StatefulSet shape, and the
// measurement of the real path (FIP create→Ready through pod exec, and the
// per-request cost of a long-lived exec session against one `kubectl exec`
// per request).
package clusterstack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/natgw/natgw/gwimage/imagebuild"
	"github.com/natgw/natgw/internal/cluster"
)

// Names of the deployed controller (controller/config) and where gateway
// pods live (upstream: kube-system).
const (
	ControllerNS     = "natgw-system"
	ControllerName   = "natgw-controller"
	ControllerSA     = "system:serviceaccount:natgw-system:natgw-controller"
	ControllerLease  = "natgw-controller.kubeovn.io"
	ControllerImage  = "natgw/natgw-controller" // as controller/config names it
	GatewayNamespace = "kube-system"
)

// ControllerArchive is the controller image's archive (make image).
func ControllerArchive(repo string) string {
	return filepath.Join(repo, "gwimage/out/natgw-controller-image.tar")
}

// GatewayArchive is the image archive of data plane dp's gateways: the
// gateway image (natgw only) for nftables, its iptables variant (plus
// Debian's iptables-legacy tools) for iptables.
func GatewayArchive(repo, dp string) string {
	if dp == "iptables" {
		return filepath.Join(repo, ".cache/cluster/natgw-iptables-image.tar")
	}
	return filepath.Join(repo, "gwimage/out/natgw-image.tar")
}

// GatewayImage is the image of data plane dp's gateways as the CRI finds
// it.
func GatewayImage(repo, dp string) (string, error) {
	n, err := imagebuild.ArchiveName(GatewayArchive(repo, dp))
	if err != nil {
		return "", err
	}
	return cluster.QualifiedImage(n), nil
}

// Images are the archives the cluster imports for natgw: both gateway
// images and the controller image.
func Images(repo string) []string {
	return []string{GatewayArchive(repo, "nftables"), GatewayArchive(repo, "iptables"), ControllerArchive(repo)}
}

// ManifestImage is the controller image controller/config deploys: the
// images entry of its kustomization for ControllerImage, as newName:newTag.
func ManifestImage(repo string) (string, error) {
	p := filepath.Join(repo, "controller/config/kustomization.yaml")
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("controller manifests: %w", err)
	}
	var k struct {
		Images []struct {
			Name    string `json:"name"`
			NewName string `json:"newName"`
			NewTag  string `json:"newTag"`
		} `json:"images"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		return "", fmt.Errorf("%s: %w", p, err)
	}
	for _, im := range k.Images {
		if im.Name == ControllerImage {
			if im.NewName == "" || im.NewTag == "" {
				return "", fmt.Errorf("%s: images[%s]: want newName and newTag, got %q:%q", p, im.Name, im.NewName, im.NewTag)
			}
			return im.NewName + ":" + im.NewTag, nil
		}
	}
	return "", fmt.Errorf("%s: no images entry for %s", p, ControllerImage)
}

// DeployController applies controller/config with kubectl -k, as a user
// does (no overlay: the manifests name the image `make image` builds; an
// archive of another name, e.g. built with NATGW_VERSION overridden, is an
// error), then waits for both replicas to be ready and a leader to hold
// the lease.
func DeployController(ctx context.Context, c *cluster.Cluster, repo string) error {
	name, err := imagebuild.ArchiveName(ControllerArchive(repo))
	if err != nil {
		return err
	}
	want, err := ManifestImage(repo)
	if err != nil {
		return err
	}
	if got := cluster.QualifiedImage(name); got != cluster.QualifiedImage(want) {
		return fmt.Errorf("controller image archive %s holds %s, but controller/config deploys %s (rebuild with `make image`)", ControllerArchive(repo), got, want)
	}
	if out, err := c.Kubectl(ctx, nil, "apply", "-k", filepath.Join(repo, "controller/config")); err != nil {
		return fmt.Errorf("kubectl apply -k controller/config: %w\n%s", err, out)
	}
	// The CRDs served before anything creates their objects: a client's
	// first lookup of a kind whose CRD is not yet Established fails ("no
	// matches for kind"), which one e2e run met right after the deploy.
	crds, err := crdNames(filepath.Join(repo, "controller/config/crd"))
	if err != nil {
		return err
	}
	args := append([]string{"wait", "--for=condition=Established", "--timeout=60s"}, crds...)
	if out, err := c.Kubectl(ctx, nil, args...); err != nil {
		return fmt.Errorf("kubectl wait for natgw's CRDs to be Established: %w\n%s", err, out)
	}
	if err := waitAdmission(ctx, c, crds, time.Minute); err != nil {
		return err
	}
	return WaitController(ctx, c, 2, 3*time.Minute)
}

// admissionWarmingUp is in kube-apiserver's answer (503) while its
// MutatingAdmissionPolicy dispatcher has no type converter for a kind whose
// CRD was just created (k8s.io/apiserver admission/plugin/policy/mutating
// dispatcher.go): a create of that kind fails until it has one.
const admissionWarmingUp = "There can be a delay between when CustomResourceDefinitions are created"

// WaitAdmission waits (up to limit) until kube-apiserver's admission knows
// every natgw CRD's kind (the CRDs of repo's controller/config/crd, which
// the Helm chart installs too): waitAdmission, for a test that installed
// the CRDs another way than DeployController (e2e/firstrun: after
// `kubectl apply -k` and after `helm install`).
func WaitAdmission(ctx context.Context, c *cluster.Cluster, repo string, limit time.Duration) error {
	crds, err := crdNames(filepath.Join(repo, "controller/config/crd"))
	if err != nil {
		return err
	}
	return waitAdmission(ctx, c, crds, limit)
}

// waitAdmission waits until a server-side dry-run create of each CRD's kind
// gets past the admission policy controller/config installs (success or a
// validation error, not the 503 of a policy dispatcher that does not know
// the kind yet): one e2e run's first create failed with it right after the
// deploy.
func waitAdmission(ctx context.Context, c *cluster.Cluster, crds []string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for _, crd := range crds {
		plural, group, _ := strings.Cut(strings.TrimPrefix(crd, "crd/"), ".")
		kind, err := c.Kubectl(ctx, nil, "get", crd, "-o", "jsonpath={.spec.names.kind}")
		if err != nil {
			return fmt.Errorf("kind of %s: %w\n%s", crd, err, kind)
		}
		obj := fmt.Sprintf("apiVersion: %s/v1\nkind: %s\nmetadata:\n  name: natgw-admission-probe\nspec: {}\n", group, strings.TrimSpace(kind))
		for {
			_, err := c.Kubectl(ctx, strings.NewReader(obj), "create", "--dry-run=server", "-f", "-")
			if err == nil || !strings.Contains(err.Error(), admissionWarmingUp) {
				break // admitted, or refused by validation: admission knows the kind
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s (%s): admission still answers %q after %v", plural, group, admissionWarmingUp, limit)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	return nil
}

// WaitController waits until the controller's Deployment has replicas
// ready, available and updated, and a leader holds the lease.
func WaitController(ctx context.Context, c *cluster.Cluster, replicas int32, limit time.Duration) error {
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(limit)
	for {
		d, err := cs.AppsV1().Deployments(ControllerNS).Get(ctx, ControllerName, metav1.GetOptions{})
		if err == nil && d.Status.ReadyReplicas == replicas && d.Status.AvailableReplicas == replicas && d.Status.UpdatedReplicas == replicas {
			l, err := cs.CoordinationV1().Leases(ControllerNS).Get(ctx, ControllerLease, metav1.GetOptions{})
			if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("deployment natgw-controller: not %d/%d ready with a lease holder after %v", replicas, replicas, limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// crdNames returns crd/NAME for each CRD file of dir (controller-gen's
// GROUP_PLURAL.yaml: crd/PLURAL.GROUP).
func crdNames(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_*.yaml"))
	if err != nil {
		return nil, err
	}
	var names []string
	for _, f := range files {
		group, plural, _ := strings.Cut(strings.TrimSuffix(filepath.Base(f), ".yaml"), "_")
		names = append(names, "crd/"+plural+"."+group)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no CRD files (GROUP_PLURAL.yaml) in %s", dir)
	}
	return names, nil
}
