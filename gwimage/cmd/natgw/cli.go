package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/natgw/natgw/agentapi"
	"github.com/natgw/natgw/gwimage/version"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
	"github.com/natgw/natgw/nat/planes"
	"github.com/natgw/natgw/nat/shape"
)

// cmdServe runs the agent on stdin/stdout, or on a unix socket (one Serve per
// connection, all on the same data plane).
func cmdServe(ctx context.Context, e env, g *globals, args []string) int {
	fs := subFlags("serve", e, g, "serve [--socket PATH] [--rules-only] [--synced-file PATH]")
	socket := fs.String("socket", "", "serve on this unix socket instead of stdin/stdout")
	rulesOnly := fs.Bool("rules-only", false, "program rules only: EIP and Route objects are kept in the table and state, but no address or route is added or removed (a replica of a two-replica gateway, whose EIPs `natgw ha` moves)")
	syncedFile := fs.String("synced-file", "", "after each successful sync, make sure this file exists (the mark `natgw ha --rules-synced-file` waits for before its replica may lead)")
	if code, ok := noArgs(fs, args); !ok {
		return code
	}
	emptyOthers, open := planes.EmptyOthers, planes.Open
	if *rulesOnly {
		emptyOthers, open = planes.EmptyOthersWithoutPlumbing, planes.OpenWithoutPlumbing
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	log := g.logger(e.stderr).WithName("serve")
	// The other data plane's state in this namespace goes first: one data
	// plane at a time holds a gateway's NAT (nat/planes).
	emptied, err := emptyOthers(ctx, g.dataplane, g.config(log))
	if err != nil {
		log.Error(err, "empty the other data plane", "dataplane", g.dataplane, "netns", g.netns)
		return exitFail
	}
	if !emptied.Empty() {
		log.Info("emptied another data plane's state", "dataplanes", emptied.Planes, "objects", len(emptied.Objects))
	}
	g.stateDir = os.Getenv(indexDirEnv) // its index snapshot (nat/README.md)
	dp, err := g.openWith(ctx, log, open)
	if err != nil {
		log.Error(err, "open data plane", "dataplane", g.dataplane, "netns", g.netns)
		return exitFail
	}
	if *rulesOnly {
		emptied = planes.Emptied{} // nothing was unplumbed: nothing to put back
	}
	if err := planes.Restore(ctx, dp, g.config(log), emptied); err != nil {
		log.Error(err, "restore addresses and routes")
		_ = dp.Close()
		return exitFail
	}
	if _, wrapped := dp.(*shape.Dataplane); !wrapped {
		// Policing: no shaping of an earlier --eip-qos=shape stays.
		if err := shape.Set(ctx, g.config(log), nil); err != nil {
			log.Error(err, "remove EIP shaping")
			_ = dp.Close()
			return exitFail
		}
	}
	log.Info("serving", "version", version.Version, "dataplane", dp.Name(), "netns", g.netns, "bootID", dp.BootID(), "rulesOnly", *rulesOnly)
	// Reading a big table back leaves its garbage behind: return it to
	// the system while the first requests are served.
	if heapObjectBytes() >= startReleaseBytes {
		go debug.FreeOSMemory()
	}
	info := agentapi.Info{Version: version.Version}
	sctx := logr.NewContext(ctx, log)
	opts := serveOptions(g)
	if *syncedFile != "" {
		opts = append(opts, agentapi.WithOnSync(func(context.Context) error { return markSynced(*syncedFile) }))
	}
	if *socket == "" {
		err = agentapi.Serve(sctx, dp, e.stdin, e.stdout, info, opts...)
	} else {
		err = serveSocket(sctx, dp, *socket, info, log, opts)
	}
	if cerr := dp.Close(); cerr != nil {
		log.Error(cerr, "close data plane")
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Error(err, "serve")
		return exitFail
	}
	log.Info("stopped; kernel state stays")
	return exitOK
}

// markSynced makes sure path exists (serve --synced-file): created with its
// directory at the first sync, left alone after.
func markSynced(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("sync mark: %w", err)
	}
	body := fmt.Sprintf("synced %s\n", time.Now().UTC().Format(time.RFC3339))
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		return fmt.Errorf("sync mark: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("sync mark: %w", err)
	}
	return nil
}

