package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/natgw/natgw/internal/procfs"
)

// Sysctls are the host settings the kubelet (vm.overcommit_memory,
// kernel.panic, kernel.panic_on_oops, ...) and the bridge CNI plugin
// (net.ipv4.ip_forward) change: saved before the cluster starts, restored
// at Down.
var Sysctls = []string{
	"vm.overcommit_memory",
	"kernel.panic",
	"kernel.panic_on_oops",
	"kernel.keys.root_maxkeys",
	"kernel.keys.root_maxbytes",
	"net.ipv4.ip_forward",
	"net.ipv6.conf.all.forwarding",
	"net.bridge.bridge-nf-call-iptables",
	"net.bridge.bridge-nf-call-ip6tables",
}

// IPTablesTools are the iptables front ends whose rules Down restores.
var IPTablesTools = []string{"iptables-nft", "ip6tables-nft", "iptables-legacy", "ip6tables-legacy"}

// FixedPaths are paths the kubelet, containerd and libcni write whatever
// their configuration says (so one cluster per machine at a time). Down
// removes those that did not exist before Up.
var FixedPaths = []string{
	"/var/lib/kubelet",
	"/var/log/containers",
	"/var/log/pods",
	"/run/containerd",
	"/var/lib/cni",
	"/etc/cni",
	"/opt/cni",
	"/usr/libexec/kubernetes",
}

// iptablesNftTables are the nftables tables iptables-nft creates on first use.
var iptablesNftTables = map[string]bool{
	"ip filter": true, "ip nat": true, "ip mangle": true, "ip raw": true, "ip security": true,
	"ip6 filter": true, "ip6 nat": true, "ip6 mangle": true, "ip6 raw": true, "ip6 security": true,
}

// Proc is a daemon the cluster started.
type Proc struct {
	Name string `json:"name"`
	Pid  int    `json:"pid"`
	// Exe is the binary's path, checked before the pid is signalled (a pid
	// of a killed run may have been reused).
	Exe string `json:"exe"`
}

// HostState is what Up changed on the host and how to undo it. It is written
// to the state file before the first change, and updated as daemons start,
// so that a run that was killed is undone by the next Up or Down.
type HostState struct {
	Base     string            `json:"base"`
	BinDirs  []string          `json:"binDirs"` // processes running these binaries belong to the cluster
	Procs    []Proc            `json:"procs"`
	Sysctls  map[string]string `json:"sysctls"`  // value before Up ("" if the key does not exist)
	IPTables map[string]string `json:"iptables"` // tool -> its save output before Up
	NFTables []string          `json:"nftables"` // "family name" of the tables before Up
	NewPaths []string          `json:"newPaths"` // fixed paths that did not exist before Up
	Links    []string          `json:"links"`    // links Up creates
}

// captureHost records the host's state before the cluster changes it.
func captureHost(ctx context.Context, base string, binDirs, links []string) (*HostState, error) {
	st := &HostState{Base: base, BinDirs: binDirs, Sysctls: map[string]string{}, IPTables: map[string]string{}, Links: links}
	for _, k := range Sysctls {
		v, err := readSysctl(k)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		st.Sysctls[k] = v
	}
	for _, tool := range IPTablesTools {
		out, err := iptablesSave(ctx, tool)
		if err != nil {
			return nil, err
		}
		st.IPTables[tool] = out
	}
	tables, err := nftTables(ctx)
	if err != nil {
		return nil, err
	}
	st.NFTables = tables
	for _, p := range FixedPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			st.NewPaths = append(st.NewPaths, p)
		}
	}
	return st, nil
}

func sysctlPath(key string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
}

