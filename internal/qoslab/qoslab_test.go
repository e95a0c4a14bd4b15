package qoslab

import (
	"strings"
	"testing"
)

// TestParseSNMP: OutSegs and RetransSegs are read from the Tcp lines
// (other counters may be negative: MaxConn is -1); a file without them,
// or with a malformed value of one of them, is an error naming it.
func TestParseSNMP(t *testing.T) {
	const good = "Ip: Forwarding DefaultTTL\nIp: 1 64\n" +
		"Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n" +
		"Tcp: 1 200 120000 -1 10 5 0 0 2 5000 %s %s 0 1 0\n"
	for _, tc := range []struct {
		name, snmp string
		want       TCPCounters
		wantErr    string
	}{
		{"counters", strings.ReplaceAll(strings.Replace(good, "%s", "4000", 1), "%s", "12"), TCPCounters{Out: 4000, Retrans: 12}, ""},
		{"malformed OutSegs", strings.ReplaceAll(strings.Replace(good, "%s", "x1", 1), "%s", "12"), TCPCounters{}, `OutSegs "x1"`},
		{"no Tcp lines", "Ip: Forwarding\nIp: 1\n", TCPCounters{}, "no Tcp OutSegs and RetransSegs"},
		{"names without values", "Tcp: OutSegs RetransSegs\n", TCPCounters{}, "no Tcp OutSegs and RetransSegs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSNMP("ns1", tc.snmp)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "ns1") {
					t.Fatalf("error %v, want one naming ns1 and %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseSNMP = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestRunTCPOptions: a run without flows or with an empty window is
// refused before any socket is opened.
func TestRunTCPOptions(t *testing.T) {
	tp := &Topo{}
	for _, o := range []TCPOptions{{Flows: 0, Dur: 1}, {Flows: 1, Warm: 2, Dur: 1}} {
		if _, err := tp.RunTCP(t.Context(), o); err == nil || !strings.Contains(err.Error(), "want flows") {
			t.Errorf("RunTCP(%+v): %v, want the options refused", o, err)
		}
	}
}
