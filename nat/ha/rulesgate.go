package ha

import (
	"sync/atomic"

	"github.com/natgw/natgw/agentapi"
)

// RulesSyncedFile returns a Config.RulesReady that is ready once the file
// path exists: the mark the gateway's agent leaves after its first
// successful sync (`natgw serve --synced-file`, written where both of the
// pod's containers see it and gone with the pod). A replica that starts in
// a new pod therefore waits for the controller's sync before it may lead.
// The mark is never removed within the pod's life, so once it has been
// seen the file is not looked at again: the replica calls RulesReady every
// heartbeat interval, and after the first sync that costs nothing.
func RulesSyncedFile(path string) func() error {
	var seen atomic.Bool
	return func() error {
		if seen.Load() {
			return nil
		}
		if err := agentapi.CheckSynced(path); err != nil {
			return err
		}
		seen.Store(true)
		return nil
	}
}