// serveOptions are the protocol options of natgw serve: the memory of a
// request of a megabyte or more (a sync or list of thousands of objects) goes
// back to the system once it is answered and input pauses (agentapi's
// releaseIdle, 200 ms); gwqos requests set the gateway's
// gateway-wide QoS (package nat/gwqos, table natgw_gwqos) in its namespace,
// a rule without interface on the external one.
func serveOptions(g *globals) []agentapi.Option {
	return []agentapi.Option{
		agentapi.WithReleaseMemory(1 << 20),
		agentapi.WithGatewayQoS(func(ctx context.Context, rules []gwqos.Rule) (bool, error) {
			return gwqos.Ensure(ctx, g.config(logr.Discard()), withInterface(rules, g.extIface))
		}),
	}
}

// withInterface returns rules with ext as the interface of those without
// one (upstream's default, net1: the external interface).
func withInterface(rules []gwqos.Rule, ext string) []gwqos.Rule {
	out := make([]gwqos.Rule, len(rules))
	for i, r := range rules {
		if r.Iface == "" {
			r.Iface = ext
		}
		out[i] = r
	}
	return out
}

// serveSocket accepts connections on a unix socket until ctx ends.
func serveSocket(ctx context.Context, dp nat.Dataplane, path string, info agentapi.Info, log logr.Logger, opts []agentapi.Option) error {
	_ = os.Remove(path) // a stale socket of an earlier agent
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	defer os.Remove(path)
	go func() { <-ctx.Done(); ln.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("accept on %s: %w", path, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			stop := context.AfterFunc(ctx, func() { conn.Close() })
			defer stop()
			if err := agentapi.Serve(ctx, dp, conn, conn, info, opts...); err != nil && ctx.Err() == nil {
				log.Error(err, "connection ended")
			}
		}()
	}
}

func cmdApply(ctx context.Context, e env, g *globals, args []string) int {
	return fileCommand(ctx, e, g, "apply", args, func(ctx context.Context, dp nat.Dataplane, objs []nat.Object) error {
		if err := dp.Apply(ctx, objs...); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "applied %d object(s)\n", len(objs))
		return nil
	})
}

func cmdSync(ctx context.Context, e env, g *globals, args []string) int {
	return fileCommand(ctx, e, g, "sync", args, func(ctx context.Context, dp nat.Dataplane, objs []nat.Object) error {
		if err := dp.Sync(ctx, objs); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "synced: the gateway holds %d object(s)\n", len(objs))
		return nil
	})
}

// fileCommand is apply and sync: read -f FILE, then fn.
func fileCommand(ctx context.Context, e env, g *globals, name string, args []string, fn func(context.Context, nat.Dataplane, []nat.Object) error) int {
	fs := subFlags(name, e, g, name+" -f FILE (YAML or JSON: a list of objects, {objects: [...]}, or one object; - for stdin)")
	file := fs.String("f", "", "file of objects (- for stdin)")
	if code, ok := noArgs(fs, args); !ok {
		return code
	}
	if *file == "" {
		fs.Usage()
		return exitUsage
	}
	var data []byte
	var err error
	if *file == "-" {
		data, err = io.ReadAll(e.stdin)
	} else {
		data, err = os.ReadFile(*file)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "natgw %s: %v\n", name, err)
		return exitFail
	}
	objs, err := ParseObjects(data)
	if err != nil {
		fmt.Fprintf(e.stderr, "natgw %s: %s: %v\n", name, *file, err)
		return exitFail
	}
	return withDataplane(ctx, e, g, func(ctx context.Context, dp nat.Dataplane, _ logr.Logger) error {
		return fn(ctx, dp, objs)
	})
}

