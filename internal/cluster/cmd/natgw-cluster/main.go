// Command natgw-cluster starts and stops the test cluster by hand (package
// internal/cluster), as `make cluster-up` and `make cluster-down` do:
//
//	natgw-cluster -repo . up [-image ARCHIVE]...   start it, leave it running, print KUBECONFIG
//	natgw-cluster -repo . down                     stop it and restore the host
//
// Flags may come before or after the verb. up cleans up after a killed run
// first; down works after a killed run too.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/natgw/natgw/internal/cluster"
)

const usage = "usage: natgw-cluster [-repo DIR] [-image ARCHIVE]... up|down (flags before or after the verb)"

type imageList []string

func (l *imageList) String() string     { return strings.Join(*l, ",") }
func (l *imageList) Set(v string) error { *l = append(*l, v); return nil }

// command is a parsed command line.
type command struct {
	verb   string // up or down
	repo   string
	images []string
}

// parse reads the command line (without the program name). Go's flag
// package stops at the first argument that is not a flag, so the flags
// after the verb are parsed in a second pass; exactly one verb, up or down.
func parse(args []string, stderr io.Writer) (command, error) {
	fs := flag.NewFlagSet("natgw-cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	repo := fs.String("repo", ".", "the natgw checkout (for .cache/cluster and .cache/envtest)")
	var imgs imageList
	fs.Var(&imgs, "image", "image archive to import (repeatable); default: gwimage/out/*-image.tar that exist")
	if err := fs.Parse(args); err != nil {
		return command{}, err
	}
	var verbs []string
	for rest := fs.Args(); len(rest) > 0; rest = fs.Args() {
		verbs = append(verbs, rest[0])
		if err := fs.Parse(rest[1:]); err != nil {
			return command{}, err
		}
	}
	if len(verbs) != 1 {
		return command{}, fmt.Errorf("want one command, got %d %q; %s", len(verbs), verbs, usage)
	}
	if verbs[0] != "up" && verbs[0] != "down" {
		return command{}, fmt.Errorf("unknown command %q (up or down); %s", verbs[0], usage)
	}
	if verbs[0] == "down" && len(imgs) > 0 {
		return command{}, fmt.Errorf("-image %q: only up imports images", imgs)
	}
	return command{verb: verbs[0], repo: *repo, images: imgs}, nil
}

func main() {
	cmd, err := parse(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err == nil {
		err = run(cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "natgw-cluster:", err)
		os.Exit(1)
	}
}

func run(cmd command) error {
	abs, err := filepath.Abs(cmd.repo)
	if err != nil {
		return fmt.Errorf("-repo %q: %w", cmd.repo, err)
	}
	imgs := cmd.images
	if len(imgs) == 0 {
		imgs, _ = filepath.Glob(filepath.Join(abs, "gwimage/out/*-image.tar"))
	}
	cfg := cluster.Defaults(cluster.Config{Images: imgs, Log: os.Stderr}, abs)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	t0 := time.Now()
	if cmd.verb == "up" {
		c, err := cluster.Up(ctx, cfg)
		if err != nil {
			return err
		}
		c.Detach()
		fmt.Fprintf(os.Stderr, "cluster up in %.1fs; images imported: %v\n", time.Since(t0).Seconds(), imgs)
		fmt.Printf("export KUBECONFIG=%s\n", c.Kubeconfig())
		return nil
	}
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
