package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/procfs"
)

// APIServer is one kube-apiserver + etcd pair (envtest) with the natgw CRDs
// installed. The API server can be stopped and started again on the same
// port with the same certificates (etcd keeps running), so clients and the
// controller's kubeconfig stay valid across a restart.
type APIServer struct {
	env *envtest.Environment
	// Config is the admin user's REST config.
	Config *rest.Config
	// KubeconfigPath is a kubeconfig file of the admin user.
	KubeconfigPath string

	certDir string
	mu      sync.Mutex
	stopped bool
}

// StartAPIServer starts the control plane with natgw's CRDs; t.Cleanup
// stops it.
func StartAPIServer(t testing.TB) *APIServer { return StartAPIServerWith(t, crdtest.Natgw) }

// StartAPIServerWith starts the control plane with the CRD set set (natgw's,
// or upstream Kube-OVN v1.16.2's as a cluster with Kube-OVN has them);
// t.Cleanup stops it.
func StartAPIServerWith(t testing.TB, set crdtest.Set) *APIServer {
	t.Helper()
	dir, natgwCRDs, err := assets()
	if err != nil {
		t.Fatal(err)
	}
	crds, err := crdtest.Path(context.Background(), set, natgwCRDs)
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	certDir := filepath.Join(work, "apiserver")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	env := apitest.Environment(dir, crds)
	// A fixed certificate directory: a restarted API server keeps its
	// serving certificate (envtest generates one only when none exists)
	// and its port (kept in the APIServer struct).
	env.ControlPlane.APIServer = &envtest.APIServer{CertDir: certDir}
	cfg, err := apitest.Start(env)
	if err != nil {
		t.Fatal(err)
	}
	a := &APIServer{env: env, Config: cfg, KubeconfigPath: filepath.Join(work, "kubeconfig"), certDir: certDir}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})
	if err := os.WriteFile(a.KubeconfigPath, env.KubeConfig, 0o600); err != nil {
		t.Fatal(err)
	}
	return a
}

// Stop kills the API server with SIGKILL, a crash (etcd keeps running): a
// graceful stop waits for open watches and takes over a minute here.
func (a *APIServer) Stop() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return nil
	}
	pid, err := a.pid()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill -9 kube-apiserver pid %d: %w", pid, err)
	}
	// envtest reaps it and clears its state (the process has exited).
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver pid %d still there 30s after SIGKILL", pid)
		}
		time.Sleep(Poll)
	}
	// envtest marks the process exited a moment after its Wait reaped
	// it; a Stop in between signals a process that is gone (ESRCH).
	// Retry until envtest has seen the exit and Stop is a no-op.
	for {
		err := a.env.ControlPlane.APIServer.Stop()
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.ESRCH) && !errors.Is(err, os.ErrProcessDone) || time.Now().After(deadline) {
			return fmt.Errorf("stop kube-apiserver: %w", err)
		}
		time.Sleep(Poll)
	}
	a.stopped = true
	return nil
}

// pid finds this API server's process by its certificate directory.
func (a *APIServer) pid() (int, error) {
	return procfs.FindOne("kube-apiserver", "--cert-dir="+a.certDir)
}

// Start starts a stopped API server again and waits until it is healthy.
func (a *APIServer) Start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.stopped {
		return nil
	}
	if err := a.env.ControlPlane.APIServer.Start(); err != nil {
		return fmt.Errorf("start kube-apiserver again: %w", err)
	}
	a.stopped = false
	return nil
}
