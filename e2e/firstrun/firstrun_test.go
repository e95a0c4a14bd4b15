// Package firstrun_test is a person's first run, taken literally: the
// commands the READMEs document (README.md, controller/docs/operations.md,
// e2e/cluster/README.md, charts/natgw-controller/README.md), run as a
// shell would run them from the repository root — `make cluster-up`, the
// KUBECONFIG it prints, `kubectl apply -k controller/config`, `kubectl
// delete -k controller/config`, `helm install` of the chart, `helm
// uninstall`, `make cluster-down` — not the e2e's helpers. Between them it
// checks what a person would: both controller replicas Running with one
// leader, a gateway and a FIP carrying real TCP, the Helm install running
// the same controller as the kustomization, and the host as it was before
// (sysctls, iptables, nftables tables, mounts, links, fixed paths).
//
// It holds the cluster lock (internal/cluster) from before `make
// cluster-up` to after `make cluster-down` and hands it to those runs
// (cluster.LockFDEnv), so no other run takes the cluster in between.
package firstrun_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/reconciler"
	fw "github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/manifests"
	"github.com/natgw/natgw/internal/netlab"
)

// RequireEnv set to 1 (make test) turns missing assets into a failure.
const RequireEnv = "NATGW_CLUSTER_REQUIRED"

// RunEnv set to 1 runs TestFirstRun (`make firstrun-test`, which `make
// test` runs after the package tests): within `go test ./...` it would
// hold the cluster while e2e/cluster and e2e/kubeovn wait for it.
const RunEnv = "NATGW_FIRSTRUN"

// The documented commands, each run as written (Commands in README.md of
// this package lists where each is documented). Tokens are split on
// spaces; none needs quoting.
const (
	cmdClusterUp     = "make cluster-up"
	cmdApply         = "kubectl apply -k controller/config"
	cmdRollout       = "kubectl -n natgw-system rollout status deployment/natgw-controller"
	cmdGetNodes      = ".cache/cluster/bin/kubectl get nodes"
	cmdDelete        = "kubectl delete -k controller/config"
	cmdHelmInstall   = "helm install natgw-controller charts/natgw-controller -n natgw-system --create-namespace --set crds.install=true"
	cmdHelmUninstall = "helm uninstall natgw-controller -n natgw-system --wait"
	cmdClusterDown   = "make cluster-down"
)

// documentedKubeconfig is the KUBECONFIG the READMEs tell a person to
// export after `make cluster-up`.
const documentedKubeconfig = "/var/lib/natgw-cluster/admin.kubeconfig"

// Commands are the documented commands TestFirstRun runs, in order.
var Commands = []string{cmdClusterUp, cmdGetNodes, cmdApply, cmdRollout, cmdDelete, cmdHelmInstall, cmdRollout, cmdHelmUninstall, cmdClusterDown}

// run is a person's shell in the repository: PATH with the kubectl and
// helm the repository builds, KUBECONFIG once cluster-up printed it, and
// the cluster lock handed down as fd 3.
type run struct {
	t          *testing.T
	repo       string
	lock       *os.File
	kubeconfig string
}

// do runs line and fails the test when it fails.
func (r *run) do(ctx context.Context, line string, limit time.Duration) string {
	r.t.Helper()
	out, err := r.exec(ctx, line, limit)
	if err != nil {
		r.t.Fatal(err)
	}
	return out
}

// exec runs line, logs its output's tail and returns its output.
func (r *run) exec(ctx context.Context, line string, limit time.Duration) (string, error) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var out bytes.Buffer
	// Through bash, as a person types it: the command is looked up in the
	// PATH below (the repository's kubectl and helm first), not in this
	// process's (which may have a kubectl of its own).
	cmd := exec.CommandContext(ctx, "bash", "-c", line)
	cmd.Dir = r.repo
	path := filepath.Dir(manifests.Kubectl(r.repo)) + ":" + filepath.Dir(manifests.Helm(r.repo)) + ":" + os.Getenv("PATH")
	cmd.Env = append(os.Environ(), "PATH="+path, cluster.LockFDEnv+"=3")
	if r.kubeconfig != "" {
		cmd.Env = append(cmd.Env, "KUBECONFIG="+r.kubeconfig)
	}
	cmd.ExtraFiles = []*os.File{r.lock}
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 10 * time.Second
	t0 := time.Now()
	err := cmd.Run()
	r.t.Logf("$ %s   (%.1fs)\n%s", line, time.Since(t0).Seconds(), tail(out.String(), 40))
	if err != nil {
		return out.String(), fmt.Errorf("%s: %w", line, err)
	}
	return out.String(), nil
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = append([]string{fmt.Sprintf("[... %d lines]", len(l)-n)}, l[len(l)-n:]...)
	}
	return strings.Join(l, "\n")
}

