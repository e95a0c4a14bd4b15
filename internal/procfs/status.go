package procfs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Memory returns the resident set size (VmRSS) of process pid and its peak
// (VmHWM), in bytes, from /proc/PID/status. It is an error when either is
// missing (a kernel thread has neither).
func Memory(pid int) (rss, hwm float64, err error) {
	s, err := readStatus(pid)
	if err != nil {
		return 0, 0, err
	}
	rss, err1 := statusKB(s, "VmRSS")
	hwm, err2 := statusKB(s, "VmHWM")
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("/proc/%d/status: %w", pid, firstErr(err1, err2))
	}
	return rss, hwm, nil
}

// Threads returns the number of threads of process pid (/proc/PID/status).
func Threads(pid int) (int, error) {
	s, err := readStatus(pid)
	if err != nil {
		return 0, err
	}
	v, err := statusValue(s, "Threads")
	if err == nil {
		var n int
		if n, err = strconv.Atoi(v); err == nil {
			return n, nil
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: Threads: %w", pid, err)
}

func readStatus(pid int) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	return string(b), err
}

// statusValue returns the value of the "key:" line of a /proc/PID/status
// text, trimmed.
func statusValue(status, key string) (string, error) {
	for line := range strings.Lines(status) {
		if k, v, ok := strings.Cut(line, ":"); ok && k == key {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("no %s line", key)
}

// statusKB returns the "key: N kB" line of a /proc/PID/status text in
// bytes.
func statusKB(status, key string) (float64, error) {
	v, err := statusValue(status, key)
	if err != nil {
		return 0, err
	}
	f := strings.Fields(v)
	if len(f) != 2 || f[1] != "kB" {
		return 0, fmt.Errorf("unexpected %s value %q, want \"N kB\"", key, v)
	}
	kb, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", key, err)
	}
	return kb * 1024, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
