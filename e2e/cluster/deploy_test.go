package cluster_test

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

const (
	controllerNS     = "natgw-system"
	controllerName   = "natgw-controller"
	controllerSA     = "system:serviceaccount:natgw-system:natgw-controller"
	controllerLease  = "natgw-controller.kubeovn.io"
	controllerImage  = "natgw/natgw-controller" // as controller/config names it
	gatewayNamespace = "kube-system"
)

// deployController applies controller/config with kubectl -k through an
// overlay that only points the image at the archive's name and tag, then
// waits for both replicas to be ready and a leader to hold the lease.
func deployController(ctx context.Context, c *cluster.Cluster, repo string) error {
	name, err := imagebuild.ArchiveName(filepath.Join(repo, "gwimage/out/natgw-controller-image.tar"))
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
`, base, controllerImage, ref[:i], ref[i+1:])
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(overlay), 0o644); err != nil {
		return err
	}
	if out, err := c.Kubectl(ctx, nil, "apply", "-k", dir); err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	cs, err := c.Clientset()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		d, err := cs.AppsV1().Deployments(controllerNS).Get(ctx, controllerName, metav1.GetOptions{})
		if err == nil && d.Status.ReadyReplicas == 2 && d.Status.AvailableReplicas == 2 && d.Status.UpdatedReplicas == 2 {
			l, err := cs.CoordinationV1().Leases(controllerNS).Get(ctx, controllerLease, metav1.GetOptions{})
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
