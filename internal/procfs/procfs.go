// Package procfs is the one reader of /proc for natgw's tests, benchmarks
// and e2e: processes by their command line, their state, process group,
// start and CPU time (/proc/PID/stat), their memory and thread count
// (/proc/PID/status), the load average (/proc/loadavg) and the mount table
// (/proc/self/mountinfo). Shipped binaries do not import it: a product
// package that reads /proc keeps its own reader.
package procfs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Pids returns the pids of the processes in /proc, in /proc order.
func Pids() ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// Cmdline returns the command line (argv) of process pid; it is empty for
// a kernel thread and a zombie.
func Cmdline(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return nil, err
	}
	return parseCmdline(string(b)), nil
}

// parseCmdline splits /proc/PID/cmdline (arguments each ended by a NUL).
func parseCmdline(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimRight(s, "\x00"), "\x00")
}

// Find returns the pids of the processes whose command line (argv, without
// the trailing NUL) match accepts, in /proc order. Processes that exit while
// it reads, kernel threads and zombies (no command line) are skipped.
func Find(match func(argv []string) bool) ([]int, error) {
	all, err := Pids()
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, pid := range all {
		argv, err := Cmdline(pid)
		if err != nil || len(argv) == 0 {
			continue
		}
		if match(argv) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// FindOne returns the one process whose argv[0] has base name and whose
// arguments include arg; it is an error when there is none or several.
func FindOne(name, arg string) (int, error) {
	pids, err := Find(func(argv []string) bool {
		return filepath.Base(argv[0]) == name && slices.Contains(argv[1:], arg)
	})
	if err != nil {
		return 0, err
	}
	if len(pids) != 1 {
		return 0, fmt.Errorf("%d %s processes with %s, want 1", len(pids), name, arg)
	}
	return pids[0], nil
}

// NetNS returns the network namespace of process pid as /proc/PID/ns/net
// names it ("net:[4026531840]"): equal for processes in one namespace.
func NetNS(pid int) (string, error) {
	return os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "net"))
}
