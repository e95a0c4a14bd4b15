package main

import (
	"context"
	"fmt"

	"github.com/natgw/natgw/agentapi"
)

// cmdSynced is `natgw synced [--file PATH]`: exit 0 when the agent's sync
// mark exists (the rule of `natgw ha --rules-synced-file`,
// agentapi.CheckSynced), else 1 with the reason on stderr. A two-replica
// gateway's pod runs it as its gateway container's readiness probe
// (controller/provision), so that the StatefulSet creates pod -1 only once
// pod -0 has been synced (OrderedReady) and a rolling update deletes the
// next pod only once the new one has been synced.
func cmdSynced(ctx context.Context, e env, g *globals, args []string) int {
	fs := subFlags("synced", e, g, "synced [--file PATH]")
	file := fs.String("file", agentapi.RulesSyncedFile, "the sync mark `natgw serve --synced-file` leaves")
	if code, ok := noArgs(fs, args); !ok {
		return code
	}
	if err := agentapi.CheckSynced(*file); err != nil {
		fmt.Fprintf(e.stderr, "natgw synced: %v\n", err)
		return exitFail
	}
	return exitOK
}
