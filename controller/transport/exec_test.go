package transport

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	if got := strings.Join(serveArgs(Endpoint{Dataplane: "nftables"}, false, true), " "); got != "serve --dataplane nftables --rules-only" {
		t.Errorf("a replica of a two-replica gateway: %q, want serve --dataplane nftables --rules-only", got)
	}
}
