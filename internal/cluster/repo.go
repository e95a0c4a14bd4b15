package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// RepoRoot finds the natgw checkout at or above the working directory (the
// directory of natgw's go.mod), where the tests find the built images and
// the cache of built binaries.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/natgw/natgw\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("natgw's go.mod not found above the working directory")
		}
		dir = parent
	}
}
