package netlab

import (
	"os/exec"
	"testing"
)

// TestRun: Run returns both streams and the exit status; a signal is -1
// without an error; a program that cannot start is an error.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		argv        []string
		out, errOut string
		code        int
		wantErr     bool
	}{
		{[]string{"sh", "-c", "echo out; echo err >&2"}, "out\n", "err\n", 0, false},
		{[]string{"sh", "-c", "echo no >&2; exit 3"}, "", "no\n", 3, false},
		{[]string{"sh", "-c", "kill -9 $$"}, "", "", -1, false},
		{[]string{"/nonexistent/natgw-netlab-test"}, "", "", -1, true},
	} {
		out, errOut, code, err := Run(exec.Command(tc.argv[0], tc.argv[1:]...))
		if out != tc.out || errOut != tc.errOut || code != tc.code || (err != nil) != tc.wantErr {
			t.Errorf("%q: %q, %q, %d, %v; want %q, %q, %d, error %v", tc.argv, out, errOut, code, err, tc.out, tc.errOut, tc.code, tc.wantErr)
		}
	}
}
