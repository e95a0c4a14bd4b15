// Package version holds natgw's version, stamped at link time:
//
//	go build -ldflags "-X github.com/natgw/natgw/gwimage/version.Version=v0.1.0" ./gwimage/cmd/natgw
//
// and the release the repository builds (Release, the file RELEASE): the
// one place the version of `make image`'s images comes from (mk/gwimage.mk
// reads it, mkimage defaults to it), which controller/config and the Helm
// chart (charts/natgw-controller) reference; charts/chart_test.go checks
// that they agree.
package version

import (
	_ "embed"
	"fmt"
	"runtime"
	"strings"
)

//go:embed RELEASE
var release string

// Release is the version the repository's images are built and tagged
// with by default ("0.1.0"): the file RELEASE, trimmed.
func Release() string { return strings.TrimSpace(release) }

// Version is natgw's version; "dev" when not stamped.
var Version = "dev"

// String is the version line of `natgw version`.
func String() string {
	return fmt.Sprintf("natgw %s (%s, %s/%s)", Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
