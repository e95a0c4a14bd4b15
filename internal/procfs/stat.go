package procfs

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the times in /proc/PID/stat (USER_HZ, 100 on every
// Linux architecture Go supports).
const userHZ = 100

// Stat is what this package reads of a /proc/PID/stat line.
type Stat struct {
	// State is field 3: 'R' running, 'S' sleeping, 'Z' zombie, ...
	State byte
	// Pgrp is field 5, the process group.
	Pgrp int
	// CPU is user plus system time (fields 14 and 15).
	CPU time.Duration
	// ChildrenCPU is the user plus system time of the children it waited
	// for (fields 16 and 17): a process's children that exited and were
	// reaped, with their own reaped children.
	ChildrenCPU time.Duration
	// Start is when the process started after boot (field 22).
	Start time.Duration
}

// ReadStat reads /proc/PID/stat.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return Stat{}, err
	}
	st, err := parseStat(string(b))
	if err != nil {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return st, nil
}

// CPUTime returns the user plus system CPU time pid has used so far.
func CPUTime(pid int) (time.Duration, error) {
	st, err := ReadStat(pid)
	return st.CPU, err
}

// Age returns how long ago process pid started: the time since boot
// (/proc/uptime) less its start after boot (/proc/PID/stat), both on the
// kernel's boot clock, so wall-clock steps do not move it.
func Age(pid int) (time.Duration, error) {
	st, err := ReadStat(pid)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	up, err := parseUptime(string(b))
	if err != nil {
		return 0, fmt.Errorf("/proc/uptime: %w", err)
	}
	return up - st.Start, nil
}

// StartTime returns when process pid started, on the wall clock: now less
// its Age.
func StartTime(pid int) (time.Time, error) {
	age, err := Age(pid)
	if err != nil {
		return time.Time{}, err
	}
	return time.Now().Add(-age), nil
}

// parseStat reads a /proc/PID/stat line. The command name (field 2) is in
// parentheses and may hold spaces and parentheses, so fields are counted
// from its last ')'.
func parseStat(s string) (Stat, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("%q: no command name", s)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return Stat{}, fmt.Errorf("%q: %d fields after the command name, want ≥20", s, len(f))
	}
	if len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("%q: state %q", s, f[0])
	}
	num := func(field int) (int64, error) {
		n, err := strconv.ParseInt(f[field-3], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%q: field %d: %w", s, field, err)
		}
		return n, nil
	}
	pgrp, err1 := num(5)
	utime, err2 := num(14)
	stime, err3 := num(15)
	cutime, err4 := num(16)
	cstime, err5 := num(17)
	start, err6 := num(22)
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
		return Stat{}, err
	}
	return Stat{State: f[0][0], Pgrp: int(pgrp), CPU: ticks(utime + stime), ChildrenCPU: ticks(cutime + cstime), Start: ticks(start)}, nil
}

func ticks(n int64) time.Duration { return time.Duration(n) * time.Second / userHZ }

// parseUptime reads the first field of /proc/uptime ("12345.67 23456.78"):
// the time since boot.
func parseUptime(s string) (time.Duration, error) {
	f := strings.Fields(s)
	if len(f) == 0 {
		return 0, fmt.Errorf("%q: no fields", s)
	}
	sec, err := strconv.ParseFloat(f[0], 64)
	if err != nil || sec < 0 {
		return 0, fmt.Errorf("%q: uptime %q is not a number of seconds", s, f[0])
	}
	return time.Duration(math.Round(sec * float64(time.Second))), nil
}
