package kubeovn_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// listPods lists the pods in the gateway namespace with label selector
// selector, as kubectl gets them.
func (e *env) listPods(selector string) ([]corev1.Pod, error) {
	out, err := e.kubectl("", "-n", ns, "get", "pods", "-l", selector, "-o", "json")
	if err != nil {
		return nil, err
	}
	var l corev1.PodList
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		return nil, fmt.Errorf("pods -l %s: %w", selector, err)
	}
	return l.Items, nil
}

// getPod reads the pod name in the gateway namespace, as kubectl gets it.
func (e *env) getPod(name string) (*corev1.Pod, error) {
	out, err := e.kubectl("", "-n", ns, "get", "pod", name, "-o", "json")
	if err != nil {
		return nil, err
	}
	p := &corev1.Pod{}
	if err := json.Unmarshal([]byte(out), p); err != nil {
		return nil, fmt.Errorf("pod %s: %w", name, err)
	}
	return p, nil
}

// waitWorkloadGone waits (2 minutes at most) until the gateway's
// StatefulSet and pods are gone; after says what should have removed
// them, for the error.
func (e *env) waitWorkloadGone(ctx context.Context, after string) error {
	return eventually(ctx, 2*time.Minute, func() error {
		out, err := e.kubectl("", "-n", ns, "get", "sts,pods", "-l", "app="+stsName, "-o", "name")
		if err != nil {
			return err
		}
		if s := strings.TrimSpace(out); s != "" {
			return fmt.Errorf("still there after %s: %s", after, strings.ReplaceAll(s, "\n", " "))
		}
		return nil
	})
}
