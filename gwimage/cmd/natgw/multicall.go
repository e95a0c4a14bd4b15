package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The image has no shell and no userland: the programs Kube-OVN's pod specs
// and controller run in a pod of the gateway image are links to natgw, which
// dispatches on its program name (see multicall). Each accepts exactly the
// forms upstream uses and refuses anything else with a message on stderr.
//
//	nat-gateway.sh OP RULE...     natgw compat
//	lb-svc.sh OP RULE...          the LoadBalancer-Service pods' script (gwimage/lbsvc)
//	bash|sh -c "LINE"             LINE one of: [bash ]/…/nat-gateway.sh|lb-svc.sh OP RULE...;
//	                              sleep infinity | while true; do sleep N; done;
//	                              sysctl -w KEY=VALUE...
//	sleep infinity|DURATION       the container command of the gateway pod
//	sysctl [-w] KEY[=VALUE]...    the v1.16 PostStart hook (through sh -c)
//	ip [-4|-6] route replace CIDR via GW                the VPC LB pod's init containers
//	iptables|ip6tables -t nat -I POSTROUTING -d CIDR -j MASQUERADE   (gwimage/vpclb)

// multicall runs argv when its program name is one of the image's links;
// ok is false for any other name (natgw itself).
func multicall(ctx context.Context, e env, argv []string) (code int, ok bool) {
	args := argv[1:]
	switch filepath.Base(argv[0]) {
	case "nat-gateway.sh":
		g := defaultGlobals()
		return runCompat(ctx, e, &g, args), true
	case "bash", "sh":
		return runShellShim(ctx, e, args), true
	case "sleep":
		return runSleep(ctx, e, args), true
	case "lb-svc.sh":
		return runLBSvc(e, args), true
	case "sysctl":
		return runSysctl(e, args), true
	case "ip":
		return runIP(e, args), true
	case "iptables", "ip6tables":
		return runIptables(e, filepath.Base(argv[0]), args), true
	}
	return 0, false
}

// exitNotFound is a shell's exit status for a command it cannot run.
const exitNotFound = 127

// runShellShim stands in for /bin/bash and /bin/sh: it runs the command
// lines upstream's pods and controller use (see multicall) without a shell.
func runShellShim(ctx context.Context, e env, args []string) int {
	if isKeepAlive(args) {
		g := defaultGlobals()
		return cmdPause(ctx, e, &g, nil)
	}
	if len(args) == 2 && args[0] == "-c" {
		if words := strings.Fields(args[1]); len(words) > 0 && words[0] == "sysctl" && !strings.ContainsAny(args[1], shellMeta) {
			return runSysctl(e, words[1:])
		}
	}
	script, words, err := shimScript(args)
	if err != nil {
		fmt.Fprintf(e.stderr, "natgw (shell shim): %v\n", err)
		return exitNotFound
	}
	if script == "lb-svc.sh" {
		return runLBSvc(e, words)
	}
	g := defaultGlobals()
	return runCompat(ctx, e, &g, words)
}

// shellMeta are the characters that would make a command line more than
// words separated by blanks.
const shellMeta = "'\"`$;&|<>(){}*?[]\\!#~"

// keepAlive matches the container commands that only keep a container
// alive: `sleep infinity` and `while true; do sleep N; done`.
var keepAlive = regexp.MustCompile(`^(while (true|:); do sleep [0-9]+; done|sleep infinity)$`)

// isKeepAlive reports whether the shim was asked for a keep-alive loop,
// which it serves as `natgw pause`.
func isKeepAlive(args []string) bool {
	return len(args) == 2 && args[0] == "-c" && keepAlive.MatchString(strings.Join(strings.Fields(args[1]), " "))
}

// shimWords returns OP RULE... of a nat-gateway.sh command line the shim
// accepts: `-c "[bash] PATH/nat-gateway.sh OP RULE..."` or the script path
// and its arguments given directly.
func shimWords(args []string) ([]string, error) {
	script, words, err := shimScript(args)
	if err == nil && script != "nat-gateway.sh" {
		err = fmt.Errorf("not a shell: only nat-gateway.sh runs here, got %s", script)
	}
	if err != nil {
		return nil, err
	}
	return words, nil
}

