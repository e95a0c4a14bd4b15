package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSynced: `natgw synced` (a two-replica pod's readiness probe) fails
// naming the mark while it is missing, succeeds once `serve
// --synced-file` would have left it, and refuses an operand.
func TestSynced(t *testing.T) {
	mark := filepath.Join(t.TempDir(), "rules-synced")
	for _, tc := range []struct {
		what     string
		before   func() error
		args     []string
		wantCode int
		wantErr  string
	}{
		{what: "no mark", args: []string{"--file", mark}, wantCode: exitFail, wantErr: "no sync yet: " + mark + " does not exist"},
		{what: "mark left", before: func() error { return os.WriteFile(mark, []byte("synced\n"), 0o644) }, args: []string{"--file", mark}, wantCode: exitOK},
		{what: "an operand", args: []string{"--file", mark, "extra"}, wantCode: exitUsage, wantErr: "usage: natgw synced"},
	} {
		if tc.before != nil {
			if err := tc.before(); err != nil {
				t.Fatal(err)
			}
		}
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"natgw", "synced"}, tc.args...), strings.NewReader(""), &out, &errb)
		if code != tc.wantCode || (tc.wantErr != "" && !strings.Contains(errb.String(), tc.wantErr)) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d and %q", tc.what, code, errb.String(), tc.wantCode, tc.wantErr)
		}
	}
}
