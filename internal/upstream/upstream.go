// Package upstream locates Kube-OVN's own source tree, downloaded through the
// Go module proxy into the module cache, so that tests and benchmarks can run
// upstream's code (its nat-gateway.sh and lb-svc.sh, its CRDs, its
// controller) as the reference natgw is judged against.
//
// The proxy serves github.com/kubeovn/kube-ovn v1.16.2 only (it refuses the
// older tags). The download is cached by Go's
// module cache: the first call costs about a second, later ones a few
// milliseconds. Nothing from the tree is copied into natgw.
package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"
)

// Module and Version name the upstream tree.
const (
	Module  = "github.com/kubeovn/kube-ovn"
	Version = "v1.16.2"
)

// Paths of upstream files inside the module tree.
const (
	// NatGatewayScript is the script kube-ovn-controller execs in a VPC NAT
	// gateway pod (`bash /kube-ovn/nat-gateway.sh OP RULES...`).
	NatGatewayScript = "dist/images/vpcnatgateway/nat-gateway.sh"
	// LBSvcScript is the script of the LoadBalancer Service pods.
	LBSvcScript = "dist/images/vpcnatgateway/lb-svc.sh"
	// CRDs holds every kubeovn.io CustomResourceDefinition of the release.
	CRDs = "charts/kube-ovn-v2/crds/kube-ovn-crd.yaml"
)

// downloadTimeout bounds one `go mod download`.
const downloadTimeout = 5 * time.Minute

var (
	mu     sync.Mutex
	cached string
)

// Dir returns the directory of the upstream module tree in Go's module
// cache, downloading it through the Go module proxy when it is not there.
// The tree is read-only.
func Dir(ctx context.Context) (string, error) {
	mu.Lock()
	defer mu.Unlock()
	if cached != "" {
		return cached, nil
	}
	dir, err := download(ctx)
	if err != nil {
		return "", err
	}
	cached = dir
	return dir, nil
}

// Path returns the absolute path of rel (one of the constants above) in the
// upstream tree, downloading the tree when needed.
func Path(ctx context.Context, rel string) (string, error) {
	dir, err := Dir(ctx)
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("upstream %s@%s: %w", Module, Version, err)
	}
	return p, nil
}

// ReadFile returns the contents of rel in the upstream tree.
func ReadFile(ctx context.Context, rel string) ([]byte, error) {
	p, err := Path(ctx, rel)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(p)
}

func download(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, downloadTimeout)
	defer cancel()
	// Outside any module, so natgw's go.mod and go.sum stay untouched.
	tmp, err := os.MkdirTemp("", "natgw-upstream-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	goBin := "go"
	if p, err := exec.LookPath("go"); err == nil {
		goBin = p
	} else if _, err := os.Stat("/usr/local/go/bin/go"); err == nil {
		goBin = "/usr/local/go/bin/go"
	}
	cmd := exec.CommandContext(ctx, goBin, "mod", "download", "-json", Module+"@"+Version)
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GO111MODULE=on", "GOFLAGS=-mod=mod", "GOWORK=off")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var info struct {
		Dir   string
		Error string
	}
	if err := json.Unmarshal(stdout.Bytes(), &info); err != nil || info.Dir == "" {
		msg := info.Error
		if msg == "" {
			msg = stderr.String()
		}
		return "", fmt.Errorf("download %s@%s through the Go module proxy: %v: %s", Module, Version, runErr, msg)
	}
	return info.Dir, nil
}
