package cluster

import (
	"reflect"
	"strings"
	"testing"
)

func TestSplitRule(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"-A INPUT -j KUBE-FIREWALL", []string{"-A", "INPUT", "-j", "KUBE-FIREWALL"}},
		{`-A CNI-x -d 10.0.0.0/24 -m comment --comment "name: \"natgw\" id: \"abc\"" -j ACCEPT`,
			[]string{"-A", "CNI-x", "-d", "10.0.0.0/24", "-m", "comment", "--comment", `name: "natgw" id: "abc"`, "-j", "ACCEPT"}},
		{`-A X -m comment --comment ""`, []string{"-A", "X", "-m", "comment", "--comment", ""}},
		{"", nil},
	} {
		if got := splitRule(tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("splitRule(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestIPTablesUndo(t *testing.T) {
	before := strings.Join([]string{
		"*filter", ":INPUT ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]", ":MINE - [0:0]",
		"-A INPUT -j MINE", "-A MINE -j ACCEPT", "COMMIT",
	}, "\n")
	for _, tc := range []struct {
		name, after string
		want        []string
	}{
		{"unchanged", before, nil},
		{"kubelet firewall and a new nat table", strings.Join([]string{
			"*filter", ":INPUT ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]", ":KUBE-FIREWALL - [0:0]", ":MINE - [0:0]",
			"-A INPUT -j KUBE-FIREWALL", "-A INPUT -j MINE", "-A OUTPUT -j KUBE-FIREWALL",
			"-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -j DROP",
			"-A MINE -j ACCEPT", "COMMIT",
			"*nat", ":POSTROUTING ACCEPT [0:0]", ":CNI-1 - [0:0]",
			"-A POSTROUTING -s 10.244.77.2/32 -j CNI-1", "-A CNI-1 -j MASQUERADE", "COMMIT",
		}, "\n"), []string{
			"-t filter -D INPUT -j KUBE-FIREWALL",
			"-t filter -D OUTPUT -j KUBE-FIREWALL",
			"-t nat -D POSTROUTING -s 10.244.77.2/32 -j CNI-1",
			"-t filter -F KUBE-FIREWALL",
			"-t nat -F CNI-1",
			"-t filter -X KUBE-FIREWALL",
			"-t nat -X CNI-1",
		}},
		{"a duplicate of an existing rule", strings.Join([]string{
			"*filter", ":INPUT ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]", ":MINE - [0:0]",
			"-A INPUT -j MINE", "-A INPUT -j MINE", "-A MINE -j ACCEPT", "COMMIT",
		}, "\n"), []string{"-t filter -D INPUT -j MINE"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, args := range iptablesUndo(before, tc.after) {
				got = append(got, strings.Join(args, " "))
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("undo:\n got  %q\n want %q", got, tc.want)
			}
		})
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		"/var/lib/x":          "/var/lib/x",
		`/a\040b`:             "/a b",
		`/tab\011end\134x`:    "/tab\tend\\x",
		`/trailing\04`:        `/trailing\04`,
		`/var/lib/natgw\040c`: "/var/lib/natgw c",
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}