func readSysctl(key string) (string, error) {
	b, err := os.ReadFile(sysctlPath(key))
	if err != nil {
		return "", fmt.Errorf("sysctl %s: %w", key, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// ReadSysctls returns the current values of Sysctls (missing keys omitted).
func ReadSysctls() map[string]string {
	m := map[string]string{}
	for _, k := range Sysctls {
		if v, err := readSysctl(k); err == nil {
			m[k] = v
		}
	}
	return m
}

func iptablesSave(ctx context.Context, tool string) (string, error) {
	if _, err := exec.LookPath(tool + "-save"); err != nil {
		return "", nil // tool not installed: nothing to restore
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, tool+"-save").Output()
	if err != nil {
		return "", fmt.Errorf("%s-save: %w", tool, err)
	}
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		keep = append(keep, l)
	}
	return dropChainCounters(strings.Join(keep, "\n")), nil
}

// dropChainCounters drops the packet and byte counters of the chain lines
// of a save output (":FORWARD ACCEPT [80:6160]" -> ":FORWARD ACCEPT"):
// traffic the host forwards while a cluster runs (bridged IPv6 passes
// ip6tables' FORWARD with bridge-nf-call-ip6tables) changes them, not the
// rules.
func dropChainCounters(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, ":") && strings.HasSuffix(l, "]") {
			if j := strings.LastIndex(l, " ["); j > 0 {
				lines[i] = l[:j]
			}
		}
	}
	return strings.Join(lines, "\n")
}

// IPTablesSave returns every tool's rules (comments and counters dropped),
// for before/after comparisons.
func IPTablesSave(ctx context.Context) (map[string]string, error) {
	m := map[string]string{}
	for _, tool := range IPTablesTools {
		out, err := iptablesSave(ctx, tool)
		if err != nil {
			return nil, err
		}
		m[tool] = out
	}
	return m, nil
}

func nftTables(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nft", "list", "tables").Output()
	if err != nil {
		return nil, fmt.Errorf("nft list tables: %w", err)
	}
	var t []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "table" {
			t = append(t, f[1]+" "+f[2])
		}
	}
	return t, nil
}

// ipt is one parsed save output: per table, its chains and rules in order.
type ipt struct {
	tables map[string]*iptTable
	order  []string
}

type iptTable struct {
	chains  []string
	builtin map[string]bool // chains with a policy (INPUT, POSTROUTING, ...)
	rules   []string        // "-A CHAIN ..." lines
}

func parseSave(s string) ipt {
	p := ipt{tables: map[string]*iptTable{}}
	var cur *iptTable
	for _, l := range strings.Split(s, "\n") {
		switch {
		case strings.HasPrefix(l, "*"):
			name := l[1:]
			cur = &iptTable{builtin: map[string]bool{}}
			p.tables[name] = cur
			p.order = append(p.order, name)
		case cur == nil:
		case strings.HasPrefix(l, ":"):
			if f := strings.Fields(l[1:]); len(f) > 0 {
				cur.chains = append(cur.chains, f[0])
				cur.builtin[f[0]] = len(f) > 1 && f[1] != "-"
			}
		case strings.HasPrefix(l, "-A "):
			cur.rules = append(cur.rules, l)
		}
	}
	return p
}

// iptablesUndo returns the commands (argument lists for tool) that take the
// rules and chains in after back to before: rules added to chains that
// existed are deleted one by one; chains that are new are flushed and
// removed. Rules and chains of others that were there before stay.
func iptablesUndo(before, after string) [][]string {
	b, a := parseSave(before), parseSave(after)
	var dels, flushes, removes [][]string
	for _, name := range a.order {
		at := a.tables[name]
		bt := b.tables[name]
		if bt == nil {
			bt = &iptTable{builtin: map[string]bool{}}
		}
		// Built-in chains stay (a table iptables-nft created goes with
		// the nftables clean-up); their new rules are deleted.
		oldChain := map[string]bool{}
		for _, c := range bt.chains {
			oldChain[c] = true
		}
		for c, b := range at.builtin {
			if b {
				oldChain[c] = true
			}
		}
		oldRule := map[string]int{}
		for _, r := range bt.rules {
			oldRule[r]++
		}
		for _, r := range at.rules {
			if oldRule[r] > 0 {
				oldRule[r]--
				continue
			}
			args := splitRule(r)
			if len(args) < 2 || !oldChain[args[1]] {
				continue // in a new chain: goes with the flush
			}
			dels = append(dels, append([]string{"-t", name, "-D"}, args[1:]...))
		}
		for _, c := range at.chains {
			if !oldChain[c] {
				flushes = append(flushes, []string{"-t", name, "-F", c})
				removes = append(removes, []string{"-t", name, "-X", c})
			}
		}
	}
	return append(append(dels, flushes...), removes...)
}

