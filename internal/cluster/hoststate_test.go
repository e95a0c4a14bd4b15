package cluster

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestSplitRule(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"-A INPUT -j KUBE-FIREWALL", []string{"-A", "INPUT", "-j", "KUBE-FIREWALL"}},
		{`-A CNI-x -d 10.0.0.0/24 -m comment --comment "name: \"natgw\" id: \"abc\"" -j ACCEPT`,
			[]string{"-A", "CNI-x", "-d", "10.0.0.0/24", "-m", "comment", "--comment", `name: "natgw" id: "abc"`, "-j", "ACCEPT"}},
		{`-A X -m comment --comment ""`, []string{"-A", "X", "-m", "comment", "--comment", ""}},
		{"", nil},
	} {
		if got := splitRule(tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("splitRule(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestIPTablesUndo(t *testing.T) {
	before := strings.Join([]string{
		"*filter", ":INPUT ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]", ":MINE - [0:0]",
		"-A INPUT -j MINE", "-A MINE -j ACCEPT", "COMMIT",
	}, "\n")
	for _, tc := range []struct {
		name, after string
		want        []string
	}{
		{"unchanged", before, nil},
		{"kubelet firewall and a new nat table", strings.Join([]string{
			"*filter", ":INPUT ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]", ":KUBE-FIREWALL - [0:0]", ":MINE - [0:0]",
			"-A INPUT -j KUBE-FIREWALL", "-A INPUT -j MINE", "-A OUTPUT -j KUBE-FIREWALL",
			"-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -j DROP",
			"-A MINE -j ACCEPT", "COMMIT",
			"*nat", ":POSTROUTING ACCEPT [0:0]", ":CNI-1 - [0:0]",
			"-A POSTROUTING -s 10.244.77.2/32 -j CNI-1", "-A CNI-1 -j MASQUERADE", "COMMIT",
		}, "\n"), []string{
			"-t filter -D INPUT -j KUBE-FIREWALL",
			"-t filter -D OUTPUT -j KUBE-FIREWALL",
			"-t nat -D POSTROUTING -s 10.244.77.2/32 -j CNI-1",
			"-t filter -F KUBE-FIREWALL",
			"-t nat -F CNI-1",
			"-t filter -X KUBE-FIREWALL",
			"-t nat -X CNI-1",
		}},
		{"a duplicate of an existing rule", strings.Join([]string{
			"*filter", ":INPUT ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]", ":MINE - [0:0]",
			"-A INPUT -j MINE", "-A INPUT -j MINE", "-A MINE -j ACCEPT", "COMMIT",
		}, "\n"), []string{"-t filter -D INPUT -j MINE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, args := range iptablesUndo(before, tc.after) {
				got = append(got, strings.Join(args, " "))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("undo:\n got  %q\n want %q", got, tc.want)
			}
		})
	}
}

func TestParseTCPLine(t *testing.T) {
	for _, tc := range []struct {
		line  string
		port  int
		inode string
		ok    bool
	}{
		{"   0: 014D1EAC:4033 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 123456 1 0000000000000000 100 0 0 10 0", 0x4033, "123456", true},
		{"   1: 0100007F:3FEB 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 654321 1", 0, "", false}, // ESTABLISHED
		{"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode", 0, "", false},
		{"   2: 00000000000000000000000000000000:4033 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1", 0x4033, "777", true},
	} {
		port, inode, ok := parseTCPLine(tc.line)
		if port != tc.port || inode != tc.inode || ok != tc.ok {
			t.Errorf("parseTCPLine(%q) = %d, %q, %v; want %d, %q, %v", tc.line, port, inode, ok, tc.port, tc.inode, tc.ok)
		}
	}
}

func TestMentions(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want bool
	}{
		{[]string{"kube-apiserver", "--client-ca-file=/var/lib/natgw-cluster/pki/ca.crt"}, true},
		{[]string{"etcd", "--data-dir", "/var/lib/natgw-cluster"}, true},
		{[]string{"etcd", "--data-dir", "/var/lib/natgw-cluster-other/etcd"}, false},
		{[]string{"kube-apiserver", "--etcd-servers=http://127.0.0.1:2379"}, false},
	} {
		if got := mentions(tc.argv, "/var/lib/natgw-cluster"); got != tc.want {
			t.Errorf("mentions(%q) = %v, want %v", tc.argv, got, tc.want)
		}
	}
}

// TestListeners finds this test's own listening socket by its port.
func TestListeners(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	ls, err := listeners([]int{port})
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 || ls[0].pid != os.Getpid() || ls[0].port != port {
		t.Fatalf("listeners on %d = %v, want this process (pid %d)", port, ls, os.Getpid())
	}
	ln.Close()
	if ls, err := listeners([]int{port}); err != nil || len(ls) != 0 {
		t.Fatalf("listeners on %d after close = %v, %v; want none", port, ls, err)
	}
}

// TestClearPorts: a listener on a cluster port whose command line names
// the cluster's base directory (a daemon of an earlier cluster) is
// stopped; any other listener is an error naming it.
func TestClearPorts(t *testing.T) {
	if os.Getenv("NATGW_TEST_LISTEN") != "" {
		ln, err := net.Listen("tcp", os.Getenv("NATGW_TEST_LISTEN"))
		if err != nil {
			os.Exit(3)
		}
		defer ln.Close()
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	base := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	c := &Cluster{cfg: Config{Base: base, APIPort: port}}
	if err := c.clearPorts(context.Background()); err == nil || !strings.Contains(err.Error(), strconv.Itoa(os.Getpid())) {
		t.Fatalf("clearPorts with a foreign listener: %v; want an error naming pid %d", err, os.Getpid())
	}
	ln.Close()

	child := exec.Command(os.Args[0], "-test.run=^TestClearPorts$", base+"/pki/ca.crt")
	child.Env = append(os.Environ(), "NATGW_TEST_LISTEN="+ln.Addr().String())
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- child.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ls, _ := listeners([]int{port})
		if len(ls) == 1 && ls[0].pid == child.Process.Pid {
			break
		}
		if time.Now().After(deadline) {
			_ = child.Process.Kill()
			t.Fatalf("the child never listened on %d: %v", port, ls)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := c.clearPorts(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = child.Process.Kill()
		t.Fatal("the earlier cluster's listener still runs after clearPorts")
	}
}

// TestClusterPidsThroughSymlink: a process started from a bin dir reached
// through a symlink (/proc/PID/exe names the real path) is still one of the
// cluster's, so cluster-down kills it (a .cache linked elsewhere once left
// containerd shims running).
func TestClusterPidsThroughSymlink(t *testing.T) {
	real := filepath.Join(t.TempDir(), "bin")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	src, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("no sleep binary: %v", err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(real, "sleep"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "linked")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(link, "sleep"), "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if !slices.Contains(clusterPids([]string{link}), cmd.Process.Pid) {
		t.Errorf("pid %d (started from %s) not among the cluster's processes", cmd.Process.Pid, link)
	}
	if slices.Contains(clusterPids([]string{t.TempDir()}), cmd.Process.Pid) {
		t.Errorf("pid %d matched an unrelated dir", cmd.Process.Pid)
	}
}
