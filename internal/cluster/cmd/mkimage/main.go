// Command mkimage builds natgw's controller image or the test cluster's
// pause image without a container daemon (package internal/cluster/images)
// and prints its name, digest and sizes:
//
//	go run ./internal/cluster/cmd/mkimage -image controller -version 0.1.0 -o gwimage/out/natgw-controller-image.tar
//	go run ./internal/cluster/cmd/mkimage -image pause -o .cache/cluster/pause-image.tar
//	go run ./internal/cluster/cmd/mkimage -image gateway-iptables -base gwimage/out/natgw-image.tar -o .cache/cluster/natgw-iptables-image.tar
//
// gateway-iptables is the gateway image plus the host's iptables-legacy
// tools (see images.GatewayIptables), for the cluster e2e's iptables data
// plane.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/natgw/natgw/gwimage/imagebuild"
	"github.com/natgw/natgw/internal/cluster/images"
)

func main() {
	which := flag.String("image", "controller", "controller, pause or gateway-iptables")
	version := flag.String("version", "0.1.0", "the controller image's version (tag and label)")
	out := flag.String("o", "", "archive to write")
	base := flag.String("base", "gwimage/out/natgw-image.tar", "gateway image archive (gateway-iptables)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *which, *version, *base, *out); err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, which, version, base, out string) error {
	if out == "" {
		return fmt.Errorf("-o is required")
	}
	if which == "gateway-iptables" {
		res, err := images.GatewayIptables(ctx, base, images.GatewayIptablesName(version), out)
		if err != nil {
			return err
		}
		fmt.Printf("image    %s\ndigest   %s\narchive  %s (%d bytes)\n", res.Name, res.Digest, out, res.ArchiveSize)
		return nil
	}
	mod, err := imagebuild.ModuleDir(ctx)
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
		return fmt.Errorf("-image %q: want controller, pause or gateway-iptables", which)
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
