package apitest

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMissing(t *testing.T) {
	dir := t.TempDir()
	if why := Missing(""); why == "" {
		t.Error(`Missing(""): no reason`)
	}
	if why := Missing(dir); !strings.Contains(why, "kube-apiserver") || !strings.Contains(why, dir) {
		t.Errorf("Missing(empty dir) = %q, want it to name kube-apiserver and %s", why, dir)
	}
	for _, b := range Binaries {
		if err := os.WriteFile(filepath.Join(dir, b), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if why := Missing(dir); why != "" {
		t.Errorf("Missing(dir with the binaries) = %q", why)
	}
}

// TestStartFailureStopsTheProcesses: a start that fails after launching
// etcd and kube-apiserver (the CRD directory is missing, which envtest finds
// out only when it installs the CRDs) leaves neither running.
func TestStartFailureStopsTheProcesses(t *testing.T) {
	assets := Assets()
	if why := Missing(assets); why != "" {
		if os.Getenv("CI") != "" && os.Geteuid() == 0 {
			t.Fatalf("%s (required as root in CI)", why)
		}
		t.Skip("SKIP: " + why)
	}
	env := Environment(assets, filepath.Join(t.TempDir(), "no-crds-here"))
	if _, err := Start(env); err == nil {
		_ = env.Stop()
		t.Fatal("Start with a missing CRD directory succeeded")
	} else if !strings.Contains(err.Error(), "no-crds-here") {
		t.Errorf("error does not name the CRD directory: %v", err)
	}
	var addrs []string
	if e := env.ControlPlane.Etcd; e != nil && e.URL != nil {
		addrs = append(addrs, e.URL.Host)
	}
	if a := env.ControlPlane.APIServer; a != nil && a.SecureServing.ListenAddr.Port != "" {
		addrs = append(addrs, net.JoinHostPort(a.SecureServing.ListenAddr.Address, a.SecureServing.ListenAddr.Port))
	}
	if len(addrs) != 2 {
		t.Fatalf("the failed start did not launch both processes (addresses %v): the test proves nothing", addrs)
	}
	for _, a := range addrs {
		if c, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			c.Close()
			t.Errorf("%s still accepts connections after the failed start", a)
		}
	}
}
