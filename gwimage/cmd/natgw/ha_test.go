//go:build !natgw_omit_ha

package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/nat/ha"
	"github.com/natgw/natgw/nat/ha/leasefence"
)

// TestHAFlags: `natgw ha` refuses bad flags with the flag and the value
// named, before opening the namespace.
func TestHAFlags(t *testing.T) {
	base := []string{"--local", "10.0.0.2:7400", "--peer", "10.0.0.3:7400", "--eip", "192.0.2.10/24", "--fence-file", "/tmp/x"}
	for _, c := range []struct {
		what string
		args []string
		want string
	}{
		{"bad local", []string{"--local", "10.0.0.2", "--peer", "10.0.0.3:7400", "--eip", "192.0.2.10/24", "--fence-file", "/x"}, `--local "10.0.0.2"`},
		{"bad peer", []string{"--local", "10.0.0.2:7400", "--peer", "nope", "--eip", "192.0.2.10/24", "--fence-file", "/x"}, `--peer "nope"`},
		{"bad eip", append(append([]string{}, base...), "--eip", "192.0.2.300/24"), `"192.0.2.300/24"`},
		{"two fences", append(append([]string{}, base...), "--fence-socket", "/s"), "give one"},
		{"lease and file", append(append([]string{}, base...), "--fence-lease", "ns/gw"), "give one"},
		{"bad lease", []string{"--local", "10.0.0.2:7400", "--peer", "10.0.0.3:7400", "--eip", "192.0.2.10/24", "--fence-lease", "gw"}, `--fence-lease "gw"`},
		{"empty lease name", []string{"--local", "10.0.0.2:7400", "--peer", "10.0.0.3:7400", "--eip", "192.0.2.10/24", "--fence-lease", "ns/"}, `--fence-lease "ns/"`},
		{"missing kubeconfig", []string{"--local", "10.0.0.2:7400", "--peer", "10.0.0.3:7400", "--eip", "192.0.2.10/24", "--fence-lease", "ns/gw", "--kubeconfig", "/nonexistent/kubeconfig"}, `--kubeconfig "/nonexistent/kubeconfig"`},
		{"kubeconfig without lease", append(append([]string{}, base...), "--kubeconfig", "/k"), "only with --fence-lease"},
		{"no fence", []string{"--local", "10.0.0.2:7400", "--peer", "10.0.0.3:7400", "--eip", "192.0.2.10/24"}, "no fence"},
		{"no address", []string{"--local", "10.0.0.2:7400", "--peer", "10.0.0.3:7400", "--fence-file", "/x"}, "no floating address"},
		{"bad misses", append(append([]string{}, base...), "--misses", "-1"), "--misses -1: want 1..100"},
		{"bad interval", append(append([]string{}, base...), "--interval", "5s"), "--interval 5s: want 1ms..1s"},
		{"lease under 3 intervals", append(append([]string{}, base...), "--lease", "140ms"), "--lease 140ms: want at least 3 × the interval 50ms (150ms)"},
		{"lease under 3 of a longer interval", append(append([]string{}, base...), "--interval", "100ms", "--lease", "250ms"), "--lease 250ms: want at least 3 × the interval 100ms (300ms)"},
		{"eip and from-dataplane", append(append([]string{}, base...), "--eips-from-dataplane"), "--eip 192.0.2.10/24 and --eips-from-dataplane"},
		{"peer and sibling", append(append([]string{}, base...), "--peer-sibling", "kube-system", "--id", "vpc-nat-gw-g-0"), `--peer "10.0.0.3:7400" and --peer-sibling "kube-system"`},
		{"sibling of a non-StatefulSet id", []string{"--local", "10.0.0.2:7400", "--peer-sibling", "kube-system", "--id", "gw", "--eip", "192.0.2.10/24", "--fence-file", "/x"}, `--id "gw"`},
		{"sibling of ordinal 2", []string{"--local", "10.0.0.2:7400", "--peer-sibling", "kube-system", "--id", "vpc-nat-gw-g-2", "--eip", "192.0.2.10/24", "--fence-file", "/x"}, `--id "vpc-nat-gw-g-2"`},
		{"sibling namespace with a slash", []string{"--local", "10.0.0.2:7400", "--peer-sibling", "kube-system/x", "--id", "vpc-nat-gw-g-1", "--eip", "192.0.2.10/24", "--fence-file", "/x"}, `--peer-sibling "kube-system/x"`},
		{"sibling with a missing kubeconfig", []string{"--local", "10.0.0.2:7400", "--peer-sibling", "kube-system", "--id", "vpc-nat-gw-g-1", "--eip", "192.0.2.10/24", "--fence-file", "/x", "--kubeconfig", "/nonexistent/kubeconfig"}, `--kubeconfig "/nonexistent/kubeconfig"`},
		{"IPv4-mapped eip", append(append([]string{}, base...), "--eip", "::ffff:192.0.2.1/120"), `"::ffff:192.0.2.1/120"`},
		{"loopback eip (nat's rule)", append(append([]string{}, base...), "--eip", "127.0.0.1/8"), `floating address "127.0.0.1/8": invalid address "127.0.0.1": not a unicast address`},
		{"multicast lan-ip (nat's rule)", append(append([]string{}, base...), "--lan-ip", "224.0.0.5/24"), `floating address "224.0.0.5/24": invalid address "224.0.0.5": not a unicast address`},
		{"bad eips-poll", []string{"--local", "10.0.0.2:7400", "--peer", "10.0.0.3:7400", "--eips-from-dataplane", "--eips-poll", "2m", "--fence-file", "/x"}, "--eips-poll 2m0s"},
	} {
		var out, errb bytes.Buffer
		// A namespace that does not exist: should a case pass the
		// checks, it fails opening it instead of touching this host.
		argv := append([]string{"natgw", "--netns", "/nonexistent/natgw-ha-test", "ha"}, c.args...)
		code := run(context.Background(), argv, strings.NewReader(""), &out, &errb)
		if code == exitOK || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%s: exit %d, stderr %q; want a failure naming %q", c.what, code, errb.String(), c.want)
		}
	}
}

