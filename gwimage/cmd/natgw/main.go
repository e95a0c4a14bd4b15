// Command natgw is the VPC NAT gateway agent and its CLI.
//
//	natgw [global flags] serve [--socket PATH] [--rules-only]   the agent: JSON lines on stdin/stdout (or a unix socket)
//	natgw [global flags] apply -f FILE           add/update objects (YAML or JSON), one transaction
//	natgw [global flags] sync -f FILE            make the gateway hold exactly FILE's objects
//	natgw [global flags] delete UID...           delete objects by UID
//	natgw [global flags] list [-o table|json|yaml]
//	natgw [global flags] info                    data plane, boot id, counts
//	natgw version
//	natgw pause                                  keep a container alive (entrypoint)
//	natgw compat OP RULE...                      Kube-OVN nat-gateway.sh subcommands
//
// Global flags (also taken from the environment, for the compatibility
// entry points that get no flags): --netns NAME|PATH ($NATGW_NETNS),
// --dataplane nftables|iptables ($NATGW_DATAPLANE), --external-iface
// ($NATGW_EXTERNAL_IFACE, net1), --internal-iface ($NATGW_INTERNAL_IFACE,
// eth0), -v LEVEL ($NATGW_V).
//
// Invoked as nat-gateway.sh (a symlink, as in the image) natgw behaves like
// `natgw compat`; invoked as bash it accepts only the command line Kube-OVN's
// controller execs (`bash -c "bash /kube-ovn/nat-gateway.sh OP RULE..."`) and
// runs it without a shell. Logs go to stderr, except in the compatibility
// modes, where they go to stdout: the controller treats any stderr output as
// a failure.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/gwimage/version"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/planes"
	"github.com/natgw/natgw/nat/shape"
)

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

func main() {
	os.Exit(run(context.Background(), os.Args, os.Stdin, os.Stdout, os.Stderr))
}

// env carries a command's streams and the command line it came from.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	argv           []string // as run got it (the lean build's `ha` passes it on)
}

