package ha

import (
	"errors"
	"fmt"
	"os"
)

// RulesSyncedFile returns a Config.RulesReady that is ready once the file
// path exists: the mark the gateway's agent leaves after its first
// successful sync (`natgw serve --synced-file`, written where both of the
// pod's containers see it and gone with the pod). A replica that starts in
// a new pod therefore waits for the controller's sync before it may lead.
func RulesSyncedFile(path string) func() error {
	return func() error {
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
}
