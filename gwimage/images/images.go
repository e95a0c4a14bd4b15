// Package images builds single-binary container images the way the gateway
// image is built (gwimage/imagebuild): a static Go binary (CGO off,
// -trimpath, no build id) in one layer with fixed timestamps and owners, a
// non-shell entrypoint, written by imagebuild.WriteArchive as one tar that
// is an OCI layout and a docker-save archive. Same inputs, same digest.
// The images natgw ships (natgw-controller's) and the ones its tests run
// (the test cluster's pause image, the gateway image with iptables tools
// for the cluster e2e) are specified here, beside the builder.
package images

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/natgw/natgw/gwimage/imagebuild"
)

// Spec describes one image.
type Spec struct {
	// Package is the main package to build, e.g.
	// "github.com/natgw/natgw/controller/cmd/natgw-controller".
	Package string
	// Binary is the binary's name at the image's root ("/" + Binary is the
	// entrypoint's first word).
	Binary string
	// Args follow the binary in the entrypoint.
	Args []string
	// Name is the image reference written into the archive; fully
	// qualified, e.g. "docker.io/natgw/natgw-controller:0.1.0".
	Name string
	// User runs the entrypoint ("" for root), e.g. "65532:65532".
	User string
	// Title and Description go into the OCI labels.
	Title, Description string
	// Version is stamped into the labels (and LDFlags may use it).
	Version string
	// LDFlags are extra linker flags (e.g. -X for a version variable).
	LDFlags string
	// ModuleDir is the natgw module's root; Arch the GOARCH (default the
	// host's); Go the go command (default "go").
	ModuleDir, Arch, Go string
}

// Controller is the natgw-controller image of version.
func Controller(moduleDir, version string) Spec {
	return Spec{
		Package:     "github.com/natgw/natgw/controller/cmd/natgw-controller",
		Binary:      "natgw-controller",
		Name:        "docker.io/natgw/natgw-controller:" + version,
		User:        "65532:65532",
		Title:       "natgw-controller",
		Description: "natgw controller: reconciles Kube-OVN's VPC NAT CRDs onto natgw gateways through pod exec",
		Version:     version,
		ModuleDir:   moduleDir,
	}
}

// Pause is the test cluster's sandbox image (internal/cluster/cmd/pause).
func Pause(moduleDir string) Spec {
	return Spec{
		Package:     "github.com/natgw/natgw/internal/cluster/cmd/pause",
		Binary:      "pause",
		Name:        "docker.io/natgw/pause:0.1.0",
		Title:       "pause",
		Description: "natgw test cluster sandbox image: holds a pod's namespaces, reaps children",
		Version:     "0.1.0",
		ModuleDir:   moduleDir,
	}
}

// Build builds the binary and writes the archive to out.
func Build(ctx context.Context, s Spec, out string) (*imagebuild.Result, error) {
	if s.Arch == "" {
		s.Arch = runtime.GOARCH
	}
	if s.Go == "" {
		s.Go = "go"
	}
	if s.Package == "" || s.Binary == "" || s.Name == "" || s.ModuleDir == "" || out == "" {
		return nil, errors.New("images: Package, Binary, Name, ModuleDir and out are required")
	}
	tmp, err := os.MkdirTemp("", "natgw-image-")
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, s.Binary)
	cmd := exec.CommandContext(ctx, s.Go, "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -buildid= "+s.LDFlags, "-o", bin, s.Package)
	cmd.Dir = s.ModuleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+s.Arch, "GOFLAGS=-mod=readonly")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("images: go build %s: %w\n%s", s.Package, err, stderr.String())
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	img, err := Image(s, data)
	if err != nil {
		return nil, err
	}
	res, err := imagebuild.WriteArchive(img, s.Name, out)
	if err != nil {
		return nil, err
	}
	res.BinarySize = int64(len(data))
	return res, nil
}

// Image assembles the image from the binary's bytes: /BINARY and an empty
// /tmp, every entry owned by root with imagebuild.Epoch as its time.
func Image(s Spec, bin []byte) (v1.Image, error) {
	raw, err := imagebuild.LayerTar([]imagebuild.Entry{
		{Type: tar.TypeReg, Name: s.Binary, Mode: 0o755, Data: bin},
		{Type: tar.TypeDir, Name: "tmp/", Mode: 0o1777},
	})
	if err != nil {
		return nil, err
	}
	return imagebuild.OneLayer(raw, "natgw images: /"+s.Binary, s.Title+" "+s.Version, s.Arch, v1.Config{
		Entrypoint: append([]string{"/" + s.Binary}, s.Args...),
		Env:        []string{"PATH=/"},
		WorkingDir: "/",
		User:       s.User,
		Labels: map[string]string{
			"org.opencontainers.image.title":       s.Title,
			"org.opencontainers.image.description": s.Description,
			"org.opencontainers.image.version":     s.Version,
			"org.opencontainers.image.source":      "https://github.com/natgw/natgw",
			"org.opencontainers.image.licenses":    "Apache-2.0",
			"org.opencontainers.image.created":     imagebuild.Epoch.Format(time.RFC3339),
		},
		StopSignal: "SIGTERM",
	})
}
