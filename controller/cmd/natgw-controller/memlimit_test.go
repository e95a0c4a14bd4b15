package main

import (
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestMemoryLimit(t *testing.T) {
	dir := t.TempDir()
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v2 := write("memory.max", "536870912\n")
	v2max := write("memory.max.unlimited", "max\n")
	v1unl := write("limit_in_bytes", "9223372036854771712\n")
	bad := write("bad", "lots\n")
	noEnv := func(string) string { return "" }
	withEnv := func(k string) string {
		if k == "GOMEMLIMIT" {
			return "300MiB"
		}
		return ""
	}
	for _, tc := range []struct {
		name, arg string
		files     []string
		getenv    func(string) string
		want      int64
		source    string // substring
		err       bool
	}{
		{name: "quantity", arg: "400Mi", getenv: noEnv, want: 400 << 20, source: "--memory-limit"},
		{name: "bytes", arg: "1000000", getenv: noEnv, want: 1000000, source: "--memory-limit"},
		{name: "off", arg: "off", getenv: withEnv, want: 0, source: "off"},
		{name: "zero", arg: "0", getenv: noEnv, want: 0, source: "off"},
		{name: "zero quantity", arg: "0Mi", getenv: noEnv, want: 0, source: "off"},
		{name: "negative", arg: "-5Mi", getenv: noEnv, err: true},
		{name: "garbage", arg: "a lot", getenv: noEnv, err: true},
		{name: "auto cgroup v2", arg: "auto", files: []string{v2}, getenv: noEnv, want: cgroupWant(512 << 20), source: "memory.max"},
		{name: "auto GOMEMLIMIT wins", arg: "auto", files: []string{v2}, getenv: withEnv, want: 0, source: "GOMEMLIMIT=300MiB"},
		{name: "auto unlimited v2", arg: "auto", files: []string{v2max, v2}, getenv: noEnv, want: 0, source: "max"},
		{name: "auto unlimited v1", arg: "auto", files: []string{filepath.Join(dir, "missing"), v1unl}, getenv: noEnv, want: 0, source: "unlimited"},
		{name: "auto no cgroup", arg: "auto", files: []string{filepath.Join(dir, "missing")}, getenv: noEnv, want: 0, source: "no cgroup"},
		{name: "auto unreadable value", arg: "auto", files: []string{bad}, getenv: noEnv, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			saved := cgroupMemoryFiles
			t.Cleanup(func() { cgroupMemoryFiles = saved })
			cgroupMemoryFiles = tc.files
			got, source, err := memoryLimit(tc.arg, tc.getenv)
			if tc.err {
				if err == nil {
					t.Fatalf("memoryLimit(%q) = %d, %q; want an error", tc.arg, got, source)
				}
				return
			}
			if err != nil {
				t.Fatalf("memoryLimit(%q): %v", tc.arg, err)
			}
			if got != tc.want || !strings.Contains(source, tc.source) {
				t.Fatalf("memoryLimit(%q) = %d, %q; want %d, source containing %q", tc.arg, got, source, tc.want, tc.source)
			}
		})
	}
}

func TestApplyMemoryLimit(t *testing.T) {
	old := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(old) })
	got, source, err := applyMemoryLimit("300Mi")
	if err != nil || got != 300<<20 || source != "--memory-limit" {
		t.Fatalf("applyMemoryLimit(300Mi) = %d, %q, %v; want %d from the flag", got, source, err, 300<<20)
	}
	if cur := debug.SetMemoryLimit(-1); cur != 300<<20 {
		t.Fatalf("runtime limit %d after applyMemoryLimit(300Mi), want %d", cur, 300<<20)
	}
	got, source, err = applyMemoryLimit("off")
	if err != nil || got != -1 || source != "off" {
		t.Fatalf("applyMemoryLimit(off) = %d, %q, %v; want -1, off", got, source, err)
	}
	if cur := debug.SetMemoryLimit(-1); cur != math.MaxInt64 {
		t.Fatalf("runtime limit %d after applyMemoryLimit(off), want none", cur)
	}
}

// cgroupWant is the soft limit memoryLimit derives from a cgroup limit of n.
func cgroupWant(n int64) int64 { return int64(float64(n) * cgroupShare) }