// TestHALeaseFlags: --fence-lease with a kubeconfig gives the Lease fence of
// that namespace and name (no API call is made before the replica runs).
func TestHALeaseFlags(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	const kubeconfig = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(kc, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	f := haFlags{local: "10.0.0.2:7400", peer: "10.0.0.3:7400", eips: prefixList{netip.MustParsePrefix("192.0.2.10/24")},
		fenceLease: "kube-system/gw1-ha", kubeconfig: kc, interval: 50 * time.Millisecond, misses: 3}
	cfg, err := f.haConfig(&globals{})
	if err != nil {
		t.Fatal(err)
	}
	lf, ok := cfg.Fence.(*leasefence.Fence)
	if !ok || lf.String() != "Lease kube-system/gw1-ha" {
		t.Fatalf("fence %T %v, want the Lease kube-system/gw1-ha", cfg.Fence, cfg.Fence)
	}
}

// TestHAMetrics: --metrics-address serves the replica's natgw_ha_* metrics;
// a bad address is refused naming the flag.
func TestHAMetrics(t *testing.T) {
	st := ha.Status{Role: ha.RoleActive, ToActive: 2, TakeoversPeerSilent: 1}
	addr, shutdown, err := serveHAMetrics("127.0.0.1:0", ha.NewCollector(func() ha.Status { return st }))
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr.String()+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"natgw_ha_active 1\n", `natgw_ha_role_changes_total{role="active"} 2` + "\n", `natgw_ha_takeovers_total{peer="silent"} 1` + "\n"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q:\n%s", want, body)
		}
	}
	if _, _, err := serveHAMetrics("127.0.0.1:notaport", ha.NewCollector(func() ha.Status { return st })); err == nil || !strings.Contains(err.Error(), `--metrics-address "127.0.0.1:notaport"`) {
		t.Fatalf("bad address: %v, want an error naming --metrics-address", err)
	}
}

// TestSiblingPod: the peer of a two-replica StatefulSet's pod is the other
// ordinal.
func TestSiblingPod(t *testing.T) {
	for _, c := range []struct{ id, want, err string }{
		{"vpc-nat-gw-g1-0", "vpc-nat-gw-g1-1", ""},
		{"vpc-nat-gw-g1-1", "vpc-nat-gw-g1-0", ""},
		{"vpc-nat-gw-a-b-1", "vpc-nat-gw-a-b-0", ""},
		{"vpc-nat-gw-g1-2", "", `--id "vpc-nat-gw-g1-2"`},
		{"-1", "", `--id "-1"`},
		{"host", "", `--id "host"`},
	} {
		got, err := siblingPod(c.id)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %q, %v; want an error naming %s", c.id, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: %q, %v; want %q", c.id, got, err, c.want)
		}
	}
}

