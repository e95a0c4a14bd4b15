package firstrun_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"

	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/procfs"
)

// host is what the cluster changes on the host (internal/cluster's lists
// Sysctls, IPTablesTools and FixedPaths): sysctls, every iptables front
// end's rules, the nftables tables, mounts, links and the fixed paths the
// kubelet, containerd and libcni write. Network namespaces (this or another
// test's) are left out.
type host struct {
	sysctls  map[string]string
	iptables map[string]string
	nft      []string
	mounts   []string
	links    []string
	paths    []string // FixedPaths that exist
}

func snapshot(ctx context.Context, t *testing.T) host {
	t.Helper()
	ipt, err := cluster.IPTablesSave(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := host{sysctls: cluster.ReadSysctls(), iptables: ipt}
	out, err := exec.CommandContext(ctx, "nft", "list", "tables").Output()
	if err != nil {
		t.Fatalf("nft list tables: %v", err)
	}
	h.nft = lines(string(out))
	mounts, err := procfs.Mounts()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mounts {
		if m.FSType == "nsfs" || strings.HasPrefix(m.Point, "/run/netns/") || strings.HasPrefix(m.Point, "/var/run/netns/") {
			continue
		}
		h.mounts = append(h.mounts, m.Point+" "+m.FSType)
	}
	sort.Strings(h.mounts)
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range ifs {
		h.links = append(h.links, i.Name)
	}
	sort.Strings(h.links)
	for _, p := range cluster.FixedPaths {
		if _, err := os.Stat(p); err == nil {
			h.paths = append(h.paths, p)
		}
	}
	return h
}

// diff lists what differs between h (before) and a (after).
func (h host) diff(a host) []string {
	var d []string
	for k, v := range h.sysctls {
		if a.sysctls[k] != v {
			d = append(d, fmt.Sprintf("sysctl %s: %q before, %q after", k, v, a.sysctls[k]))
		}
	}
	for tool, v := range h.iptables {
		if a.iptables[tool] != v {
			d = append(d, fmt.Sprintf("%s rules:\nbefore:\n%s\nafter:\n%s", tool, v, a.iptables[tool]))
		}
	}
	for _, c := range []struct {
		what          string
		before, after []string
	}{
		{"nftables tables", h.nft, a.nft},
		{"mounts", h.mounts, a.mounts},
		{"links", h.links, a.links},
		{"fixed paths", h.paths, a.paths},
	} {
		if gone, added := setDiff(c.before, c.after), setDiff(c.after, c.before); len(gone)+len(added) > 0 {
			d = append(d, fmt.Sprintf("%s: gone %q, added %q", c.what, gone, added))
		}
	}
	sort.Strings(d)
	return d
}

// setDiff is a minus b, as multisets.
func setDiff(a, b []string) []string {
	n := map[string]int{}
	for _, s := range b {
		n[s]++
	}
	var out []string
	for _, s := range a {
		if n[s] > 0 {
			n[s]--
			continue
		}
		out = append(out, s)
	}
	return out
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	sort.Strings(out)
	return out
}

// TestHostDiff: the before/after comparison reports each kind of change
// (so the first run's host check can fail).
func TestHostDiff(t *testing.T) {
	base := host{
		sysctls:  map[string]string{"net.ipv4.ip_forward": "0"},
		iptables: map[string]string{"iptables-nft": "*filter\nCOMMIT"},
		nft:      []string{"table ip filter"},
		mounts:   []string{"/ proc"},
		links:    []string{"lo"},
		paths:    []string{"/etc/cni"},
	}
	for _, tc := range []struct {
		name string
		mod  func(h *host)
		want string
	}{
		{"same", func(h *host) {}, ""},
		{"sysctl", func(h *host) { h.sysctls = map[string]string{"net.ipv4.ip_forward": "1"} }, `sysctl net.ipv4.ip_forward: "0" before, "1" after`},
		{"iptables", func(h *host) {
			h.iptables = map[string]string{"iptables-nft": "*filter\n:KUBE-FIREWALL - [0:0]\nCOMMIT"}
		}, "iptables-nft rules"},
		{"nft table", func(h *host) { h.nft = []string{"table ip filter", "table ip nat"} }, `nftables tables: gone [], added ["table ip nat"]`},
		{"mount", func(h *host) { h.mounts = []string{"/ proc", "/var/lib/kubelet/pods/x tmpfs"} }, `mounts: gone [], added ["/var/lib/kubelet/pods/x tmpfs"]`},
		{"link", func(h *host) { h.links = []string{"cni0", "lo"} }, `links: gone [], added ["cni0"]`},
		{"path", func(h *host) { h.paths = nil }, `fixed paths: gone ["/etc/cni"], added []`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := base
			tc.mod(&a)
			d := strings.Join(base.diff(a), "\n")
			if tc.want == "" && d != "" || !strings.Contains(d, tc.want) {
				t.Fatalf("diff = %q, want %q", d, tc.want)
			}
		})
	}
}
