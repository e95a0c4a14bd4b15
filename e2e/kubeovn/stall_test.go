package kubeovn_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/natgw/natgw/internal/procfs"
)

// A Kube-OVN phase of the migration's set-up is stalled when the count of
// ready objects has not moved for stallAfter: Kube-OVN retries a failed
// object at most every 20 s (--cust-crd-retry-max-delay), so 90 s without
// progress is not a retry backoff.
const (
	stallAfter = 90 * time.Second
	// hungGatewayCommand is how long a gateway command may run in the pod
	// before a stall is blamed on it (natgw's compat CLI is bounded at 2
	// minutes; an eip-add takes well under a second).
	hungGatewayCommand = 60 * time.Second
	// maxStallRestarts bounds the restarts of Kube-OVN's controller.
	maxStallRestarts = 2
)

// kubeOVNStall returns the onStall of waitReadyCount for a phase in which
// Kube-OVN v1.16.2's own controller programs the gateway. notReady names
// the objects still not ready (the count function records them).
//
// Kube-OVN runs every gateway command under one lock per gateway pod
// (pkg/controller/vpc_nat_gateway.go:775 execNatGwRules) through an exec
// stream opened with context.TODO (pkg/util/pod_exec.go:77): no timeout,
// so one exec stream that never ends holds up every later command to that
// gateway until the controller restarts. Seen once in CI: 999 of 1,000
// EIPs ready after 4 minutes, the last never, and the controller silent
// for the remaining 6.
//
// On a stall it logs what it found: the objects not ready, the controller's
// log lines naming them, its last gateway commands with their outcome, and
// the processes in the gateway pod. When a gateway command is still
// running in the pod after hungGatewayCommand, the hang is natgw's: it
// fails. Otherwise nothing of natgw's is running and Kube-OVN's controller
// is waiting on its own exec stream: it restarts the controller (what an
// operator does; it lists every object again and resumes), at most
// maxStallRestarts times, logging each.
func (e *env) kubeOVNStall(notReady func() []string) func() error {
	restarts := 0
	return func() error {
		names := notReady()
		e.t.Logf("Kube-OVN stalled: %d not ready: %s", len(names), firstN(names, 10))
		logText, _ := os.ReadFile(e.k.OutputPath())
		for _, name := range firstN(names, 3) {
			e.t.Logf("Kube-OVN's log on %s:\n%s", name, strings.Join(lastLines(string(logText), 6, func(l string) bool {
				return strings.Contains(l, " "+name+" ") || strings.HasSuffix(l, " "+name) || strings.Contains(l, "/"+name)
			}), "\n"))
		}
		e.t.Logf("Kube-OVN's last gateway commands:\n%s", strings.Join(lastLines(string(logText), 6, func(l string) bool {
			return strings.Contains(l, "NAT gateway command")
		}), "\n"))
		procs, err := podProcesses(e.pod.netns)
		if err != nil {
			return fmt.Errorf("Kube-OVN stalled; processes of the gateway pod: %w", err)
		}
		var lines []string
		var hung []string
		for _, p := range procs {
			lines = append(lines, p.String())
			if p.isGatewayCommand() && p.age > hungGatewayCommand {
				hung = append(hung, p.String())
			}
		}
		e.t.Logf("processes in the gateway pod's network namespace:\n%s", strings.Join(lines, "\n"))
		if len(hung) > 0 {
			return fmt.Errorf("Kube-OVN stalled on natgw: a gateway command has run for more than %v: %s", hungGatewayCommand, strings.Join(hung, "; "))
		}
		if restarts >= maxStallRestarts {
			return fmt.Errorf("Kube-OVN stalled again after %d restarts of its controller, no gateway command running in the pod", restarts)
		}
		restarts++
		e.t.Logf("no gateway command is running in the pod: Kube-OVN's controller waits on an exec stream without a timeout; restarting it (%d of %d)", restarts, maxStallRestarts)
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		defer cancel()
		return e.k.RestartController(ctx)
	}
}

