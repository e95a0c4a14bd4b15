package images

import (
	"archive/tar"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/tarball"

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
	raw, err := imagebuild.LayerTar(files)
	if err != nil {
		return nil, err
	}
	img, err := imagebuild.Append(base, raw, "natgw images: iptables-legacy, nsenter and their libraries from Debian", "")
	if err != nil {
		return nil, err
	}
	return imagebuild.WriteArchive(img, name, out)
}

// iptablesFiles collects the tools, the libraries ldd names, the loader and
// the extensions, each under the path the loader or xtables looks for it.
func iptablesFiles(ctx context.Context) ([]imagebuild.Entry, error) {
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
	var files []imagebuild.Entry
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
		files = append(files, imagebuild.Entry{Type: tar.TypeReg, Name: rel, Mode: mode, Data: data})
	}
	for _, l := range IptablesLinks {
		files = append(files, imagebuild.Entry{Type: tar.TypeSymlink, Name: l, Link: "xtables-legacy-multi", Mode: 0o777})
	}
	dirs["run/"] = true
	for d := range dirs {
		files = append(files, imagebuild.Entry{Type: tar.TypeDir, Name: d, Mode: 0o755})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	return files, nil
}

// lddRE matches "name => /path (0x...)" and "/path (0x...)" lines.
var lddRE = regexp.MustCompile(`(?m)^\s*(\S+)(?: => (\S+))? \(0x[0-9a-f]+\)$`)
