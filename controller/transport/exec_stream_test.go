package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream/wsstream"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testlog"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/netns"
)

// podExecServer stands in for the API server and the kubelet behind it: it
// serves the pods/exec subresource over WebSocket with the remote command
// protocol (v5.channel.k8s.io, v4 as fallback) as the kubelet does, and runs
// the requested command inside a network namespace (the "pod"), with argv[0]
// replaced by a local binary. It records every exec and can kill the
// running processes.
type podExecServer struct {
	t   *testing.T
	bin string
	ns  string
	// nsOf, when set, gives each pod its own namespace (by pod name).
	nsOf map[string]string
	mu   sync.Mutex
	cmds []*exec.Cmd
	reqs []string // "<pod> <container> <command...>"
	done chan error
	// fsRoot holds each pod's files (podFile), made at the first use.
	fsRoot string
}

// podFile is where the stand-in keeps the file a pod's command names as
// path: under a directory of its own per pod, never the host's path (an
// agent's sync mark, agentapi.RulesSyncedFile, would otherwise land in
// this host's /run).
func (p *podExecServer) podFile(pod, path string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fsRoot == "" {
		p.fsRoot = p.t.TempDir()
	}
	return filepath.Join(p.fsRoot, pod, path)
}

func (p *podExecServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	// api/v1/namespaces/NS/pods/POD/exec
	if len(parts) != 7 || parts[5] == "" || parts[6] != "exec" || !wsstream.IsWebSocketRequest(r) {
		http.Error(w, "not a pod exec websocket request: "+r.URL.Path, http.StatusBadRequest)
		return
	}
	q := r.URL.Query()
	argv := q["command"]
	p.mu.Lock()
	p.reqs = append(p.reqs, strings.Join(append([]string{parts[5], q.Get("container")}, argv...), " "))
	p.mu.Unlock()
	chans := []wsstream.ChannelType{wsstream.ReadChannel, wsstream.WriteChannel, wsstream.WriteChannel, wsstream.WriteChannel, wsstream.IgnoreChannel}
	conn := wsstream.NewConn(map[string]wsstream.ChannelProtocolConfig{
		"v5.channel.k8s.io": {Binary: true, Channels: chans},
		"v4.channel.k8s.io": {Binary: true, Channels: chans},
	})
	_, streams, err := conn.Open(w, r)
	if err != nil {
		p.t.Errorf("pod exec: open websocket: %v", err)
		return
	}
	defer conn.Close()
	if len(argv) == 0 {
		writeStatus(streams[3], errors.New("no command"))
		return
	}
	args := slices.Clone(argv[1:])
	for i, a := range args {
		if a == agentapi.RulesSyncedFile {
			args[i] = p.podFile(parts[5], a)
		}
	}
	cmd := exec.Command(p.bin, args...)
	cmd.Stdout, cmd.Stderr = streams[1], streams[2]
	// Like a container runtime, end the exec when the process exits even
	// though the client's stdin stays open: the stdin copy is not waited
	// for.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		writeStatus(streams[3], err)
		return
	}
	go func() {
		_, _ = io.Copy(stdin, streams[0])
		stdin.Close()
	}()
	ns := p.ns
	if p.nsOf != nil {
		ns = p.nsOf[parts[5]]
	}
	h, err := netns.Open(ns)
	if err == nil {
		err = h.Do(cmd.Start)
		h.Close()
	}
	if err != nil {
		writeStatus(streams[3], err)
		return
	}
	p.mu.Lock()
	p.cmds = append(p.cmds, cmd)
	p.mu.Unlock()
	err = cmd.Wait()
	writeStatus(streams[3], err)
	p.done <- err
}

// writeStatus writes the command's outcome on the error channel as the
// kubelet does for protocol v4 and later: a metav1.Status.
func writeStatus(w io.Writer, err error) {
	st := metav1.Status{Status: metav1.StatusSuccess}
	if err != nil {
		st = metav1.Status{Status: metav1.StatusFailure, Reason: "NonZeroExitCode", Message: err.Error()}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			st.Details = &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: "ExitCode", Message: fmt.Sprint(ee.ExitCode())}}}
		}
	}
	b, _ := json.Marshal(st)
	_, _ = w.Write(b)
}

func (p *podExecServer) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.cmds {
		if c.ProcessState == nil {
			_ = c.Process.Kill()
		}
	}
}

// TestExecStream drives the real agent through the Exec transport's whole
// client side (pod lookup, WebSocket remote command stream, protocol
// session): the pod's container and command are upstream's, the session
// programs the gateway namespace, Close ends the agent with end of input,
// and an agent that dies breaks the session.
func TestExecStream(t *testing.T) {
	lab := netlab.ForTest(t)
	bin := buildNatgw(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{Name: "ex"})
	if err != nil {
		t.Fatal(err)
	}
	kubelet := &podExecServer{t: t, bin: bin, ns: gw.GW, done: make(chan error, 4)}
	srv := httptest.NewServer(kubelet)
	defer srv.Close()

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vpc-nat-gw-gw1-0", Namespace: "kube-system",
			Labels: map[string]string{"app": GatewayAppPrefix + "gw1", GatewayPodLabel: "true"}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: GatewayContainer, Ready: true}}},
	}
	tr := &Exec{Config: &rest.Config{Host: srv.URL}, Client: fake.NewClientset(pod), Namespace: "kube-system", Log: testlog.New(t, 0)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	target := Endpoint{Name: "gw1", Dataplane: nat.DataplaneNftables, NetNS: "ignored-by-exec"}

	s, err := tr.Open(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := kubelet.reqs[0], "vpc-nat-gw-gw1-0 vpc-nat-gw natgw serve --dataplane nftables"; got != want {
		t.Errorf("exec request %q, want %q", got, want)
	}
	info, fip := infoAndFIP(ctx, t, s, nat.DataplaneNftables, gw.VMs[0].Addr)
	if objs, err := s.List(ctx, true); err != nil || len(objs) != 1 || !objs[0].Equal(fip) {
		t.Fatalf("list = %v, %v; want the FIP", objs, err)
	}
	rs, err := netlab.NftRuleset(ctx, gw.GW)
	if err != nil || !strings.Contains(rs, netlab.EIP(0).String()) {
		t.Fatalf("the gateway namespace's ruleset lacks the EIP: %v\n%s", err, rs)
	}

	// Close: the agent reads end of input and exits 0; the kernel keeps
	// the state.
	if err := s.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	select {
	case err := <-kubelet.done:
		if err != nil {
			t.Errorf("agent exited with %v after Close, want 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent still running 10s after Close")
	}

	// A second session sees the same kernel state; the agent dying
	// (the pod restarted) breaks the session.
	s2, err := tr.Open(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if info2, err := s2.Info(ctx); err != nil || info2.BootID != info.BootID {
		t.Errorf("second session: info %+v, %v; want boot id %s", info2, err, info.BootID)
	}
	kubelet.kill()
	select {
	case <-s2.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("session not done 10s after the agent was killed")
	}
	if s2.Err() == nil {
		t.Error("broken session has no error")
	}
	if err := s2.Apply(ctx, fip); err == nil {
		t.Error("apply on a broken session succeeded")
	}
}