// firstN is s cut to n items.
func firstN(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// lastLines returns the last n lines of text that keep accepts.
func lastLines(text string, n int, keep func(string) bool) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		if l := sc.Text(); keep(l) {
			out = append(out, l)
			if len(out) > n {
				out = out[1:]
			}
		}
	}
	return out
}

// proc is a process of the gateway pod.
type proc struct {
	pid   int
	age   time.Duration
	wchan string
	argv  []string
}

func (p proc) String() string {
	return fmt.Sprintf("pid %d age %v wchan %s: %s", p.pid, p.age.Round(time.Second), p.wchan, strings.Join(p.argv, " "))
}

// isGatewayCommand reports whether p runs a command a controller exec'd
// (the script's name or natgw's compat subcommand), not the image's
// long-running agent or pause.
func (p proc) isGatewayCommand() bool {
	s := strings.Join(p.argv, " ")
	return strings.Contains(s, "nat-gateway.sh") || strings.Contains(s, "lb-svc.sh") || strings.Contains(s, " compat ")
}

// podProcesses lists the host's processes in the network namespace nsPath
// (same inode), with their age and kernel wait channel.
func podProcesses(nsPath string) ([]proc, error) {
	var want syscall.Stat_t
	if err := syscall.Stat(nsPath, &want); err != nil {
		return nil, err
	}
	pids, err := procfs.Pids()
	if err != nil {
		return nil, err
	}
	var out []proc
	for _, pid := range pids {
		d := fmt.Sprintf("/proc/%d", pid)
		var st syscall.Stat_t
		if syscall.Stat(d+"/ns/net", &st) != nil || st.Ino != want.Ino || st.Dev != want.Dev {
			continue
		}
		age, err := procfs.Age(pid)
		if err != nil {
			continue // exited
		}
		argv, _ := procfs.Cmdline(pid)
		wchan, _ := os.ReadFile(d + "/wchan")
		out = append(out, proc{
			pid:   pid,
			age:   age,
			wchan: string(wchan),
			argv:  argv,
		})
	}
	return out, nil
}

// TestPodProcesses checks podProcesses' reading of /proc on the test's own
// process: found in its own network namespace, with its argv and an age
// no older than the process.
func TestPodProcesses(t *testing.T) {
	t0 := time.Now()
	procs, err := podProcesses("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p.pid != os.Getpid() {
			continue
		}
		if len(p.argv) == 0 || p.argv[0] != os.Args[0] {
			t.Errorf("argv %q, want %q first", p.argv, os.Args[0])
		}
		if p.age < 0 || p.age > time.Since(processStart)+time.Second {
			t.Errorf("age %v, the process started %v ago", p.age, time.Since(processStart))
		}
		if p.isGatewayCommand() {
			t.Errorf("%s taken for a gateway command", p)
		}
		return
	}
	t.Fatalf("own pid %d not among %d processes (listed in %v)", os.Getpid(), len(procs), time.Since(t0))
}

// processStart is about when the test binary started.
var processStart = time.Now()

func TestIsGatewayCommand(t *testing.T) {
	for _, c := range []struct {
		argv []string
		want bool
	}{
		{[]string{"bash", "/kube-ovn/nat-gateway.sh", "eip-add", "192.0.2.10/24"}, true},
		{[]string{"/bin/bash", "-c", "bash /kube-ovn/nat-gateway.sh eip-add 192.0.2.10/24"}, true},
		{[]string{"bash", "/kube-ovn/lb-svc.sh", "eip-add", "192.0.2.10/24"}, true},
		{[]string{"/natgw", "compat", "eip-add", "192.0.2.10/24"}, true},
		{[]string{"/natgw", "serve", "--rules-only"}, false},
		{[]string{"/pause"}, false},
	} {
		if got := (proc{argv: c.argv}).isGatewayCommand(); got != c.want {
			t.Errorf("%q: %v, want %v", c.argv, got, c.want)
		}
	}
}
