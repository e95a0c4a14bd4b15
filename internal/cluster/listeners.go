package cluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/natgw/natgw/internal/procfs"
)

// listener is a process listening on one of the cluster's fixed ports.
type listener struct {
	port int
	pid  int
	exe  string
	argv []string
}

func (l listener) String() string {
	return fmt.Sprintf("port %d: pid %d %s %s", l.port, l.pid, l.exe, strings.Join(l.argv, " "))
}

// ports are the cluster's fixed TCP ports.
func (c *Cluster) ports() []int {
	return []int{c.cfg.EtcdPort, c.cfg.EtcdPeerPort, c.cfg.APIPort, c.cfg.KubeletPort,
		c.cfg.ControllerManagerPort, c.cfg.SchedulerPort}
}

// clearPorts makes sure no process listens on the cluster's ports before
// its daemons start. A daemon of an earlier cluster that outlived its Down
// would otherwise answer in the new one's place (the new daemon cannot
// bind, and a client sees the old PKI: "certificate signed by unknown
// authority"). A listener whose command line names the cluster's base
// directory is such a daemon: it is killed (SIGTERM, SIGKILL after 10 s)
// and logged. Any other listener is an error naming it.
func (c *Cluster) clearPorts(ctx context.Context) error {
	ls, err := listeners(c.ports())
	if err != nil {
		return err
	}
	var stale []int
	for _, l := range ls {
		if !mentions(l.argv, c.cfg.Base) {
			return fmt.Errorf("another process listens on the cluster's %s", l)
		}
		c.logf("cluster: a daemon of an earlier cluster still listens on %s: stopping it", l)
		_ = syscall.Kill(l.pid, syscall.SIGTERM)
		stale = append(stale, l.pid)
	}
	if len(stale) == 0 {
		return nil
	}
	waitGone(ctx, stale, 10*time.Second)
	for _, pid := range stale {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	waitGone(ctx, stale, 5*time.Second)
	if ls, err := listeners(c.ports()); err != nil || len(ls) > 0 {
		return fmt.Errorf("the cluster's ports are still taken after stopping %v: %v (%v)", stale, ls, err)
	}
	return nil
}

// mentions says whether an argument of argv is dir or a path below it.
func mentions(argv []string, dir string) bool {
	if dir == "" {
		return false
	}
	for _, a := range argv {
		if i := strings.Index(a, dir); i >= 0 {
			rest := a[i+len(dir):]
			if rest == "" || rest[0] == '/' {
				return true
			}
		}
	}
	return false
}

// listeners lists the processes with a TCP socket listening on one of
// ports in the host's network namespace (pid 1's: a test thread may sit
// in another namespace).
func listeners(ports []int) ([]listener, error) {
	want := map[int]bool{}
	for _, p := range ports {
		if p > 0 {
			want[p] = true
		}
	}
	inodes := map[string]int{} // socket inode -> port
	for _, f := range []string{"/proc/1/net/tcp", "/proc/1/net/tcp6"} {
		m, err := listeningInodes(f, want)
		if err != nil {
			return nil, err
		}
		for k, v := range m {
			inodes[k] = v
		}
	}
	if len(inodes) == 0 {
		return nil, nil
	}
	var out []listener
	pids, _ := procfs.Pids()
	for _, pid := range pids {
		dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
		fds, _ := os.ReadDir(dir)
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(dir, fd.Name()))
			if err != nil || !strings.HasPrefix(link, "socket:[") {
				continue
			}
			port, ok := inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")]
			if !ok {
				continue
			}
			argv, _ := procfs.Cmdline(pid)
			out = append(out, listener{port: port, pid: pid, exe: exeOf(pid), argv: argv})
			break
		}
	}
	return out, nil
}

// listeningInodes reads a /proc/net/tcp{,6} table: the inodes of the
// sockets in LISTEN state on one of the wanted ports.
func listeningInodes(path string, want map[int]bool) (map[string]int, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		port, inode, ok := parseTCPLine(sc.Text())
		if ok && want[port] {
			out[inode] = port
		}
	}
	return out, sc.Err()
}

// parseTCPLine reads one row of /proc/net/tcp: the local port and the
// socket inode of a LISTEN (0A) socket.
func parseTCPLine(line string) (port int, inode string, ok bool) {
	f := strings.Fields(line)
	if len(f) < 10 || f[3] != "0A" {
		return 0, "", false
	}
	i := strings.LastIndexByte(f[1], ':')
	if i < 0 {
		return 0, "", false
	}
	p, err := strconv.ParseUint(f[1][i+1:], 16, 16)
	if err != nil {
		return 0, "", false
	}
	return int(p), f[9], true
}
