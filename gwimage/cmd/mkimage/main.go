// Command mkimage builds natgw's images without a container daemon and
// prints each one's name, digest and sizes:
//
//	go run ./gwimage/cmd/mkimage                   # the gateway image (gwimage/imagebuild), version gwimage/version/RELEASE
//	go run ./gwimage/cmd/mkimage -image controller # natgw-controller's image (gwimage/images)
//	go run ./gwimage/cmd/mkimage -image pause      # the test cluster's pause image
//	go run ./gwimage/cmd/mkimage -image gateway-iptables -base gwimage/out/natgw-image.tar
//
// gateway-iptables is the gateway image plus the host's iptables-legacy
// tools (see images.GatewayIptables), for the cluster e2e's iptables data
// plane. Load an archive with `docker load -i FILE` or `podman load -i FILE`.
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
	"github.com/natgw/natgw/gwimage/images"
	"github.com/natgw/natgw/gwimage/version"
)

// defaultOut is each image's archive when -o is not given.
var defaultOut = map[string]string{
	"gateway":          "gwimage/out/natgw-image.tar",
	"controller":       "gwimage/out/natgw-controller-image.tar",
	"pause":            ".cache/cluster/pause-image.tar",
	"gateway-iptables": ".cache/cluster/natgw-iptables-image.tar",
}

type options struct {
	image, version, name, out, arch, base string
}

func main() {
	var o options
	flag.StringVar(&o.image, "image", "gateway", "gateway, controller, pause or gateway-iptables")
	flag.StringVar(&o.version, "version", version.Release(), "natgw version stamped into the binary, tags and labels (default: gwimage/version/RELEASE)")
	flag.StringVar(&o.name, "name", "", "gateway: image reference recorded in the archive (default natgw:VERSION)")
	flag.StringVar(&o.out, "o", "", "archive to write (default per image: gwimage/out/natgw-image.tar, ...)")
	flag.StringVar(&o.arch, "arch", runtime.GOARCH, "gateway: image architecture (GOARCH)")
	flag.StringVar(&o.base, "base", "gwimage/out/natgw-image.tar", "gateway-iptables: the gateway image archive it extends")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "mkimage: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	def, ok := defaultOut[o.image]
	if !ok {
		return fmt.Errorf("-image %q: want gateway, controller, pause or gateway-iptables", o.image)
	}
	if o.out == "" {
		o.out = def
	}
	res, err := build(ctx, o)
	if err != nil {
		return err
	}
	abs, _ := filepath.Abs(o.out)
	fmt.Printf("image    %s\n", res.Name)
	fmt.Printf("digest   %s\n", res.Digest)
	fmt.Printf("config   %s\n", res.ConfigID)
	binary := ""
	if res.BinarySize > 0 {
		binary = fmt.Sprintf(", binary %d bytes", res.BinarySize)
	}
	fmt.Printf("size     layer %d bytes (compressed)%s, archive %d bytes\n", res.LayerSize, binary, res.ArchiveSize)
	fmt.Printf("archive  %s (docker load -i / podman load -i)\n", abs)
	return nil
}

func build(ctx context.Context, o options) (*imagebuild.Result, error) {
	if o.image == "gateway-iptables" {
		return images.GatewayIptables(ctx, o.base, images.GatewayIptablesName(o.version), o.out)
	}
	mod, err := imagebuild.ModuleDir(ctx)
	if err != nil {
		return nil, err
	}
	switch o.image {
	case "controller":
		return images.Build(ctx, images.Controller(mod, o.version), o.out)
	case "pause":
		return images.Build(ctx, images.Pause(mod), o.out)
	}
	if o.name == "" {
		o.name = "natgw:" + o.version
	}
	return imagebuild.Build(ctx, imagebuild.Options{ModuleDir: mod, Version: o.version, Name: o.name, Arch: o.arch, Out: o.out})
}
