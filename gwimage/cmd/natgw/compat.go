package main

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/natgw/natgw/gwimage/compat"
	"github.com/natgw/natgw/gwimage/version"
	"github.com/natgw/natgw/nat"
)

// cmdCompat is `natgw compat OP RULE...`.
func cmdCompat(ctx context.Context, e env, g *globals, args []string) int {
	return runCompat(ctx, e, g, args)
}

// runCompat carries out one nat-gateway.sh subcommand: args are OP RULE....
// Like the script, it prints the subcommand to stdout; logs go to stdout too
// and only the failure message goes to stderr, because the controller reads
// any stderr output as a failure.
func runCompat(ctx context.Context, e env, g *globals, args []string) int {
	if len(args) == 0 {
		fmt.Fprintf(e.stderr, "usage: nat-gateway.sh OP RULE...\nops: %s\n", strings.Join(compat.Ops, " "))
		return exitUsage
	}
	op, rules := args[0], args[1:]
	plan, err := compat.Parse(op, rules)
	if err != nil {
		fmt.Fprintf(e.stderr, "natgw: %v\n", err)
		return exitUsage
	}
	fmt.Fprintf(e.stdout, "%s %s\n", op, strings.Join(rules, " "))
	if plan.PrintVersion {
		fmt.Fprintln(e.stdout, compat.VersionLine(version.Version, g.dataplane))
		return exitOK
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	log := g.logger(e.stdout).WithName("compat").WithValues("op", op)
	// Opening creates the table when it is missing: even a plan with
	// nothing to do (init without rules) leaves an initialized gateway.
	dp, err := g.open(ctx, log)
	if err != nil {
		fmt.Fprintf(e.stderr, "natgw: %s: %v\n", op, err)
		return exitFail
	}
	err = carryOut(ctx, dp, plan)
	if cerr := dp.Close(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "natgw: %s: %v\n", op, err)
		return exitFail
	}
	return exitOK
}

// carryOut applies a compat plan as one transaction.
func carryOut(ctx context.Context, dp nat.Dataplane, plan compat.Plan) error {
	switch {
	case len(plan.Apply) > 0:
		return dp.Apply(ctx, plan.Apply...)
	case len(plan.Delete) > 0:
		return dp.Delete(ctx, plan.Delete...)
	case len(plan.QoS) > 0:
		cur, err := dp.List(ctx)
		if err != nil {
			return err
		}
		changed, err := compat.ApplyQoS(cur, plan.QoS)
		if err != nil {
			return err
		}
		return dp.Apply(ctx, changed...)
	}
	return nil
}

// runBashShim stands in for /bin/bash in the image, which has no shell: the
// Kube-OVN controller execs `/bin/bash -c "bash /kube-ovn/nat-gateway.sh OP
// RULE..."` (its init container too) and runs the gateway container as
// `bash -c "while true; do sleep 10000; done"`. The shim accepts exactly
// these: a nat-gateway.sh command line (with or without the inner "bash", or
// the script path and arguments given directly), split on blanks and run
// in-process; the keep-alive loop (or `sleep infinity`), served as `natgw
// pause`. Anything else is refused: it is not a shell.
func runBashShim(ctx context.Context, e env, args []string) int {
	if isKeepAlive(args) {
		g := defaultGlobals()
		return cmdPause(ctx, e, &g, nil)
	}
	words, err := shimWords(args)
	if err != nil {
		fmt.Fprintf(e.stderr, "natgw (bash shim): %v\n", err)
		return 127
	}
	g := defaultGlobals()
	return runCompat(ctx, e, &g, words)
}

// keepAlive matches the container commands that only keep a container
// alive: the controller's gateway pod runs `bash -c "while true; do sleep
// 10000; done"`.
var keepAlive = regexp.MustCompile(`^(while (true|:); do sleep [0-9]+; done|sleep infinity)$`)

// isKeepAlive reports whether the shim was asked for a keep-alive loop,
// which it serves as `natgw pause`.
func isKeepAlive(args []string) bool {
	return len(args) == 2 && args[0] == "-c" && keepAlive.MatchString(strings.Join(strings.Fields(args[1]), " "))
}

// shimWords returns OP RULE... of a command line the bash shim accepts.
func shimWords(args []string) ([]string, error) {
	var words []string
	switch {
	case len(args) == 2 && args[0] == "-c":
		if strings.ContainsAny(args[1], "'\"`$;&|<>(){}*?[]\\!#~=") {
			return nil, fmt.Errorf("not a shell: refusing %q (only `[bash] .../nat-gateway.sh OP RULE...` runs)", args[1])
		}
		words = strings.Fields(args[1])
	case len(args) >= 1 && !strings.HasPrefix(args[0], "-"):
		words = args
	default:
		return nil, fmt.Errorf("not a shell: only `bash -c \"bash /kube-ovn/nat-gateway.sh OP RULE...\"` runs, got %q", args)
	}
	if len(words) > 0 && words[0] == "bash" {
		words = words[1:]
	}
	if len(words) < 2 || filepath.Base(words[0]) != "nat-gateway.sh" {
		return nil, fmt.Errorf("not a shell: only nat-gateway.sh runs, got %q", strings.Join(words, " "))
	}
	return words[1:], nil
}
