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
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// DeployController applies controller/config with kubectl -k through an
// overlay that only points the image at the archive's name and tag, then
// waits for both replicas to be ready and a leader to hold the lease.
func DeployController(ctx context.Context, c *cluster.Cluster, repo string) error {
	name, err := imagebuild.ArchiveName(ControllerArchive(repo))
	if err != nil {
		return err
	}
	ref := cluster.QualifiedImage(name)
	i := strings.LastIndex(ref, ":")
	if i < 0 {
		return fmt.Errorf("controller image %q has no tag", ref)
	}
	dir, err := os.MkdirTemp("", "natgw-overlay-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	base, err := filepath.Rel(dir, filepath.Join(repo, "controller/config"))
	if err != nil {
		return err
	}
	overlay := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
images:
  - name: %s
    newName: %s
    newTag: %s
`, base, ControllerImage, ref[:i], ref[i+1:])
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(overlay), 0o644); err != nil {
		return err
	}
	if out, err := c.Kubectl(ctx, nil, "apply", "-k", dir); err != nil {
		return fmt.Errorf("kubectl apply -k controller/config: %w\n%s", err, out)
	}
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		d, err := cs.AppsV1().Deployments(ControllerNS).Get(ctx, ControllerName, metav1.GetOptions{})
		if err == nil && d.Status.ReadyReplicas == 2 && d.Status.AvailableReplicas == 2 && d.Status.UpdatedReplicas == 2 {
			l, err := cs.CoordinationV1().Leases(ControllerNS).Get(ctx, ControllerLease, metav1.GetOptions{})
			if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("deployment natgw-controller: not 2/2 ready with a lease holder after 3m")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