// shimScript returns the script name (nat-gateway.sh or lb-svc.sh) and OP
// RULE... of a command line the shim accepts: `-c "[bash] PATH/SCRIPT OP
// RULE..."` or the script path and its arguments given directly.
func shimScript(args []string) (string, []string, error) {
	var words []string
	switch {
	case len(args) == 2 && args[0] == "-c":
		if strings.ContainsAny(args[1], shellMeta+"=") {
			return "", nil, fmt.Errorf("not a shell: refusing %q (only `[bash] .../nat-gateway.sh OP RULE...`, `[bash] .../lb-svc.sh OP RULE...`, `sleep infinity` and `sysctl -w KEY=VALUE` run)", args[1])
		}
		words = strings.Fields(args[1])
	case len(args) >= 1 && !strings.HasPrefix(args[0], "-"):
		words = args
	default:
		return "", nil, fmt.Errorf("not a shell: only `bash -c \"bash /kube-ovn/nat-gateway.sh OP RULE...\"` runs, got %q", args)
	}
	if len(words) > 0 && (words[0] == "bash" || words[0] == "sh") {
		words = words[1:]
	}
	if len(words) < 2 {
		return "", nil, fmt.Errorf("not a shell: only nat-gateway.sh and lb-svc.sh run, got %q", strings.Join(words, " "))
	}
	switch script := filepath.Base(words[0]); script {
	case "nat-gateway.sh", "lb-svc.sh":
		return script, words[1:], nil
	}
	return "", nil, fmt.Errorf("not a shell: only nat-gateway.sh and lb-svc.sh run, got %q", strings.Join(words, " "))
}

// runSleep is sleep(1) for one operand: "infinity" (served as natgw pause:
// it ends on SIGTERM or SIGINT, and reaps children as PID 1) or a number of
// seconds with an optional s, m, h or d suffix.
func runSleep(ctx context.Context, e env, args []string) int {
	if len(args) != 1 {
		fmt.Fprintf(e.stderr, "sleep: want one operand (infinity or a duration such as 10, 1.5, 2m), got %q\n", args)
		return exitFail
	}
	if args[0] == "infinity" {
		g := defaultGlobals()
		return cmdPause(ctx, e, &g, nil)
	}
	d, err := parseSleep(args[0])
	if err != nil {
		fmt.Fprintf(e.stderr, "sleep: %v\n", err)
		return exitFail
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	select {
	case <-ctx.Done():
		return 128 + int(syscall.SIGTERM)
	case <-time.After(d):
		return exitOK
	}
}

// parseSleep reads sleep(1)'s NUMBER[SUFFIX].
func parseSleep(s string) (time.Duration, error) {
	unit := time.Second
	num := s
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 's':
			num = s[:n-1]
		case 'm':
			unit, num = time.Minute, s[:n-1]
		case 'h':
			unit, num = time.Hour, s[:n-1]
		case 'd':
			unit, num = 24*time.Hour, s[:n-1]
		}
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 || strings.ContainsAny(num, "eEnNxX+-") || v*float64(unit) > float64(1<<62) {
		return 0, fmt.Errorf("invalid time interval %q", s)
	}
	return time.Duration(v * float64(unit)), nil
}

// procSys is where sysctl reads and writes (a variable for tests).
var procSys = "/proc/sys"

// runSysctl is sysctl(8) for `-w KEY=VALUE...` and `KEY...` (read): it
// prints "KEY = VALUE" for each, as procps does. A key is dotted
// (net.ipv4.ip_forward) or slashed.
func runSysctl(e env, args []string) int {
	write := false
	var ops []string
	for _, a := range args {
		switch {
		case a == "-w":
			write = true
		case strings.HasPrefix(a, "-"):
			fmt.Fprintf(e.stderr, "sysctl: option %q not supported (natgw's sysctl takes -w KEY=VALUE and KEY)\n", a)
			return exitFail
		default:
			ops = append(ops, a)
		}
	}
	if len(ops) == 0 {
		fmt.Fprintln(e.stderr, "sysctl: no variables specified")
		return exitFail
	}
	code := exitOK
	for _, op := range ops {
		key, val, set := strings.Cut(op, "=")
		if write && !set {
			fmt.Fprintf(e.stderr, "sysctl: %q must be of the form name=value\n", op)
			code = exitFail
			continue
		}
		if err := sysctlOne(e, key, val, set); err != nil {
			fmt.Fprintf(e.stderr, "sysctl: %v\n", err)
			code = exitFail
		}
	}
	return code
}

func sysctlOne(e env, key, val string, set bool) error {
	key = strings.TrimSpace(key)
	rel := strings.ReplaceAll(key, ".", "/")
	if key == "" || strings.Contains(rel, "..") || strings.HasPrefix(rel, "/") {
		return fmt.Errorf("cannot stat %q: invalid key", key)
	}
	p := filepath.Join(procSys, rel)
	if set {
		// Never create: a key that is not there is an error, as in /proc/sys.
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
		if err == nil {
			_, err = f.WriteString(strings.TrimSpace(val) + "\n")
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("cannot stat %s: No such file or directory", p)
			}
			return fmt.Errorf("setting key %q: %w", key, err)
		}
	}
	b, err := os.ReadFile(p)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("cannot stat %s: No such file or directory", p)
		}
		return fmt.Errorf("reading key %q: %w", key, err)
	}
	fmt.Fprintf(e.stdout, "%s = %s\n", key, strings.TrimSpace(string(b)))
	return nil
}
