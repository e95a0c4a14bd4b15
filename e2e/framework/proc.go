package framework

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// processes returns the pids of the processes whose command line (argv,
// without the trailing NUL) match accepts, in /proc order. Processes that
// exit while it reads are skipped.
func processes(match func(argv []string) bool) ([]int, error) {
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
