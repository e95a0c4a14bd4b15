package procfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// MachineCPU is the time all CPUs of the machine spent, from the first
// line of /proc/stat, since boot.
type MachineCPU struct {
	// Total is every state's time: user, nice, system, idle, iowait, irq,
	// softirq and steal (guest time is inside user and nice).
	Total time.Duration
	// Idle is idle plus iowait: no process had the CPU.
	Idle time.Duration
}

// Busy is the time some process or the kernel had a CPU.
func (m MachineCPU) Busy() time.Duration { return m.Total - m.Idle }

// Sub returns the time spent between before and m.
func (m MachineCPU) Sub(before MachineCPU) MachineCPU {
	return MachineCPU{Total: m.Total - before.Total, Idle: m.Idle - before.Idle}
}

// ReadMachineCPU reads the machine's CPU times from /proc/stat.
func ReadMachineCPU() (MachineCPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return MachineCPU{}, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	m, err := parseMachineCPU(line)
	if err != nil {
		return MachineCPU{}, fmt.Errorf("/proc/stat: %w", err)
	}
	return m, nil
}

// parseMachineCPU reads the "cpu" line of /proc/stat: "cpu user nice
// system idle iowait irq softirq steal guest guest_nice", in USER_HZ
// ticks (kernels before 2.6.11 had fewer fields: at least the first four
// are required, the missing ones count 0).
func parseMachineCPU(line string) (MachineCPU, error) {
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return MachineCPU{}, fmt.Errorf("%q: not the cpu line with user, nice, system and idle", line)
	}
	var n [8]int64
	for i := 0; i < len(n) && i+1 < len(f); i++ {
		v, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil || v < 0 {
			return MachineCPU{}, fmt.Errorf("%q: field %d: %q is not a count of ticks", line, i+1, f[i+1])
		}
		n[i] = v
	}
	var total int64
	for _, v := range n {
		total += v
	}
	return MachineCPU{Total: ticks(total), Idle: ticks(n[3] + n[4])}, nil
}
