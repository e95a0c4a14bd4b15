package nattest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/natgw/natgw/internal/netlab"
)

// foreignNft is what "someone else" keeps in nftables on the gateway: an
// inet filter table with a set and counters, a table shaped like
// iptables-nft's nat table, and an ip nat table with a masquerade rule. None
// matches the suite's traffic (203.0.113.0/24 is nobody's address here).
const foreignNft = `table inet foreign {
	set blocked {
		type ipv4_addr
		elements = { 203.0.113.7, 203.0.113.8 }
	}
	chain c {
		type filter hook forward priority 0; policy accept;
		ip saddr @blocked counter drop
		counter
	}
}
table ip nat {
	chain PREROUTING {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr 203.0.113.99 tcp dport 9 counter dnat to 203.0.113.100
	}
	chain POSTROUTING {
		type nat hook postrouting priority srcnat; policy accept;
	}
}
table ip foreign_nat {
	chain post {
		type nat hook postrouting priority 110; policy accept;
		ip saddr 203.0.113.0/24 oifname "net1" counter masquerade
	}
}
`

// foreignIptables is someone else's iptables-legacy state, in the filter,
// nat and mangle tables, including rules in PREROUTING/POSTROUTING and a
// chain of its own.
const foreignIptables = `*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:FOREIGN-FWD - [0:0]
-A FORWARD -s 203.0.113.0/24 -j FOREIGN-FWD
-A FOREIGN-FWD -d 203.0.113.7/32 -j DROP
-A FOREIGN-FWD -j RETURN
-A INPUT -p tcp -s 203.0.113.0/24 --dport 22 -j ACCEPT
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:FOREIGN-DNAT - [0:0]
-A PREROUTING -d 203.0.113.99/32 -j FOREIGN-DNAT
-A FOREIGN-DNAT -p tcp --dport 80 -j DNAT --to-destination 203.0.113.100:8080
-A POSTROUTING -s 203.0.113.0/24 -o net1 -j MASQUERADE
COMMIT
*mangle
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
-A PREROUTING -s 203.0.113.0/24 -j MARK --set-xmark 0x77/0xff
COMMIT
`

// xtablesWait bounds the wait for the host-wide xtables lock.
const xtablesWait = 60 * time.Second

// installForeign puts the foreign nft tables and iptables-legacy rules in ns.
func installForeign(ctx context.Context, ns string) error {
	if _, err := netlab.Exec(ctx, ns, foreignNft, "nft", "-f", "-"); err != nil {
		return fmt.Errorf("install foreign nft tables: %w", err)
	}
	// The xtables lock is host-wide: wait for other runs' restores.
	ctx, cancel := context.WithTimeout(ctx, xtablesWait+10*time.Second)
	defer cancel()
	if _, err := netlab.Exec(ctx, ns, foreignIptables, "iptables-legacy-restore", "-w", strconv.Itoa(int(xtablesWait/time.Second))); err != nil {
		return fmt.Errorf("install foreign iptables-legacy rules: %w", err)
	}
	return nil
}

// foreignState is a snapshot of the nft tables and iptables-legacy rules of
// a namespace.
type foreignState struct {
	nft      map[string]string   // "family name" -> stateless listing
	ipt      map[string][]string // table -> lines (after the "*table" header, without COMMIT)
	iptOrder []string
}

func parseForeign(nft, ipt string) foreignState {
	st := foreignState{nft: splitNftTables(nft)}
	st.ipt, st.iptOrder = splitIptables(ipt)
	return st
}

// splitNftTables splits an nft listing into its tables, keyed "family name".
func splitNftTables(s string) map[string]string {
	out := map[string]string{}
	var key string
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		if rest, ok := strings.CutPrefix(line, "table "); ok {
			key = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "{"))
			b.Reset()
		}
		if key == "" {
			continue
		}
		b.WriteString(line)
		if strings.TrimRight(line, "\n") == "}" {
			out[key] = b.String()
			key = ""
		}
	}
	return out
}

