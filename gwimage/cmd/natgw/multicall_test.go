package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseSleep(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"10", 10 * time.Second, true},
		{"1.5", 1500 * time.Millisecond, true},
		{"2m", 2 * time.Minute, true},
		{"3h", 3 * time.Hour, true},
		{"1d", 24 * time.Hour, true},
		{"0", 0, true},
		{"-1", 0, false},
		{"1e3", 0, false},
		{"soon", 0, false},
		{"", 0, false},
	} {
		got, err := parseSleep(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("parseSleep(%q) = %v, %v; want %v ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestMulticall runs the image's link names in-process: sysctl (against a
// stand-in /proc/sys), sh -c with the v1.16 PostStart line, sleep, and
// command lines the shim refuses.
func TestMulticall(t *testing.T) {
	dir := t.TempDir()
	old := procSys
	procSys = dir
	defer func() { procSys = old }()
	key := filepath.Join(dir, "net/ipv4/ip_forward")
	if err := os.MkdirAll(filepath.Dir(key), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, []byte("0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		argv     []string
		code     int
		stdout   string // substring
		stderr   string // substring; "" means empty
		fileWant string // ip_forward afterwards
	}{
		{[]string{"/bin/sh", "-c", "sysctl -w net.ipv4.ip_forward=1"}, 0, "net.ipv4.ip_forward = 1", "", "1"},
		{[]string{"/bin/sysctl", "net.ipv4.ip_forward"}, 0, "net.ipv4.ip_forward = 1", "", "1"},
		{[]string{"/bin/sysctl", "-w", "net/ipv4/ip_forward=0"}, 0, "net/ipv4/ip_forward = 0", "", "0"},
		{[]string{"/bin/sysctl", "-w", "net.ipv4.ip_forward"}, 1, "", "name=value", "0"},
		{[]string{"/bin/sysctl", "-w", "net.ipv4.nosuch=1"}, 1, "", "No such file", "0"},
		{[]string{"/bin/sysctl", "-p"}, 1, "", "not supported", "0"},
		{[]string{"/bin/sysctl", "-w", "../../etc/passwd=x"}, 1, "", "invalid key", "0"},
		{[]string{"/bin/sh", "-c", "sysctl -w net.ipv4.ip_forward=1; id"}, 127, "", "not a shell", "0"},
		{[]string{"/bin/bash", "-c", "ls /"}, 127, "", "not a shell", "0"},
		{[]string{"/bin/sh", "-c", "bash /kube-ovn/nat-gateway.sh eip-add $(id)"}, 127, "", "not a shell", "0"},
		{[]string{"/bin/sleep", "0.01"}, 0, "", "", "0"},
		{[]string{"/bin/sleep"}, 1, "", "want one operand", "0"},
		{[]string{"/bin/sleep", "forever"}, 1, "", "invalid time interval", "0"},
	}
	for _, tc := range tests {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.argv, strings.NewReader(""), &out, &errb)
		if code != tc.code || !strings.Contains(out.String(), tc.stdout) || (tc.stderr == "") != (errb.Len() == 0) || !strings.Contains(errb.String(), tc.stderr) {
			t.Errorf("%q: exit %d stdout %q stderr %q; want exit %d stdout ~%q stderr ~%q", tc.argv, code, out.String(), errb.String(), tc.code, tc.stdout, tc.stderr)
		}
		b, _ := os.ReadFile(key)
		if got := strings.TrimSpace(string(b)); got != tc.fileWant {
			t.Errorf("%q: ip_forward %q, want %q", tc.argv, got, tc.fileWant)
		}
	}
	// sleep infinity and the keep-alive lines are natgw pause: they end
	// with the context (SIGTERM in a container).
	for _, argv := range [][]string{{"/bin/sleep", "infinity"}, {"/bin/bash", "-c", "sleep infinity"}, {"/bin/sh", "-c", "while true; do sleep 10000; done"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		var errb bytes.Buffer
		start := time.Now()
		code := run(ctx, argv, strings.NewReader(""), &bytes.Buffer{}, &errb)
		cancel()
		if code != 0 || time.Since(start) < 150*time.Millisecond || !strings.Contains(errb.String(), "pausing until SIGTERM") {
			t.Errorf("%q: exit %d after %v, stderr %q; want a pause until the context ends", argv, code, time.Since(start), errb.String())
		}
	}
}
