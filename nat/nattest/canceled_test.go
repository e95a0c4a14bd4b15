package nattest

import (
	"context"
	"testing"

	"github.com/natgw/natgw/nat"
)

// failures is a testing.TB that counts failures instead of failing.
type failures struct {
	testing.TB
	n int
}

func (f *failures) Helper()               {}
func (f *failures) Errorf(string, ...any) { f.n++ }

// TestCanceled: a call that returns context.Canceled passes, one that
// ignores the ended context (nil, or another error) fails the test, and
// each call gets an ended context and a namespace that does not exist.
func TestCanceled(t *testing.T) {
	f := &failures{TB: t}
	Canceled(f, map[string]func(context.Context, nat.Config) error{
		"honours": func(ctx context.Context, cfg nat.Config) error {
			if cfg.NetNS == "" {
				t.Error("no namespace given")
			}
			return ctx.Err()
		},
		"ignores": func(context.Context, nat.Config) error { return nil },
		"other":   func(context.Context, nat.Config) error { return context.DeadlineExceeded },
	})
	if f.n != 2 {
		t.Errorf("%d failures, want 2 (the calls that ignore the context)", f.n)
	}
}
