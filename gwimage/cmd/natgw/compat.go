package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"

	"github.com/natgw/natgw/gwimage/compat"
	"github.com/natgw/natgw/gwimage/snatqueue"
	"github.com/natgw/natgw/gwimage/version"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/gwqos"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/shape"
)

// cmdCompat is `natgw compat OP RULE...`.
func cmdCompat(ctx context.Context, e env, g *globals, args []string) int {
	return runCompat(ctx, e, g, args)
}

// stateDir holds what init records for later calls (the interface names), as
// the script keeps /etc/kube-ovn/nat-gateway.env: in the container's
// filesystem, so a new pod starts without it and the controller's init
// writes it again. $NATGW_STATE_DIR_FOR_TEST overrides it: tests that run
// the binary without root's /etc set it; nothing in the product does.
func stateDir() string { return envOr("NATGW_STATE_DIR_FOR_TEST", "/etc/natgw") }

// indexDirEnv names the directory where `natgw serve` keeps its index
// snapshot (nat/README.md, "The index snapshot"). The gateway image sets it
// to /etc/natgw (imagebuild.IndexDir), so every serve exec'ed into the same
// container finds the last one's. Unset, as for a serve started on a host
// (the local transport, tests, the demo), serve keeps none and writes
// nothing.
const indexDirEnv = "NATGW_INDEX_DIR"

// snatQueue is the queue of SNATs held back (gwimage/snatqueue), kept in
// stateDir.
func snatQueue() snatqueue.Queue { return snatqueue.Queue{Dir: stateDir()} }

// isSNATDelete reports whether plan may touch queued SNATs.
func isSNATDelete(plan compat.Plan) bool { return plan.Op == compat.OpSNATDel }

// interfacesFile is where init with "VPC_IFACE,EXT_IFACE" records them.
func interfacesFile() string { return filepath.Join(stateDir(), "interfaces") }

// loadInterfaces sets g's interface names from the file init wrote, if any.
func loadInterfaces(g *globals) error {
	b, err := os.ReadFile(interfacesFile())
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the interfaces init recorded: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), "=")
		switch k {
		case "VPC_INTERFACE":
			g.intIface = v
		case "EXTERNAL_INTERFACE":
			g.extIface = v
		}
	}
	return nil
}

// saveInterfaces records init's interface names; nil removes the record
// (init without names goes back to the defaults, as the script's does).
func saveInterfaces(in *compat.Interfaces) error {
	if in == nil {
		if err := os.Remove(interfacesFile()); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("reset interface names: %w", err)
		}
		return nil
	}
	if err := os.MkdirAll(stateDir(), 0o755); err != nil {
		return fmt.Errorf("record interface names: %w", err)
	}
	body := fmt.Sprintf("VPC_INTERFACE=%s\nEXTERNAL_INTERFACE=%s\n", in.VPC, in.External)
	tmp := interfacesFile() + ".tmp"
	if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
		return fmt.Errorf("record interface names: %w", err)
	}
	if err := os.Rename(tmp, interfacesFile()); err != nil {
		return fmt.Errorf("record interface names: %w", err)
	}
	return nil
}

