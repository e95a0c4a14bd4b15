// Package procfs finds processes by their command line and reads their CPU
// time, from /proc.
package procfs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Find returns the pids of the processes whose command line (argv, without
// the trailing NUL) match accepts, in /proc order. Processes that exit while
// it reads are skipped.
func Find(match func(argv []string) bool) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		if match(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")) {
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

// userHZ is the unit of the times in /proc/PID/stat (USER_HZ, 100 on every
// Linux architecture Go supports).
const userHZ = 100

// CPUTime returns the user plus system CPU time pid has used so far.
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	return parseStat(string(b))
}

// parseStat reads utime and stime (fields 14 and 15) of a /proc/PID/stat
// line. The command name (field 2) is in parentheses and may hold spaces
// and parentheses, so fields are counted from its last ')'.
func parseStat(s string) (time.Duration, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no command name", s)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("stat %q: %d fields after the command name, want ≥13", s, len(f))
	}
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}