// ParseObjects reads objects from YAML or JSON: a list of objects, a
// document {objects: [...]}, or a single object. Unknown fields are errors.
func ParseObjects(data []byte) ([]nat.Object, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	js = bytes.TrimSpace(js)
	strict := func(v any) error {
		dec := json.NewDecoder(bytes.NewReader(js))
		dec.DisallowUnknownFields()
		return dec.Decode(v)
	}
	switch {
	case len(js) == 0 || string(js) == "null":
		return []nat.Object{}, nil
	case js[0] == '[':
		var objs []nat.Object
		if err := strict(&objs); err != nil {
			return nil, fmt.Errorf("decode list of objects: %w", err)
		}
		return nonNil(objs), nil
	}
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(js, &probe); err != nil {
		return nil, fmt.Errorf("decode: want a list of objects or a mapping: %w", err)
	}
	if _, ok := probe["objects"]; ok {
		var doc struct {
			Objects []nat.Object `json:"objects"`
		}
		if err := strict(&doc); err != nil {
			return nil, fmt.Errorf("decode objects: %w", err)
		}
		return nonNil(doc.Objects), nil
	}
	var o nat.Object
	if err := strict(&o); err != nil {
		return nil, fmt.Errorf("decode object: %w", err)
	}
	return []nat.Object{o}, nil
}

func nonNil(objs []nat.Object) []nat.Object {
	if objs == nil {
		return []nat.Object{}
	}
	return objs
}

func cmdDelete(ctx context.Context, e env, g *globals, args []string) int {
	fs := subFlags("delete", e, g, "delete UID...")
	uids, code, ok := parseFlags(fs, args)
	if !ok {
		return code
	}
	if len(uids) == 0 {
		fs.Usage()
		return exitUsage
	}
	for _, uid := range uids {
		if err := nat.ValidateUID(uid); err != nil {
			fmt.Fprintf(e.stderr, "natgw delete: %v\n", err)
			return exitUsage
		}
	}
	return withDataplane(ctx, e, g, func(ctx context.Context, dp nat.Dataplane, _ logr.Logger) error {
		before, err := dp.List(ctx)
		if err != nil {
			return err
		}
		present := map[string]nat.Object{}
		for _, o := range before {
			present[o.UID] = o
		}
		if err := dp.Delete(ctx, uids...); err != nil {
			return err
		}
		for _, uid := range uids {
			if o, ok := present[uid]; ok {
				fmt.Fprintf(e.stdout, "deleted %s\n", o)
			} else {
				fmt.Fprintf(e.stdout, "not present: %s\n", uid)
			}
		}
		return nil
	})
}

func cmdList(ctx context.Context, e env, g *globals, args []string) int {
	fs := subFlags("list", e, g, "list [-o table|json|yaml]")
	out := fs.String("o", "table", "output format: table, json or yaml")
	if code, ok := noArgs(fs, args); !ok {
		return code
	}
	if *out != "table" && *out != "json" && *out != "yaml" {
		fs.Usage()
		return exitUsage
	}
	return withDataplane(ctx, e, g, func(ctx context.Context, dp nat.Dataplane, _ logr.Logger) error {
		objs, err := dp.List(ctx)
		if err != nil {
			return err
		}
		return printObjects(e.stdout, *out, objs)
	})
}

