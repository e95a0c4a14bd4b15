package imagebuild

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftconn"
)

func moduleRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// readTar returns the regular files, symlinks and directories of a tar.
func readTar(t *testing.T, r io.Reader) (files map[string][]byte, links map[string]string, hdrs map[string]*tar.Header) {
	t.Helper()
	files, links, hdrs = map[string][]byte{}, map[string]string{}, map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		hdrs[h.Name] = h
		switch h.Typeflag {
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = b
		case tar.TypeSymlink:
			links[h.Name] = h.Linkname
		}
	}
}

// TestImage builds the image twice and inspects the archive: same digest,
// a valid OCI layout and docker archive, the entrypoint, a static natgw that
// runs, nothing else (no shell, no iptables).
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds natgw twice")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	opts := Options{ModuleDir: moduleRoot(t), Version: "9.9.9-test", Name: "natgw:test", Out: filepath.Join(dir, "a.tar")}
	r1, err := Build(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	opts.Out = filepath.Join(dir, "b.tar")
	r2, err := Build(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(filepath.Join(dir, "a.tar"))
	b, _ := os.ReadFile(filepath.Join(dir, "b.tar"))
	if r1.Digest != r2.Digest || !bytes.Equal(a, b) {
		t.Fatalf("two builds differ: %s vs %s (archives equal: %v)", r1.Digest, r2.Digest, bytes.Equal(a, b))
	}
	t.Logf("digest %s, layer %d bytes, binary %d bytes, archive %d bytes", r1.Digest, r1.LayerSize, r1.BinarySize, r1.ArchiveSize)

	// The archive as an OCI image layout.
	files, _, _ := readTar(t, bytes.NewReader(a))
	layoutDir := filepath.Join(dir, "layout")
	for name, data := range files {
		p := filepath.Join(layoutDir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("OCI layout: %v", err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 || im.Manifests[0].Digest != r1.Digest ||
		im.Manifests[0].Annotations["io.containerd.image.name"] != "natgw:test" || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "test" {
		t.Fatalf("index.json: %+v, %v", im, err)
	}
	img, err := idx.Image(r1.Digest)
	if err != nil {
		t.Fatal(err)
	}
	// The same archive as a docker-save archive (manifest.json).
	dimg, err := tarball.ImageFromPath(filepath.Join(dir, "a.tar"), nil)
	if err != nil {
		t.Fatalf("docker archive: %v", err)
	}
	if err := validate.Image(dimg); err != nil {
		t.Fatalf("docker archive: %v", err)
	}
	if d, _ := dimg.ConfigName(); d != r1.ConfigID {
		t.Fatalf("docker archive config %s, want %s", d, r1.ConfigID)
	}

	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cf.Config.Entrypoint, []string{"/natgw", "pause"}) || len(cf.Config.Cmd) != 0 {
		t.Fatalf("entrypoint %q cmd %q", cf.Config.Entrypoint, cf.Config.Cmd)
	}
	if cf.Config.Labels["org.opencontainers.image.version"] != "9.9.9-test" || cf.OS != "linux" || cf.Architecture != runtime.GOARCH || !cf.Created.Time.Equal(Epoch) {
		t.Fatalf("config: %+v", cf)
	}

	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	lfiles, links, hdrs := readTar(t, rc)
	rc.Close()
	for name, h := range hdrs {
		if !h.ModTime.Equal(Epoch) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: mtime %v owner %d:%d", name, h.ModTime, h.Uid, h.Gid)
		}
	}
	if len(lfiles) != 2 || lfiles["natgw"] == nil || lfiles[HABinary] == nil {
		t.Fatalf("regular files %v, want only natgw and %s", keys(lfiles), HABinary)
	}
	if n, h := len(lfiles["natgw"]), len(lfiles[HABinary]); int64(n) != r1.BinarySize || int64(h) != r1.HASize || n >= h {
		t.Errorf("natgw %d bytes (Result %d), %s %d (Result %d): want natgw, built without ha, the smaller", n, r1.BinarySize, HABinary, h, r1.HASize)
	}
	if len(links) != len(Links) {
		t.Errorf("links %v, want %v", keys(links), Links)
	}
	for _, l := range Links {
		if links[l] != "/natgw" {
			t.Errorf("%s -> %q, want /natgw", l, links[l])
		}
	}

	// natgw and natgw-ha are static and run.
	bin := filepath.Join(dir, "natgw")
	for _, name := range []string{"natgw", HABinary} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, lfiles[name], 0o755); err != nil {
			t.Fatal(err)
		}
		ef, err := elf.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ef.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s has a program interpreter: not static", name)
			}
		}
		if libs, err := ef.ImportedLibraries(); err != nil || len(libs) != 0 {
			t.Errorf("%s needs %v (%v): not static", name, libs, err)
		}
		if ds, _ := ef.DynString(elf.DT_NEEDED); len(ds) != 0 {
			t.Errorf("%s DT_NEEDED %v", name, ds)
		}
		ef.Close()
		out, err := exec.Command(p, "version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "natgw 9.9.9-test ") {
			t.Fatalf("%s version: %q, %v", name, out, err)
		}
	}
	// natgw ha runs natgw-ha (its usage names the fencing flags), and
	// says so when natgw-ha is missing.
	out, err := exec.Command(bin, "ha", "-h").CombinedOutput()
	if !strings.Contains(string(out), "-fence-lease") {
		t.Errorf("natgw ha -h: %q, %v: want natgw-ha's usage", out, err)
	}
	alone := filepath.Join(t.TempDir(), "natgw")
	if err := os.WriteFile(alone, lfiles["natgw"], 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(alone, "ha", "-h")
	cmd.Env = []string{"PATH=/nonexistent"}
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "built without ha") {
		t.Errorf("natgw ha without natgw-ha: %q, %v: want an error that says why", out, err)
	}
	// The compat name resolves by argv[0] in the image too.
	link := filepath.Join(dir, "nat-gateway.sh")
	os.Symlink(bin, link)
	if out, err := exec.Command(link, "get-iptables-version").CombinedOutput(); err != nil || !strings.Contains(string(out), "natgw 9.9.9-test") {
		t.Fatalf("nat-gateway.sh get-iptables-version: %q, %v", out, err)
	}
	var m v1.Manifest
	raw, _ := img.RawManifest()
	json.Unmarshal(raw, &m)
	if m.MediaType != "application/vnd.oci.image.manifest.v1+json" || m.Config.MediaType != "application/vnd.oci.image.config.v1+json" {
		t.Fatalf("media types %s / %s", m.MediaType, m.Config.MediaType)
	}
	gz, _ := layers[0].Compressed()
	if _, err := gzip.NewReader(gz); err != nil {
		t.Fatalf("layer not gzip: %v", err)
	}
	gz.Close()

	t.Run("rootfs", func(t *testing.T) { runInRootfs(t, lfiles, links, hdrs) })
}

