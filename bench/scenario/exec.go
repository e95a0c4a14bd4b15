package scenario

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/natgw/natgw/nat/netns"
)

// run executes argv inside ns and returns its standard output. The child is
// forked from an OS thread switched into ns, so it inherits the namespace
// without a wrapper process (no `ip netns exec`, whose own cost would blur
// the per-exec figures). env adds environment variables; stdin may be nil.
func run(ctx context.Context, ns *netns.NS, stdin io.Reader, env []string, argv ...string) ([]byte, error) {
	out, _, err := runOutputs(ctx, ns, stdin, env, argv...)
	return out, err
}

// runOutputs is run returning standard error too.
func runOutputs(ctx context.Context, ns *netns.NS, stdin io.Reader, env []string, argv ...string) (stdout, stderr []byte, err error) {
	var out, errb bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, &out, &errb
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	if err := ns.Do(cmd.Run); err != nil {
		return out.Bytes(), errb.Bytes(), fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), errb.Bytes(), nil
}

// toolVersion returns the first line a tool prints for args (e.g.
// "--version"), or the error text.
func toolVersion(ctx context.Context, argv ...string) string {
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if err != nil && line == "" {
		return "unavailable: " + err.Error()
	}
	return line
}
