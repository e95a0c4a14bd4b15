package imagebuild

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ArchiveName reads the image name an archive written by WriteArchive
// records (index.json's io.containerd.image.name annotation).
func ArchiveName(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return "", fmt.Errorf("%s: no index.json", path)
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		if h.Name != "index.json" {
			continue
		}
		var idx struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(tr).Decode(&idx); err != nil {
			return "", fmt.Errorf("%s: index.json: %w", path, err)
		}
		for _, m := range idx.Manifests {
			if n := m.Annotations["io.containerd.image.name"]; n != "" {
				return n, nil
			}
		}
		return "", fmt.Errorf("%s: index.json names no image", path)
	}
}

// ModuleDir finds natgw's module root (the directory of the go.mod that
// `go env GOMOD` names), where the image builds run `go build`.
func ModuleDir(ctx context.Context) (string, error) {
	b, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(b))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the natgw module")
	}
	return filepath.Dir(gomod), nil
}
