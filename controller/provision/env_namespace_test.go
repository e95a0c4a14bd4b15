package provision

import (
	"context"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"

	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/internal/testlog"
)

// TestEnvNamespace: on a real kube-apiserver with natgw's CRDs (which keep
// Kube-OVN master's spec.namespace), a gateway with spec.namespace gets its
// StatefulSet server-side applied in that namespace (none in the configured
// one), and once the gateway is gone and the StatefulSet deleted (the
// garbage collector's part, which envtest does not run), the provisioner
// releases it there and the API server removes it.
func TestEnvNamespace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Kube-OVN v1.16.2's CRDs for its Vpcs and Subnets, natgw's for the
	// NAT kinds (natgw's set has no Vpc or Subnet).
	c := envWithCRDs(ctx, t, crdtest.Upstream, crdtest.Natgw)
	const gwNS = "team-a"
	g := gateway()
	g.UID = ""
	g.Spec.Namespace = gwNS
	createWithNetwork(ctx, t, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: gwNS}}, g)
	if g.Spec.Namespace != gwNS {
		t.Fatalf("the API server kept spec.namespace %q, want %q", g.Spec.Namespace, gwNS)
	}
	reconcile := envReconciler(ctx, t, c, events.NewFakeRecorder(16),
		Options{Namespace: "kube-system", GatewayNamespaces: []string{gwNS}, Image: testImage, Log: testlog.New(t, 0)})
	key := types.NamespacedName{Namespace: gwNS, Name: StatefulSetName(g.Name)}
	reconcile(g.Name)
	s := &appsv1.StatefulSet{}
	if err := c.Get(ctx, key, s); err != nil {
		t.Fatalf("StatefulSet in %s: %v", gwNS, err)
	}
	if !metav1.IsControlledBy(s, g) {
		t.Errorf("StatefulSet %s/%s not controlled by the gateway: %v", s.Namespace, s.Name, s.OwnerReferences)
	}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "kube-system", Name: StatefulSetName(g.Name)}, &appsv1.StatefulSet{}); !apierrors.IsNotFound(err) {
		t.Errorf("StatefulSet in kube-system: %v, want not found", err)
	}

	if err := c.Delete(ctx, g); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, key, s); err != nil || s.DeletionTimestamp.IsZero() {
		t.Fatalf("StatefulSet after delete: %v (deletionTimestamp %v), want held by natgw's finalizer", err, s.DeletionTimestamp)
	}
	reconcile(g.Name)
	if err := c.Get(ctx, key, s); !apierrors.IsNotFound(err) {
		t.Fatalf("StatefulSet %s after the gateway went: %v (finalizers %v), want deleted", key, err, s.Finalizers)
	}
}
