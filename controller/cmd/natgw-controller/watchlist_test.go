package main

import (
	"flag"
	"testing"

	clientfeatures "k8s.io/client-go/features"
)

// TestApplyWatchList: the flag sets client-go's WatchListClient gate (on by
// default, as client-go's), and an explicit environment variable is left in
// charge.
func TestApplyWatchList(t *testing.T) {
	f, err := parseFlags(flag.NewFlagSet("t", flag.ContinueOnError), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !f.watchList {
		t.Fatal("--watch-list-client defaults to false, want true (client-go's default: the list's memory streamed)")
	}
	noEnv := func(string) string { return "" }
	for _, on := range []bool{false, true, false} {
		got, err := applyWatchList(on, noEnv)
		if err != nil {
			t.Fatal(err)
		}
		if got != on || clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient) != on {
			t.Errorf("applyWatchList(%t) = %t, gate %t", on, got, clientfeatures.FeatureGates().Enabled(clientfeatures.WatchListClient))
		}
	}
	// With the variable set the gate is not touched (it stays off here).
	env := func(k string) string {
		if k == watchListEnv {
			return "false"
		}
		return ""
	}
	if got, err := applyWatchList(true, env); err != nil || got {
		t.Errorf("applyWatchList(true) with %s set = %t, %v; want the gate left off", watchListEnv, got, err)
	}
}
