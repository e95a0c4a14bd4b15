// Package version holds natgw's version, stamped at link time:
//
//	go build -ldflags "-X github.com/natgw/natgw/gwimage/version.Version=v0.1.0" ./gwimage/cmd/natgw
package version

import (
	"fmt"
	"runtime"
)

// Version is natgw's version; "dev" when not stamped.
var Version = "dev"

// String is the version line of `natgw version`.
func String() string {
	return fmt.Sprintf("natgw %s (%s, %s/%s)", Version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