// TestSiblingPeerFollow: the follower hands the sibling's address to the
// replica when the pod gets one and when it changes (a new pod), keeps
// the last one while the pod is gone, and takes the IPv4 of a dual-stack
// pod. The API server is a real kube-apiserver (envtest) and the follower
// is the one `natgw ha --peer-sibling` builds (its core/v1-only RESTClient,
// from --kubeconfig); the test writes the pods through the typed clientset.
func TestSiblingPeerFollow(t *testing.T) {
	assets := apitest.RequireAssets(t)
	env := apitest.Environment(assets, apitest.CRDDir())
	cfg := apitest.StartT(t, env)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	pods := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("default")
	f := haFlags{id: "vpc-nat-gw-g-0", peerSibling: "default", kubeconfig: kubeconfig}
	s, err := f.sibling(ha.Config{Local: netip.MustParseAddrPort("10.0.1.4:7460")})
	if err != nil {
		t.Fatal(err)
	}
	if s.ns != "default" || s.name != "vpc-nat-gw-g-1" {
		t.Fatalf("sibling %s/%s, want default/vpc-nat-gw-g-1", s.ns, s.name)
	}
	got := make(chan netip.AddrPort, 16)
	s.setPeer = func(p netip.AddrPort) error { got <- p; return nil }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if p, err := s.read(ctx); err != nil || p.IsValid() {
		t.Fatalf("no pod: %v, %v; want no address and no error", p, err)
	}
	done := make(chan struct{})
	go func() { defer close(done); s.follow(ctx, netip.AddrPort{}, 10*time.Millisecond) }()
	defer func() { cancel(); <-done }()
	expect := func(what, want string) {
		t.Helper()
		select {
		case p := <-got:
			if p.String() != want {
				t.Fatalf("%s: peer %s, want %s", what, p, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no peer address given, want %s", what, want)
		}
	}
	// Bound to a node (no node object is needed) as a pod with an address
	// is; deleted with no grace period, as there is no kubelet.
	spec := corev1.PodSpec{NodeName: "node1", Containers: []corev1.Container{{Name: "gw", Image: "natgw"}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vpc-nat-gw-g-1", Namespace: "default"}, Spec: spec}
	pod, err = pods.Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Status.PodIPs = []corev1.PodIP{{IP: "fd00::5"}, {IP: "10.0.1.5"}}
	pod.Status.PodIP = "fd00::5"
	if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("scheduled, dual stack", "10.0.1.5:7460")
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	if p, err := s.read(ctx); err != nil || p.IsValid() {
		t.Fatalf("pod deleted: %v, %v; want no address and no error", p, err)
	}
	pod = &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vpc-nat-gw-g-1", Namespace: "default"}, Spec: spec}
	if pod, err = pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{PodIP: "10.0.1.9", PodIPs: []corev1.PodIP{{IP: "10.0.1.9"}}}
	if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("a new pod with another address", "10.0.1.9:7460")
	time.Sleep(50 * time.Millisecond)
	select {
	case p := <-got:
		t.Fatalf("unchanged address given again: %s", p)
	default:
	}
}

// TestHARulesSyncedFlag: --rules-synced-file gates the replica on that
// file (ha.Config.RulesReady); without it there is no gate.
func TestHARulesSyncedFlag(t *testing.T) {
	mark := filepath.Join(t.TempDir(), "rules-synced")
	f := haFlags{id: "a", local: "10.0.0.2:7400", peer: "10.0.0.3:7400", fenceFile: "/x", eips: prefixList{netip.MustParsePrefix("192.0.2.10/24")},
		interval: 50 * time.Millisecond, misses: 3} // the flags' defaults: haConfig checks the timing
	cfg, err := f.haConfig(&globals{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RulesReady != nil {
		t.Fatal("a gate without --rules-synced-file")
	}
	f.rulesSyncedFile = mark
	if cfg, err = f.haConfig(&globals{}); err != nil {
		t.Fatal(err)
	}
	if cfg.RulesReady == nil {
		t.Fatal("no gate with --rules-synced-file")
	}
	if err := cfg.RulesReady(); err == nil || !strings.Contains(err.Error(), mark) {
		t.Fatalf("before the mark: %v, want an error naming %s", err, mark)
	}
	if err := os.WriteFile(mark, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cfg.RulesReady(); err != nil {
		t.Fatalf("with the mark: %v", err)
	}
}
