package imagebuild

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Entry is one entry of an image layer: a regular file (Data), a directory
// or a symbolic link (Link).
type Entry struct {
	Name, Link string
	Mode       int64
	Type       byte // tar.TypeReg, tar.TypeDir or tar.TypeSymlink
	Data       []byte
}

// LayerTar renders entries, in their order, as an uncompressed tar whose
// every entry is owned by root and dated Epoch (same entries, same bytes).
func LayerTar(entries []Entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Typeflag: e.Type, Name: e.Name, Linkname: e.Link, Mode: e.Mode, Size: int64(len(e.Data)),
			ModTime: Epoch, Format: tar.FormatUSTAR,
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("imagebuild: layer %s: %w", e.Name, err)
		}
		if _, err := tw.Write(e.Data); err != nil {
			return nil, fmt.Errorf("imagebuild: layer %s: %w", e.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("imagebuild: layer: %w", err)
	}
	return buf.Bytes(), nil
}

// Append adds the uncompressed layer tar raw to base as an OCI layer, with
// history dated Epoch.
func Append(base v1.Image, raw []byte, createdBy, comment string) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("imagebuild: layer: %w", err)
	}
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: Epoch}, CreatedBy: createdBy, Comment: comment},
	})
	if err != nil {
		return nil, fmt.Errorf("imagebuild: append layer: %w", err)
	}
	return img, nil
}

// OneLayer assembles a reproducible single-layer OCI image for linux/arch
// (default: the host's) from the uncompressed layer tar raw, with cfg as
// its configuration and Epoch as its creation time.
func OneLayer(raw []byte, createdBy, comment, arch string, cfg v1.Config) (v1.Image, error) {
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := Append(base, raw, createdBy, comment)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("imagebuild: config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = arch, "linux"
	if cf.Architecture == "" {
		cf.Architecture = runtime.GOARCH
	}
	cf.Created = v1.Time{Time: Epoch}
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("imagebuild: config: %w", err)
	}
	return img, nil
}
