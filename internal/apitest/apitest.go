// Package apitest describes the control plane that natgw's tests, e2e suite
// and benchmarks run against: a real kube-apiserver and etcd started by
// controller-runtime's envtest from prebuilt binaries (`make envtest-assets`
// builds them into .cache/envtest/bin), with natgw's CRDs installed.
package apitest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Binaries are the programs an assets directory must hold.
var Binaries = []string{"kube-apiserver", "etcd"}

// Missing says why the assets directory cannot start a control plane, or
// "" when it can.
func Missing(assets string) string {
	if assets == "" {
		return "no envtest assets directory (set KUBEBUILDER_ASSETS or run `make envtest-assets`)"
	}
	for _, bin := range Binaries {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			return fmt.Sprintf("envtest assets missing (%s not in %s): run `make envtest-assets`", bin, assets)
		}
	}
	return ""
}

// Environment returns the control plane of the binaries in assets with the
// CRDs of crdDir, with timeouts for a small shared machine.
func Environment(assets, crdDir string) *envtest.Environment {
	return &envtest.Environment{
		CRDDirectoryPaths:        []string{crdDir},
		ErrorIfCRDPathMissing:    true,
		BinaryAssetsDirectory:    assets,
		ControlPlaneStartTimeout: 2 * time.Minute, // 2 shared cores
		ControlPlaneStopTimeout:  time.Minute,
	}
}

// Start starts env and returns the admin user's REST config. Start can
// fail after it launched etcd or kube-apiserver (a CRD the server refuses, a
// timeout); those processes are stopped before the error is returned.
func Start(env *envtest.Environment) (*rest.Config, error) {
	cfg, err := env.Start()
	if err != nil {
		if serr := env.Stop(); serr != nil {
			err = errors.Join(err, fmt.Errorf("stop after the failed start: %w", serr))
		}
		return nil, fmt.Errorf("start kube-apiserver + etcd (envtest, assets %s, CRDs %v): %w", env.BinaryAssetsDirectory, env.CRDDirectoryPaths, err)
	}
	return cfg, nil
}

// RepoRoot finds the module root upward from the working directory (go test
// runs in the package's directory, the benchmarks in the checkout); "" when
// there is none.
func RepoRoot() string {
	wd, err := os.Getwd()
	if err != nil {
		return ""
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if d == filepath.Dir(d) {
			return ""
		}
	}
}

// Assets is $KUBEBUILDER_ASSETS, or the checkout's .cache/envtest/bin.
func Assets() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	if root := RepoRoot(); root != "" {
		return filepath.Join(root, ".cache", "envtest", "bin")
	}
	return ""
}

// CRDDir is the checkout's controller/config/crd.
func CRDDir() string {
	return filepath.Join(RepoRoot(), "controller", "config", "crd")
}
