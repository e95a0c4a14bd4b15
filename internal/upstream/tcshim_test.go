package upstream

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTCWithoutFqCodel: the shim skips exactly the fq_codel leaf and passes every
// other tc command, arguments intact, to the real tc (here a recorder).
func TestTCWithoutFqCodel(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	rec := filepath.Join(dir, "realtc")
	if err := os.WriteFile(rec, []byte("#!/bin/sh\necho \"$*\" >> "+log+"\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	shim := filepath.Join(dir, "tc")
	if err := os.WriteFile(shim, []byte(TCWithoutFqCodel(rec)), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args   []string
		passed bool
	}{
		{[]string{"qdisc", "replace", "dev", "net1", "parent", "1:0x473b", "fq_codel"}, false},
		{[]string{"qdisc", "replace", "dev", "ifb-net1", "parent", "1:0x473b", "fq_codel"}, false},
		{[]string{"class", "add", "dev", "net1", "parent", "1:", "classid", "1:0x473b", "htb", "rate", "10mbit"}, true},
		{[]string{"-p", "filter", "show", "dev", "net1", "parent", "1:"}, true},
		{[]string{"filter", "add", "dev", "net1", "parent", "1:", "u32", "match", "ip", "src", "192.0.2.10/32", "action", "fq_codel"}, true}, // not a qdisc command
	} {
		os.Remove(log)
		err := exec.Command(shim, tc.args...).Run()
		b, _ := os.ReadFile(log)
		got := strings.TrimSpace(string(b))
		if tc.passed {
			if got != strings.Join(tc.args, " ") {
				t.Errorf("tc %v: the real tc saw %q", tc.args, got)
			}
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
				t.Errorf("tc %v: %v, want the real tc's exit 3", tc.args, err)
			}
		} else if got != "" || err != nil {
			t.Errorf("tc %v: the real tc saw %q (err %v), want it skipped with exit 0", tc.args, got, err)
		}
	}
}
