package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/natgw/natgw/gwimage/imagebuild"
	"github.com/natgw/natgw/internal/netlab"
)

// build compiles natgw and the demo into a temp dir. natgw is built as
// `make demo` and the image build it: with imagebuild.OmitHATag (no
// `natgw ha`, which the demo never runs).
func build(t *testing.T) (natgw, demo string) {
	t.Helper()
	if reason := netlab.Unavailable(); reason != "" {
		t.Skipf("netlab: %s", reason)
	}
	dir := t.TempDir()
	natgw, demo = filepath.Join(dir, "natgw"), filepath.Join(dir, "natgw-demo")
	for _, b := range []struct{ out, pkg, tags string }{{natgw, "../natgw", imagebuild.OmitHATag}, {demo, ".", ""}} {
		cmd := exec.Command("go", "build", "-tags", b.tags, "-o", b.out, b.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return natgw, demo
}

// TestDemo runs the whole demo on both data planes: every check must pass.
func TestDemo(t *testing.T) {
	natgw, demo := build(t)
	for _, dp := range []string{"nftables", "iptables"} {
		out, err := exec.Command(demo, "-natgw", natgw, "-dataplane", dp).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "demo passed: 18 checks") || strings.Contains(string(out), "✘") {
			t.Fatalf("demo on %s: %v\n%s", dp, err, out)
		}
	}
}

// TestDemoInterrupted: Ctrl-C in the middle fails the demo and still removes
// its namespaces and stops the agent.
func TestDemoInterrupted(t *testing.T) {
	natgw, demo := build(t)
	cmd := exec.Command(demo, "-natgw", natgw)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var names []string
	var out strings.Builder
	sc := bufio.NewScanner(stdout)
	sent := false
	for sc.Scan() {
		line := sc.Text()
		out.WriteString(line + "\n")
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "✔ namespaces: "); ok {
			names = strings.Fields(rest)
		}
		if !sent && strings.Contains(line, "FIP inbound") {
			cmd.Process.Signal(syscall.SIGINT)
			sent = true
		}
	}
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !sent {
		t.Fatalf("interrupted demo: %v (signal sent %v)\n%s", err, sent, out.String())
	}
	if !strings.Contains(out.String(), "✘ interrupted") || !strings.Contains(out.String(), "natgw serve exited cleanly") {
		t.Fatalf("interrupted demo output:\n%s", out.String())
	}
	if len(names) == 0 {
		t.Fatalf("no namespaces reported:\n%s", out.String())
	}
	time.Sleep(100 * time.Millisecond)
	for _, n := range names {
		if _, err := os.Stat(filepath.Join("/run/netns", n)); err == nil {
			t.Errorf("namespace %s left behind", n)
		}
	}
}
