package agentapi

import (
	"errors"
	"fmt"
	"os"
)

// CheckSynced reports whether the sync mark at path (RulesSyncedFile, or
// another path given to `natgw serve --synced-file`) exists: nil once the
// agent has synced, else an error that says why not. It is the one reader
// of the mark: `natgw synced` (a two-replica pod's readiness probe) and
// `natgw ha`'s RulesReady (nat/ha.RulesSyncedFile) both call it.
func CheckSynced(path string) error {
	_, err := os.Stat(path)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("no sync yet: %s does not exist", path)
	default:
		return fmt.Errorf("sync mark %s: %w", path, err)
	}
}