// run dispatches on the program name, then on the subcommand.
func run(ctx context.Context, argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := env{stdin: stdin, stdout: stdout, stderr: stderr, argv: argv}
	if code, ok := multicall(ctx, e, argv); ok {
		return code
	}
	g := defaultGlobals()
	fs := flag.NewFlagSet("natgw", flag.ContinueOnError)
	fs.SetOutput(stderr)
	g.register(fs)
	fs.Usage = func() { usage(stderr) }
	if err := fs.Parse(argv[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	args := fs.Args()
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	cmd, rest := args[0], args[1:]
	c, ok := commands[cmd]
	if !ok {
		fmt.Fprintf(stderr, "natgw: unknown command %q\n", cmd)
		usage(stderr)
		return exitUsage
	}
	return c.run(ctx, e, &g, rest)
}

type command struct {
	summary string
	run     func(ctx context.Context, e env, g *globals, args []string) int
}

var commands map[string]command

func init() {
	commands = map[string]command{
		"serve":   {"run the agent: JSON-lines requests on stdin, responses on stdout", cmdServe},
		"apply":   {"add or update the objects of a YAML/JSON file (-f), one transaction", cmdApply},
		"sync":    {"make the gateway hold exactly the objects of a file (-f), one transaction", cmdSync},
		"delete":  {"delete objects by UID", cmdDelete},
		"list":    {"list the gateway's objects (-o table|json|yaml)", cmdList},
		"info":    {"show the data plane, boot id and object counts", cmdInfo},
		"version": {"print the version", cmdVersion},
		"pause":   {"sleep until SIGTERM/SIGINT (container entrypoint)", cmdPause},
		"compat":  {"run a Kube-OVN nat-gateway.sh subcommand: compat OP RULE...", cmdCompat},
		"ha":      {"run one replica of an active/standby gateway (nat/ha)", cmdHA},
		"synced":  {"exit 0 when the agent's sync mark exists (a two-replica pod's readiness probe)", cmdSynced},
	}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: natgw [global flags] COMMAND [flags] [args]\n\ncommands:\n")
	for _, name := range []string{"serve", "apply", "sync", "delete", "list", "info", "version", "pause", "compat", "ha", "synced"} {
		fmt.Fprintf(w, "  %-8s %s\n", name, commands[name].summary)
	}
	fmt.Fprintf(w, "\nglobal flags:\n")
	g := defaultGlobals()
	fs := flag.NewFlagSet("natgw", flag.ContinueOnError)
	fs.SetOutput(w)
	g.register(fs)
	fs.PrintDefaults()
}

// globals are the flags every command takes.
type globals struct {
	netns     string
	dataplane nat.DataplaneName
	extIface  string
	intIface  string
	verbosity int
	timeout   time.Duration
	eipQoS    string
	// stateDir is nat.Config.StateDir: set by serve ($NATGW_INDEX_DIR,
	// see indexDirEnv), so that an agent exec'ed again on a controller
	// reconnect starts from its index snapshot; "" for the one-shot
	// commands.
	stateDir string
}

// EIP QoS modes (--eip-qos).
const (
	eipQoSShape  = "shape"  // HTB classes (nat/shape), as Kube-OVN's script
	eipQoSPolice = "police" // nftables limits in the NAT table
)

func defaultGlobals() globals {
	g := globals{
		netns:     os.Getenv("NATGW_NETNS"),
		dataplane: nat.DataplaneName(envOr("NATGW_DATAPLANE", string(nat.DataplaneNftables))),
		extIface:  envOr("NATGW_EXTERNAL_IFACE", nat.DefaultExternalInterface),
		intIface:  envOr("NATGW_INTERNAL_IFACE", nat.DefaultInternalInterface),
		timeout:   2 * time.Minute,
		eipQoS:    envOr("NATGW_EIP_QOS", eipQoSShape),
	}
	if v, err := strconv.Atoi(os.Getenv("NATGW_V")); err == nil {
		g.verbosity = v
	}
	return g
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func (g *globals) register(fs *flag.FlagSet) {
	fs.StringVar(&g.netns, "netns", g.netns, "network namespace of the gateway: a name under /run/netns or a path (default: the current one)")
	fs.Var(&g.dataplane, "dataplane", "data plane: nftables or iptables (default $NATGW_DATAPLANE, else nftables)")
	fs.StringVar(&g.extIface, "external-iface", g.extIface, "the gateway's external interface")
	fs.StringVar(&g.intIface, "internal-iface", g.intIface, "the gateway's VPC interface")
	fs.IntVar(&g.verbosity, "v", g.verbosity, "log verbosity (0: changes and errors, 1: every request, 2+: debug)")
	fs.DurationVar(&g.timeout, "timeout", g.timeout, "bound of one CLI operation (not of serve)")
	fs.StringVar(&g.eipQoS, "eip-qos", g.eipQoS, "EIP QoS on the nftables data plane: shape (HTB classes, as Kube-OVN's script) or police (nftables limits, drop above rate + burst); the iptables data plane always polices")
}

// logger returns a logr.Logger writing text to w at the globals' verbosity.
func (g *globals) logger(w io.Writer) logr.Logger {
	h := slog.NewTextHandler(w, &slog.HandlerOptions{
		Level: slog.Level(-g.verbosity),
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			// logr's V(n) is slog level -n: print it as "V1", not "DEBUG+3".
			if lvl, ok := a.Value.Any().(slog.Level); ok && a.Key == slog.LevelKey && lvl < slog.LevelInfo && lvl > slog.LevelDebug {
				a.Value = slog.StringValue(fmt.Sprintf("V%d", -int(lvl)))
			}
			return a
		},
	})
	return logr.FromSlogHandler(h)
}

func (g *globals) config(log logr.Logger) nat.Config {
	return nat.Config{NetNS: g.netns, ExternalInterface: g.extIface, InternalInterface: g.intIface, Log: log, StateDir: g.stateDir}
}

// open opens the chosen data plane; on nftables with --eip-qos=shape its
// EIP QoS is shaped (shape.Wrap).
func (g *globals) open(ctx context.Context, log logr.Logger) (nat.Dataplane, error) {
	return g.openWith(ctx, log, planes.Open)
}

// openWith is open with the data plane opened by open (planes.Open, or
// planes.OpenWithoutPlumbing for `serve --rules-only`).
func (g *globals) openWith(ctx context.Context, log logr.Logger, open func(context.Context, nat.DataplaneName, nat.Config) (nat.Dataplane, error)) (nat.Dataplane, error) {
	if g.eipQoS != eipQoSShape && g.eipQoS != eipQoSPolice {
		return nil, fmt.Errorf("--eip-qos %q: want %s or %s", g.eipQoS, eipQoSShape, eipQoSPolice)
	}
	dp, err := open(ctx, g.dataplane, g.config(log))
	if err != nil || !g.shapes(dp) {
		return dp, err
	}
	return shape.Wrap(dp, g.config(log)), nil
}

// openUnshaped opens the chosen data plane without shape.Wrap: the compat
// path's EIP objects carry no QoS (its eip-*-qos-* calls program nat/shape
// themselves), so a wrapper would drop an EIP's classes at every eip-add.
func (g *globals) openUnshaped(ctx context.Context, log logr.Logger) (nat.Dataplane, error) {
	if g.eipQoS != eipQoSShape && g.eipQoS != eipQoSPolice {
		return nil, fmt.Errorf("--eip-qos %q: want %s or %s", g.eipQoS, eipQoSShape, eipQoSPolice)
	}
	return planes.Open(ctx, g.dataplane, g.config(log))
}

// shapes says whether EIP QoS on dp is shaped.
func (g *globals) shapes(dp nat.Dataplane) bool {
	return g.eipQoS == eipQoSShape && dp.Name() == nat.DataplaneNftables
}

// subFlags returns a FlagSet for a subcommand that also takes the globals.
func subFlags(name string, e env, g *globals, usageLine string) *flag.FlagSet {
	fs := flag.NewFlagSet("natgw "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	g.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: natgw %s\n", usageLine)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args, interleaved flags and positional arguments alike.
func parseFlags(fs *flag.FlagSet, args []string) ([]string, int, bool) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, exitOK, false
			}
			return nil, exitUsage, false
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, 0, true
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), 0, true
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// noArgs parses args for a subcommand that takes flags only; a positional
// argument prints the usage. ok is false when the caller must exit with code.
func noArgs(fs *flag.FlagSet, args []string) (code int, ok bool) {
	pos, code, ok := parseFlags(fs, args)
	if ok && len(pos) > 0 {
		fs.Usage()
		return exitUsage, false
	}
	return code, ok
}

// withDataplane runs fn on the opened data plane, bounded by the timeout,
// and closes it (kernel state stays).
func withDataplane(ctx context.Context, e env, g *globals, fn func(ctx context.Context, dp nat.Dataplane, log logr.Logger) error) int {
	log := g.logger(e.stderr)
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	dp, err := g.open(ctx, log)
	if err != nil {
		fmt.Fprintf(e.stderr, "natgw: %v\n", err)
		return exitFail
	}
	err = fn(ctx, dp, log)
	if cerr := dp.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("close data plane: %w", cerr)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "natgw: %v\n", err)
		return exitFail
	}
	return exitOK
}

func cmdVersion(ctx context.Context, e env, g *globals, args []string) int {
	fs := subFlags("version", e, g, "version")
	if code, ok := noArgs(fs, args); !ok {
		return code
	}
	fmt.Fprintln(e.stdout, version.String())
	return exitOK
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
