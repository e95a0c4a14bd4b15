package cluster

import (
	"fmt"
	"net/netip"
	"strings"
)

// containerdConfig renders containerd's config (version 3): private root,
// state and sockets, what this kind of machine needs (restrict_oom_score_adj:
// the VM lacks CAP_SYS_RESOURCE; cgroupfs; netns mounts under the state dir;
// CNI in the cluster's own directories; the self-built pause image pinned),
// and the plugins the node does not need disabled.
func (c *Cluster) containerdConfig() string {
	return fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.snapshotter.v1.blockfile",
]

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
`, c.path("containerd/root"), c.path("containerd/state"), c.ContainerdSocket(), c.ContainerdSocket()+".ttrpc",
		PauseImage, c.cfg.BinDir+"/cni", c.path("cni/net.d"), c.cfg.Runc)
}

// cniConfig is the node's pod network: a bridge of its own with the pod
// CIDR (gateway on the bridge, masquerade out), host-local IPAM with its
// state in the cluster's directory, then portmap.
func (c *Cluster) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "natgw-cluster",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q, "rangeStart": %q, "rangeEnd": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, BridgeName, c.path("cni/ipam"), c.cfg.PodCIDR, c.hostAddr(2), c.hostAddr(PodRangeEnd))
}

// PodRangeEnd is the last host number host-local hands to pods; the
// addresses above it in PodCIDR are free for hosts a test attaches to the
// bridge (HostAddr).
const PodRangeEnd = 199

// hostAddr returns host number n of the pod CIDR (a /24).
func (c *Cluster) hostAddr(n int) string {
	p, err := netip.ParsePrefix(c.cfg.PodCIDR)
	if err != nil {
		return ""
	}
	b := p.Masked().Addr().As4()
	b[3] = byte(n)
	return netip.AddrFrom4(b).String()
}

// HostAddr returns host number n (PodRangeEnd < n < 255) of the pod CIDR, an
// address no pod gets: for hosts a test attaches to the pod bridge.
func (c *Cluster) HostAddr(n int) (netip.Addr, error) {
	if n <= PodRangeEnd || n > 254 {
		return netip.Addr{}, fmt.Errorf("cluster: host number %d outside %d..254", n, PodRangeEnd+1)
	}
	return netip.ParseAddr(c.hostAddr(n))
}

// kubeletConfig is the KubeletConfiguration: cgroupfs on cgroup v1, x509
// and webhook authentication and authorization, the cluster's own paths,
// eviction thresholds low enough for a busy test machine.
func (c *Cluster) kubeletConfig() string {
	pki := c.path(c.pkiDir)
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: %d
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %s/ca.crt}
authorization:
  mode: Webhook
tlsCertFile: %s/kubelet.crt
tlsPrivateKeyFile: %s/kubelet.key
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
volumePluginDir: %s
podLogsDir: %s
resolvConf: /etc/resolv.conf
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  nodefs.inodesFree: "1%%"
  imagefs.available: "1%%"
  imagefs.inodesFree: "1%%"
evictionPressureTransitionPeriod: 5s
nodeStatusUpdateFrequency: 2s
syncFrequency: 10s
maxPods: 200
`, c.cfg.NodeIP, c.cfg.KubeletPort, pki, pki, pki, c.ContainerdSocket(), c.path("kubelet-plugins/volume"), c.path("log/pods"))
}

// flags renders name=value flags in order.
func flags(kv ...string) []string {
	out := make([]string, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, "--"+kv[i]+"="+kv[i+1])
	}
	return out
}

// QualifiedImage returns the fully qualified form of an image reference as
// containerd's CRI looks it up: "natgw:0.1.0" -> "docker.io/library/natgw:0.1.0",
// "natgw/pause:1" -> "docker.io/natgw/pause:1"; qualified names are unchanged.
func QualifiedImage(ref string) string {
	first, _, found := strings.Cut(ref, "/")
	if !found {
		return "docker.io/library/" + ref
	}
	if strings.ContainsAny(first, ".:") || first == "localhost" {
		return ref
	}
	return "docker.io/" + ref
}
