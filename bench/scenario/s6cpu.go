package scenario

import (
	"fmt"
	"os"
	"time"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/internal/procfs"
)

// s6CPUAt is where the machine's CPU time went, read at one moment of the
// cold start: the new natgw-controller process, its `natgw serve` agents
// (the other processes of its process group, and those it reaped), the
// API server with etcd, this process (natgw-bench: it reads the
// controller's log and metrics) and the whole machine.
type s6CPUAt struct {
	at             time.Time
	ctl, agents    time.Duration
	agentsN        int
	api, bench     time.Duration
	machine        procfs.MachineCPU
	ctlErr, apiErr error
}

// s6ReadCPU reads s6CPUAt now. pgid is the controller's pid (the leader of
// its process group), 0 before it started: then the controller and its
// agents count 0. A process that exits while the group is read loses the
// CPU it used unless the controller reaped it first.
func s6ReadCPU(cp *controlPlane, pgid int) s6CPUAt {
	c := s6CPUAt{at: time.Now()}
	c.machine, _ = procfs.ReadMachineCPU()
	c.api, c.apiErr = cp.cpu()
	c.bench, _ = procfs.CPUTime(os.Getpid())
	if pgid == 0 {
		return c
	}
	st, err := procfs.ReadStat(pgid)
	if err != nil {
		c.ctlErr = fmt.Errorf("natgw-controller pid %d: %w", pgid, err)
		return c
	}
	c.ctl, c.agents = st.CPU, st.ChildrenCPU
	agents, err := s6GroupMembers(pgid)
	if err != nil {
		c.ctlErr = err
		return c
	}
	for _, st := range agents {
		c.agents += st.CPU + st.ChildrenCPU
	}
	c.agentsN = len(agents)
	return c
}

// s6CPUSpan is the CPU time spent between two readings.
type s6CPUSpan struct {
	name                      string
	span                      time.Duration
	ctl, agents, api          time.Duration
	bench                     time.Duration
	agentsN                   int // agents running at the end
	machineBusy, machineTotal time.Duration
	err                       error
}

// s6CPUBetween returns what was spent from a to b.
func s6CPUBetween(name string, a, b s6CPUAt) s6CPUSpan {
	m := b.machine.Sub(a.machine)
	s := s6CPUSpan{name: name, span: b.at.Sub(a.at), ctl: b.ctl - a.ctl, agents: b.agents - a.agents, api: b.api - a.api,
		bench: b.bench - a.bench, agentsN: b.agentsN, machineBusy: m.Busy(), machineTotal: m.Total}
	for _, err := range []error{a.ctlErr, b.ctlErr, a.apiErr, b.apiErr} {
		if err != nil && s.err == nil {
			s.err = err
		}
	}
	return s
}

// s6CPUTable is the cold start's CPU by process over its windows.
func s6CPUTable(spans []s6CPUSpan) (report.Table, []string) {
	t := report.Table{Caption: "**CPU during the cold start** by process (CPU time, and its share of all the machine's CPUs over the window; " +
		"the agents: the new controller's `natgw serve` processes; the machine: every process and the kernel, from /proc/stat)",
		Header: []string{"window", "wall time", "natgw-controller", "natgw serve agents (running at the end)", "kube-apiserver + etcd", "natgw-bench", "the machine busy", "the rest (busy, not the four before)"}}
	var notes []string
	for _, s := range spans {
		if s.span <= 0 {
			continue
		}
		if s.err != nil {
			notes = append(notes, fmt.Sprintf("CPU during the cold start, %s: %v", s.name, s.err))
			continue
		}
		busy := "—"
		rest := "—"
		if s.machineTotal > 0 {
			busy = fmt.Sprintf("%s (%.0f%%)", report.Seconds(s.machineBusy.Seconds()), 100*float64(s.machineBusy)/float64(s.machineTotal))
			rest = cpuCell(max(0, s.machineBusy-s.ctl-s.agents-s.api-s.bench), s.span)
		}
		t.Rows = append(t.Rows, []string{s.name, report.Seconds(s.span.Seconds()), cpuCell(s.ctl, s.span),
			fmt.Sprintf("%s (%d)", cpuCell(s.agents, s.span), s.agentsN), cpuCell(s.api, s.span), cpuCell(s.bench, s.span), busy, rest})
	}
	return t, notes
}