// splitIptables splits iptables-save output into tables.
func splitIptables(s string) (map[string][]string, []string) {
	out := map[string][]string{}
	var order []string
	var table string
	for _, line := range strings.Split(s, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			table = line[1:]
			order = append(order, table)
			out[table] = nil
		case line == "COMMIT" || line == "":
		default:
			out[table] = append(out[table], line)
		}
	}
	return out, order
}

// iptChains returns the chains declared in lines.
func iptChains(lines []string) map[string]bool {
	out := map[string]bool{}
	for _, l := range lines {
		if rest, ok := strings.CutPrefix(l, ":"); ok {
			name, _, _ := strings.Cut(rest, " ")
			out[name] = true
		}
	}
	return out
}

// refsNewChain reports whether an iptables-save line declares, appends to
// or jumps to a chain not in known.
func refsNewChain(line string, known map[string]bool) bool {
	f := strings.Fields(line)
	for i, w := range f {
		switch {
		case i == 0 && strings.HasPrefix(w, ":"):
			return !known[w[1:]]
		case (w == "-A" || w == "-I") && i+1 < len(f):
			if !known[f[i+1]] {
				return true
			}
		case (w == "-j" || w == "-g") && i+1 < len(f):
			if !known[f[i+1]] && isChainTarget(f[i+1]) {
				return true
			}
		}
	}
	return false
}

// isChainTarget tells user chains from built-in targets (ACCEPT, DNAT, ...).
func isChainTarget(name string) bool {
	switch name {
	case "ACCEPT", "DROP", "RETURN", "REJECT", "DNAT", "SNAT", "MASQUERADE", "MARK", "CONNMARK",
		"LOG", "NOTRACK", "CT", "REDIRECT", "NETMAP", "TCPMSS", "CLASSIFY", "TRACE", "QUEUE", "NFQUEUE":
		return false
	}
	return true
}

// check verifies that the foreign nft tables and iptables-legacy rules are
// as they were before the backend was opened, and that the backend added
// only what it owns (see Options).
func (e *env) check(op string) {
	e.t.Helper()
	snap := e.snapshot()
	now := parseForeign(snap.nft, snap.ipt)
	for key, want := range e.base.nft {
		if got, ok := now.nft[key]; !ok {
			e.t.Errorf("isolation: after %s: foreign nft table %q is gone", op, key)
		} else if got != want {
			e.t.Errorf("isolation: after %s: foreign nft table %q changed:\n%s", op, key, lineDiff(want, got))
		}
	}
	name := e.name
	ownNft := e.s.opts.OwnNftTable
	if ownNft == nil {
		ownNft = func(string) bool { return name == "nftables" }
	}
	for key := range now.nft {
		if _, ok := e.base.nft[key]; !ok && !ownNft(key) {
			e.t.Errorf("isolation: after %s: the %s data plane created nft table %q", op, name, key)
		}
	}
	for _, table := range now.iptOrder {
		base := e.base.ipt[table]
		known := iptChains(base)
		own := e.s.opts.OwnIptablesLine
		if own == nil {
			own = func(line string) bool { return name == "iptables" && refsNewChain(line, known) }
		}
		var rest []string
		for _, l := range now.ipt[table] {
			if !own(l) {
				rest = append(rest, l)
			}
		}
		if !slices.Equal(rest, base) {
			e.t.Errorf("isolation: after %s: iptables-legacy table %s changed outside the %s data plane's own chains:\n%s",
				op, table, name, lineDiff(strings.Join(base, "\n"), strings.Join(rest, "\n")))
		}
	}
	for _, table := range e.base.iptOrder {
		if _, ok := now.ipt[table]; !ok {
			e.t.Errorf("isolation: after %s: iptables-legacy table %s is gone", op, table)
		}
	}
}
