// Command mkimage builds the natgw gateway image without a container daemon
// (see package gwimage/imagebuild) and prints its digest and sizes:
//
//	go run ./gwimage/cmd/mkimage -version 0.1.0 -o gwimage/out/natgw-image.tar
//
// Load the archive with `docker load -i FILE` or `podman load -i FILE`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/natgw/natgw/gwimage/imagebuild"
)

func main() {
	version := flag.String("version", "0.1.0", "natgw version stamped into the binary and labels")
	name := flag.String("name", "", "image reference recorded in the archive (default natgw:VERSION)")
	out := flag.String("o", "gwimage/out/natgw-image.tar", "archive to write")
	arch := flag.String("arch", runtime.GOARCH, "image architecture (GOARCH)")
	flag.Parse()
	if *name == "" {
		*name = "natgw:" + *version
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	mod, err := imagebuild.ModuleDir(ctx)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
	res, err := imagebuild.Build(ctx, imagebuild.Options{ModuleDir: mod, Version: *version, Name: *name, Arch: *arch, Out: *out})
	if err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
	abs, _ := filepath.Abs(*out)
	fmt.Printf("image    %s (%s/linux)\n", res.Name, *arch)
	fmt.Printf("digest   %s\n", res.Digest)
	fmt.Printf("config   %s\n", res.ConfigID)
	fmt.Printf("size     layer %d bytes (compressed), binary %d bytes, archive %d bytes\n", res.LayerSize, res.BinarySize, res.ArchiveSize)
	fmt.Printf("archive  %s (docker load -i / podman load -i)\n", abs)
}