// printObjects writes objs as a table, JSON or YAML.
func printObjects(w io.Writer, format string, objs []nat.Object) error {
	objs = nonNil(objs)
	switch format {
	case "json":
		b, err := json.MarshalIndent(objs, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(objs)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "UID\tKIND\tEXTERNAL\tINTERNAL\tDETAIL")
	for _, o := range objs {
		ext, in, detail := columns(o)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", o.UID, o.Kind, ext, in, detail)
	}
	return tw.Flush()
}

// columns renders an object's table cells.
func columns(o nat.Object) (ext, in, detail string) {
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	switch {
	case o.EIP != nil:
		var ps []string
		for _, p := range o.EIP.Prefixes() {
			ps = append(ps, p.String())
		}
		ext = strings.Join(ps, ",")
		if q := o.EIP.QoS; q != nil {
			var parts []string
			if q.IngressRateMbps > 0 {
				parts = append(parts, fmt.Sprintf("ingress %dMbit/s burst %dMbit", q.IngressRateMbps, q.IngressBurstMbit))
			}
			if q.EgressRateMbps > 0 {
				parts = append(parts, fmt.Sprintf("egress %dMbit/s burst %dMbit", q.EgressRateMbps, q.EgressBurstMbit))
			}
			detail = strings.Join(parts, ", ")
		}
	case o.FIP != nil:
		ext, in, detail = o.FIP.EIP.String(), o.FIP.InternalIP.String(), "1:1"
	case o.DNAT != nil:
		d := o.DNAT
		ext = fmt.Sprintf("%s:%d/%s", d.EIP, d.ExternalPort, d.Protocol)
		in = fmt.Sprintf("%s:%d", d.InternalIP, d.InternalPort)
	case o.SNAT != nil:
		ext, in = o.SNAT.EIP.String(), o.SNAT.InternalCIDR.String()
		if o.SNAT.RandomFully {
			detail = "random-fully"
		}
	case o.Route != nil:
		r := o.Route
		detail = fmt.Sprintf("%s via %s dev %s", r.Destination, r.NextHop, r.Device)
	}
	return dash(ext), dash(in), dash(detail)
}

func cmdInfo(ctx context.Context, e env, g *globals, args []string) int {
	fs := subFlags("info", e, g, "info [-o text|json]")
	out := fs.String("o", "text", "output format: text or json")
	if code, ok := noArgs(fs, args); !ok {
		return code
	}
	return withDataplane(ctx, e, g, func(ctx context.Context, dp nat.Dataplane, _ logr.Logger) error {
		objs, err := dp.List(ctx)
		if err != nil {
			return err
		}
		in := agentapi.Info{Version: version.Version, Dataplane: dp.Name(), BootID: dp.BootID(), Counts: map[nat.Kind]int{}}
		for _, o := range objs {
			in.Counts[o.Kind]++
		}
		if *out == "json" {
			b, err := json.MarshalIndent(in, "", "  ")
			if err != nil {
				return err
			}
			fmt.Fprintf(e.stdout, "%s\n", b)
			return nil
		}
		fmt.Fprintf(e.stdout, "version:   %s\ndataplane: %s\nnetns:     %s\nboot id:   %s\n", in.Version, in.Dataplane, nsName(g.netns), in.BootID)
		kinds := make([]string, 0, len(nat.Kinds))
		for _, k := range nat.Kinds {
			kinds = append(kinds, fmt.Sprintf("%s=%d", k, in.Counts[k]))
		}
		sort.Strings(kinds)
		fmt.Fprintf(e.stdout, "objects:   %s\n", strings.Join(kinds, " "))
		return nil
	})
}

func nsName(ref string) string {
	if ref == "" {
		return "(current)"
	}
	return ref
}

// cmdPause sleeps until SIGTERM or SIGINT. As PID 1 of a container it also
// reaps the zombies of processes exec'd into the container.
func cmdPause(ctx context.Context, e env, g *globals, args []string) int {
	fs := subFlags("pause", e, g, "pause")
	if code, ok := noArgs(fs, args); !ok {
		return code
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	defer signal.Stop(sigs)
	fmt.Fprintf(e.stderr, "natgw %s: pausing until SIGTERM or SIGINT\n", version.Version)
	for {
		select {
		case <-ctx.Done():
			return exitOK
		case s := <-sigs:
			if s != syscall.SIGCHLD {
				return exitOK
			}
			if os.Getpid() == 1 {
				reap()
			}
		}
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// startReleaseBytes is the heap (live objects and garbage not yet
// collected) above which serve returns memory to the system after its
// start: below it the collection and the returned pages cost more than
// they free.
const startReleaseBytes = 16 << 20

// heapObjectBytes is the memory in heap objects, garbage included.
func heapObjectBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}
