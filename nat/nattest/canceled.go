package nattest

import (
	"context"
	"errors"
	"testing"

	"github.com/natgw/natgw/nat"
)

// Canceled calls each of calls (by name) with an ended context and a
// config whose namespace does not exist, and fails t for each that does not
// return context.Canceled: a call that reaches netlink takes the caller's
// context and refuses an ended one before it opens a socket (no root
// needed).
func Canceled(t testing.TB, calls map[string]func(context.Context, nat.Config) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cfg := nat.Config{NetNS: "/nonexistent/natgw-test-ns"}
	for name, call := range calls {
		if err := call(ctx, cfg); !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a canceled context: %v, want context.Canceled", name, err)
		}
	}
}