// linkExists reports whether the gateway namespace has a link named name.
func linkExists(g *globals, name string) (bool, error) {
	found := false
	look := func() error {
		_, err := net.InterfaceByName(name)
		found = err == nil
		return nil
	}
	if g.netns == "" {
		return found, look()
	}
	err := netns.Do(g.netns, look)
	return found, err
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
	if plan.DefaultRouteFromEnv {
		if gw := os.Getenv("GATEWAY_V4"); gw != "" {
			o, err := compat.DefaultRouteObject(gw)
			if err != nil {
				fmt.Fprintf(e.stderr, "natgw: %v\n", err)
				return exitUsage
			}
			plan.Apply = append(plan.Apply, o)
		}
	}
	if plan.Init {
		if in := plan.Interfaces; in != nil {
			for _, name := range []string{in.VPC, in.External} {
				ok, err := linkExists(g, name)
				if err == nil && !ok {
					err = fmt.Errorf("interface %q not found", name)
				}
				if err != nil {
					fmt.Fprintf(e.stderr, "natgw: init: %v\n", err)
					return exitFail
				}
			}
		}
		if err := saveInterfaces(plan.Interfaces); err != nil {
			fmt.Fprintf(e.stderr, "natgw: init: %v\n", err)
			return exitFail
		}
	}
	if err := loadInterfaces(g); err != nil {
		fmt.Fprintf(e.stderr, "natgw: %s: %v\n", op, err)
		return exitFail
	}
	if g.eipQoS != eipQoSShape && g.eipQoS != eipQoSPolice {
		fmt.Fprintf(e.stderr, "natgw: --eip-qos %q: want %s or %s\n", g.eipQoS, eipQoSShape, eipQoSPolice)
		return exitUsage
	}
	if plan.EIPQoS && g.eipQoS == eipQoSShape && g.dataplane == nat.DataplaneNftables {
		if err := shapeEIPQoS(ctx, g, plan.GatewayQoS); err != nil {
			fmt.Fprintf(e.stderr, "natgw: %s: %v\n", op, err)
			return exitFail
		}
		return exitOK
	}
	if len(plan.GatewayQoS) > 0 {
		if plan.EIPQoS {
			// Policed: no class of an earlier --eip-qos=shape stays.
			if err := shape.Change(ctx, g.config(logr.Discard()), shapeUpdates(plan.GatewayQoS, true)); err != nil {
				fmt.Fprintf(e.stderr, "natgw: %s: %v\n", op, err)
				return exitFail
			}
		}
		for i := range plan.GatewayQoS {
			if plan.GatewayQoS[i].Iface == "" { // EIP QoS: the external interface
				plan.GatewayQoS[i].Iface = g.extIface
			}
			// Policed EIP QoS (--eip-qos=police, iptables): dropped
			// above rate + burst, among the gateway-wide rules.
			plan.GatewayQoS[i].Police = plan.EIPQoS
		}
		if err := gwqos.Apply(ctx, g.config(logr.Discard()), plan.GatewayQoS); err != nil {
			fmt.Fprintf(e.stderr, "natgw: %s: %v\n", op, err)
			return exitFail
		}
		return exitOK
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	log := g.logger(e.stdout).WithName("compat").WithValues("op", op)
	// Opening creates the table when it is missing: even a plan with
	// nothing to do (init without rules) leaves an initialized gateway.
	dp, err := g.openUnshaped(ctx, log)
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

// changer is a Dataplane that deletes and applies in one transaction
// (engine.Engine).
type changer interface {
	Change(ctx context.Context, objs []nat.Object, uids []string) error
}

// carryOut applies a compat plan as one transaction.
func carryOut(ctx context.Context, dp nat.Dataplane, plan compat.Plan) error {
	switch {
	case len(plan.ShareIdentities) > 0:
		return replaceShares(ctx, dp, plan)
	case len(plan.Apply) > 0:
		apply, err := resolvePresence(ctx, dp, plan)
		if err != nil || len(apply) == 0 {
			return err
		}
		return dp.Apply(ctx, apply...)
	case len(plan.Delete) > 0:
		if isSNATDelete(plan) {
			cur, err := dp.List(ctx)
			if err != nil {
				return err
			}
			return snatQueue().Delete(ctx, dp, cur, plan.Delete)
		}
		if len(plan.MustExist) > 0 {
			cur, err := dp.List(ctx)
			if err != nil {
				return err
			}
			have := map[string]bool{}
			for _, o := range cur {
				have[o.UID] = true
			}
			for _, uid := range plan.MustExist {
				if !have[uid] {
					return fmt.Errorf("%s: not programmed (nothing to delete)", uid)
				}
			}
		}
		return dp.Delete(ctx, plan.Delete...)
	}
	return nil
}

// replaceShares makes the compat backends of each identity of the plan
// exactly those of plan.Apply (none for nft-dnat-map-del), in one
// transaction: master's map-add carries the identity's whole backend set.
func replaceShares(ctx context.Context, dp nat.Dataplane, plan compat.Plan) error {
	ch, ok := dp.(changer)
	if !ok {
		return fmt.Errorf("the %s data plane cannot replace a share DNAT's backends in one transaction", dp.Name())
	}
	cur, err := dp.List(ctx)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, o := range plan.Apply {
		keep[o.UID] = true
	}
	var del []string
	for _, o := range cur {
		for _, id := range plan.ShareIdentities {
			if strings.HasPrefix(o.UID, compat.ShareUIDPrefix(id)) && !keep[o.UID] {
				del = append(del, o.UID)
			}
		}
	}
	if len(del) == 0 && len(plan.Apply) == 0 {
		return nil // as master's script: nothing to delete is no error
	}
	return ch.Change(ctx, plan.Apply, del)
}

// resolvePresence drops the objects of plan.Apply that are already
// programmed and must be kept, and fails when one must not be replaced.
func resolvePresence(ctx context.Context, dp nat.Dataplane, plan compat.Plan) ([]nat.Object, error) {
	if len(plan.IfPresent) == 0 {
		return plan.Apply, nil
	}
	cur, err := dp.List(ctx)
	if err != nil {
		return nil, err
	}
	byUID := make(map[string]nat.Object, len(cur))
	for _, o := range cur {
		byUID[o.UID] = o
	}
	apply, _, err := snatQueue().Hold(cur, plan.Apply)
	if err != nil {
		return nil, err
	}
	var out []nat.Object
	for _, o := range apply {
		old, ok := byUID[o.UID]
		switch {
		case !ok || old.Equal(o):
		case plan.IfPresent[o.UID] == compat.Keep:
			continue
		case plan.IfPresent[o.UID] == compat.Refuse:
			return nil, fmt.Errorf("%s is already programmed as %q; remove it first", o.UID, old.String())
		}
		out = append(out, o)
	}
	return out, nil
}

// shapeEIPQoS carries out eip-*-qos-add / -del as upstream's script does
// them, with HTB classes (nat/shape: rate Mbit/s, burst MB; an add
// replaces the EIP's class of that direction, a del removes it, an EIP
// without a class is no error). A rule of the same EIP and direction that
// an earlier --eip-qos=police call left in natgw_gwqos goes too, so the
// EIP is not limited twice.
func shapeEIPQoS(ctx context.Context, g *globals, rules []compat.GatewayQoS) error {
	if err := shape.Change(ctx, g.config(logr.Discard()), shapeUpdates(rules, false)); err != nil {
		return err
	}
	dels := make([]gwqos.Change, len(rules))
	for i, r := range rules {
		dels[i] = gwqos.Change{Rule: r.Rule}
		dels[i].Iface = g.extIface
	}
	return gwqos.Apply(ctx, g.config(logr.Discard()), dels)
}

// shapeUpdates are the nat/shape updates of EIP QoS rules (u32 on EIP/32:
// dst is traffic to the EIP, src from it); remove: every update removes
// the class.
func shapeUpdates(rules []compat.GatewayQoS, remove bool) []shape.Update {
	out := make([]shape.Update, len(rules))
	for i, r := range rules {
		out[i] = shape.Update{Address: r.CIDR.Addr(), Egress: r.MatchDir == "src"}
		if r.Add && !remove {
			out[i].Limit = shape.Limit{RateMbps: r.RateMbps, BurstMB: r.BurstMB}
		}
	}
	return out
}
