package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDeployment checks that the controller runs as users deploy it: two
// replicas of the controller image from controller/config, under their own
// service account, one of them the leader, with --transport=exec, and that
// the service account is not an admin: it may exec into pods and read its
// CRDs, nothing more of what was checked.
func TestDeployment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs, err := env.c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	pods, err := cs.CoreV1().Pods(controllerNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=natgw-controller"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 2 {
		t.Fatalf("%d controller pods, want 2", len(pods.Items))
	}
	for _, p := range pods.Items {
		if p.Spec.ServiceAccountName != "natgw-controller" {
			t.Errorf("pod %s runs as service account %q", p.Name, p.Spec.ServiceAccountName)
		}
		c := p.Spec.Containers[0]
		if !strings.HasPrefix(c.Image, "docker.io/natgw/natgw-controller:") {
			t.Errorf("pod %s runs image %q", p.Name, c.Image)
		}
		if !strings.Contains(strings.Join(c.Args, " "), "--transport=exec") {
			t.Errorf("pod %s args %q lack --transport=exec", p.Name, c.Args)
		}
	}
	lease, err := cs.CoordinationV1().Leases(controllerNS).Get(ctx, controllerLease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holder := *lease.Spec.HolderIdentity
	if !strings.HasPrefix(holder, pods.Items[0].Name) && !strings.HasPrefix(holder, pods.Items[1].Name) {
		t.Errorf("lease held by %q, not one of the controller pods", holder)
	}
	for _, tc := range []struct {
		verb, resource, ns string
		want               bool
	}{
		{"create", "pods/exec", gatewayNamespace, true},
		{"get", "pods/exec", gatewayNamespace, true}, // the WebSocket upgrade
		{"list", "pods", gatewayNamespace, true},
		{"patch", "iptables-eips.kubeovn.io/status", "", true},
		{"patch", "iptables-fip-rules.kubeovn.io", "", true}, // finalizers and labels, by merge patch
		{"update", "iptables-eips.kubeovn.io/status", "", false},
		{"update", "iptables-fip-rules.kubeovn.io", "", false}, // no whole-object writes
		{"watch", "vpc-nat-gateways.kubeovn.io", "", true},
		{"create", "pods", gatewayNamespace, false},
		{"delete", "pods", gatewayNamespace, false},
		{"get", "secrets", gatewayNamespace, false},
		{"create", "deployments.apps", controllerNS, false},
		{"create", "iptables-eips.kubeovn.io", "", false},
		{"*", "*", "", false},
	} {
		resource, sub, _ := strings.Cut(tc.resource, "/")
		args := []string{"auth", "can-i", tc.verb, resource, "--as", controllerSA}
		if sub != "" {
			args = append(args, "--subresource", sub)
		}
		if tc.ns != "" {
			args = append(args, "-n", tc.ns)
		}
		out, _ := env.c.Kubectl(ctx, nil, args...) // exits 1 for "no"
		got := strings.TrimSpace(out) == "yes"
		if got != tc.want {
			t.Errorf("can the controller %s %s in %q: %q, want %v", tc.verb, tc.resource, tc.ns, strings.TrimSpace(out), tc.want)
		}
	}
}
