package cluster

import (
	"strings"
	"testing"
)

func TestQualifiedImage(t *testing.T) {
	for in, want := range map[string]string{
		"natgw:0.1.0":                         "docker.io/library/natgw:0.1.0",
		"natgw/natgw-controller:0.1.0":        "docker.io/natgw/natgw-controller:0.1.0",
		"docker.io/natgw/pause:0.1.0":         "docker.io/natgw/pause:0.1.0",
		"registry.k8s.io/pause:3.10":          "registry.k8s.io/pause:3.10",
		"localhost/natgw:1":                   "localhost/natgw:1",
		"localhost:5000/natgw:1":              "localhost:5000/natgw:1",
		"docker.io/library/natgw:0.1.0":       "docker.io/library/natgw:0.1.0",
		"ghcr.io/natgw/natgw-controller:main": "ghcr.io/natgw/natgw-controller:main",
	} {
		if got := QualifiedImage(in); got != want {
			t.Errorf("QualifiedImage(%q) = %q, want %q", in, got, want)
		}
	}
}

// The rendered configurations carry what a node on this kind of machine
// needs (containerdConfig and the kubelet configuration say why).
func TestConfigs(t *testing.T) {
	c := &Cluster{cfg: Defaults(Config{}, "/repo"), pkiDir: "pki-x"}
	for _, tc := range []struct {
		name, text string
		want       []string
	}{
		{"containerd", c.containerdConfig(), []string{
			"version = 3", "restrict_oom_score_adj = true", "SystemdCgroup = false",
			"netns_mounts_under_state_dir = true", `sandbox = "` + PauseImage + `"`,
			`root = "/var/lib/natgw-cluster/containerd/root"`, `bin_dirs = ["/repo/.cache/cluster/bin/cni"]`,
			`BinaryName = "/usr/sbin/runc"`, `"io.containerd.nri.v1.nri"`}},
		{"kubelet", c.kubeletConfig(), []string{
			"cgroupDriver: cgroupfs", "failCgroupV1: false", "address: 172.30.77.1", "port: 16250",
			"readOnlyPort: 0", "mode: Webhook", "volumePluginDir: /var/lib/natgw-cluster/kubelet-plugins/volume"}},
		{"cni", c.cniConfig(), []string{`"bridge": "ngwcbr0"`, `"subnet": "10.244.77.0/24"`, `"isGateway": true`,
			`"dataDir": "/var/lib/natgw-cluster/cni/ipam"`, `"type": "portmap"`}},
		{"kubeconfig", c.kubeconfig("admin"), []string{"server: https://172.30.77.1:16443",
			"client-certificate: /var/lib/natgw-cluster/pki-x/admin.crt", "certificate-authority: /var/lib/natgw-cluster/pki-x/ca.crt"}},
	} {
		for _, w := range tc.want {
			if !strings.Contains(tc.text, w) {
				t.Errorf("%s config lacks %q:\n%s", tc.name, w, tc.text)
			}
		}
	}
}

func TestMissing(t *testing.T) {
	cfg := Defaults(Config{}, t.TempDir())
	why := Missing(cfg)
	if why == "" {
		t.Fatal("Missing found nothing missing in an empty directory")
	}
	if !strings.Contains(why, "kubelet") && !strings.Contains(why, "root") {
		t.Errorf("Missing = %q, want it to name kubelet (or root)", why)
	}
}

func TestParseImageNames(t *testing.T) {
	out := "docker.io/natgw/pause:0.1.0\n" +
		`time="2026-12-03T12:43:51Z" level=warning msg="something"` + "\n" +
		"natgw:0.1.0\nsha256:0123abcd\n\n"
	got := parseImageNames(out)
	want := map[string]bool{"docker.io/natgw/pause:0.1.0": true, "natgw:0.1.0": true, "sha256:0123abcd": true}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for n := range want {
		if !got[n] {
			t.Errorf("%q missing from %v", n, got)
		}
	}
}
