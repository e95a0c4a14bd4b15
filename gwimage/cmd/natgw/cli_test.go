package main

import (
	"bufio"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

func TestParseObjects(t *testing.T) {
	fipYAML := "uid: a\nkind: fip\nfip:\n  eip: 192.0.2.10\n  internalIP: 198.51.100.10\n"
	tests := []struct {
		name    string
		in      string
		n       int
		wantErr string
	}{
		{"yaml list", "- " + strings.ReplaceAll(fipYAML, "\n", "\n  "), 1, ""},
		{"yaml objects document", "objects:\n- " + strings.ReplaceAll(fipYAML, "\n", "\n  "), 1, ""},
		{"yaml single object", fipYAML, 1, ""},
		{"json list", `[{"uid":"a","kind":"fip","fip":{"eip":"192.0.2.10","internalIP":"198.51.100.10"}},{"uid":"b","kind":"route","route":{"destination":"0.0.0.0/0","nextHop":"192.0.2.1","device":"external"}}]`, 2, ""},
		{"empty", "", 0, ""},
		{"empty list", "[]", 0, ""},
		{"unknown field", "uid: a\nkind: fip\nfipp: {}\n", 0, "unknown field"},
		{"bad address", "uid: a\nkind: fip\nfip: {eip: 192.0.2.300}\n", 0, "192.0.2.300"},
		{"not yaml", "a: [", 0, "parse"},
		{"scalar", "hello", 0, "want a list of objects or a mapping"},
	}
	for _, tt := range tests {
		got, err := ParseObjects([]byte(tt.in))
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: %v, want error with %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil || len(got) != tt.n || got == nil {
			t.Errorf("%s: %d objects, %v; want %d", tt.name, len(got), err, tt.n)
		}
	}
}

func TestShimWords(t *testing.T) {
	tests := []struct {
		args []string
		want []string
		ok   bool
	}{
		{[]string{"-c", "bash /kube-ovn/nat-gateway.sh eip-add 192.0.2.10/24,192.0.2.1"}, []string{"eip-add", "192.0.2.10/24,192.0.2.1"}, true},
		{[]string{"-c", "bash /kube-ovn/nat-gateway.sh snat-add 192.0.2.12,10.0.0.0/24,--random-fully 192.0.2.13,10.1.0.0/24"}, []string{"snat-add", "192.0.2.12,10.0.0.0/24,--random-fully", "192.0.2.13,10.1.0.0/24"}, true},
		{[]string{"-c", "/usr/local/bin/nat-gateway.sh get-iptables-version"}, []string{"get-iptables-version"}, true},
		{[]string{"/kube-ovn/nat-gateway.sh", "init"}, []string{"init"}, true},
		{[]string{"-c", "bash /kube-ovn/nat-gateway.sh init; id"}, nil, false},
		{[]string{"-c", "bash /kube-ovn/nat-gateway.sh eip-add $(id)"}, nil, false},
		{[]string{"-c", "ls /"}, nil, false},
		{[]string{"-c", "bash"}, nil, false},
		{[]string{"-i"}, nil, false},
		{nil, nil, false},
	}
	for _, tt := range tests {
		got, err := shimWords(tt.args)
		if (err == nil) != tt.ok || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("shimWords(%q) = %q, %v; want %q ok=%v", tt.args, got, err, tt.want, tt.ok)
		}
	}
}

func TestColumns(t *testing.T) {
	for i, o := range sample() {
		ext, in, detail := columns(o)
		if ext == "" || in == "" || detail == "" {
			t.Errorf("object %d (%s): empty cell %q %q %q", i, o.Kind, ext, in, detail)
		}
	}
	_, _, d := columns(sample()[1])
	if d != "ingress 100Mbit/s burst 10Mbit" {
		t.Errorf("qos detail %q", d)
	}
	for want, e := range map[string]*nat.EIP{
		"2001:db8::10/64":               {V6Address: netip.MustParseAddr("2001:db8::10"), V6PrefixLen: 64},
		"192.0.2.10/24,2001:db8::10/64": {Address: netip.MustParseAddr("192.0.2.10"), PrefixLen: 24, V6Address: netip.MustParseAddr("2001:db8::10"), V6PrefixLen: 64},
	} {
		if ext, _, _ := columns(nat.Object{UID: "e", Kind: nat.KindEIP, EIP: e}); ext != want {
			t.Errorf("EIP cell %q, want %q", ext, want)
		}
	}
}