// runInRootfs unpacks the layer into a directory and drives a gateway
// namespace from inside it (chroot, with only a procfs and the gateway's
// namespace file mounted in, as a container runtime would): the upstream controller's exact command
// lines through /bin/bash, which is natgw. Nothing but the image's files is
// there, so this proves the nftables path needs no shell, nft or iptables.
func runInRootfs(t *testing.T, files map[string][]byte, links map[string]string, hdrs map[string]*tar.Header) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chroot, mounts, namespaces)")
	}
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 1})
	if err != nil {
		t.Fatal(err)
	}
	// Not t.TempDir: the directory is removed only once nothing is mounted
	// in it any more.
	root, err := os.MkdirTemp("", "natgw-rootfs-")
	if err != nil {
		t.Fatal(err)
	}
	var mounted []string
	t.Cleanup(func() {
		for _, m := range mounted {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				t.Errorf("unmount %s: %v (leaving %s in place)", m, err, root)
				return
			}
		}
		os.RemoveAll(root)
	})
	for name, h := range hdrs {
		p := filepath.Join(root, name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, os.FileMode(h.Mode).Perm())
		case tar.TypeReg:
			err = os.WriteFile(p, files[name], os.FileMode(h.Mode).Perm())
		case tar.TypeSymlink:
			os.MkdirAll(filepath.Dir(p), 0o755)
			err = os.Symlink(links[name], p)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	// What a container runtime gives: a fresh procfs, and (here) the one
	// gateway namespace file. Neither has submounts, and both are made
	// private, so nothing propagates to or from the host's mounts: a
	// recursive bind of the shared /run/netns would join its peer group,
	// and unmounting the copy would unmount every named namespace.
	mnt := func(src, dst, fstype string, flags uintptr) {
		t.Helper()
		if err := unix.Mount(src, dst, fstype, flags, ""); err != nil {
			t.Fatalf("mount %s on %s: %v", src, dst, err)
		}
		mounted = append([]string{dst}, mounted...)
		if err := unix.Mount("", dst, "", unix.MS_PRIVATE, ""); err != nil {
			t.Fatalf("make %s private: %v", dst, err)
		}
	}
	procDir := filepath.Join(root, "proc")
	if err := os.MkdirAll(procDir, 0o555); err != nil {
		t.Fatal(err)
	}
	mnt("proc", procDir, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC)
	nsFile := filepath.Join(root, netns.RunDir, gw.GW)
	if err := os.MkdirAll(filepath.Dir(nsFile), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(nsFile, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	mnt(netns.Path(gw.GW), nsFile, "", unix.MS_BIND)
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("/bin/bash", args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
		cmd.Dir = "/"
		cmd.Env = []string{"PATH=/usr/local/bin:/bin", "NATGW_NETNS=" + gw.GW, "GATEWAY_V4=" + netlab.ExtAddr.String(), "NATGW_STATE_DIR_FOR_TEST=/tmp"}
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil || errb.Len() > 0 {
			t.Fatalf("chroot %s: /bin/bash %q: %v\nstdout: %s\nstderr: %s", root, args, err, out.String(), errb.String())
		}
		return out.String()
	}
	run("-c", "bash /kube-ovn/nat-gateway.sh init ")
	run("-c", "bash /kube-ovn/nat-gateway.sh eip-add 192.0.2.10/24")
	run("-c", "bash /kube-ovn/nat-gateway.sh floating-ip-add 192.0.2.10,198.51.100.10")
	if v := run("-c", "bash /kube-ovn/nat-gateway.sh get-iptables-version"); !strings.Contains(v, "iptables v1.8.9") {
		t.Fatalf("get-iptables-version: %q", v)
	}
	table, err := netlab.NftTable(context.Background(), gw.GW, "inet", nftconn.MainTable)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table, `192.0.2.10 comment "compat-fip-192.0.2.10" : 198.51.100.10`) {
		t.Fatalf("the FIP made inside the image is not in the table:\n%s", table)
	}
	if r, err := netlab.Dial(context.Background(), gw.Ext.NS, "192.0.2.10:80", netlab.FailTimeout); err == nil {
		t.Fatalf("nothing listens on vm1 yet, but a connection was answered: %+v", r)
	}
	srv, err := lab.ServeTCP(context.Background(), gw.VMs[0].NS, "198.51.100.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if r, err := netlab.Dial(context.Background(), gw.Ext.NS, "192.0.2.10:80", netlab.DialTimeout); err != nil || r.Client.Addr() != netlab.ExtAddr {
		t.Fatalf("ext -> FIP made from the image: %+v, %v", r, err)
	}
	run("-c", "bash /kube-ovn/nat-gateway.sh floating-ip-del 192.0.2.10")
	run("-c", "bash /kube-ovn/nat-gateway.sh eip-del 192.0.2.10/24")
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
