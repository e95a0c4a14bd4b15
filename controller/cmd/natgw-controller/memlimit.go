package main

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// memoryLimitAuto is --memory-limit's default: a soft limit derived from
// the container's cgroup memory limit, unless GOMEMLIMIT is set.
const memoryLimitAuto = "auto"

// cgroupShare is the share of the cgroup's memory limit that becomes the Go
// runtime's soft limit under --memory-limit=auto: the rest is left for what
// the runtime does not count (thread stacks outside the heap, the binary's
// pages) so that the kernel's hard limit is not reached first.
const cgroupShare = 0.9

// cgroupMemoryFiles are where a process finds its memory limit: cgroup v2's
// memory.max ("max" when unlimited), then cgroup v1's limit_in_bytes (a
// huge number when unlimited). Variables for tests.
var cgroupMemoryFiles = []string{
	"/sys/fs/cgroup/memory.max",
	"/sys/fs/cgroup/memory/memory.limit_in_bytes",
}

// memoryLimit resolves --memory-limit to the soft limit to set, in bytes:
// 0 means leave the runtime as it is (GOMEMLIMIT from the environment, or
// none). "off" and "0" set none; a quantity ("400Mi", "419430400") sets
// it; "auto" takes cgroupShare of the cgroup's limit when GOMEMLIMIT is
// not set and the cgroup has a limit. source says where the value came
// from, for the start-up log.
func memoryLimit(arg string, getenv func(string) string) (limit int64, source string, err error) {
	switch strings.TrimSpace(arg) {
	case "off", "0":
		return 0, "off", nil
	case memoryLimitAuto, "":
		if v := getenv("GOMEMLIMIT"); v != "" {
			return 0, "GOMEMLIMIT=" + v, nil
		}
		for _, f := range cgroupMemoryFiles {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			v := strings.TrimSpace(string(b))
			if v == "max" {
				return 0, "none (" + f + ": max)", nil
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, "", fmt.Errorf("--memory-limit=auto: %s: %q is not a byte count", f, v)
			}
			if n <= 0 || n >= math.MaxInt64/2 { // cgroup v1's "unlimited"
				return 0, "none (" + f + ": unlimited)", nil
			}
			return int64(float64(n) * cgroupShare), fmt.Sprintf("%.0f%% of %s (%d bytes)", cgroupShare*100, f, n), nil
		}
		return 0, "none (no cgroup memory limit found)", nil
	}
	q, err := resource.ParseQuantity(arg)
	if err != nil {
		return 0, "", fmt.Errorf("--memory-limit: %q is not auto, off or a quantity such as 400Mi: %w", arg, err)
	}
	n, ok := q.AsInt64()
	if !ok || n < 0 {
		return 0, "", fmt.Errorf("--memory-limit: %q is not a byte count", arg)
	}
	if n == 0 {
		return 0, "off", nil
	}
	return n, "--memory-limit", nil
}

// applyMemoryLimit sets the Go runtime's soft memory limit as --memory-limit
// says (see memoryLimit) and returns the limit now in effect (-1 for none,
// math.MaxInt64 as the runtime reports it) and where it came from. A
// missing cgroup file is not an error: the process may run outside a
// container.
func applyMemoryLimit(arg string) (int64, string, error) {
	limit, source, err := memoryLimit(arg, os.Getenv)
	if err != nil {
		return 0, "", err
	}
	switch {
	case limit > 0:
		debug.SetMemoryLimit(limit)
	case source == "off":
		debug.SetMemoryLimit(math.MaxInt64)
	}
	cur := debug.SetMemoryLimit(-1) // -1 reads it
	if cur == math.MaxInt64 {
		cur = -1
	}
	return cur, source, nil
}
