package images

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The same binary gives the same image; the config runs the binary as the
// spec's user with no shell.
func TestImage(t *testing.T) {
	for _, s := range []Spec{Controller("/m", "0.1.0"), Pause("/m")} {
		t.Run(s.Binary, func(t *testing.T) {
			a, err := Image(s, []byte("binary"))
			if err != nil {
				t.Fatal(err)
			}
			b, err := Image(s, []byte("binary"))
			if err != nil {
				t.Fatal(err)
			}
			da, _ := a.Digest()
			db, _ := b.Digest()
			if da != db {
				t.Errorf("two builds of the same bytes: %s != %s", da, db)
			}
			other, _ := Image(s, []byte("other"))
			if do, _ := other.Digest(); do == da {
				t.Error("a different binary gives the same digest")
			}
			cf, err := a.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if got := cf.Config.Entrypoint; len(got) != 1 || got[0] != "/"+s.Binary {
				t.Errorf("entrypoint %q, want [/%s]", got, s.Binary)
			}
			if cf.Config.User != s.User {
				t.Errorf("user %q, want %q", cf.Config.User, s.User)
			}
			if !strings.HasPrefix(s.Name, "docker.io/natgw/") {
				t.Errorf("name %q is not fully qualified", s.Name)
			}
		})
	}
}

// Build is reproducible end to end: two archives of the pause image have
// the same digest and bytes.
func TestBuildReproducible(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatal("go not on PATH")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	mod, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var sums []string
	for i, out := range []string{filepath.Join(dir, "a.tar"), filepath.Join(dir, "b.tar")} {
		res, err := Build(ctx, Pause(mod), out)
		if err != nil {
			t.Fatalf("build %d: %v", i, err)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(b)) != res.ArchiveSize {
			t.Errorf("archive %d bytes, result says %d", len(b), res.ArchiveSize)
		}
		sums = append(sums, res.Digest.String())
		if i == 1 {
			a, _ := os.ReadFile(filepath.Join(dir, "a.tar"))
			if string(a) != string(b) {
				t.Error("two builds wrote different archives")
			}
		}
	}
	if sums[0] != sums[1] {
		t.Errorf("digests differ: %v", sums)
	}
}
