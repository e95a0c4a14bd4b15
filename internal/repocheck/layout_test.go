package repocheck

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// layoutSection is the README heading whose table lists the packages.
const layoutSection = "## Layout"

// TestLayoutNamesEveryPackage: every package `go list ./...` reports has a
// row of README.md's layout table (its path relative to the module, e.g.
// `nat/nftables`, exactly: the table names no parent for its children),
// and every path the table names is a directory of the repository.
func TestLayoutNamesEveryPackage(t *testing.T) {
	modPath, root := goList(t, ".", "-m", "-f", "{{.Path}}\n{{.Dir}}")
	pkgs := goListLines(t, root, "-f", "{{.ImportPath}}", "./...")
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	named, err := layoutPaths(string(readme))
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	var missing []string
	for _, p := range pkgs {
		rel, ok := strings.CutPrefix(p, modPath+"/")
		if !ok {
			rel = "." // the module's root package
		}
		if !named[rel] {
			missing = append(missing, rel)
		}
	}
	if len(missing) > 0 {
		t.Errorf("README.md %q names no row for %d package(s) of `go list ./...`; add a line each (`path` | what its doc comment says):\n  %s",
			layoutSection, len(missing), strings.Join(missing, "\n  "))
	}
	for p := range named {
		if st, err := os.Stat(filepath.Join(root, p)); err != nil || !st.IsDir() {
			t.Errorf("README.md %q names `%s`, which is not a directory of the repository", layoutSection, p)
		}
	}
	if len(pkgs) < 10 {
		t.Errorf("`go list ./...` reported %d packages: %q; want the module's", len(pkgs), pkgs)
	}
}

// cellPath is a path in a table cell: `nat/nftables`, `hack/`.
var cellPath = regexp.MustCompile("`([^`]+)`")

// layoutPaths returns the paths the first column of the layout section's
// table names in backquotes, a trailing "/" dropped ("`hack/`, `mk/`" names
// hack and mk). It is an error when the section or its table is missing.
func layoutPaths(readme string) (map[string]bool, error) {
	_, section, ok := strings.Cut("\n"+readme, "\n"+layoutSection+"\n")
	if !ok {
		return nil, fmt.Errorf("no %q section", layoutSection)
	}
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	named := map[string]bool{}
	rows := 0
	for line := range strings.Lines(section) {
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) < 3 || cells[0] != "" || strings.Trim(cells[1], " -:") == "" {
			continue // not a row, or the header's separator
		}
		rows++
		for _, m := range cellPath.FindAllStringSubmatch(cells[1], -1) {
			named[strings.TrimSuffix(m[1], "/")] = true
		}
	}
	if rows == 0 || len(named) == 0 {
		return nil, errors.New("no table of paths in the " + layoutSection + " section")
	}
	return named, nil
}

// goList runs `go list args...` in dir and returns its two output lines.
func goList(t *testing.T, dir string, args ...string) (string, string) {
	t.Helper()
	l := goListLines(t, dir, args...)
	if len(l) != 2 {
		t.Fatalf("go list %s: %q, want two lines", strings.Join(args, " "), l)
	}
	return l[0], l[1]
}

// goListLines runs `go list args...` in dir and returns its output lines.
func goListLines(t *testing.T, dir string, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return slices.DeleteFunc(strings.Split(strings.TrimSpace(string(out)), "\n"), func(s string) bool { return s == "" })
}
