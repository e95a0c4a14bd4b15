// Command natgw-cluster starts and stops the test cluster by hand (package
// internal/cluster), as `make cluster-up` and `make cluster-down` do:
//
//	natgw-cluster -repo . up [-image ARCHIVE]...   start it, leave it running, print KUBECONFIG
//	natgw-cluster -repo . down                     stop it and restore the host
//
// up cleans up after a killed run first; down works after a killed run too.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/natgw/natgw/internal/cluster"
)

type imageList []string

func (l *imageList) String() string     { return strings.Join(*l, ",") }
func (l *imageList) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	repo := flag.String("repo", ".", "the natgw checkout (for .cache/cluster and .cache/envtest)")
	var imgs imageList
	flag.Var(&imgs, "image", "image archive to import (repeatable); default: gwimage/out/*-image.tar that exist")
	flag.Parse()
	if err := run(*repo, imgs, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "natgw-cluster:", err)
		os.Exit(1)
	}
}

func run(repo string, imgs []string, args []string) error {
	if len(args) != 1 {
		return errors.New("usage: natgw-cluster [-repo DIR] [-image ARCHIVE]... up|down")
	}
	abs, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	if len(imgs) == 0 {
		imgs, _ = filepath.Glob(filepath.Join(abs, "gwimage/out/*-image.tar"))
	}
	cfg := cluster.Defaults(cluster.Config{Images: imgs, Log: os.Stderr}, abs)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	switch args[0] {
	case "up":
		t0 := time.Now()
		c, err := cluster.Up(ctx, cfg)
		if err != nil {
			return err
		}
		c.Detach()
		fmt.Fprintf(os.Stderr, "cluster up in %.1fs; images imported: %v\n", time.Since(t0).Seconds(), imgs)
		fmt.Printf("export KUBECONFIG=%s\n", c.Kubeconfig())
		return nil
	case "down":
		t0 := time.Now()
		c, err := cluster.Attach(ctx, cfg)
		if err != nil {
			return err
		}
		if err := c.Down(ctx); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "cluster down in %.1fs, host restored\n", time.Since(t0).Seconds())
		return nil
	}
	return fmt.Errorf("unknown command %q (up or down)", args[0])
}
