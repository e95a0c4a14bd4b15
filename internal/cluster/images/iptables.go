package images

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/natgw/natgw/gwimage/imagebuild"
)

// IptablesTools are the programs natgw's iptables data plane runs
// (nat/iptables: iptables-legacy-save, iptables-legacy-restore, nsenter),
// taken from the host's Debian packages (iptables, util-linux).
var IptablesTools = []string{"/usr/sbin/xtables-legacy-multi", "/usr/bin/nsenter"}

// IptablesLinks are the tool names that point at xtables-legacy-multi.
var IptablesLinks = []string{"usr/sbin/iptables-legacy-save", "usr/sbin/iptables-legacy-restore", "usr/sbin/iptables-legacy"}

// xtablesDir holds the iptables extensions xtables loads at run time.
const xtablesDir = "/usr/lib/x86_64-linux-gnu/xtables"

// GatewayIptablesName is the iptables variant's image name for version.
func GatewayIptablesName(version string) string {
	return "docker.io/natgw/natgw-iptables:" + version
}

// GatewayIptables writes the iptables variant of the gateway image: the
// gateway image of baseArchive (gwimage/imagebuild: natgw only, the
// nftables image) plus one layer with the host's iptables-legacy tools,
// nsenter, their shared libraries and loader, and the xtables extensions,
// with fixed times and owners (same host packages, same digest). It is for
// the cluster e2e's iptables data plane: the gateway image itself holds no
// iptables.
func GatewayIptables(ctx context.Context, baseArchive, name, out string) (*imagebuild.Result, error) {
	base, err := tarball.ImageFromPath(baseArchive, nil)
	if err != nil {
		return nil, fmt.Errorf("images: base %s: %w", baseArchive, err)
	}
	files, err := iptablesFiles(ctx)
	if err != nil {
		return nil, err
	}
	raw, err := filesLayer(files)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("images: layer: %w", err)
	}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: imagebuild.Epoch}, CreatedBy: "natgw images: iptables-legacy, nsenter and their libraries from Debian"},
	})
	if err != nil {
		return nil, fmt.Errorf("images: append layer: %w", err)
	}
	return imagebuild.WriteArchive(img, name, out)
}

// layerFile is one entry of a layer: a regular file (data), a directory or
// a symlink (link).
type layerFile struct {
	name, link string
	mode       int64
	dir        bool
	data       []byte
}

// iptablesFiles collects the tools, the libraries ldd names, the loader and
// the extensions, each under the path the loader or xtables looks for it.
func iptablesFiles(ctx context.Context) ([]layerFile, error) {
	paths := map[string]string{} // image path -> host file
	for _, t := range IptablesTools {
		paths[t] = t
		out, err := exec.CommandContext(ctx, "ldd", t).Output()
		if err != nil {
			return nil, fmt.Errorf("images: ldd %s: %w", t, err)
		}
		for _, m := range lddRE.FindAllStringSubmatch(string(out), -1) {
			lib := m[1]
			if m[2] != "" {
				lib = m[2]
			}
			// The libraries live where ldd says (/lib/... on merged /usr);
			// keep that path in the image.
			if strings.HasPrefix(lib, "/") {
				paths[lib] = lib
			}
		}
	}
	ext, err := filepath.Glob(filepath.Join(xtablesDir, "*.so"))
	if err != nil || len(ext) == 0 {
		return nil, fmt.Errorf("images: no xtables extensions in %s (install iptables)", xtablesDir)
	}
	for _, e := range ext {
		paths[e] = e
	}
	paths["/etc/protocols"] = "/etc/protocols"
	names := make([]string, 0, len(paths))
	for p := range paths {
		names = append(names, p)
	}
	sort.Strings(names)
	dirs := map[string]bool{}
	var files []layerFile
	for _, n := range names {
		data, err := os.ReadFile(paths[n]) // follows symlinks: the real file under the linked name
		if err != nil {
			return nil, fmt.Errorf("images: %w", err)
		}
		rel := strings.TrimPrefix(n, "/")
		for d := filepath.Dir(rel); d != "."; d = filepath.Dir(d) {
			dirs[d+"/"] = true
		}
		mode := int64(0o755)
		if strings.HasPrefix(rel, "etc/") {
			mode = 0o644
		}
		files = append(files, layerFile{name: rel, mode: mode, data: data})
	}
	for _, l := range IptablesLinks {
		files = append(files, layerFile{name: l, link: "xtables-legacy-multi", mode: 0o777})
	}
	dirs["run/"] = true
	for d := range dirs {
		files = append(files, layerFile{name: d, dir: true, mode: 0o755})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	return files, nil
}

// lddRE matches "name => /path (0x...)" and "/path (0x...)" lines.
var lddRE = regexp.MustCompile(`(?m)^\s*(\S+)(?: => (\S+))? \(0x[0-9a-f]+\)$`)

func filesLayer(files []layerFile) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: imagebuild.Epoch, Format: tar.FormatUSTAR}
		switch {
		case f.dir:
			h.Typeflag = tar.TypeDir
		case f.link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("images: layer %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, fmt.Errorf("images: layer %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("images: layer: %w", err)
	}
	return buf.Bytes(), nil
}
