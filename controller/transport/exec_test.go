package transport

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// TestFindPod checks which gateway pod the exec transport picks: upstream's
// labels, running, container vpc-nat-gw up, not terminating, newest first.
func TestFindPod(t *testing.T) {
	now := time.Now()
	pod := func(name, app string, phase corev1.PodPhase, ready bool, age time.Duration, deleting bool) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system",
				Labels:            map[string]string{"app": app, GatewayPodLabel: "true"},
				CreationTimestamp: metav1.NewTime(now.Add(-age))},
			Status: corev1.PodStatus{Phase: phase, ContainerStatuses: []corev1.ContainerStatus{{Name: GatewayContainer, Ready: ready}}},
		}
		if deleting {
			ts := metav1.NewTime(now)
			p.DeletionTimestamp = &ts
			p.Finalizers = []string{"x"}
		}
		return p
	}
	cases := []struct {
		name string
		pods []*corev1.Pod
		want string // "" → ErrNoPod
	}{
		{"one", []*corev1.Pod{pod("vpc-nat-gw-gw1-0", "vpc-nat-gw-gw1", corev1.PodRunning, true, time.Hour, false)}, "vpc-nat-gw-gw1-0"},
		{"other-gateway", []*corev1.Pod{pod("vpc-nat-gw-gw2-0", "vpc-nat-gw-gw2", corev1.PodRunning, true, time.Hour, false)}, ""},
		{"pending", []*corev1.Pod{pod("vpc-nat-gw-gw1-0", "vpc-nat-gw-gw1", corev1.PodPending, false, time.Hour, false)}, ""},
		{"terminating-and-new", []*corev1.Pod{
			pod("old", "vpc-nat-gw-gw1", corev1.PodRunning, true, time.Hour, true),
			pod("new", "vpc-nat-gw-gw1", corev1.PodRunning, true, time.Minute, false),
		}, "new"},
		{"newest-of-two", []*corev1.Pod{
			pod("a", "vpc-nat-gw-gw1", corev1.PodRunning, true, time.Hour, false),
			pod("b", "vpc-nat-gw-gw1", corev1.PodRunning, true, time.Minute, false),
		}, "b"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			for _, p := range tc.pods {
				if _, err := cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			e := &Exec{Client: cs, Namespace: "kube-system"}
			pods, err := e.runningPods(context.Background(), "gw1")
			var got *corev1.Pod
			if err == nil {
				got = &pods[0]
			}
			if tc.want == "" {
				if !errors.Is(err, ErrNoPod) {
					t.Fatalf("got %v, %v; want ErrNoPod", got, err)
				}
				return
			}
			if err != nil || got.Name != tc.want {
				t.Fatalf("got %v, %v; want %s", got, err, tc.want)
			}
		})
	}
}

func TestServeArgs(t *testing.T) {
	got := serveArgs(Endpoint{Name: "g", Dataplane: "iptables", NetNS: "ns", ExternalInterface: "ext0"}, true, false)
	want := []string{"serve", "--dataplane", "iptables", "--netns", "ns", "--external-iface", "ext0"}
	if len(got) != len(want) {
		t.Fatalf("got %q, want %q", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("got %q, want %q", got, want)
		}
	}
	if got := serveArgs(Endpoint{Dataplane: "nftables", NetNS: "ns"}, false, false); len(got) != 3 {
		t.Errorf("exec args carry the namespace: %q", got)
	}
	if got := strings.Join(serveArgs(Endpoint{Dataplane: "nftables"}, false, true), " "); got != "serve --dataplane nftables --rules-only --synced-file /run/natgw/rules-synced" {
		t.Errorf("a replica of a two-replica gateway: %q, want it with --rules-only --synced-file", got)
	}
}

// TestExecNamespaceOf: the exec transport looks for a gateway's pods and
// reads its Lease in the namespace NamespaceOf names (the VpcNatGateway's
// spec.namespace), in Namespace when it answers "" or is nil.
func TestExecNamespaceOf(t *testing.T) {
	holder := "vpc-nat-gw-gw1-1"
	objs := []runtime.Object{
		&corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "vpc-nat-gw-gw1-0", Namespace: "team-a",
				Labels: map[string]string{"app": "vpc-nat-gw-gw1", GatewayPodLabel: "true"}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: GatewayContainer, Ready: true}}},
		},
		&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "vpc-nat-gw-gw1", Namespace: "team-a"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}},
	}
	tests := []struct {
		name       string
		of         func(context.Context, string) (string, error)
		wantPod    bool
		wantHolder string
		wantErr    string
	}{
		{name: "nil: Namespace", of: nil},
		{name: "empty answer: Namespace", of: func(context.Context, string) (string, error) { return "", nil }},
		{name: "team-a", of: func(_ context.Context, gw string) (string, error) {
			if gw != "gw1" {
				return "", fmt.Errorf("asked for %q", gw)
			}
			return "team-a", nil
		}, wantPod: true, wantHolder: holder},
		{name: "lookup fails", of: func(context.Context, string) (string, error) { return "", errors.New("cache down") }, wantErr: "gateway gw1: its namespace: cache down"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := &Exec{Client: fake.NewClientset(objs...), Namespace: "kube-system", NamespaceOf: tc.of}
			pods, err := e.runningPods(context.Background(), "gw1")
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("runningPods: %v, want %q", err, tc.wantErr)
				}
			case tc.wantPod:
				if err != nil || len(pods) != 1 || pods[0].Namespace != "team-a" {
					t.Fatalf("runningPods: %v, %v; want the pod in team-a", pods, err)
				}
			default:
				if !errors.Is(err, ErrNoPod) || !strings.Contains(err.Error(), "in namespace kube-system") {
					t.Fatalf("runningPods: %v, %v; want ErrNoPod in kube-system", pods, err)
				}
			}
			got, err := e.leaseHolder(context.Background(), "gw1")
			if tc.wantErr != "" {
				if err == nil {
					t.Fatal("leaseHolder: no error")
				}
				return
			}
			if err != nil || got != tc.wantHolder {
				t.Fatalf("leaseHolder = %q, %v; want %q", got, err, tc.wantHolder)
			}
		})
	}
}