// TestCLI exercises the keyed commands on a real gateway.
func TestCLI(t *testing.T) {
	lab := netlab.ForTest(t)
	gw, err := lab.Gateway(netlab.GatewayOptions{VMs: 2})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "gw.yaml")
	if err := os.WriteFile(file, []byte(`
- uid: eip-a
  kind: eip
  eip: {address: 192.0.2.10, prefixLen: 24}
- uid: fip-a
  kind: fip
  fip: {eip: 192.0.2.10, internalIP: 198.51.100.10}
- uid: dnat-b
  kind: dnat
  dnat: {eip: 192.0.2.11, protocol: udp, externalPort: 53, internalIP: 198.51.100.11, internalPort: 5353}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	ns := []string{"--netns", gw.GW}
	if out := mustCLI(t, "natgw", append(ns, "apply", "-f", file)...); !strings.Contains(out, "applied 3 object(s)") {
		t.Fatalf("apply output %q", out)
	}
	table := mustCLI(t, "natgw", append(ns, "list")...)
	for _, want := range []string{"UID", "eip-a", "192.0.2.10/24", "fip-a", "198.51.100.10", "1:1", "dnat-b", "192.0.2.11:53/udp", "198.51.100.11:5353"} {
		if !strings.Contains(table, want) {
			t.Fatalf("list table lacks %q:\n%s", want, table)
		}
	}
	if y := mustCLI(t, "natgw", append(ns, "list", "-o", "yaml")...); !strings.Contains(y, "internalPort: 5353") {
		t.Fatalf("list -o yaml:\n%s", y)
	}
	info := mustCLI(t, "natgw", append(ns, "info")...)
	if !strings.Contains(info, "dataplane: nftables") || !strings.Contains(info, "fip=1") || !strings.Contains(info, "boot id:") {
		t.Fatalf("info:\n%s", info)
	}
	out := mustCLI(t, "natgw", append(ns, "delete", "fip-a", "nope")...)
	if !strings.Contains(out, "deleted fip fip-a") || !strings.Contains(out, "not present: nope") {
		t.Fatalf("delete output %q", out)
	}
	syncFile := filepath.Join(dir, "sync.json")
	os.WriteFile(syncFile, []byte(`{"objects":[{"uid":"eip-a","kind":"eip","eip":{"address":"192.0.2.10","prefixLen":24}}]}`), 0o644)
	mustCLI(t, "natgw", append(ns, "sync", "-f", syncFile)...)
	sameObjects(t, "after sync", listJSON(t, gw.GW), []nat.Object{{UID: "eip-a", Kind: nat.KindEIP, EIP: &nat.EIP{Address: addr("192.0.2.10"), PrefixLen: 24}}})

	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"frobnicate"}, 2, "unknown command"},
		{append(ns, "apply"), 2, "usage"},
		{append(ns, "delete", "bad uid"), 2, "uid"},
		{append(ns, "--dataplane", "pf", "list"), 2, `invalid value "pf" for flag -dataplane: unknown data plane "pf"`},
		{[]string{"--netns", "/nonexistent/ns", "list"}, 1, "netns"},
	} {
		_, errOut, code := cli(t, "natgw", tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.msg) {
			t.Errorf("natgw %q: exit %d, stderr %q; want %d with %q", tc.args, code, errOut, tc.code, tc.msg)
		}
	}
	// $NATGW_DATAPLANE is the flag's default: a bad one is refused too.
	cmd := exec.Command(filepath.Join(binDir, "natgw"), append(ns, "list")...)
	cmd.Env = append(os.Environ(), "NATGW_DATAPLANE=pf")
	if _, errOut, code := runCmd(t, cmd); code != 1 || !strings.Contains(errOut, `unknown data plane "pf"`) {
		t.Errorf("NATGW_DATAPLANE=pf natgw list: exit %d, stderr %q", code, errOut)
	}
	if v := mustCLI(t, "natgw", "version"); !strings.HasPrefix(v, "natgw ") {
		t.Errorf("version %q", v)
	}
}

func TestIsKeepAlive(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"-c", "while true; do sleep 10000; done"}, true},
		{[]string{"-c", "  while  true;  do sleep 1; done "}, true},
		{[]string{"-c", "sleep infinity"}, true},
		{[]string{"-c", "while true; do sleep 1; rm -rf /; done"}, false},
		{[]string{"-c", "sleep 5"}, false},
		{[]string{"while true; do sleep 1; done"}, false},
	} {
		if got := isKeepAlive(tc.args); got != tc.want {
			t.Errorf("isKeepAlive(%q) = %v", tc.args, got)
		}
	}
}

// TestPause: the entrypoint, and the upstream pod's keep-alive command
// through the bash name, sleep until SIGTERM, then exit 0.
func TestPause(t *testing.T) {
	for _, argv := range [][]string{{natgwBin, "pause"}, {filepath.Join(binDir, "bash"), "-c", "while true; do sleep 10000; done"}} {
		testPause(t, argv)
	}
}

func testPause(t *testing.T, argv []string) {
	cmd := exec.Command(argv[0], argv[1:]...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The first line says the signal handlers are in place.
	line, err := bufio.NewReader(stderr).ReadString('\n')
	if err != nil || !strings.Contains(line, "pausing until SIGTERM") {
		cmd.Process.Kill()
		t.Fatalf("%q: first line %q, %v", argv, line, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("%q exited on its own: %v", argv, err)
	case <-time.After(300 * time.Millisecond):
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%q after SIGTERM: %v", argv, err)
		}
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("%q ignored SIGTERM", argv)
	}
}