// splitRule splits an iptables-save rule line into arguments, honouring the
// double quotes iptables-save puts around arguments with spaces.
func splitRule(l string) []string {
	var args []string
	var cur strings.Builder
	in, have := false, false
	for i := 0; i < len(l); i++ {
		c := l[i]
		switch {
		case c == '\\' && in && i+1 < len(l):
			i++
			cur.WriteByte(l[i])
		case c == '"':
			in, have = !in, true
		case c == ' ' && !in:
			if have {
				args = append(args, cur.String())
				cur.Reset()
				have = false
			}
		default:
			cur.WriteByte(c)
			have = true
		}
	}
	if have {
		args = append(args, cur.String())
	}
	return args
}

// saveState writes st to path atomically.
func saveState(path string, st *HostState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	return nil
}

// loadState reads the state file; (nil, nil) when there is none.
func loadState(path string) (*HostState, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state file: %w", err)
	}
	st := &HostState{}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	return st, nil
}

// restoreHost undoes everything st records, best effort: every step runs,
// and the errors are joined. The order matters: processes first (they would
// re-create what is removed), then mounts, cgroups, links, iptables,
// sysctls and paths.
func restoreHost(ctx context.Context, st *HostState) error {
	var errs []error
	errs = append(errs, stopProcs(ctx, st))
	errs = append(errs, unmountUnder(append([]string{st.Base}, FixedPaths...)))
	errs = append(errs, removeCgroups())
	for _, l := range st.Links {
		if err := run(ctx, "ip", "link", "del", l); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
			errs = append(errs, err)
		}
	}
	for _, tool := range IPTablesTools {
		before, ok := st.IPTables[tool]
		if !ok {
			continue
		}
		after, err := iptablesSave(ctx, tool)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, args := range iptablesUndo(before, after) {
			if err := run(ctx, tool, args...); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if tables, err := nftTables(ctx); err != nil {
		errs = append(errs, err)
	} else {
		old := map[string]bool{}
		for _, t := range st.NFTables {
			old[t] = true
		}
		for _, t := range tables {
			if !old[t] && iptablesNftTables[t] {
				f := strings.Fields(t)
				if err := run(ctx, "nft", "delete", "table", f[0], f[1]); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	keys := make([]string, 0, len(st.Sysctls))
	for k := range st.Sysctls {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := st.Sysctls[k]
		if v == "" {
			continue
		}
		if cur, err := readSysctl(k); err == nil && cur != v {
			if err := os.WriteFile(sysctlPath(k), []byte(v), 0o644); err != nil {
				errs = append(errs, fmt.Errorf("restore sysctl %s=%s: %w", k, v, err))
			}
		}
	}
	for _, p := range st.NewPaths {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
		}
	}
	if st.Base != "" {
		if err := os.RemoveAll(st.Base); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", st.Base, err))
		}
	}
	return errors.Join(errs...)
}

// verifyRestored compares the host with st: every recorded sysctl and
// every iptables front end's rules must be as they were before Up.
func verifyRestored(ctx context.Context, st *HostState) error {
	var errs []error
	for k, v := range st.Sysctls {
		if v == "" {
			continue
		}
		if cur, err := readSysctl(k); err != nil || cur != v {
			errs = append(errs, fmt.Errorf("sysctl %s is %q, was %q before the cluster (%v)", k, cur, v, err))
		}
	}
	for tool, before := range st.IPTables {
		after, err := iptablesSave(ctx, tool)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if after != dropChainCounters(before) { // a state file of an older run kept them
			errs = append(errs, fmt.Errorf("%s rules differ from before the cluster:\nnow:\n%s\nbefore:\n%s", tool, after, before))
		}
	}
	return errors.Join(errs...)
}

// stopProcs stops the recorded daemons (SIGTERM, then SIGKILL after a grace
// period), then kills every other process running one of the cluster's
// binaries (shims) and every process left in the kubepods cgroups.
func stopProcs(ctx context.Context, st *HostState) error {
	var live []int
	for i := len(st.Procs) - 1; i >= 0; i-- {
		p := st.Procs[i]
		if exeOf(p.Pid) == p.Exe {
			_ = syscall.Kill(p.Pid, syscall.SIGTERM)
			live = append(live, p.Pid)
		}
	}
	waitGone(ctx, live, 10*time.Second)
	for _, pid := range live {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	// Shims and anything else run from the cluster's own binaries, then the
	// containers (kubepods cgroups). Repeat: a shim may be mid-start.
	for round := 0; round < 5; round++ {
		pids := clusterPids(st.BinDirs)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		waitGone(ctx, pids, 2*time.Second)
	}
	if left := clusterPids(st.BinDirs); len(left) > 0 {
		return fmt.Errorf("processes of the cluster still alive: %v", left)
	}
	return nil
}

func waitGone(ctx context.Context, pids []int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		alive := false
		for _, pid := range pids {
			if syscall.Kill(pid, 0) == nil && !zombie(pid) {
				alive = true
			}
		}
		if !alive {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// zombie reports whether pid is a zombie or gone.
func zombie(pid int) bool {
	st, err := procfs.ReadStat(pid)
	return err != nil || st.State == 'Z'
}

func exeOf(pid int) string {
	p, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(p, " (deleted)")
}

// clusterPids lists live processes running a binary of binDirs or sitting
// in a kubepods cgroup.
func clusterPids(binDirs []string) []int {
	seen := map[int]bool{}
	// /proc/PID/exe names the binary by its real path: a bin dir reached
	// through a symlink (a .cache linked elsewhere) is matched as resolved.
	dirs := slices.Clone(binDirs)
	for _, d := range binDirs {
		if r, err := filepath.EvalSymlinks(d); err == nil && r != d {
			dirs = append(dirs, r)
		}
	}
	binDirs = dirs
	all, _ := procfs.Pids()
	for _, pid := range all {
		if pid == os.Getpid() {
			continue
		}
		exe := exeOf(pid)
		for _, d := range binDirs {
			if d != "" && strings.HasPrefix(exe, d+"/") && !zombie(pid) {
				seen[pid] = true
			}
		}
	}
	for _, root := range cgroupRoots() {
		_ = filepath.WalkDir(filepath.Join(root, "kubepods"), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			f, err := os.Open(p)
			if err != nil {
				return nil
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			for sc.Scan() {
				var pid int
				if _, err := fmt.Sscanf(sc.Text(), "%d", &pid); err == nil && !zombie(pid) {
					seen[pid] = true
				}
			}
			return nil
		})
	}
	pids := make([]int, 0, len(seen))
	for p := range seen {
		pids = append(pids, p)
	}
	sort.Ints(pids)
	return pids
}

// cgroupRoots are the mounted cgroup hierarchies (v1 controllers and v2).
func cgroupRoots() []string {
	mounts, err := procfs.Mounts()
	if err != nil {
		return nil
	}
	var roots []string
	for _, m := range mounts {
		if m.FSType == "cgroup" || m.FSType == "cgroup2" {
			roots = append(roots, m.Point)
		}
	}
	return roots
}

// removeCgroups removes the kubelet's kubepods cgroups, deepest first.
func removeCgroups() error {
	var errs []error
	for _, root := range cgroupRoots() {
		top := filepath.Join(root, "kubepods")
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			var err error
			for try := 0; try < 20; try++ { // a cgroup empties shortly after its last process exits
				if err = syscall.Rmdir(dirs[i]); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", dirs[i], err))
			}
		}
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount at or below one of dirs, deepest first.
func unmountUnder(dirs []string) error {
	mounts, err := procfs.Mounts()
	if err != nil {
		return fmt.Errorf("mountinfo: %w", err)
	}
	var mps []string
	for _, m := range mounts {
		mp := m.Point
		for _, d := range dirs {
			if d != "" && (mp == d || strings.HasPrefix(mp, d+"/")) {
				mps = append(mps, mp)
				break
			}
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	var errs []error
	for _, mp := range mps {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	return errors.Join(errs...)
}

// run runs a command with a timeout, returning its output in the error.
func run(ctx context.Context, name string, args ...string) error {
	_, err := output(ctx, name, args...)
	return err
}

// output runs a command with a timeout and returns its standard output;
// its standard error goes into the error.
func output(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()+" "+string(out)))
	}
	return string(out), nil
}
