package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestHAFlags: `natgw ha` refuses bad flags with the flag and the value
// named, before opening the namespace.
func TestHAFlags(t *testing.T) {
	base := []string{"--local", "10.0.0.2:7400", "--peer", "10.0.0.3:7400", "--eip", "192.0.2.10/24", "--fence-file", "/tmp/x"}
	for _, c := range []struct {
		what string
		args []string
		want string
	}{
		{"bad local", []string{"--local", "10.0.0.2", "--peer", "10.0.0.3:7400", "--eip", "192.0.2.10/24", "--fence-file", "/x"}, `--local "10.0.0.2"`},
		{"bad peer", []string{"--local", "10.0.0.2:7400", "--peer", "nope", "--eip", "192.0.2.10/24", "--fence-file", "/x"}, `--peer "nope"`},
		{"bad eip", append(append([]string{}, base...), "--eip", "192.0.2.300/24"), `"192.0.2.300/24"`},
		{"two fences", append(append([]string{}, base...), "--fence-socket", "/s"), "give one"},
		{"no fence", []string{"--local", "10.0.0.2:7400", "--peer", "10.0.0.3:7400", "--eip", "192.0.2.10/24"}, "no fence"},
		{"no address", []string{"--local", "10.0.0.2:7400", "--peer", "10.0.0.3:7400", "--fence-file", "/x"}, "no floating address"},
		{"bad misses", append(append([]string{}, base...), "--misses", "-1"), "misses -1"},
		{"bad interval", append(append([]string{}, base...), "--interval", "5s"), "interval 5s"},
	} {
		var out, errb bytes.Buffer
		// A namespace that does not exist: should a case pass the
		// checks, it fails opening it instead of touching this host.
		argv := append([]string{"natgw", "--netns", "/nonexistent/natgw-ha-test", "ha"}, c.args...)
		code := run(context.Background(), argv, strings.NewReader(""), &out, &errb)
		if code == exitOK || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%s: exit %d, stderr %q; want a failure naming %q", c.what, code, errb.String(), c.want)
		}
	}
}
