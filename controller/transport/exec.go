package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/natgw/natgw/agentapi"
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
	// Namespace holds the gateway pods (upstream: kube-system) of a
	// gateway for which NamespaceOf is nil or answers "".
	Namespace string
	// NamespaceOf, when set, returns the namespace of a gateway's pods and
	// Lease (natgw-controller: provision.GatewayNamespace of the
	// VpcNatGateway, its spec.namespace when set); "" means Namespace.
	NamespaceOf func(ctx context.Context, gateway string) (string, error)
	// Command is the agent's binary inside the container (default "natgw").
	Command string
	// Log receives the agent's stderr, one entry per line.
	Log logr.Logger

	// behind is, per two-replica gateway, since when a standby has missed
	// changes (kept across Pairs: a standby that stays unreachable lags
	// on through the reopens); absent: in step.
	behindMu sync.Mutex
	behind   map[string]time.Time
}

// StandbyLag says, for a two-replica gateway, how long one of its standby
// replicas has been missing changes that the active holds (0: every
// running replica holds what the active holds, or a single gateway). The
// same value is the gauge natgw_gateway_standby_lag_seconds.
func (e *Exec) StandbyLag(gateway string) time.Duration {
	e.behindMu.Lock()
	defer e.behindMu.Unlock()
	since, ok := e.behind[gateway]
	if !ok {
		return 0
	}
	return time.Since(since)
}

// noteLag records a Pair's standby state: behind since now-lag, or in step
// (lag 0), and sets the gauge.
func (e *Exec) noteLag(gateway string, lag time.Duration) {
	e.behindMu.Lock()
	defer e.behindMu.Unlock()
	if lag <= 0 {
		delete(e.behind, gateway)
		pairStandbyLag.WithLabelValues(gateway).Set(0)
		return
	}
	if e.behind == nil {
		e.behind = map[string]time.Time{}
	}
	since, ok := e.behind[gateway]
	if !ok || time.Since(since) < lag {
		since = time.Now().Add(-lag)
		e.behind[gateway] = since
	}
	pairStandbyLag.WithLabelValues(gateway).Set(time.Since(since).Seconds())
}

// Open finds the gateway's running pod and starts the agent in it. A
// gateway whose pods carry ReplicasAnnotation "2" (a two-replica gateway)
// is reached as a Pair: `serve --rules-only` in every running pod, the
// standbys brought in step with the active (the holder of the gateway's
// Lease) before Open returns, and the Pair ended when the set of running
// pods changes (a pod that starts or comes back is then caught up by the
// next Open).
func (e *Exec) Open(ctx context.Context, gw Endpoint) (Session, error) {
	if err := gw.Dataplane.Valid(); err != nil {
		return nil, fmt.Errorf("exec transport: gateway %s: %w", gw.Name, err)
	}
	running, err := e.runningPods(ctx, gw.Name)
	if err != nil {
		return nil, err
	}
	if isPair(running) {
		return e.openPair(ctx, gw, running)
	}
	return e.openPod(ctx, gw, &running[0], false)
}

// isPair says whether the running pods are a two-replica gateway's.
func isPair(pods []corev1.Pod) bool {
	for _, p := range pods {
		if p.Annotations[ReplicasAnnotation] == "2" {
			return true
		}
	}
	return false
}

