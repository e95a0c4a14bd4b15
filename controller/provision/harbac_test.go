package provision

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/nat/ha"
	"github.com/natgw/natgw/nat/ha/leasefence"
)

// haRBAC reads controller/config/ha/gateway_lease.yaml: the gateway pods'
// ServiceAccount, Role and RoleBinding, as shipped.
func haRBAC(t *testing.T) (*corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(apitest.RepoRoot(), "controller", "config", "ha", "gateway_lease.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := bytes.Split(b, []byte("\n---\n"))
	if len(docs) != 3 {
		t.Fatalf("gateway_lease.yaml: %d documents, want 3", len(docs))
	}
	sa, role, rb := &corev1.ServiceAccount{}, &rbacv1.Role{}, &rbacv1.RoleBinding{}
	for i, o := range []any{sa, role, rb} {
		if err := yaml.UnmarshalStrict(docs[i], o); err != nil {
			t.Fatalf("gateway_lease.yaml document %d: %v", i, err)
		}
	}
	return sa, role, rb
}

// TestHARBAC: the RBAC of controller/config/ha lets a two-replica
// gateway's pod (ServiceAccount GatewayServiceAccount, the one Build puts
// in the pod template) run `natgw ha`'s Lease fence on the gateway's
// Lease (LeaseName) against a real kube-apiserver (envtest, RBAC
// authorization), as the pod would (impersonated): refused before the
// objects exist; then acquire, renew, release, a second replica's
// acquire; get a pod of its namespace (`natgw ha --peer-sibling`); and
// nothing more (no delete, no other namespace, no pod list).
// natgw-controller (controller_leases.yaml) may get, list and watch the
// Leases there, and nothing more of them.
func TestHARBAC(t *testing.T) {
	sa, role, rb := haRBAC(t)
	if sa.Name != GatewayServiceAccount || rb.Subjects[0].Name != GatewayServiceAccount || rb.RoleRef.Name != role.Name {
		t.Fatalf("ServiceAccount %q, RoleBinding subject %q and role %q: want %q bound to Role %q", sa.Name, rb.Subjects[0].Name, rb.RoleRef.Name, GatewayServiceAccount, role.Name)
	}
	const ns = "kube-system" // controller/config/ha's namespace (Kube-OVN's gateway namespace)
	for _, o := range []metav1.Object{sa, role, rb} {
		if o.GetNamespace() != ns {
			t.Fatalf("%s in namespace %q, want %s", o.GetName(), o.GetNamespace(), ns)
		}
	}
	assets := apitest.RequireAssets(t)
	cfg := apitest.StartT(t, apitest.Environment(assets, apitest.CRDDir()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pod := rest.CopyConfig(cfg)
	pod.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + GatewayServiceAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	podClient, err := kubernetes.NewForConfig(pod)
	if err != nil {
		t.Fatal(err)
	}
	lease := LeaseName("gw1")
	fence := func() *leasefence.Fence {
		f, err := leasefence.ForConfig(pod, ns, lease)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	ttl := 2 * time.Second

	// Without the RBAC the pod may not (the test's own control).
	if err := fence().Acquire(ctx, "vpc-nat-gw-gw1-0", ttl); !apierrors.IsForbidden(err) {
		t.Fatalf("Acquire without the RBAC: %v, want Forbidden", err)
	}

	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// RBAC takes effect through the authorizer's informers: wait for it.
	a := fence()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := a.Acquire(ctx, "vpc-nat-gw-gw1-0", ttl)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire with the RBAC: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := a.Acquire(ctx, "vpc-nat-gw-gw1-0", ttl); err != nil {
		t.Fatalf("renew: %v", err)
	}
	b := fence()
	if err := b.Acquire(ctx, "vpc-nat-gw-gw1-1", ttl); !errors.Is(err, ha.ErrHeld) {
		t.Fatalf("second replica's Acquire while held: %v, want ErrHeld", err)
	}
	if err := a.Release(ctx, "vpc-nat-gw-gw1-0"); err != nil {
		t.Fatalf("release: %v", err)
	}
	if err := b.Acquire(ctx, "vpc-nat-gw-gw1-1", ttl); err != nil {
		t.Fatalf("second replica's Acquire after the release: %v", err)
	}
	l, err := admin.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h == nil || *h != "vpc-nat-gw-gw1-1" {
		t.Errorf("Lease %s/%s holder %v, want vpc-nat-gw-gw1-1", ns, lease, h)
	}

	// natgw-controller reads the Leases (controller_leases.yaml), only.
	b2, err := os.ReadFile(filepath.Join(apitest.RepoRoot(), "controller", "config", "ha", "controller_leases.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := bytes.Split(b2, []byte("\n---\n"))
	crole, crb := &rbacv1.Role{}, &rbacv1.RoleBinding{}
	if len(docs) != 2 || yaml.UnmarshalStrict(docs[0], crole) != nil || yaml.UnmarshalStrict(docs[1], crb) != nil {
		t.Fatalf("controller_leases.yaml: want a Role and a RoleBinding")
	}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, crole, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctl := rest.CopyConfig(cfg)
	ctl.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:natgw-system:natgw-controller",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:natgw-system", "system:authenticated"},
	}
	ctlClient, err := kubernetes.NewForConfig(ctl)
	if err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		_, err := ctlClient.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("natgw-controller lists Leases in %s: %v", ns, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	w, err := ctlClient.CoordinationV1().Leases(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("natgw-controller watches Leases in %s: %v", ns, err)
	}
	w.Stop()
	if _, err := ctlClient.CoordinationV1().Leases(ns).Get(ctx, lease, metav1.GetOptions{}); err != nil {
		t.Errorf("natgw-controller gets Lease %s: %v", lease, err)
	}
	for what, err := range map[string]error{
		"natgw-controller updates the Lease": func() error {
			_, err := ctlClient.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
			return err
		}(),
		"natgw-controller lists Leases in default": func() error {
			_, err := ctlClient.CoordinationV1().Leases("default").List(ctx, metav1.ListOptions{})
			return err
		}(),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", what, err)
		}
	}

	// natgw ha --peer-sibling reads the other pod: get in its namespace
	// (an absent pod is NotFound, not Forbidden).
	if _, err := podClient.CoreV1().Pods(ns).Get(ctx, "vpc-nat-gw-gw1-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("get the sibling pod: %v, want NotFound (allowed, absent)", err)
	}
	// Nothing more than the fence and the sibling's address need.
	for what, err := range map[string]error{
		"get a pod in default": func() error {
			_, err := podClient.CoreV1().Pods("default").Get(ctx, "x", metav1.GetOptions{})
			return err
		}(),
		"delete the Lease": podClient.CoordinationV1().Leases(ns).Delete(ctx, lease, metav1.DeleteOptions{}),
		"get a Lease in default": func() error {
			_, err := podClient.CoordinationV1().Leases("default").Get(ctx, lease, metav1.GetOptions{})
			return err
		}(),
		"list pods in its namespace": func() error { _, err := podClient.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); return err }(),
		"list Leases": func() error {
			_, err := podClient.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
			return err
		}(),
	} {
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", what, err)
		}
	}
}
