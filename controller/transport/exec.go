package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/nat"
)

// Upstream Kube-OVN's names for the gateway pod.
const (
	// GatewayContainer is the container of the gateway pod the agent runs in.
	GatewayContainer = "vpc-nat-gw"
	// GatewayPodLabel marks every gateway pod ("true").
	GatewayPodLabel = "ovn.kubernetes.io/vpc-nat-gw"
	// GatewayAppPrefix + gateway name is the pod's "app" label.
	GatewayAppPrefix = "vpc-nat-gw-"
)

// GatewayPodSelector selects the pods of gateway name as upstream labels
// them: app=vpc-nat-gw-<name>, ovn.kubernetes.io/vpc-nat-gw=true.
func GatewayPodSelector(name string) labels.Selector {
	return labels.SelectorFromSet(labels.Set{"app": GatewayAppPrefix + name, GatewayPodLabel: "true"})
}

// Exec runs `natgw serve --dataplane DP` in the gateway pod's `vpc-nat-gw`
// container through the pod-exec API (WebSocket, falling back to SPDY), one
// long-lived exec session per gateway pod. This is the only channel that
// always reaches a gateway in a cluster: its eth0 sits in an isolated VPC.
type Exec struct {
	// Config is the API server's REST config; Client is built from it.
	Config *rest.Config
	Client kubernetes.Interface
	// Namespace holds the gateway pods (upstream: kube-system).
	Namespace string
	// Command is the agent's binary inside the container (default "natgw").
	Command string
	// Log receives the agent's stderr, one entry per line.
	Log logr.Logger
}

// Open finds the gateway's running pod and starts the agent in it.
func (e *Exec) Open(ctx context.Context, gw Endpoint) (Session, error) {
	if err := nat.CheckDataplaneName(gw.Dataplane); err != nil {
		return nil, fmt.Errorf("exec transport: gateway %s: %w", gw.Name, err)
	}
	pod, err := e.findPod(ctx, gw.Name)
	if err != nil {
		return nil, err
	}
	command := e.Command
	if command == "" {
		command = "natgw"
	}
	// The exec URL comes from Config (Client may be any implementation,
	// e.g. a cache-backed one, and is used for the pod lookup only).
	core, err := corev1client.NewForConfig(e.Config)
	if err != nil {
		return nil, fmt.Errorf("gateway %s: REST client: %w", gw.Name, err)
	}
	req := core.RESTClient().Post().
		Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: GatewayContainer,
			Command:   append([]string{command}, serveArgs(gw, false)...),
			Stdin:     true,
			Stdout:    true,
			Stderr:    true,
		}, scheme.ParameterCodec)
	ws, err := remotecommand.NewWebSocketExecutor(e.Config, "GET", req.URL().String())
	if err != nil {
		return nil, fmt.Errorf("gateway %s: websocket executor: %w", gw.Name, err)
	}
	spdy, err := remotecommand.NewSPDYExecutor(e.Config, "POST", req.URL())
	if err != nil {
		return nil, fmt.Errorf("gateway %s: spdy executor: %w", gw.Name, err)
	}
	executor, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, fmt.Errorf("gateway %s: executor: %w", gw.Name, err)
	}

	log := e.Log.WithValues("gateway", gw.Name, "dataplane", gw.Dataplane, "pod", pod.Name)
	stdinR, stdinW := io.Pipe()
	stdoutR, stdoutW := io.Pipe()
	stderrR, stderrW := io.Pipe()
	go forwardLines(stderrR, log)

	// The stream lives until Close (or until the pod goes away), not
	// until ctx ends.
	streamCtx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() {
		err := executor.StreamWithContext(streamCtx, remotecommand.StreamOptions{
			Stdin: stdinR, Stdout: stdoutW, Stderr: stderrW,
		})
		if err == nil {
			err = io.EOF
		}
		log.V(1).Info("exec stream ended", "err", err.Error())
		err = fmt.Errorf("exec stream of pod %s/%s ended: %w", pod.Namespace, pod.Name, err)
		stdoutW.CloseWithError(err)
		// A stream that ended (or never started) reads no more input:
		// fail the writers instead of leaving them blocked on the pipe.
		stdinR.CloseWithError(err)
		stderrW.Close()
		ended <- err
		close(ended)
	}()
	var once sync.Once
	s := &session{
		Client: agentapi.NewClient(stdoutR, stdinW),
		closeFn: func() error {
			once.Do(func() {
				select {
				case <-ended:
				case <-time.After(5 * time.Second):
					log.Info("exec stream did not end after end of input; cancelling")
				}
				cancel()
			})
			return nil
		},
	}
	if err := handshake(ctx, s, gw); err != nil {
		cancel()
		_ = s.Close()
		return nil, fmt.Errorf("pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	log.V(1).Info("agent started over pod exec")
	return s, nil
}

// findPod returns the gateway's running, ready pod (the newest one when a
// rollout briefly runs two).
func (e *Exec) findPod(ctx context.Context, name string) (*corev1.Pod, error) {
	pods, err := e.Client.CoreV1().Pods(e.Namespace).List(ctx, metav1ListOptions(GatewayPodSelector(name)))
	if err != nil {
		return nil, fmt.Errorf("gateway %s: list pods: %w", name, err)
	}
	var running []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && containerReady(p, GatewayContainer) {
			running = append(running, p)
		}
	}
	if len(running) == 0 {
		return nil, fmt.Errorf("gateway %s: %w in namespace %s (selector %s)", name, ErrNoPod, e.Namespace, GatewayPodSelector(name))
	}
	sort.Slice(running, func(i, j int) bool {
		return running[j].CreationTimestamp.Before(&running[i].CreationTimestamp)
	})
	return &running[0], nil
}

// ErrNoPod is matched when a gateway has no running pod.
var ErrNoPod = errors.New("no running gateway pod")

func containerReady(p corev1.Pod, name string) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == name {
			return cs.Ready || cs.State.Running != nil
		}
	}
	return false
}

func metav1ListOptions(sel labels.Selector) metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: sel.String()}
}
