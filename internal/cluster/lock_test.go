package cluster

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestLockFile: LockFDEnv takes only a descriptor of LockPath (no lock is
// taken here: another run may hold the cluster).
func TestLockFile(t *testing.T) {
	other, err := os.CreateTemp(t.TempDir(), "notlock")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var lockFD string
	if os.Geteuid() == 0 {
		f, err := os.OpenFile(LockPath, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fd, err := syscall.Dup(int(f.Fd())) // lockFile's *os.File owns (and closes) its own
		if err != nil {
			t.Fatal(err)
		}
		lockFD = strconv.Itoa(fd)
	}
	for _, tc := range []struct {
		name, env, err string
	}{
		{"not a number", "three", `NATGW_CLUSTER_LOCK_FD="three": want an inherited file descriptor number`},
		{"stdio", "1", `NATGW_CLUSTER_LOCK_FD="1": want an inherited file descriptor number`},
		{"closed", "999", "NATGW_CLUSTER_LOCK_FD=999: bad file descriptor"},
		{"another file", strconv.Itoa(int(other.Fd())), "not " + LockPath},
		{"the lock file", lockFD, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env == "" {
				t.Skip("needs root to open " + LockPath)
			}
			t.Setenv(LockFDEnv, tc.env)
			f, err := lockFile()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("lockFile() error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			var got, want syscall.Stat_t
			if err := syscall.Fstat(int(f.Fd()), &got); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Stat(LockPath, &want); err != nil {
				t.Fatal(err)
			}
			if got.Ino != want.Ino {
				t.Fatalf("lockFile() is inode %d, %s is %d", got.Ino, LockPath, want.Ino)
			}
		})
	}
}
