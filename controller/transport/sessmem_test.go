package transport

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/internal/procfs"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/natfake"
)

// fakeAgentEnv makes the test binary a stand-in for `natgw serve` (see
// TestMain): the agent protocol on stdin/stdout over natfake's in-memory
// data plane holding fakeGatewayObjects, whatever the arguments.
const fakeAgentEnv = "NATGW_TRANSPORT_TEST_FAKE_AGENT"

// fakeKubeletEnv makes the test binary a stand-in kubelet (see
// TestMain): podExecServer on a local port, written to the file the value
// names, running every exec as a fake agent (fakeAgentEnv).
const fakeKubeletEnv = "NATGW_TRANSPORT_TEST_FAKE_KUBELET"

func TestMain(m *testing.M) {
	if os.Getenv(fakeAgentEnv) != "" {
		os.Exit(serveFakeAgent())
	}
	if f := os.Getenv(fakeKubeletEnv); f != "" {
		os.Exit(serveFakeKubelet(f))
	}
	os.Exit(m.Run())
}

// serveFakeKubelet serves pod exec requests until killed, in this
// process's network namespace.
func serveFakeKubelet(addrFile string) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err == nil {
		err = os.Setenv(fakeAgentEnv, "1")
	}
	if err == nil {
		err = os.WriteFile(addrFile+".tmp", []byte(ln.Addr().String()), 0o600)
	}
	if err == nil {
		err = os.Rename(addrFile+".tmp", addrFile)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "fake kubelet: %v\n", err)
		return 2
	}
	kubelet := &podExecServer{bin: os.Args[0], ns: "/proc/self/ns/net", done: make(chan error, 4096)}
	if err := http.Serve(ln, kubelet); err != nil {
		fmt.Fprintf(os.Stderr, "fake kubelet: %v\n", err)
		return 1
	}
	return 0
}

func serveFakeAgent() int {
	dp, err := natfake.Over(natfake.NewBackend(nat.DataplaneNftables, "boot-1", fakeGatewayObjects()...))
	if err != nil {
		fmt.Fprintf(os.Stderr, "fake agent: %v\n", err)
		return 2
	}
	fmt.Fprintln(os.Stderr, "fake agent serving") // a line for the session's log forwarding
	if err := agentapi.Serve(context.Background(), dp, os.Stdin, os.Stdout, agentapi.Info{Version: "fake"}); err != nil {
		fmt.Fprintf(os.Stderr, "fake agent: %v\n", err)
		return 1
	}
	return 0
}

// fakeGatewayObjects is a small gateway's set (scenario 6's many small
// gateways hold 113 objects each): 10 FIPs and 103 DNATs.
func fakeGatewayObjects() []nat.Object {
	var objs []nat.Object
	for i := range 10 {
		objs = append(objs, nat.Object{UID: fmt.Sprintf("fip-%d", i), Kind: nat.KindFIP, FIP: &nat.FIP{
			EIP: netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + i)}), InternalIP: netip.AddrFrom4([4]byte{10, 0, 0, byte(1 + i)})}})
	}
	for i := range 103 {
		objs = append(objs, nat.Object{UID: fmt.Sprintf("dnat-%d", i), Kind: nat.KindDNAT, DNAT: &nat.DNAT{
			EIP: netip.AddrFrom4([4]byte{198, 51, 100, 1}), Protocol: nat.TCP, ExternalPort: uint16(1000 + i),
			InternalIP: netip.AddrFrom4([4]byte{10, 0, 1, byte(1 + i)}), InternalPort: 8080}})
	}
	return objs
}

// localIdleSessionBytes bounds the heap one idle local session holds in
// the controller's process (its Client and line reader, the agent's pipes,
// exec.Cmd, the log forwarding), after an Info and a List of a 113-object
// gateway (HeapInuse counts whole spans: it is about four times the live
// objects here). It was ~100 KiB while every Client kept a 64 KiB
// bufio.Reader and its last List's line.
const localIdleSessionBytes = 32 << 10

// TestLocalIdleSessionMemory opens local-transport sessions as the
// controller holds them, one per gateway, each to an agent process (this
// test binary as a stand-in for `natgw serve`, fakeAgentEnv), and
// measures what they hold idle (idleSessions).
func TestLocalIdleSessionMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 55 agent processes")
	}
	t.Setenv(fakeAgentEnv, "1")
	per := idleSessions(t, &Local{Binary: os.Args[0], Log: logr.Discard()}, 50)
	t.Logf("%s local sessions", per)
	if per.inuse > localIdleSessionBytes {
		t.Errorf("an idle local session holds %d B of heap, want at most %d", per.inuse, localIdleSessionBytes)
	}
}

// execIdleSessionBytes bounds the heap one idle exec session holds in the
// controller's process: the local session's parts but the process, plus
// client-go's remote command stream, ~170 KB of its own (the WebSocket
// connection's buffers, its demultiplexer's read buffer, the stdin copy's
// 32 KiB). It was ~330 KB while the agent's stdout and stderr were copied
// through io.Copy's own 32 KiB buffers and the Client kept a 64 KiB
// reader and its last line.
const execIdleSessionBytes = 224 << 10

