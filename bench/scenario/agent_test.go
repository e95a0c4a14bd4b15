package scenario

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// testRoot returns the module's root directory.
func testRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// testAgentBinary builds natgw for the tests that drive `natgw serve`.
func testAgentBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "natgw")
	cmd := exec.Command("go", "build", "-o", bin, "./gwimage/cmd/natgw")
	cmd.Dir = testRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build natgw: %v\n%s", err, out)
	}
	return bin
}
