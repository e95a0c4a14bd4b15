// Package cluster_test is natgw's cluster e2e: a real single-node
// Kubernetes (internal/cluster) with natgw deployed as a user deploys it
// (controller/config applied with kubectl -k: CRDs, RBAC, a two-replica
// Deployment of the controller image with leader election and
// --transport=exec), gateways as pods of the natgw image in upstream's
// StatefulSet shape, net1 attached by the test as Multus would, and real
// traffic from an external namespace through the pod.
//
// TestMain brings the cluster up once for the package and down at the end
// (also on failure and on SIGINT/SIGTERM); the cluster lock serializes it
// with any other package that uses the cluster.
package cluster_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/clusterstack"
	"github.com/natgw/natgw/internal/netlab"
)

// RequireEnv set to 1 (as `make test` does, after building the cluster's
// assets and images) turns missing assets into a failure instead of a skip.
const RequireEnv = "NATGW_CLUSTER_REQUIRED"

// env is the package's cluster, set by TestMain.
var env *clusterEnv

type clusterEnv struct {
	c          *cluster.Cluster
	repo       string
	upIn       time.Duration
	deployedIn time.Duration
}

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	repo, err := cluster.RepoRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	images := clusterstack.Images(repo)
	cfg := cluster.Defaults(cluster.Config{Images: images, Log: os.Stderr}, repo)
	why := cluster.Missing(cfg)
	if why == "" {
		why = netlab.Unavailable()
	}
	for _, img := range images {
		if _, err := os.Stat(img); err != nil && why == "" {
			why = img + " missing (run `make image cluster-images`)"
		}
	}
	if why != "" {
		if os.Getenv(RequireEnv) == "1" {
			fmt.Fprintf(os.Stderr, "cluster e2e: %s, but %s=1\n", why, RequireEnv)
			return 1
		}
		fmt.Fprintf(os.Stderr, "cluster e2e skipped: %s (`make cluster-assets image` builds what it needs)\n", why)
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	c, err := cluster.Up(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster e2e:", err)
		return 1
	}
	env = &clusterEnv{c: c, repo: repo, upIn: time.Since(start)}
	code := func() int {
		t0 := time.Now()
		if err := clusterstack.DeployController(ctx, c, repo); err != nil {
			fmt.Fprintln(os.Stderr, "cluster e2e: deploy the controller:", err)
			dumpDiagnostics(c)
			return 1
		}
		env.deployedIn = time.Since(t0)
		fmt.Fprintf(os.Stderr, "cluster e2e: cluster up in %v, controller deployed in %v\n", env.upIn.Round(time.Millisecond), env.deployedIn.Round(time.Millisecond))
		code := m.Run()
		if code != 0 {
			dumpDiagnostics(c)
		}
		return code
	}()
	dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer dcancel()
	t0 := time.Now()
	if err := c.Down(dctx); err != nil {
		fmt.Fprintln(os.Stderr, "cluster e2e:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "cluster e2e: cluster down in %v\n", time.Since(t0).Round(time.Millisecond))
	return code
}

// dumpDiagnostics prints what explains a failure: pods, events, the
// controller's logs, the tails of the node's logs.
func dumpDiagnostics(c *cluster.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		{"-n", controllerNS, "logs", "-l", "app.kubernetes.io/name=natgw-controller", "--tail=60", "--prefix"},
	} {
		out, err := c.Kubectl(ctx, nil, args...)
		fmt.Fprintf(os.Stderr, "--- kubectl %s\n%s%v\n", strings.Join(args, " "), out, errOrEmpty(err))
	}
	for _, name := range []string{"kubelet", "containerd"} {
		b, _ := os.ReadFile(c.LogPath(name))
		lines := strings.Split(string(b), "\n")
		if len(lines) > 30 {
			lines = lines[len(lines)-30:]
		}
		fmt.Fprintf(os.Stderr, "--- %s log tail\n%s\n", name, strings.Join(lines, "\n"))
	}
}

func errOrEmpty(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
