package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
)

// Kernel is what a gateway namespace holds, read with the kernel's own
// tools (nft, iptables-legacy-save, ip addr), independently of natgw.
type Kernel struct {
	// Dump is `nft list table inet natgw` (nftables; "" when there is no
	// such table) or iptables-legacy-save (iptables).
	Dump string
	// Entries are the UID-tagged entries of the dump by owner UID: nft map
	// and set elements ("set: element") or iptables rules (whole lines).
	// Entries tagged with no UID where one is expected are under "".
	Entries map[string][]string
	// Addrs are the addresses on the external interface.
	Addrs []netip.Prefix
}

// Count is the number of UID-tagged entries.
func (k Kernel) Count() int {
	n := 0
	for _, e := range k.Entries {
		n += len(e)
	}
	return n
}

// UIDs returns the owner UIDs of the entries, sorted.
func (k Kernel) UIDs() []string {
	var out []string
	for u := range k.Entries {
		out = append(out, u)
	}
	sort.Strings(out)
	return out
}

// EIPAddrs returns the external interface's addresses other than the
// gateway's own (IPv4, and IPv6 of a dual-stack topology) and the
// kernel's IPv6 link-local one.
func (k Kernel) EIPAddrs() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range k.Addrs {
		if a := p.Addr(); a != netlab.GWExtAddr && a != netlab.GWExtAddr6 && !a.IsLinkLocalUnicast() {
			out = append(out, p)
		}
	}
	return out
}

var uidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// ReadKernel reads gateway g's kernel state for data plane dp.
func ReadKernel(ctx context.Context, g *Topology, dp string) (Kernel, error) {
	var k Kernel
	var err error
	switch dp {
	case "nftables":
		k.Dump, err = netlab.NftTable(ctx, g.GW, "inet", "natgw")
		if err != nil {
			// No table yet (or any more): nothing of ours.
			if strings.Contains(err.Error(), "No such file or directory") {
				k.Dump, err = "", nil
			} else {
				return k, err
			}
		}
		k.Entries = nftEntries(k.Dump)
	case "iptables":
		k.Dump, err = netlab.IptablesSave(ctx, g.GW, true)
		if err != nil {
			return k, err
		}
		k.Entries = iptablesEntries(k.Dump)
	default:
		return k, fmt.Errorf("unknown data plane %q", dp)
	}
	k.Addrs, err = netlab.Addrs(g.GW, g.ExternalInterface)
	if err != nil {
		return k, err
	}
	return k, nil
}

// nftEntries parses the elements of the sets and maps of an nft table
// listing. Elements of natgw_meta (the boot id) are not objects.
func nftEntries(dump string) map[string][]string {
	out := map[string][]string{}
	set := ""
	var elems strings.Builder
	inElems := false
	flush := func() {
		for _, e := range strings.Split(elems.String(), ",") {
			e = strings.Join(strings.Fields(e), " ")
			if e == "" || set == "natgw_meta" {
				continue
			}
			uid := uidRE.FindString(e)
			out[uid] = append(out[uid], set+": "+e)
		}
		elems.Reset()
	}
	for _, line := range strings.Split(dump, "\n") {
		l := strings.TrimSpace(line)
		if !inElems {
			if f := strings.Fields(l); len(f) == 3 && (f[0] == "set" || f[0] == "map") && f[2] == "{" {
				set = f[1]
				continue
			}
			rest, ok := strings.CutPrefix(l, "elements = {")
			if !ok {
				continue
			}
			inElems, l = true, rest
		}
		if body, ok := strings.CutSuffix(l, "}"); ok {
			elems.WriteString(body)
			inElems = false
			flush()
			continue
		}
		elems.WriteString(l + " ")
	}
	return out
}

// iptablesEntries returns the rules whose comment starts with a UID.
func iptablesEntries(dump string) map[string][]string {
	out := map[string][]string{}
	table := ""
	for _, line := range strings.Split(dump, "\n") {
		if strings.HasPrefix(line, "*") {
			table = line[1:]
			continue
		}
		if !strings.HasPrefix(line, "-A ") {
			continue
		}
		_, c, ok := strings.Cut(line, "--comment ")
		if !ok {
			continue
		}
		c = strings.TrimLeft(c, `"`)
		if uid := uidRE.FindString(c); uid != "" && strings.HasPrefix(c, uid) {
			out[uid] = append(out[uid], table+" "+line)
		}
	}
	return out
}

