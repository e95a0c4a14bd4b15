// Package testlog is a logr.Logger that writes to a test's log while the
// test runs and to standard error after it ended. Components a test starts
// (a controller manager, an agent's log forwarder, a registry stopping on
// context cancellation) may log after the test function returned; writing
// those lines to the finished test panics ("Log in goroutine after Test...
// has completed") and races with the testing package. testr alone has that
// problem.
package testlog

import (
	"fmt"
	"io"
	"os"
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
)

// late receives the lines logged after a test ended.
var late io.Writer = os.Stderr

// New returns a logger for t at verbosity v. Lines logged after t's
// cleanups started go to standard error, prefixed with t's name.
func New(t testing.TB, v int) logr.Logger {
	g := &guard{name: t.Name()}
	t.Cleanup(g.end)
	return logr.New(&sink{g: g, inner: testr.NewWithInterface(t, testr.Options{Verbosity: v}).GetSink(), v: v})
}

// guard is shared by a logger and every logger derived from it.
type guard struct {
	mu    sync.RWMutex
	ended bool
	name  string
}

func (g *guard) end() {
	g.mu.Lock()
	g.ended = true
	g.mu.Unlock()
}

// sink forwards to inner while the test runs; afterwards it prints to
// standard error.
type sink struct {
	g      *guard
	inner  logr.LogSink
	v      int
	names  string
	values []any
}

func (s *sink) Init(info logr.RuntimeInfo) { s.inner.Init(info) }

func (s *sink) Enabled(level int) bool { return level <= s.v }

func (s *sink) Info(level int, msg string, kv ...any) {
	s.log(func() { s.inner.Info(level, msg, kv...) }, "info", msg, nil, kv)
}

func (s *sink) Error(err error, msg string, kv ...any) {
	s.log(func() { s.inner.Error(err, msg, kv...) }, "error", msg, err, kv)
}

// log runs toTest while the test runs (under the guard's read lock, so
// that the test cannot end halfway), else writes the line to late.
func (s *sink) log(toTest func(), level, msg string, err error, kv []any) {
	s.g.mu.RLock()
	defer s.g.mu.RUnlock()
	if !s.g.ended {
		toTest()
		return
	}
	s.afterEnd(level, msg, err, kv)
}

func (s *sink) afterEnd(level, msg string, err error, kv []any) {
	line := fmt.Sprintf("%s (ended) %s%s: %s", s.g.name, s.names, level, msg)
	if err != nil {
		line += fmt.Sprintf(" error=%q", err)
	}
	for _, a := range append(append([]any{}, s.values...), kv...) {
		line += fmt.Sprintf(" %v", a)
	}
	fmt.Fprintln(late, line)
}

func (s *sink) WithValues(kv ...any) logr.LogSink {
	c := *s
	c.inner = s.inner.WithValues(kv...)
	c.values = append(append([]any{}, s.values...), kv...)
	return &c
}

func (s *sink) WithName(name string) logr.LogSink {
	c := *s
	c.inner = s.inner.WithName(name)
	c.names += name + " "
	return &c
}