// openPod starts the agent in pod (with --rules-only for a replica of a
// two-replica gateway).
func (e *Exec) openPod(ctx context.Context, gw Endpoint, pod *corev1.Pod, rulesOnly bool) (Session, error) {
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
			Command:   append([]string{command}, serveArgs(gw, false, rulesOnly)...),
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
			Stdin: stdinR, Stdout: quietCopy{stdoutW}, Stderr: quietCopy{stderrW},
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

// namespace returns the namespace of gateway's pods and Lease: NamespaceOf's
// answer, else Namespace.
func (e *Exec) namespace(ctx context.Context, gateway string) (string, error) {
	if e.NamespaceOf == nil {
		return e.Namespace, nil
	}
	ns, err := e.NamespaceOf(ctx, gateway)
	if err != nil {
		return "", fmt.Errorf("gateway %s: its namespace: %w", gateway, err)
	}
	if ns == "" {
		return e.Namespace, nil
	}
	return ns, nil
}

// runningPods returns the gateway's running, ready pods, newest first (a
// single gateway's rollout briefly runs two: the newest is its pod).
func (e *Exec) runningPods(ctx context.Context, name string) ([]corev1.Pod, error) {
	ns, err := e.namespace(ctx, name)
	if err != nil {
		return nil, err
	}
	pods, err := e.Client.CoreV1().Pods(ns).List(ctx, metav1ListOptions(GatewayPodSelector(name)))
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
		return nil, fmt.Errorf("gateway %s: %w in namespace %s (selector %s)", name, ErrNoPod, ns, GatewayPodSelector(name))
	}
	sort.Slice(running, func(i, j int) bool {
		return running[j].CreationTimestamp.Before(&running[i].CreationTimestamp)
	})
	return running, nil
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

// PairPoll is how often the exec transport reads a two-replica gateway's
// pods and Lease (the active replica, a pod that starts or goes).
const PairPoll = 500 * time.Millisecond

// openPair opens `serve --rules-only` in every running pod of a two-replica
// gateway and returns their Pair, the standbys in step with the active.
func (e *Exec) openPair(ctx context.Context, gw Endpoint, running []corev1.Pod) (Session, error) {
	active, err := e.leaseHolder(ctx, gw.Name)
	if err != nil {
		return nil, err
	}
	log := e.Log.WithValues("gateway", gw.Name, "dataplane", gw.Dataplane)
	var members []Member
	closeAll := func() {
		for _, m := range members {
			_ = m.Close()
		}
	}
	var missed error
	for i := range running {
		s, err := e.openPod(ctx, gw, &running[i], true)
		if err != nil {
			if running[i].Name == active || active == "" {
				closeAll()
				return nil, err
			}
			// A standby that cannot be reached does not hold up the
			// active: the Pair runs without it, behind, and is
			// reopened after PairRetry.
			log.Error(err, "standby replica not reached; programming the active alone", "pod", running[i].Name)
			missed = err
			continue
		}
		members = append(members, Member{Pod: running[i].Name, Session: s})
	}
	p, err := NewPair(gw, members, active, log)
	if err != nil {
		closeAll()
		return nil, err
	}
	if err := p.CatchUp(ctx); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("gateway %s: %w", gw.Name, err)
	}
	if missed != nil {
		p.markBehind()
	}
	e.noteLag(gw.Name, p.StandbyLag())
	go e.watchPair(p, gw.Name, podSet(running), missed != nil)
	log.V(1).Info("two-replica gateway reached", "replicas", p.Members(), "active", active)
	return p, nil
}

// PairRetry is how long a Pair that runs without an unreachable standby
// lasts before it is reopened to try that standby again.
const PairRetry = 5 * time.Second

// leaseHolder returns the holder of the gateway's Lease ("" when none or no
// Lease yet): `natgw ha --fence-lease` names it after the StatefulSet.
func (e *Exec) leaseHolder(ctx context.Context, gateway string) (string, error) {
	ns, err := e.namespace(ctx, gateway)
	if err != nil {
		return "", err
	}
	l, err := e.Client.CoordinationV1().Leases(ns).Get(ctx, GatewayAppPrefix+gateway, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("gateway %s: read Lease %s/%s%s: %w", gateway, ns, GatewayAppPrefix, gateway, err)
	}
	if l.Spec.HolderIdentity == nil {
		return "", nil
	}
	return *l.Spec.HolderIdentity, nil
}

// podSet names running pods by name and UID (a pod recreated under its
// name is another pod).
func podSet(pods []corev1.Pod) string {
	var ids []string
	for _, p := range pods {
		ids = append(ids, p.Name+"/"+string(p.UID))
	}
	sort.Strings(ids)
	return strings.Join(ids, ",")
}

// watchPair follows a Pair until it ends: the Lease holder (SetActive), the
// standby lag gauge, and the running pods: when they are no longer the
// Pair's, it ends the Pair so that the caller reopens (and Open catches
// the new pod up before the Pair is used).
func (e *Exec) watchPair(p *Pair, gateway, pods string, missing bool) {
	tick := time.NewTicker(PairPoll)
	defer tick.Stop()
	start := time.Now()
	for {
		select {
		case <-p.Done():
			if lag := p.StandbyLag(); lag > 0 {
				e.noteLag(gateway, lag)
			}
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if holder, err := e.leaseHolder(ctx, gateway); err == nil {
			if old := p.Active(); old != holder {
				p.SetActive(holder)
				e.Log.Info("active replica", "gateway", gateway, "pod", holder, "was", old)
			}
		}
		running, err := e.runningPods(ctx, gateway)
		cancel()
		e.noteLag(gateway, p.StandbyLag())
		if err != nil && !errors.Is(err, ErrNoPod) {
			continue
		}
		if now := podSet(running); now != pods {
			p.end(fmt.Errorf("the gateway's running pods changed: %q, were %q", now, pods))
		}
		if missing && time.Since(start) > PairRetry {
			p.end(errors.New("retrying the standby replica that was not reached"))
		}
	}
}