var bootRE = regexp.MustCompile(`boot=[0-9a-zA-Z]+`)

// EmptyNftTable reports whether an nft listing of table inet natgw is
// natgw's empty layout (nat/nftables/testdata/golden/empty.nft, boot id
// aside): nothing but the fixed sets, maps and chains.
func EmptyNftTable(dump string) error {
	b, err := os.ReadFile(filepath.Join(apitest.RepoRoot(), "nat", "nftables", "testdata", "golden", "empty.nft"))
	if err != nil {
		return err
	}
	norm := func(s string) string {
		return strings.Join(strings.Fields(bootRE.ReplaceAllString(s, "boot=BOOT")), " ")
	}
	if norm(dump) != norm(string(b)) {
		return fmt.Errorf("table inet natgw is not the empty layout:\n%s", dump)
	}
	return nil
}

// Foreign is what a gateway namespace holds that is not natgw's: the nft
// ruleset without table inet natgw, and iptables-legacy-save without natgw's
// chains and hook rules (counters dropped).
type Foreign struct {
	Nft      string
	Iptables string
}

// ReadForeign reads the foreign state of gateway g.
func ReadForeign(ctx context.Context, g *Topology) (Foreign, error) {
	nft, err := netlab.NftRuleset(ctx, g.GW)
	if err != nil {
		return Foreign{}, err
	}
	ipt, err := netlab.IptablesSave(ctx, g.GW, true)
	if err != nil {
		return Foreign{}, err
	}
	return Foreign{Nft: withoutNftTable(nft, "inet", "natgw"), Iptables: withoutNatgwChains(ipt)}, nil
}

// withoutNftTable removes one table's block from an nft ruleset listing.
func withoutNftTable(ruleset, family, name string) string {
	var b strings.Builder
	skip := false
	head := "table " + family + " " + name + " {"
	for _, line := range strings.SplitAfter(ruleset, "\n") {
		switch {
		case strings.TrimSpace(line) == head:
			skip = true
		case skip && strings.TrimRight(line, "\n") == "}":
			skip = false
		case !skip:
			b.WriteString(line)
		}
	}
	return b.String()
}

// withoutNatgwChains drops natgw's chains and rules (names NATGW_*) from
// an iptables-save listing, and the tables natgw alone made appear.
func withoutNatgwChains(save string) string {
	var tables []string
	var cur []string
	keep := func() {
		// A table with only its header, built-in chains and COMMIT
		// contributes nothing foreign if it holds no rule.
		rules := 0
		for _, l := range cur {
			if strings.HasPrefix(l, "-A ") {
				rules++
			}
		}
		if len(cur) > 0 && rules > 0 {
			tables = append(tables, strings.Join(cur, "\n"))
		}
		cur = nil
	}
	for _, line := range strings.Split(save, "\n") {
		if strings.Contains(line, "NATGW_") || line == "" {
			continue
		}
		if strings.HasPrefix(line, "*") {
			keep()
		}
		cur = append(cur, line)
	}
	keep()
	return strings.Join(tables, "\n")
}

// CLI runs the natgw CLI against gateway g's namespace with data plane dp
// (e.g. "apply", "-f", "-"), feeding stdin, and returns its output.
func CLI(ctx context.Context, bin Binaries, g *Topology, dp, stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	argv := append([]string{"--netns", g.GW, "--dataplane", dp,
		"--external-iface", g.ExternalInterface, "--internal-iface", g.InternalInterface}, args...)
	cmd := exec.CommandContext(ctx, bin.Natgw, argv...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("natgw %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// ApplyObjects applies objs to gateway g with the natgw CLI, behind the
// controller's back.
func ApplyObjects(ctx context.Context, bin Binaries, g *Topology, dp string, objs []nat.Object) error {
	b, err := json.Marshal(objs)
	if err != nil {
		return err
	}
	_, err = CLI(ctx, bin, g, dp, string(b), "apply", "-f", "-")
	return err
}
