// Package imagebuild builds the natgw gateway image without a container
// daemon: a static natgw binary (CGO off, -trimpath, fixed ldflags) in one
// layer with fixed timestamps and owners, an image config with a non-shell
// entrypoint, written as one tar that is both an OCI image layout and a
// `docker save` archive (index.json + manifest.json over the same blobs), so
// `docker load` and `podman load` both take it. The same inputs give the same
// bytes and so the same digest.
//
// The image holds:
//
//	/natgw                               the binary (entrypoint: /natgw pause), built
//	                                     with OmitHATag: every command but `ha`
//	/natgw-ha                            the same main package without the tag: `ha`
//	                                     (/natgw ha execs it), with client-go and Prometheus
//	/usr/local/bin/nat-gateway.sh -> /natgw   Kube-OVN script name (argv[0] dispatch)
//	/kube-ovn/nat-gateway.sh -> /natgw        the path Kube-OVN's controller execs
//	/kube-ovn/lb-svc.sh -> /natgw             the LoadBalancer-Service pods' script
//	/bin/bash, /bin/sh -> /natgw              not a shell: run only the command lines Kube-OVN uses
//	                                          (`bash -c "bash /kube-ovn/nat-gateway.sh OP RULE..."`,
//	                                          `sh -c "sysctl -w KEY=VALUE"`, `bash -c "sleep infinity"`)
//	/bin/sleep, /bin/sysctl -> /natgw         the gateway pod's command and PostStart hook
//	/bin/ip, /bin/iptables, /bin/ip6tables    only the VPC LB pod's init containers' forms
//	/tmp                                      empty, 1777
//
// and no shell, iptables or other tools: each link is served by natgw
// (gwimage/cmd/natgw, multicall).
package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Package paths.
const (
	// MainPackage is natgw's main package.
	MainPackage = "github.com/natgw/natgw/gwimage/cmd/natgw"
	// VersionVar is stamped with the version at link time.
	VersionVar = "github.com/natgw/natgw/gwimage/version.Version"
	// OmitHATag builds natgw without `natgw ha` and what only it links
	// (client-go's REST client, API machinery, Prometheus): the image's
	// /natgw, exec'd per rule and per session, maps and starts half as much
	// (gwimage/cmd/natgw/ha_omit.go). Its `ha` execs HABinary.
	OmitHATag = "natgw_omit_ha"
	// HABinary is the image's second binary, MainPackage without
	// OmitHATag, beside /natgw.
	HABinary = "natgw-ha"
)

// Epoch is the timestamp of every file, the layer and the config (SOURCE_DATE_EPOCH
// style fixed time: 2000-01-01T00:00:00Z).
var Epoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Options say what to build.
type Options struct {
	// ModuleDir is the root of the natgw module (where go.mod is).
	ModuleDir string
	// Version is stamped into the binary and the labels.
	Version string
	// Name is the image reference recorded in the archive, e.g. "natgw:0.1.0".
	Name string
	// Arch is the GOARCH of the image (default: the host's).
	Arch string
	// Out is the archive path.
	Out string
	// Go is the go command (default "go").
	Go string
}

// Result describes a built image.
type Result struct {
	Digest      v1.Hash // the manifest digest (what a registry would call the image)
	ConfigID    v1.Hash // the config digest (what docker shows as the image ID)
	LayerSize   int64   // compressed layer bytes
	BinarySize  int64   // natgw's bytes
	HASize      int64   // natgw-ha's bytes
	ArchiveSize int64   // the archive's bytes
	Name        string
}

