package cluster_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/cluster"
)

// logWriter sends the cluster's progress lines to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// TestStaleCleanup: a cluster whose owner died without Down (Detach leaves
// exactly that: daemons running, the state file, the lock free) is cleaned
// up by the next Up, and Down then leaves the host's sysctls, iptables,
// links and paths as they were before the first Up.
func TestStaleCleanup(t *testing.T) {
	cfg := cluster.Defaults(cluster.Config{Log: logWriter{t}}, repoRoot(t))
	if why := cluster.Missing(cfg); why != "" {
		if os.Getenv("NATGW_CLUSTER_REQUIRED") == "1" {
			t.Fatalf("%s, but NATGW_CLUSTER_REQUIRED=1", why)
		}
		t.Skipf("cluster assets: %s", why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	first, err := cluster.Up(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	before := first.Before() // recorded under the lock, before any change
	if got := cluster.ReadSysctls(); reflect.DeepEqual(got, before.Sysctls) {
		t.Error("the running cluster changed no sysctl: the restore below would prove nothing")
	}
	first.Detach() // as if the test process had been killed
	if _, err := os.Stat(cluster.StatePath); err != nil {
		t.Fatalf("state file after a run that did not end: %v", err)
	}

	second, err := cluster.Up(ctx, cfg) // cleans up first, and checks it did
	if err != nil {
		t.Fatal(err)
	}
	again := second.Before()
	if !reflect.DeepEqual(again.Sysctls, before.Sysctls) {
		t.Errorf("sysctls after cleaning up the killed run: %v, before it: %v", again.Sysctls, before.Sysctls)
	}
	if !reflect.DeepEqual(again.IPTables, before.IPTables) {
		t.Errorf("iptables after cleaning up the killed run:\n%v\nbefore it:\n%v", again.IPTables, before.IPTables)
	}
	nodes, err := second.Kubectl(ctx, nil, "get", "nodes", "-o", "name")
	if err != nil || strings.TrimSpace(nodes) != "node/"+cfg.NodeName {
		t.Errorf("second cluster's nodes: %q, %v", nodes, err)
	}
	if err := second.Down(ctx); err != nil { // restores and checks sysctls and iptables
		t.Fatal(err)
	}
	if _, err := os.Stat(cluster.StatePath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file after Down: %v", err)
	}
	for _, l := range []string{cluster.BridgeName, cluster.NodeLink} {
		if _, err := os.Stat("/sys/class/net/" + l); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("link %s after Down: %v", l, err)
		}
	}
}
