package main

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/natgw/natgw/gwimage/imagebuild"
)

// heavyDeps are packages the natgw binary must not link: the typed
// clientset and what it brings (every API group's scheme registration, the
// apply configurations, structured-merge-diff's typed schema, the discovery
// client's OpenAPI models and protobuf descriptors). Their package
// initialisers ran in every natgw start, before main: at 216028c `natgw
// --help` ran 273 package inits, the top ones these (kubernetes/scheme about
// 30 ms, structured-merge-diff/v6/typed 17 ms). natgw reaches the API server
// through nat/ha/kuberest instead. A prefix ending in "/" matches the
// packages under it; one without matches the package and those under it.
var heavyDeps = []string{
	"k8s.io/client-go/kubernetes",
	"k8s.io/client-go/applyconfigurations",
	"k8s.io/client-go/discovery",
	"k8s.io/client-go/openapi",
	"github.com/google/gnostic-models",
	"google.golang.org/protobuf/types/descriptorpb",
	"sigs.k8s.io/structured-merge-diff/",
}

// allowedDeps are exceptions to heavyDeps: k8s.io/apimachinery/pkg/runtime
// itself imports structured-merge-diff's value package (cheap; no schema).
var allowedDeps = map[string]bool{
	"sigs.k8s.io/structured-merge-diff/v6/value": true,
}

func heavy(pkg string) bool {
	if allowedDeps[pkg] {
		return false
	}
	for _, h := range heavyDeps {
		if strings.HasSuffix(h, "/") && strings.HasPrefix(pkg, h) || pkg == h || strings.HasPrefix(pkg, h+"/") {
			return true
		}
	}
	return false
}

// goListDeps is `go list -deps` of this package with the build tags, as
// the binaries are built (CGO_ENABLED=0, no test files): the packages and,
// per package, those that import it. It needs the go command (go test puts
// its own first in PATH) and the module cache, not the network
// (GOPROXY=off).
func goListDeps(t *testing.T, tags string) (pkgs []string, importers map[string][]string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-tags", tags, "-f", "{{.ImportPath}}:{{join .Imports \" \"}}", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOPROXY=off", "GOFLAGS=-mod=readonly")
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps -tags %q .: %v\n%s", tags, err, stderr)
	}
	importers = map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		pkgs = append(pkgs, pkg)
		for _, imp := range strings.Fields(imports) {
			importers[imp] = append(importers[imp], pkg)
		}
	}
	if len(pkgs) < 50 || !slices.Contains(pkgs, "github.com/natgw/natgw/nat/nftables") {
		t.Fatalf("go list -deps -tags %q .: %d packages, without nat/nftables: not natgw's list?", tags, len(pkgs))
	}
	return pkgs, importers
}

// linkedBy names up to three importers of pkg.
func linkedBy(importers map[string][]string, pkg string) string {
	by := importers[pkg]
	if len(by) > 3 {
		by = append(by[:3:3], fmt.Sprintf("… %d in all", len(importers[pkg])))
	}
	return strings.Join(by, ", ")
}

// TestNoHeavyDeps: natgw-ha, the binary of `natgw ha` (this package
// without imagebuild.OmitHATag), links none of heavyDeps.
func TestNoHeavyDeps(t *testing.T) {
	pkgs, importers := goListDeps(t, "")
	if !slices.Contains(pkgs, "k8s.io/client-go/rest") {
		t.Fatalf("go list -deps .: %d packages, without k8s.io/client-go/rest: not natgw-ha's list?", len(pkgs))
	}
	n := 0
	for _, p := range pkgs {
		if heavy(p) {
			n++
			t.Errorf("natgw links %s (imported by %s)", p, linkedBy(importers, p))
		}
	}
	if n > 0 {
		t.Errorf("natgw links %d packages it must not (see heavyDeps); reach the API server through nat/ha/kuberest", n)
	}
}

// haOnlyDeps are module paths the image's natgw (built with
// imagebuild.OmitHATag) must not link: only `natgw ha` talks to the API
// server and serves metrics. Leaving them out made natgw 6.7 MB instead of
// 19.5 MB (stripped) and `natgw version` 5.6 MB of RSS with ~390 page
// faults instead of 14 MB and ~790 (gwimage/README, "Image").
var haOnlyDeps = []string{"k8s.io/", "github.com/prometheus/", "google.golang.org/protobuf/"}

// TestLeanDeps: the image's natgw links nothing of haOnlyDeps, and
// nothing of nat/ha.
func TestLeanDeps(t *testing.T) {
	pkgs, importers := goListDeps(t, imagebuild.OmitHATag)
	n := 0
	for _, p := range pkgs {
		for _, h := range append(haOnlyDeps, "github.com/natgw/natgw/nat/ha") {
			if strings.HasPrefix(p, h) {
				n++
				t.Errorf("natgw -tags %s links %s (imported by %s)", imagebuild.OmitHATag, p, linkedBy(importers, p))
				break
			}
		}
	}
	if n > 0 {
		t.Errorf("the image's natgw links %d packages only `natgw ha` needs (haOnlyDeps)", n)
	}
}

func TestHeavy(t *testing.T) {
	for pkg, want := range map[string]bool{
		"k8s.io/client-go/kubernetes":                        true,
		"k8s.io/client-go/kubernetes/scheme":                 true,
		"k8s.io/client-go/kubernetes/typed/core/v1":          true,
		"k8s.io/client-go/applyconfigurations/core/v1":       true,
		"k8s.io/client-go/discovery":                         true,
		"sigs.k8s.io/structured-merge-diff/v6/typed":         true,
		"sigs.k8s.io/structured-merge-diff/v6/value":         false,
		"k8s.io/client-go/rest":                              false,
		"k8s.io/client-go/kubernetesx":                       false,
		"google.golang.org/protobuf/types/descriptorpb":      true,
		"google.golang.org/protobuf/types/known/timestamppb": false,
	} {
		if got := heavy(pkg); got != want {
			t.Errorf("heavy(%q) = %t, want %t", pkg, got, want)
		}
	}
}