var kubeconfigLine = regexp.MustCompile(`(?m)^export KUBECONFIG=(\S+)$`)

func TestFirstRun(t *testing.T) {
	if os.Getenv(RunEnv) != "1" {
		t.Skipf("runs as `make firstrun-test` (%s=1; `make test` runs it after the package tests)", RunEnv)
	}
	repo, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cfg := cluster.Defaults(cluster.Config{}, repo)
	why := cluster.Missing(cfg)
	if why == "" {
		why = netlab.Unavailable()
	}
	if why == "" {
		why = manifests.Missing(repo)
	}
	if why != "" {
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("first run: %s, but %s=1", why, RequireEnv)
		}
		t.Skipf("first run: %s (`make cluster-assets helm` builds what it needs)", why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Minute)
	defer cancel()

	// The cluster is one per machine: wait for any other run, then keep it
	// from `make cluster-up` to `make cluster-down`.
	t0 := time.Now()
	lock, err := cluster.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	t.Logf("cluster lock taken after %v", time.Since(t0).Round(time.Second))
	r := &run{t: t, repo: repo, lock: lock}

	before := snapshot(ctx, t)
	up := r.do(ctx, cmdClusterUp, 20*time.Minute)
	down := false
	defer func() {
		if !down { // a failure on the way: still leave no cluster behind
			if _, err := r.exec(context.Background(), cmdClusterDown, 5*time.Minute); err != nil {
				t.Error(err)
			}
		}
	}()
	m := kubeconfigLine.FindStringSubmatch(up)
	if m == nil {
		t.Fatalf("%s printed no `export KUBECONFIG=...` line", cmdClusterUp)
	}
	r.kubeconfig = m[1]
	if r.kubeconfig != documentedKubeconfig {
		t.Errorf("%s printed KUBECONFIG=%s, the READMEs say %s", cmdClusterUp, r.kubeconfig, documentedKubeconfig)
	}
	if !strings.Contains(r.do(ctx, cmdGetNodes, time.Minute), " Ready ") {
		t.Fatalf("%s: the node is not Ready", cmdGetNodes)
	}

	// The test's own view of the cluster (clients, the pod's pid), on the
	// lock it holds.
	dup, err := syscall.Dup(int(lock.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(cluster.LockFDEnv, fmt.Sprint(dup))
	c, err := cluster.Attach(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := c.Clientset()
	if err != nil {
		t.Fatal(err)
	}
	s := stack(t, c)
	lab := netlab.ForTest(t)
	img, err := clusterstack.GatewayImage(repo, "nftables")
	if err != nil {
		t.Fatal(err)
	}
	// The gateway pod, deleted explicitly before make cluster-down (a
	// t.Cleanup would run after the API server is gone).
	sts := clusterstack.GatewayStatefulSet("first", img)
	if _, err := cs.AppsV1().StatefulSets(clusterstack.GatewayNamespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create statefulset: %v", err)
	}
	g := fw.NewPodGateway("first", s.Dataplane)
	if err := g.Attach(ctx, t, c, cs, lab, 1); err != nil {
		t.Fatal(err)
	}

	// kubectl apply -k, as documented.
	r.do(ctx, cmdApply, 2*time.Minute)
	r.do(ctx, cmdRollout+" --timeout=3m", 4*time.Minute)
	kust := checkController(ctx, t, cs, repo, "kubectl apply -k")
	// kubectl apply -k made the CRDs and the admission policy seconds ago:
	// the first create waits until the API admits the NAT kinds (a CI
	// run's first create met the 503 "There can be a delay...").
	waitServed(ctx, t, s, c, repo)
	fipTraffic(t, s, g, 0)
	r.do(ctx, cmdDelete, 3*time.Minute)
	waitNoNamespace(ctx, t, cs)

	// helm install of the chart: the same running controller.
	r.do(ctx, cmdHelmInstall, 3*time.Minute)
	r.do(ctx, cmdRollout+" --timeout=3m", 4*time.Minute)
	chart := checkController(ctx, t, cs, repo, "helm install")
	if !reflect.DeepEqual(kust, chart) {
		kj, _ := json.MarshalIndent(kust, "", " ")
		cj, _ := json.MarshalIndent(chart, "", " ")
		t.Errorf("the controller's pod template differs:\n--- kubectl apply -k\n%s\n--- helm install\n%s", kj, cj)
	}
	// The chart made the CRDs anew (kubectl delete -k removed them): a new
	// client, once the API serves them, so no mapping of the first install
	// is reused.
	s = stack(t, c)
	waitServed(ctx, t, s, c, repo)
	fipTraffic(t, s, g, 1)
	r.do(ctx, cmdHelmUninstall, 3*time.Minute)

	fw.DeleteStatefulSet(t, cs, sts.Name)
	// The lab's namespaces and the VPC host's link on the node's bridge go
	// before the host is compared.
	if err := lab.Close(); err != nil {
		t.Error(err)
	}
	c.Detach() // the test's handle only; the cluster keeps running
	r.do(ctx, cmdClusterDown, 5*time.Minute)
	down = true
	// The kernel destroys a deleted namespace, and the veth ends it held,
	// asynchronously: a link of the lab's may outlive lab.Close by a
	// moment (one run saw ngwvm0 still there). Compare again for a while
	// before a difference counts.
	after := snapshot(ctx, t)
	for end := time.Now().Add(15 * time.Second); len(before.diff(after)) > 0 && time.Now().Before(end); {
		time.Sleep(500 * time.Millisecond)
		after = snapshot(ctx, t)
	}
	for _, d := range before.diff(after) {
		t.Errorf("host not restored by %s: %s", cmdClusterDown, d)
	}
}

// stack is a framework Stack on the cluster's API server as the admin.
func stack(t *testing.T, c *cluster.Cluster) *fw.Stack {
	cfg, err := c.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(cfg, client.Options{Scheme: fw.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return &fw.Stack{T: t, Ctx: ctx, Dataplane: "nftables", Client: cl}
}

// waitServed waits (up to a minute) until the API serves the NAT kinds
// through s's client (a CRD just created is not served at once), then (up
// to another minute) until kube-apiserver's admission knows natgw's kinds
// (clusterstack.WaitAdmission: its MutatingAdmissionPolicy answers 503
// "There can be a delay between when CustomResourceDefinitions are
// created..." for a kind whose CRD is seconds old).
func waitServed(ctx context.Context, t *testing.T, s *fw.Stack, c *cluster.Cluster, repo string) {
	t.Helper()
	var err error
	for end := time.Now().Add(time.Minute); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		if err = s.Client.List(ctx, &v1.VpcNatGatewayList{}); err == nil {
			if err = s.Client.List(ctx, &v1.IptablesFIPRuleList{}); err == nil {
				break
			}
		}
	}
	if err != nil {
		t.Fatalf("the NAT CRDs are not served after a minute: %v", err)
	}
	if err := clusterstack.WaitAdmission(ctx, c, repo, time.Minute); err != nil {
		t.Fatalf("the NAT CRDs are served but not admitted: %v", err)
	}
}

// checkController checks what a person checks after deploying: both
// replicas Running and Ready, one of them holding the lease; it returns
// the Deployment's pod template spec for comparing the two installs.
func checkController(ctx context.Context, t *testing.T, cs kubernetes.Interface, repo, how string) corev1.PodSpec {
	t.Helper()
	if err := waitLeader(ctx, cs); err != nil {
		t.Fatalf("%s: %v", how, err)
	}
	pods, err := cs.CoreV1().Pods(clusterstack.ControllerNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=natgw-controller"})
	if err != nil {
		t.Fatal(err)
	}
	var running []string
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running = append(running, p.Name)
		}
	}
	l, err := cs.CoordinationV1().Leases(clusterstack.ControllerNS).Get(ctx, clusterstack.ControllerLease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	holder := *l.Spec.HolderIdentity
	leaders := 0
	for _, p := range running {
		if strings.HasPrefix(holder, p+"_") || holder == p {
			leaders++
		}
	}
	if len(running) != 2 || leaders != 1 {
		t.Fatalf("%s: running pods %v, lease holder %q: want 2 running, one of them the leader", how, running, holder)
	}
	d, err := cs.AppsV1().Deployments(clusterstack.ControllerNS).Get(ctx, clusterstack.ControllerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := clusterstack.ManifestImage(repo)
	if err != nil {
		t.Fatal(err)
	}
	if got := d.Spec.Template.Spec.Containers[0].Image; got != want {
		t.Errorf("%s: image %s, want %s", how, got, want)
	}
	t.Logf("%s: pods %v running, leader %s", how, running, holder)
	return d.Spec.Template.Spec
}

// waitLeader waits until a lease holder names a pod that is Running and
// Ready (a lease from the previous install may name a pod that is gone).
func waitLeader(ctx context.Context, cs kubernetes.Interface) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		l, err := cs.CoordinationV1().Leases(clusterstack.ControllerNS).Get(ctx, clusterstack.ControllerLease, metav1.GetOptions{})
		if err == nil && l.Spec.HolderIdentity != nil {
			pods, err := cs.CoreV1().Pods(clusterstack.ControllerNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=natgw-controller"})
			if err == nil {
				for _, p := range pods.Items {
					if strings.HasPrefix(*l.Spec.HolderIdentity, p.Name+"_") && p.Status.Phase == corev1.PodRunning {
						return nil
					}
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no running pod holds lease %s/%s after 2m", clusterstack.ControllerNS, clusterstack.ControllerLease)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitNoNamespace waits until kubectl delete -k's namespace is gone, so
// that helm install --create-namespace starts clean.
func waitNoNamespace(ctx context.Context, t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	fw.Eventually(t, ctx, 3*time.Minute, "namespace natgw-system gone", func() error {
		_, err := cs.CoreV1().Namespaces().Get(ctx, clusterstack.ControllerNS, metav1.GetOptions{})
		if err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
}

// fipTraffic creates the VpcNatGateway, an EIP and a FIP to the VPC host
// on the gateway pod, waits until all are Ready, checks a TCP connection
// from the external host to the EIP reaches the VPC host (and the VPC
// host's own connection leaves with the EIP as source), then deletes them
// (before the controller goes: its finalizers) and checks the FIP is gone
// from the path.
func fipTraffic(t *testing.T, s *fw.Stack, g *fw.PodGateway, n int) {
	t.Helper()
	gw := &v1.VpcNatGateway{
		ObjectMeta: metav1.ObjectMeta{Name: g.Name, Annotations: map[string]string{reconciler.DataplaneAnnotation: s.Dataplane}},
		Spec:       v1.VpcNatGatewaySpec{Vpc: "vpc-" + g.Name, Subnet: "subnet-" + g.Name},
	}
	eipAddr := netlab.EIP(n)
	eip := fw.EIP(fmt.Sprintf("first-%d", n), g.Name, eipAddr)
	fip := fw.FIP(fmt.Sprintf("first-%d", n), eip.Name, g.VMs[0].Addr)
	for _, o := range []client.Object{gw, eip, fip} {
		s.Create(o)
	}
	s.WaitReady(gw, eip, fip)
	s.CheckPaths(30*time.Second, g.ExtTo(fw.TCP, eipAddr, fw.VMPort, 0), g.VMOut(fw.TCP, 0, eipAddr))
	s.DeleteAll(60 * time.Second)
	s.CheckPaths(10*time.Second, g.ExtTo(fw.TCP, eipAddr, fw.VMPort, -1))
}