// TestExecIdleSessionMemory opens exec-transport sessions, one per gateway
// pod, through a stand-in kubelet in another process (this test binary,
// fakeKubeletEnv, serving pods/exec over WebSocket as podExecServer does,
// each exec a fake agent), and measures what they hold idle in this
// process (idleSessions).
func TestExecIdleSessionMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 55 agent processes")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the stand-in kubelet enters a network namespace (its own) for each exec")
	}
	const n = 50
	addrFile := filepath.Join(t.TempDir(), "kubelet-addr")
	kubelet := exec.Command(os.Args[0], "-test.run=^$")
	kubelet.Env = append(os.Environ(), fakeKubeletEnv+"="+addrFile)
	kubelet.Stderr = os.Stderr
	if err := kubelet.Start(); err != nil {
		t.Fatalf("start the stand-in kubelet: %v", err)
	}
	defer func() {
		_ = kubelet.Process.Kill()
		_ = kubelet.Wait()
	}()
	var addr []byte
	deadline := time.Now().Add(30 * time.Second)
	for {
		var err error
		if addr, err = os.ReadFile(addrFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stand-in kubelet did not start: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var pods []runtime.Object
	for i := range n + 5 {
		pods = append(pods, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("vpc-nat-gw-gw%d-0", i), Namespace: "kube-system",
				Labels: map[string]string{"app": GatewayAppPrefix + fmt.Sprintf("gw%d", i), GatewayPodLabel: "true"}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: GatewayContainer, Ready: true}}},
		})
	}
	tr := &Exec{Config: &rest.Config{Host: "http://" + string(addr)}, Client: fake.NewClientset(pods...), Namespace: "kube-system", Log: logr.Discard()}
	per := idleSessions(t, tr, n)
	t.Logf("%s exec sessions", per)
	if per.inuse > execIdleSessionBytes {
		t.Errorf("an idle exec session holds %d B of heap, want at most %d", per.inuse, execIdleSessionBytes)
	}
}

// idleSessions opens sessions to gateways gw0, gw1, ... as the controller
// holds them, makes one Info and one List on each, and measures what they
// hold idle in this process: HeapInuse and HeapAlloc (live objects) and
// StackInuse after two forced collections, goroutines and OS threads,
// after 5 such sessions and after n more, the difference per session (so
// that what the first ones allocate once is left out). It closes them
// when the test ends.
func idleSessions(t *testing.T, tr Transport, n int) perSession {
	sessions := make([]Session, 0, n+5)
	t.Cleanup(func() {
		for _, s := range sessions {
			if err := s.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		}
	})
	open := func(count int) {
		for range count {
			i := len(sessions)
			// Each call under its own timeout: a race-enabled agent
			// starts slowly on a loaded machine.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			s, err := tr.Open(ctx, Endpoint{Name: fmt.Sprintf("gw%d", i), Dataplane: nat.DataplaneNftables, NetNS: "unused-by-the-fake"})
			if err != nil {
				cancel()
				t.Fatalf("open session %d: %v", i, err)
			}
			sessions = append(sessions, s)
			if _, err := s.Info(ctx); err != nil {
				cancel()
				t.Fatalf("session %d: info: %v", i, err)
			}
			objs, err := s.List(ctx, false)
			cancel()
			if err != nil || len(objs) != 113 {
				t.Fatalf("session %d: list = %d objects, %v; want 113", i, len(objs), err)
			}
		}
	}
	open(5)
	before := memNow()
	open(n)
	after := memNow()
	per := func(a, b uint64) uint64 { return (a - min(a, b)) / uint64(n) }
	return perSession{
		n:     n,
		inuse: per(after.inuse, before.inuse), live: per(after.alloc, before.alloc), stack: per(after.stack, before.stack),
		goroutines: float64(after.goroutines-before.goroutines) / float64(n),
		threads:    [2]int{before.threads, after.threads},
	}
}

// perSession is what one idle session holds (idleSessions).
type perSession struct {
	n                  int
	inuse, live, stack uint64
	goroutines         float64
	threads            [2]int // OS threads with 5 sessions, with n more
}

func (p perSession) String() string {
	return fmt.Sprintf("%d idle sessions, per session: heap in use %d B (live objects %d B), goroutine stacks %d B, %.2f goroutines; OS threads %d with 5 sessions, %d with %d more;",
		p.n, p.inuse, p.live, p.stack, p.goroutines, p.threads[0], p.threads[1], p.n)
}

type memFigures struct {
	inuse, alloc, stack uint64
	goroutines, threads int
}

// memNow is what the process holds after two forced collections.
func memNow() memFigures {
	goruntime.GC()
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	return memFigures{inuse: ms.HeapInuse, alloc: ms.HeapAlloc, stack: ms.StackInuse, goroutines: goruntime.NumGoroutine(), threads: osThreads()}
}

// osThreads is the process's thread count (/proc/self/status), -1 when
// unknown.
func osThreads() int {
	n, err := procfs.Threads(os.Getpid())
	if err != nil {
		return -1
	}
	return n
}
