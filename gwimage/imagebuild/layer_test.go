package imagebuild

import (
	"archive/tar"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// TestOneLayerArchiveName: a one-layer image from LayerTar, written by
// WriteArchive, names itself in the archive (ArchiveName), and the same
// entries give the same digest.
func TestOneLayerArchiveName(t *testing.T) {
	build := func() v1.Image {
		raw, err := LayerTar([]Entry{
			{Type: tar.TypeDir, Name: "tmp/", Mode: 0o1777},
			{Type: tar.TypeReg, Name: "hello", Mode: 0o755, Data: []byte("hi\n")},
			{Type: tar.TypeSymlink, Name: "bin/sh", Link: "/hello", Mode: 0o777},
		})
		if err != nil {
			t.Fatal(err)
		}
		img, err := OneLayer(raw, "test", "comment", "", v1.Config{Entrypoint: []string{"/hello"}})
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	a, b := build(), build()
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Errorf("digests differ: %s vs %s", da, db)
	}
	for _, tc := range []struct{ name, want string }{
		{"docker.io/natgw/test:1", "docker.io/natgw/test:1"},
		{"natgw/other:2", "natgw/other:2"},
	} {
		out := filepath.Join(t.TempDir(), "img.tar")
		if _, err := WriteArchive(a, tc.name, out); err != nil {
			t.Fatal(err)
		}
		got, err := ArchiveName(out)
		if err != nil {
			t.Fatal(err)
		}
		if got != tc.want {
			t.Errorf("ArchiveName = %q, want %q", got, tc.want)
		}
	}
	if _, err := ArchiveName(filepath.Join(t.TempDir(), "missing.tar")); err == nil {
		t.Error("ArchiveName of a missing file succeeded")
	}
}
