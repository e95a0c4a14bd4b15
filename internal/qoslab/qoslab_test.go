package qoslab

import (
	"math"
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

// TestAboveRate: a timeline that passes a burst at once and then holds a
// steady rate gives the burst back as the bytes above the rate, and when
// a mark was first reached; too short a timeline or a mark never reached
// gives NaN.
func TestAboveRate(t *testing.T) {
	// 1 MB within the first 10 ms, then 1 MB/s, sampled every 10 ms for 2 s.
	var steady TCPRun
	for i := 1; i <= 200; i++ {
		s := float64(i) / 100
		b := 1e6 + 1e6*s
		if i == 1 {
			b = 0.5e6
		}
		steady.Timeline = append(steady.Timeline, [2]float64{s, b})
	}
	for _, tc := range []struct {
		name           string
		r              TCPRun
		mark           float64
		wantEx, wantAt float64
		exNaN, atNaN   bool
	}{
		{name: "burst then rate", r: steady, mark: 1e6, wantEx: 1e6, wantAt: 0.02},
		{name: "mark never reached", r: steady, mark: 1e9, wantEx: 1e6, atNaN: true},
		{name: "too short", r: TCPRun{Timeline: steady.Timeline[:3]}, mark: 1, exNaN: true, atNaN: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex, at := tc.r.AboveRate(tc.mark)
			if tc.exNaN != math.IsNaN(ex) || (!tc.exNaN && math.Abs(ex-tc.wantEx) > 1) {
				t.Errorf("excess %v, want %v (NaN %v)", ex, tc.wantEx, tc.exNaN)
			}
			if tc.atNaN != math.IsNaN(at) || (!tc.atNaN && math.Abs(at-tc.wantAt) > 1e-9) {
				t.Errorf("mark at %v, want %v (NaN %v)", at, tc.wantAt, tc.atNaN)
			}
		})
	}
}
