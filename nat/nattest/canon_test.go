package nattest

import (
	"strings"
	"testing"

	"github.com/natgw/natgw/nat"
)

func TestCanonical(t *testing.T) {
	a := "# nft -s list ruleset\ntable ip natgw {\n\tmap snat_p24 {\n\t\ttype ipv4_addr : ipv4_addr\n\t\telements = { 198.51.100.0 comment \"u1\" : 192.0.2.12,\n\t\t\t     10.0.0.0 comment \"u2\" : 192.0.2.13 }\n\t}\n\n\tmap snat_p32 {\n\t\ttype ipv4_addr : ipv4_addr\n\t}\n\n\tchain c {\n\t\trule 1\n\t\trule 2\n\t}\n}\n# iptables-legacy-save\n-A X\n# addresses of net1\n192.0.2.254/24\n192.0.2.10/24\n# routes\n"
	b := "# nft -s list ruleset\ntable ip natgw {\n\tmap snat_p32 {\n\t\ttype ipv4_addr : ipv4_addr\n\t}\n\n\tchain c {\n\t\trule 1\n\t\trule 2\n\t}\n\n\tmap snat_p24 {\n\t\ttype ipv4_addr : ipv4_addr\n\t\telements = { 10.0.0.0 comment \"u2\" : 192.0.2.13, 198.51.100.0 comment \"u1\" : 192.0.2.12 }\n\t}\n}\n# iptables-legacy-save\n-A X\n# addresses of net1\n192.0.2.10/24\n192.0.2.254/24\n# routes\n"
	if canonical(a) != canonical(b) {
		t.Errorf("same content, different order:\n%s\n---\n%s", canonical(a), canonical(b))
	}
	for name, c := range map[string]string{
		"rule order":     strings.Replace(b, "rule 1\n\t\trule 2", "rule 2\n\t\trule 1", 1),
		"element":        strings.Replace(b, "192.0.2.13", "192.0.2.14", 1),
		"iptables order": strings.Replace(b, "-A X\n", "-A X\n-A Y\n", 1),
		"address":        strings.Replace(b, "192.0.2.10/24", "192.0.2.11/24", 1),
		"table":          strings.Replace(b, "table ip natgw", "table inet natgw", 1),
	} {
		if canonical(a) == canonical(c) {
			t.Errorf("%s: a difference vanished in canonical form:\n%s", name, canonical(c))
		}
	}
}

func TestRefsNewChain(t *testing.T) {
	known := map[string]bool{"PREROUTING": true, "POSTROUTING": true, "FOREIGN": true}
	for line, want := range map[string]bool{
		":NATGW_DNAT - [0:0]":           true,
		":PREROUTING ACCEPT":            false,
		"-A PREROUTING -j NATGW_DNAT":   true,
		"-I PREROUTING 1 -j NATGW_DNAT": true,
		"-A NATGW_DNAT -d 192.0.2.10/32 -j DNAT --to-destination 1.2.3.4": true,
		"-A PREROUTING -j FOREIGN":                                        false,
		"-A POSTROUTING -s 10.0.0.0/8 -j MASQUERADE":                      false,
		"-A POSTROUTING -s 10.0.0.0/8 -g NATGW_SNAT":                      true,
	} {
		if got := refsNewChain(line, known); got != want {
			t.Errorf("refsNewChain(%q) = %v, want %v", line, got, want)
		}
	}
}

func TestSplitNftTables(t *testing.T) {
	got := splitNftTables(foreignNft)
	if len(got) != 3 || !strings.Contains(got["inet foreign"], "set blocked") || !strings.HasPrefix(got["ip nat"], "table ip nat {") {
		t.Errorf("splitNftTables: %q", got)
	}
}

func TestObjectsDiff(t *testing.T) {
	a := FIP("a", addr("192.0.2.10"), addr("198.51.100.10"))
	b := FIP("b", addr("192.0.2.11"), addr("198.51.100.11"))
	b2 := FIP("b", addr("192.0.2.11"), addr("198.51.100.12"))
	got := objectsDiff([]nat.Object{a, b}, []nat.Object{a, b2})
	if !strings.Contains(got, "- "+b.String()) || !strings.Contains(got, "+ "+b2.String()) || strings.Contains(got, a.String()) {
		t.Errorf("objectsDiff:\n%s", got)
	}
}

func TestDescribe(t *testing.T) {
	objs := sample()
	if got := describe(objs[:2]); got != "["+objs[0].String()+", "+objs[1].String()+"]" {
		t.Errorf("describe of 2: %s", got)
	}
	if got := describe(objs); !strings.HasSuffix(got, "... 11 objects in all]") || strings.Contains(got, objs[3].String()) {
		t.Errorf("describe of 11: %s", got)
	}
	if got := describe(nil); got != "[]" {
		t.Errorf("describe of none: %s", got)
	}
}
