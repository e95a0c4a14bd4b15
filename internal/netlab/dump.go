package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"

	"github.com/natgw/natgw/nat/netns"
)

// DumpTimeout bounds every kernel state reader.
const DumpTimeout = 10 * time.Second

// Command returns a command that runs name with args inside ns: through nsenter, so
// ns may be a name under /run/netns or a path; "" runs it in the caller's
// namespace. It is exec.CommandContext otherwise (e.g. for `natgw serve`
// inside a gateway).
func Command(ctx context.Context, ns, name string, args ...string) *exec.Cmd {
	if ns == "" {
		return exec.CommandContext(ctx, name, args...)
	}
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + netns.Path(ns), "--", name}, args...)...)
}

// Run runs cmd with its standard output and error captured and returns
// them with the exit status (-1 when a signal ended it); err is set (and
// code is -1) only when cmd could not run or be waited for.
func Run(cmd *exec.Cmd) (stdout, stderr string, code int, err error) {
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), errb.String(), ee.ExitCode(), nil
	}
	if err != nil {
		return out.String(), errb.String(), -1, fmt.Errorf("run %q: %w", cmd.Args, err)
	}
	return out.String(), errb.String(), 0, nil
}

// Exec runs argv inside ns (see Command) and returns its standard output.
// stdin, when not empty, is fed to the command. It is bounded by ctx's
// deadline, or by DumpTimeout when ctx has none.
func Exec(ctx context.Context, ns, stdin string, argv ...string) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DumpTimeout)
		defer cancel()
	}
	if len(argv) == 0 {
		return "", errors.New("netlab: exec: no command")
	}
	cmd := Command(ctx, ns, argv[0], argv[1:]...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("netlab: %s in %s: %w: %s", strings.Join(argv, " "), ns, err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// NftRuleset returns `nft list ruleset` of ns.
func NftRuleset(ctx context.Context, ns string) (string, error) {
	return Exec(ctx, ns, "", "nft", "list", "ruleset")
}

// NftTable returns `nft list table <family> <name>` of ns; name is any
// table's name or one of natgw's (nftconn.TableName).
func NftTable[N ~string](ctx context.Context, ns, family string, name N) (string, error) {
	return Exec(ctx, ns, "", "nft", "list", "table", family, string(name))
}

// IptablesSave returns the rules of every table of ns as printed by
// iptables-legacy-save (legacy) or iptables-nft-save, without the comment
// lines that carry timestamps and with counters zeroed, so that two dumps
// of the same rules are byte-identical.
func IptablesSave(ctx context.Context, ns string, legacy bool) (string, error) {
	bin := "iptables-nft-save"
	if legacy {
		bin = "iptables-legacy-save"
	}
	out, err := Exec(ctx, ns, "", bin)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, line := range strings.SplitAfter(out, "\n") {
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		if strings.HasPrefix(line, ":") {
			// ":CHAIN POLICY [packets:bytes]": drop the counters.
			if i := strings.LastIndex(line, " ["); i > 0 {
				line = line[:i] + "\n"
			}
		}
		b.WriteString(line)
	}
	return b.String(), nil
}

// Flow is one conntrack entry, reduced to what tests look at.
type Flow struct {
	Proto              uint8
	OrigSrc, OrigDst   netip.AddrPort
	ReplySrc, ReplyDst netip.AddrPort
	Mark               uint32
}

// Has reports whether a is one of the flow's addresses (either tuple,
// source or destination).
func (f Flow) Has(a netip.Addr) bool {
	for _, x := range []netip.AddrPort{f.OrigSrc, f.OrigDst, f.ReplySrc, f.ReplyDst} {
		if x.Addr() == a {
			return true
		}
	}
	return false
}

// Translated reports whether the flow is NATed: its reply tuple is not the
// reverse of its original one.
func (f Flow) Translated() bool {
	return f.ReplySrc != f.OrigDst || f.ReplyDst != f.OrigSrc
}

func (f Flow) String() string {
	return fmt.Sprintf("proto=%d orig=%s->%s reply=%s->%s mark=%#x", f.Proto, f.OrigSrc, f.OrigDst, f.ReplySrc, f.ReplyDst, f.Mark)
}

// ConntrackEntries dumps the conntrack table of ns.
func ConntrackEntries(ctx context.Context, ns string) ([]Flow, error) {
	ctx, cancel := context.WithTimeout(ctx, DumpTimeout)
	defer cancel()
	n, err := netns.Open(ns)
	if err != nil {
		return nil, fmt.Errorf("netlab: conntrack: %w", err)
	}
	defer n.Close()
	type result struct {
		flows []conntrack.Flow
		err   error
	}
	c, err := conntrack.Dial(&netlink.Config{NetNS: n.Fd()})
	if err != nil {
		return nil, fmt.Errorf("netlab: conntrack dial in %s: %w", ns, err)
	}
	done := make(chan result, 1)
	go func() {
		fl, err := c.Dump(nil)
		done <- result{fl, err}
	}()
	var res result
	select {
	case res = <-done:
		c.Close()
	case <-ctx.Done():
		c.Close() // unblocks Dump
		return nil, fmt.Errorf("netlab: conntrack dump in %s: %w", ns, ctx.Err())
	}
	if res.err != nil {
		return nil, fmt.Errorf("netlab: conntrack dump in %s: %w", ns, res.err)
	}
	ap := func(a netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(a, p) }
	out := make([]Flow, 0, len(res.flows))
	for _, f := range res.flows {
		o, r := f.TupleOrig, f.TupleReply
		out = append(out, Flow{
			Proto:    o.Proto.Protocol,
			OrigSrc:  ap(o.IP.SourceAddress, o.Proto.SourcePort),
			OrigDst:  ap(o.IP.DestinationAddress, o.Proto.DestinationPort),
			ReplySrc: ap(r.IP.SourceAddress, r.Proto.SourcePort),
			ReplyDst: ap(r.IP.DestinationAddress, r.Proto.DestinationPort),
			Mark:     f.Mark,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, nil
}

// FlowsWith returns the flows that have a as an address.
func FlowsWith(flows []Flow, a netip.Addr) []Flow {
	var out []Flow
	for _, f := range flows {
		if f.Has(a) {
			out = append(out, f)
		}
	}
	return out
}
