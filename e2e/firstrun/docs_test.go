package firstrun_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/natgw/natgw/internal/cluster"
)

// documented is each first-run command as a README writes it: the README
// must still say exactly that, and TestFirstRun must run it (Commands). A
// README that changes a command fails here until the test runs the new
// one. README.md of this package is the full table, with the commands no
// test runs.
var documented = []struct{ file, command string }{
	{"README.md", cmdClusterUp},
	{"README.md", cmdClusterDown},
	{"README.md", cmdApply},
	{"README.md", cmdHelmInstall},
	{"controller/docs/operations.md", cmdClusterUp},
	{"controller/docs/operations.md", "export KUBECONFIG=" + documentedKubeconfig},
	{"controller/docs/operations.md", cmdApply},
	{"controller/docs/operations.md", cmdRollout},
	{"controller/docs/operations.md", cmdDelete},
	{"controller/docs/operations.md", cmdHelmInstall},
	{"controller/docs/operations.md", cmdClusterDown},
	{"e2e/cluster/README.md", cmdClusterUp},
	{"e2e/cluster/README.md", "export KUBECONFIG=" + documentedKubeconfig},
	{"e2e/cluster/README.md", cmdGetNodes},
	{"e2e/cluster/README.md", cmdClusterDown},
	{"charts/natgw-controller/README.md", cmdHelmInstall},
	{"charts/natgw-controller/README.md", cmdRollout},
	{"charts/natgw-controller/README.md", cmdHelmUninstall},
	{"e2e/firstrun/README.md", cmdApply},
}

func TestDocumentedCommands(t *testing.T) {
	repo, err := cluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range documented {
		b, err := os.ReadFile(filepath.Join(repo, d.file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), d.command) {
			t.Errorf("%s no longer documents %q: update e2e/firstrun (the command and its table)", d.file, d.command)
		}
		if cmd, ok := strings.CutPrefix(d.command, "export KUBECONFIG="); ok {
			if cmd != documentedKubeconfig {
				t.Errorf("%s: KUBECONFIG %s, TestFirstRun checks %s", d.file, cmd, documentedKubeconfig)
			}
			continue
		}
		if !slices.Contains(Commands, d.command) {
			t.Errorf("%s documents %q, which TestFirstRun does not run", d.file, d.command)
		}
	}
}
