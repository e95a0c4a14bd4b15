package main

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseFlags(t *testing.T) {
	cases := []struct {
		args    []string
		wantErr string
		check   func(*flags) bool
	}{
		{nil, "", func(f *flags) bool {
			return f.transport == "exec" && f.dataplane == "nftables" && f.leaderElect && f.workers == 4 && f.removeUpstream
		}},
		{[]string{"--transport=local", "--gateway-config=/x.yaml", "--dataplane=iptables", "--workers=8", "--leader-elect=false", "--sweep-period=1m"}, "", func(f *flags) bool {
			return f.transport == "local" && f.dataplane == "iptables" && f.workers == 8 && !f.leaderElect && f.sweepPeriod == time.Minute
		}},
		{[]string{"--transport=local"}, "--gateway-config", nil},
		{[]string{"--transport=ssh"}, "--transport", nil},
		{[]string{"--dataplane=ebpf"}, "--dataplane", nil},
		{[]string{"--workers=0"}, "--workers", nil},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			fs := flag.NewFlagSet("t", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			f, err := parseFlags(fs, tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(f) {
				t.Errorf("flags = %+v", f)
			}
		})
	}
}