// Build builds the binary and writes the image archive.
func Build(ctx context.Context, o Options) (*Result, error) {
	if o.Arch == "" {
		o.Arch = runtime.GOARCH
	}
	if o.Go == "" {
		o.Go = "go"
	}
	if o.Version == "" || o.Name == "" || o.Out == "" || o.ModuleDir == "" {
		return nil, errors.New("imagebuild: ModuleDir, Version, Name and Out are required")
	}
	tmp, err := os.MkdirTemp("", "natgw-image-")
	if err != nil {
		return nil, fmt.Errorf("imagebuild: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := BuildBinaries(ctx, o, tmp); err != nil {
		return nil, err
	}
	var bins Binaries
	for _, b := range []struct {
		name string
		data *[]byte
	}{{"natgw", &bins.Natgw}, {HABinary, &bins.HA}} {
		if *b.data, err = os.ReadFile(filepath.Join(tmp, b.name)); err != nil {
			return nil, fmt.Errorf("imagebuild: %w", err)
		}
	}
	img, err := Image(bins, o)
	if err != nil {
		return nil, err
	}
	res, err := WriteArchive(img, o.Name, o.Out)
	if err != nil {
		return nil, err
	}
	res.BinarySize, res.HASize = int64(len(bins.Natgw)), int64(len(bins.HA))
	return res, nil
}

// Binaries are the image's two builds of MainPackage.
type Binaries struct {
	Natgw []byte // with OmitHATag
	HA    []byte // without
}

// BuildBinaries builds the image's natgw (OmitHATag) and HABinary into
// dir, statically and reproducibly.
func BuildBinaries(ctx context.Context, o Options, dir string) error {
	if err := BuildBinary(ctx, o, filepath.Join(dir, "natgw"), OmitHATag); err != nil {
		return err
	}
	return BuildBinary(ctx, o, filepath.Join(dir, HABinary), "")
}

// BuildBinary builds MainPackage with the build tags (comma-separated, ""
// for none) statically and reproducibly into out.
func BuildBinary(ctx context.Context, o Options, out, tags string) error {
	cmd := exec.CommandContext(ctx, o.Go, "build",
		"-trimpath", "-buildvcs=false", "-tags", tags,
		"-ldflags", fmt.Sprintf("-s -w -buildid= -X %s=%s", VersionVar, o.Version),
		"-o", out, MainPackage)
	cmd.Dir = o.ModuleDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.Arch, "GOFLAGS=-mod=readonly")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("imagebuild: go build -tags %q %s: %w\n%s", tags, MainPackage, err, stderr.String())
	}
	return nil
}

// Links are the image's paths (without the leading slash) that are
// symbolic links to /natgw.
var Links = []string{"bin/bash", "bin/ip", "bin/ip6tables", "bin/iptables", "bin/sh", "bin/sleep", "bin/sysctl", "kube-ovn/lb-svc.sh", "kube-ovn/nat-gateway.sh", "usr/local/bin/nat-gateway.sh"}

// layerEntries lists the layer's files in archive order.
func layerEntries(bins Binaries) []Entry {
	dir := func(n string, mode int64) Entry { return Entry{Name: n, Mode: mode, Type: tar.TypeDir} }
	sym := func(n string) Entry { return Entry{Name: n, Link: "/natgw", Mode: 0o777, Type: tar.TypeSymlink} }
	return []Entry{
		dir("bin/", 0o755),
		sym("bin/bash"),
		sym("bin/ip"),
		sym("bin/ip6tables"),
		sym("bin/iptables"),
		sym("bin/sh"),
		sym("bin/sleep"),
		sym("bin/sysctl"),
		dir("kube-ovn/", 0o755),
		sym("kube-ovn/lb-svc.sh"),
		sym("kube-ovn/nat-gateway.sh"),
		{Name: "natgw", Mode: 0o755, Type: tar.TypeReg, Data: bins.Natgw},
		{Name: HABinary, Mode: 0o755, Type: tar.TypeReg, Data: bins.HA},
		dir("tmp/", 0o1777),
		dir("usr/", 0o755),
		dir("usr/local/", 0o755),
		dir("usr/local/bin/", 0o755),
		sym("usr/local/bin/nat-gateway.sh"),
	}
}

// Labels returns the image labels.
func Labels(version string) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "natgw",
		"org.opencontainers.image.description": "nftables-native VPC NAT gateway for Kube-OVN: natgw agent and nat-gateway.sh compatibility",
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.source":      "https://github.com/natgw/natgw",
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.created":     Epoch.Format(time.RFC3339),
	}
}

// IndexDir is where `natgw serve` keeps its index snapshot in the image
// (the environment variable NATGW_INDEX_DIR; nat/README.md, "The index
// snapshot"): the container's filesystem, so every serve exec'ed into the
// same container starts from the last one's.
const IndexDir = "/etc/natgw"

