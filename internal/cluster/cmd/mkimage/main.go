// Command mkimage builds natgw's controller image or the test cluster's
// pause image without a container daemon (package internal/cluster/images)
// and prints its name, digest and sizes:
//
//	go run ./internal/cluster/cmd/mkimage -image controller -version 0.1.0 -o gwimage/out/natgw-controller-image.tar
//	go run ./internal/cluster/cmd/mkimage -image pause -o .cache/cluster/pause-image.tar
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/natgw/natgw/internal/cluster/images"
)

func main() {
	which := flag.String("image", "controller", "controller or pause")
	version := flag.String("version", "0.1.0", "the controller image's version (tag and label)")
	out := flag.String("o", "", "archive to write")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *which, *version, *out); err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, which, version, out string) error {
	if out == "" {
		return fmt.Errorf("-o is required")
	}
	mod, err := moduleDir(ctx)
	if err != nil {
		return err
	}
	var spec images.Spec
	switch which {
	case "controller":
		spec = images.Controller(mod, version)
	case "pause":
		spec = images.Pause(mod)
	default:
		return fmt.Errorf("-image %q: want controller or pause", which)
	}
	res, err := images.Build(ctx, spec, out)
	if err != nil {
		return err
	}
	abs, _ := filepath.Abs(out)
	fmt.Printf("image    %s\n", res.Name)
	fmt.Printf("digest   %s\n", res.Digest)
	fmt.Printf("size     layer %d bytes (compressed), binary %d bytes, archive %d bytes\n", res.LayerSize, res.BinarySize, res.ArchiveSize)
	fmt.Printf("archive  %s\n", abs)
	return nil
}

// moduleDir finds natgw's module root through `go env GOMOD`.
func moduleDir(ctx context.Context) (string, error) {
	b, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(b))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the natgw module")
	}
	return filepath.Dir(gomod), nil
}
