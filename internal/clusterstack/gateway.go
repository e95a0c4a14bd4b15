package clusterstack

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/natgw/natgw/controller/transport"
	"github.com/natgw/natgw/internal/cluster"
)

// GatewayStatefulSet is upstream Kube-OVN's gateway StatefulSet shape
// (pkg/controller/vpc_nat_gateway.go): vpc-nat-gw-<name> in kube-system,
// container vpc-nat-gw, privileged, labelled app=vpc-nat-gw-<name> and
// ovn.kubernetes.io/vpc-nat-gw=true. The container runs the image's
// entrypoint (`/natgw pause`: the image has no `sleep`).
func GatewayStatefulSet(name, image string) *appsv1.StatefulSet {
	labels := map[string]string{"app": transport.GatewayAppPrefix + name, transport.GatewayPodLabel: "true"}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: transport.GatewayAppPrefix + name, Namespace: GatewayNamespace, Labels: labels},
		Spec: appsv1.StatefulSetSpec{
			Replicas:       ptr.To[int32](1),
			Selector:       &metav1.LabelSelector{MatchLabels: labels},
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{Type: appsv1.RollingUpdateStatefulSetStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](2),
					DNSPolicy:                     corev1.DNSDefault,
					Containers: []corev1.Container{{
						Name:            transport.GatewayContainer,
						Image:           image,
						ImagePullPolicy: corev1.PullNever,
						SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true), AllowPrivilegeEscalation: ptr.To(true)},
					}},
				},
			},
		},
	}
}

// WaitGatewayPod waits for a running pod of gateway name other than old.
func WaitGatewayPod(ctx context.Context, cs kubernetes.Interface, name string, old *corev1.Pod, limit time.Duration) (*corev1.Pod, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	sel := transport.GatewayPodSelector(name).String()
	for {
		pods, err := cs.CoreV1().Pods(GatewayNamespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err == nil {
			for i := range pods.Items {
				p := &pods.Items[i]
				if old != nil && p.UID == old.UID {
					continue
				}
				if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" &&
					len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil {
					return p, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("gateway %s: no running pod (selector %s): %w", name, sel, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// ContainerPid returns the host pid of the pod's gateway container (its
// task in containerd), whose network namespace is the pod's.
func ContainerPid(ctx context.Context, c *cluster.Cluster, pod *corev1.Pod) (int, error) {
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, err := c.Ctr(ctx, "tasks", "ls")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[0] == id {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("pod %s: container %s has no task:\n%s", pod.Name, id, out)
}
