package cluster

import "testing"

// TestDropChainCounters: chain lines lose their counters, rules and other
// lines stay as they are.
func TestDropChainCounters(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [80:6160]\nCOMMIT", "*filter\n:INPUT ACCEPT\n:FORWARD ACCEPT\nCOMMIT"},
		{":KUBE-FIREWALL - [0:0]\n-A INPUT -j KUBE-FIREWALL", ":KUBE-FIREWALL -\n-A INPUT -j KUBE-FIREWALL"},
		{"-A FORWARD -m comment --comment \"x [1:2]\" -j ACCEPT", "-A FORWARD -m comment --comment \"x [1:2]\" -j ACCEPT"},
		{":INPUT ACCEPT", ":INPUT ACCEPT"},
		{"", ""},
	} {
		if got := dropChainCounters(tc.in); got != tc.want {
			t.Errorf("dropChainCounters(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
