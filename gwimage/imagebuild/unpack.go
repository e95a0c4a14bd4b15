package imagebuild

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Unpack extracts the root filesystem of the image in archive (as
// WriteArchive writes it) into dir, which must exist: directories, regular
// files and symbolic links, with their modes, as a container runtime would
// lay them out. Entries that would land outside dir are an error.
func Unpack(archive, dir string) error {
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		return fmt.Errorf("imagebuild: unpack %s: %w", archive, err)
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("imagebuild: unpack %s: %w", archive, err)
	}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return fmt.Errorf("imagebuild: unpack %s: layer %d: %w", archive, i, err)
		}
		err = untar(rc, dir)
		rc.Close()
		if err != nil {
			return fmt.Errorf("imagebuild: unpack %s: layer %d: %w", archive, i, err)
		}
	}
	return nil
}

func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("entry %q leaves the root", h.Name)
		}
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
			err = os.Chmod(p, os.FileMode(h.Mode).Perm()|modeBits(h.Mode))
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, os.FileMode(h.Mode).Perm()); err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			os.Remove(p)
			err = os.Symlink(h.Linkname, p)
		default:
			err = fmt.Errorf("entry %q: type %q not supported", h.Name, h.Typeflag)
		}
		if err != nil {
			return err
		}
	}
}

// modeBits carries the sticky, setuid and setgid bits of a tar mode.
func modeBits(m int64) os.FileMode {
	var out os.FileMode
	if m&0o1000 != 0 {
		out |= os.ModeSticky
	}
	if m&0o2000 != 0 {
		out |= os.ModeSetgid
	}
	if m&0o4000 != 0 {
		out |= os.ModeSetuid
	}
	return out
}
