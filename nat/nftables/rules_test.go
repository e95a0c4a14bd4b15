package nftables

import (
	"strings"
	"testing"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/nftconn"
)

// TestLoadKeepsRules (root): a Load that finds nothing committed since
// natgw's last transaction (the mirror condition) and, in natgw_meta, the
// fingerprint of the fixed rules its own configuration renders leaves the
// fixed chains' rules alone: its repair transaction adds no rule but
// snat_cidr's (a rule added to a map's chain costs the kernel a walk of
// the map). Every other start rewrites them: after a hand flush of a chain
// (which comes back), when the stored fingerprint is another one (another
// configuration or natgw version) or absent (an older natgw). The table
// ends as it was every time.
func TestLoadKeepsRules(t *testing.T) {
	cfg := gateway(t)
	dp := open(t, cfg)
	if err := dp.Apply(ctxT(t), goldenObjects()...); err != nil {
		t.Fatal(err)
	}
	want := sortedBlocks(table(t, cfg.NetNS))
	dp.Close() // settles: the stamp stores the fingerprint
	own, err := rulesPrint(cfg.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	fixed, fixedNames := 0, map[string]bool{}
	for _, cs := range fixedChains(cfg.WithDefaults()) {
		if cs.name != chainSNATCIDR {
			fixed += len(cs.rules)
			fixedNames[cs.name] = true
		}
	}
	// load runs Load on a new Backend whose fingerprint is rules (as a
	// natgw of another configuration or version would have; 0: an older
	// natgw, which stores none), then closes it (Close settles, storing
	// that fingerprint), and returns how many rules Load's transaction
	// added to the fixed chains other than snat_cidr (the policers' chains
	// are rewritten always).
	load := func(what string, rules uint64) int {
		t.Helper()
		r, err := NewBackend(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r.rules = rules
		added := 0
		r.traceForTest = func(tx *nftconn.Tx) {
			for l := range strings.Lines(tx.String()) {
				f := strings.Fields(l)
				if len(f) > 4 && strings.Join(f[:4], " ") == "add rule inet natgw" && fixedNames[f[4]] {
					added++
				}
			}
		}
		if _, _, err := r.Load(ctxT(t)); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		r.traceForTest = nil
		if err := r.Close(); err != nil {
			t.Fatalf("%s: close: %v", what, err)
		}
		if got := sortedBlocks(table(t, cfg.NetNS)); got != want {
			t.Errorf("%s: table\n%s\nwant\n%s", what, got, want)
		}
		return added
	}
	for _, step := range []struct {
		what  string
		hand  string // an nft script run before the Load
		rules uint64
		want  int // rules added to the fixed chains but snat_cidr
	}{
		{"start after a clean stop", "", own, 0},
		{"start after a start", "", own, 0},
		{"start after a hand flush of dstnat", "flush chain inet natgw dstnat\n", own, fixed},
		{"start of another configuration", "", own ^ 1, fixed},
		{"start after another configuration", "", own, fixed},
		{"start of an older natgw (no fingerprint)", "", 0, fixed},
		{"start after an older natgw", "", own, fixed},
		{"start after that", "", own, 0},
		{"start after another table's commit", "add table ip foreign\ndelete table ip foreign\n", own, fixed},
	} {
		if step.hand != "" {
			nftExec(t, cfg.NetNS, step.hand)
		}
		if got := load(step.what, step.rules); got != step.want {
			t.Errorf("%s: Load added %d rules to the fixed chains but %s, want %d", step.what, got, chainSNATCIDR, step.want)
		}
	}
}

// TestRulesPrints: every precomputed fingerprint equals rulesPrint of its
// interfaces (a change to the fixed rules fails here with the value to
// store), rulesPrintOf uses them and computes any other configuration's.
func TestRulesPrints(t *testing.T) {
	if !littleEndian {
		t.Skip("rulesPrints holds little-endian hosts' fingerprints; this host is big endian")
	}
	for ifs, stored := range rulesPrints {
		cfg := nat.Config{ExternalInterface: ifs[0], InternalInterface: ifs[1]}
		got, err := rulesPrint(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got != stored {
			t.Errorf("rulesPrints[%q] = %#016x, but rulesPrint renders %#016x: store the new value", ifs, stored, got)
		}
	}
	for _, tc := range []struct {
		name    string
		ext, in string
		precomp bool
	}{
		{"Kube-OVN's interfaces", nat.DefaultExternalInterface, nat.DefaultInternalInterface, true},
		{"another external interface", "net2", nat.DefaultInternalInterface, false},
		{"another internal interface", nat.DefaultExternalInterface, "eth1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := nat.Config{ExternalInterface: tc.ext, InternalInterface: tc.in}
			want, err := rulesPrint(cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := rulesPrintOf(cfg)
			if err != nil || got != want {
				t.Errorf("rulesPrintOf = %#016x, %v; want %#016x", got, err, want)
			}
			if _, ok := rulesPrints[[2]string{tc.ext, tc.in}]; ok != tc.precomp {
				t.Errorf("precomputed: %v, want %v", ok, tc.precomp)
			}
		})
	}
	a, _ := rulesPrint(nat.Config{ExternalInterface: "net1", InternalInterface: "eth0"})
	b, _ := rulesPrint(nat.Config{ExternalInterface: "net2", InternalInterface: "eth0"})
	if a == b {
		t.Errorf("rulesPrint does not depend on the external interface: %#016x for both", a)
	}
}
