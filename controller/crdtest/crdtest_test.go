package crdtest

import (
	"context"
	"path/filepath"
	"runtime"
	"testing"
)

func natgwDir(t *testing.T) string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "config", "crd")
}

// TestSuperset: natgw's CRDs are a superset of upstream v1.16.2's for every
// kind natgw serves.
func TestSuperset(t *testing.T) {
	ctx := context.Background()
	up, err := LoadSet(ctx, Upstream, "")
	if err != nil {
		t.Fatal(err)
	}
	ours, err := LoadSet(ctx, Natgw, natgwDir(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Kinds {
		t.Run(k, func(t *testing.T) {
			u, o := up[k], ours[k]
			if u == nil || o == nil {
				t.Fatalf("kind %s: upstream %v, natgw %v", k, u != nil, o != nil)
			}
			for _, d := range Superset(u, o) {
				t.Error(d)
			}
		})
	}
}