// Image assembles the image from its binaries.
func Image(bins Binaries, o Options) (v1.Image, error) {
	raw, err := LayerTar(layerEntries(bins))
	if err != nil {
		return nil, err
	}
	return OneLayer(raw, "natgw imagebuild: /natgw, /natgw-ha, compatibility links", "natgw "+o.Version, o.Arch, v1.Config{
		Entrypoint: []string{"/natgw", "pause"},
		Env:        []string{"PATH=/usr/local/bin:/bin", "NATGW_INDEX_DIR=" + IndexDir},
		WorkingDir: "/",
		Labels:     Labels(o.Version),
		StopSignal: "SIGTERM",
	})
}

// WriteArchive writes img as one tar holding an OCI image layout
// (oci-layout, index.json, blobs/sha256/...) and a docker-save manifest.json
// over the same blobs, with fixed timestamps.
func WriteArchive(img v1.Image, name, out string) (*Result, error) {
	manifest, err := img.RawManifest()
	if err != nil {
		return nil, fmt.Errorf("imagebuild: manifest: %w", err)
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("imagebuild: digest: %w", err)
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("imagebuild: config: %w", err)
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return nil, fmt.Errorf("imagebuild: config digest: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("imagebuild: layers: %w", err)
	}
	type blob struct {
		h    v1.Hash
		data []byte
	}
	blobs := []blob{{cfgName, cfg}, {digest, manifest}}
	var layerPaths []string
	var layerSize int64
	for _, l := range layers {
		h, err := l.Digest()
		if err != nil {
			return nil, fmt.Errorf("imagebuild: layer digest: %w", err)
		}
		rc, err := l.Compressed()
		if err != nil {
			return nil, fmt.Errorf("imagebuild: layer: %w", err)
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("imagebuild: layer: %w", err)
		}
		layerSize += int64(len(data))
		blobs = append(blobs, blob{h, data})
		layerPaths = append(layerPaths, blobPath(h))
	}
	mt, err := img.MediaType()
	if err != nil {
		return nil, fmt.Errorf("imagebuild: media type: %w", err)
	}
	index := map[string]any{
		"schemaVersion": 2,
		"mediaType":     types.OCIImageIndex,
		"manifests": []map[string]any{{
			"mediaType": mt,
			"digest":    digest.String(),
			"size":      len(manifest),
			"annotations": map[string]string{
				"io.containerd.image.name":          name,
				"org.opencontainers.image.ref.name": refName(name),
			},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return nil, fmt.Errorf("imagebuild: index: %w", err)
	}
	dockerManifest, err := json.Marshal([]map[string]any{{
		"Config":   blobPath(cfgName),
		"RepoTags": []string{name},
		"Layers":   layerPaths,
	}})
	if err != nil {
		return nil, fmt.Errorf("imagebuild: manifest.json: %w", err)
	}

	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return nil, fmt.Errorf("imagebuild: %w", err)
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return nil, fmt.Errorf("imagebuild: %w", err)
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	add := func(name string, data []byte, typ byte) error {
		h := &tar.Header{Typeflag: typ, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: Epoch, Format: tar.FormatUSTAR}
		if typ == tar.TypeDir {
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	werr := errors.Join(
		add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`), tar.TypeReg),
		add("index.json", indexJSON, tar.TypeReg),
		add("manifest.json", dockerManifest, tar.TypeReg),
		add("blobs/", nil, tar.TypeDir),
		add("blobs/sha256/", nil, tar.TypeDir),
	)
	seen := map[v1.Hash]bool{}
	for _, b := range blobs {
		if seen[b.h] {
			continue
		}
		seen[b.h] = true
		werr = errors.Join(werr, add(blobPath(b.h), b.data, tar.TypeReg))
	}
	werr = errors.Join(werr, tw.Close(), f.Close())
	if werr != nil {
		return nil, fmt.Errorf("imagebuild: write %s: %w", out, werr)
	}
	if err := os.Rename(tmp, out); err != nil {
		return nil, fmt.Errorf("imagebuild: %w", err)
	}
	st, err := os.Stat(out)
	if err != nil {
		return nil, fmt.Errorf("imagebuild: %w", err)
	}
	return &Result{Digest: digest, ConfigID: cfgName, LayerSize: layerSize, ArchiveSize: st.Size(), Name: name}, nil
}

func blobPath(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

// refName is the tag part of name ("natgw:0.1.0" -> "0.1.0"), the form OCI
// layouts use for org.opencontainers.image.ref.name.
func refName(name string) string {
	if i := strings.LastIndex(name, ":"); i >= 0 && !strings.Contains(name[i:], "/") {
		return name[i+1:]
	}
	return "latest"
}
