// Package framework runs natgw's whole stack for the end-to-end tests as
// separate processes: kube-apiserver + etcd (the envtest assets), the real
// natgw-controller binary with the local transport, and the `natgw serve`
// agents it starts inside gateway network namespaces; client and server
// namespaces (internal/netlab) send real packets through the gateways.
//
// Everything a test starts is stopped and everything it creates is removed
// by t.Cleanup, also when the test fails. Waits poll with bounded timeouts.
package framework

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/natgw/natgw/controller/crdtest"
	"github.com/natgw/natgw/gwimage/imagebuild"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testsummary"
	"github.com/natgw/natgw/nat"
)

// Binaries are the programs built once per test binary.
type Binaries struct {
	Natgw      string
	Controller string
}

var (
	bins     Binaries
	buildErr error
	binDir   string
)

// Main builds natgw and natgw-controller into a temporary directory (when
// the stack can run here), runs the tests and removes the directory. Call it
// from TestMain.
func Main(m *testing.M) int {
	if unavailable() == "" {
		binDir, buildErr = os.MkdirTemp("", "natgw-e2e-bin-")
		if buildErr == nil {
			bins, buildErr = build(binDir)
		}
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	return code
}

// build compiles the commands: natgw as the image has it (without ha,
// imagebuild.OmitHATag) with natgw-ha beside it, and natgw-controller.
func build(dir string) (Binaries, error) {
	b := Binaries{Natgw: filepath.Join(dir, "natgw"), Controller: filepath.Join(dir, "natgw-controller")}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"-tags", imagebuild.OmitHATag, "-o", b.Natgw, imagebuild.MainPackage},
		{"-o", filepath.Join(dir, imagebuild.HABinary), imagebuild.MainPackage},
		{"-o", b.Controller, "github.com/natgw/natgw/controller/cmd/natgw-controller"},
	} {
		cmd := exec.CommandContext(ctx, "go", append([]string{"build"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return Binaries{}, fmt.Errorf("go build %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	return b, nil
}

// unavailable says why the stack cannot run here ("" when it can).
func unavailable() string {
	if why := netlab.Unavailable(); why != "" {
		return why
	}
	if _, _, err := assets(); err != nil {
		return err.Error()
	}
	return ""
}

// assets returns the envtest binary directory.
func assets() (dir string, crds string, err error) {
	dir = apitest.Assets()
	if why := apitest.Missing(dir); why != "" {
		return "", "", errors.New(why)
	}
	return dir, apitest.CRDDir(), nil
}

// Require skips the test when the stack cannot run here (not root, no
// envtest assets), except as root in CI where that is a failure; and fails
// it when the binaries did not build.
func Require(t testing.TB) Binaries {
	t.Helper()
	if why := unavailable(); why != "" {
		if os.Getenv("CI") != "" && os.Geteuid() == 0 {
			t.Fatalf("e2e: %s (required as root in CI)", why)
		}
		t.Skip("SKIP: e2e: " + why)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	if bins.Natgw == "" {
		t.Fatal("e2e: binaries not built: call framework.Main from TestMain")
	}
	return bins
}

// Poll is the interval of every wait.
const Poll = 50 * time.Millisecond

// Wait polls cond until it returns nil, ctx ends or timeout passes, and
// returns how long it took or the last error.
func Wait(ctx context.Context, timeout time.Duration, cond func() error) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		err := cond()
		if err == nil {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("not within %v: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return time.Since(start), errors.Join(ctx.Err(), err)
		case <-time.After(Poll):
		}
	}
}

// Eventually is Wait that fails the test.
func Eventually(t testing.TB, ctx context.Context, timeout time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	d, err := Wait(ctx, timeout, cond)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return d
}

// Summary records a scenario's figures as one line prefixed with
// E2E-SUMMARY (internal/testsummary: the test log, and the file `make test`
// prints at its end). kv alternates keys and values.
func Summary(t testing.TB, scenario, dataplane string, kv ...any) {
	t.Helper()
	testsummary.Scenario(t, "E2E-SUMMARY", scenario, dataplane, kv...)
}

// Dataplanes are the data planes every scenario runs on (the scenarios
// take their names as text: they pass them on as flags and subtest names).
var Dataplanes = func() []string {
	out := make([]string, len(nat.DataplaneNames))
	for i, n := range nat.DataplaneNames {
		out[i] = string(n)
	}
	return out
}()

// ForEachDataplaneOn runs fn as one subtest per data plane, on the API
// server's CRD set set (named in the subtest when it is not natgw's).
func ForEachDataplaneOn(t *testing.T, set crdtest.Set, fn func(t *testing.T, dataplane string, set crdtest.Set)) {
	for _, dp := range Dataplanes {
		name := dp
		if set != crdtest.Natgw {
			name = string(set) + "-crds/" + dp
		}
		t.Run(name, func(t *testing.T) { fn(t, dp, set) })
	}
}

// UnknownFieldWarnings counts the API server's "unknown field" warnings in
// a controller log (client-go logs every warning it gets): a write carrying
// a field the installed schema lacks, which the API server prunes.
func UnknownFieldWarnings(log string) int {
	return strings.Count(log, "unknown field")
}

// ForEachDataplane runs fn as one subtest per data plane.
func ForEachDataplane(t *testing.T, fn func(t *testing.T, dataplane string)) {
	for _, dp := range Dataplanes {
		t.Run(dp, func(t *testing.T) { fn(t, dp) })
	}
}
