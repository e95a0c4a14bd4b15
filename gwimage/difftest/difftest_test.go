package difftest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/natgw/natgw/gwimage/imagebuild"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testsummary"
	"github.com/natgw/natgw/internal/upstream"
	"github.com/natgw/natgw/nat/netns"
)

// Bounds of the randomized part (make test on 2 cores).
const (
	randomSteps  = 20               // calls per seed
	timeBudget   = 6 * time.Minute  // the whole test stops generating after this
	callTimeout  = 30 * time.Second // one nat-gateway.sh call
	probeTimeout = time.Second
)

var seeds = []uint64{1, 2}

// seedsFromEnv lets a run pick its seeds ($NATGW_DIFFTEST_SEEDS="3,4"; "0"
// runs the fixed scenario only).
func seedsFromEnv(t *testing.T) []uint64 {
	v := os.Getenv("NATGW_DIFFTEST_SEEDS")
	if v == "" {
		return seeds
	}
	var out []uint64
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			t.Fatalf("NATGW_DIFFTEST_SEEDS=%q: %v", v, err)
		}
		if n != 0 {
			out = append(out, n)
		}
	}
	return out
}

// fakeBin is the directory of the upstream root with the stand-ins for
// modprobe, lsmod, ipcalc and tc (see upstreamRoot).
const fakeBin = "/difftest-bin"

// gatewayV4 is the container's $GATEWAY_V4: the external subnet's gateway.
var gatewayV4 = netlab.ExtAddr.String()

// verdict is a call's outcome as kube-ovn-controller v1.16.2 judges it: a
// failure is a non-zero exit or a stderr line that does not start with
// "Warning:".
type verdict struct {
	Code   int
	Stdout string
	Stderr string
}

func (v verdict) OK() bool {
	if v.Code != 0 {
		return false
	}
	for _, l := range strings.Split(strings.TrimSpace(v.Stderr), "\n") {
		if l != "" && !strings.HasPrefix(l, "Warning:") {
			return false
		}
	}
	return true
}

// side is one gateway: upstream's script or natgw's image.
type side struct {
	name string // "up" or "ng"
	gw   *netlab.Gateway
	lab  *netlab.Lab
	root string   // root filesystem the calls run in
	env  []string // the container's environment
	// wrap returns the host argv that runs cmd, the argv the controller
	// execs in the container, inside the gateway.
	wrap func(cmd []string) []string
}

func (s *side) exec(ctx context.Context, container []string) verdict {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	argv := s.wrap(container)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = s.env
	out, errb, code, err := netlab.Run(cmd)
	if err != nil {
		errb = err.Error()
	}
	return verdict{Code: code, Stdout: out, Stderr: errb}
}

// upstreamRoot lays out a root for upstream's script: the host's /usr
// (bind-mounted read-only per call, in a private mount namespace that dies
// with the call), merged-/usr links, the alternatives (iptables), an empty
// /etc/kube-ovn the script's init writes to, /proc, /dev/null, and the
// script at /kube-ovn/nat-gateway.sh, as upstream's image has it.
func upstreamRoot(t *testing.T, scripts map[string][]byte) string {
	root := t.TempDir()
	for _, d := range []string{"usr", "proc", "dev", "etc", "tmp", "run", "kube-ovn", "var/run"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"bin", "sbin", "lib", "lib64"} {
		if target, err := os.Readlink("/" + l); err == nil {
			if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(root, "dev/null"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	for name, script := range scripts {
		if err := os.WriteFile(filepath.Join(root, "kube-ovn", name), script, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Kernel modules: init runs `modprobe ifb` and, when that fails,
	// `lsmod`. The test must not load a module into the host's kernel, and
	// a kernel without loadable modules (this CI kernel has no
	// /proc/modules) makes the real lsmod complain on stderr, which fails
	// init for the controller on such a kernel whatever the image. So the
	// upstream side finds, first on its PATH, a modprobe that fails
	// silently (a container without CAP_SYS_MODULE) and an lsmod that
	// lists no modules (a modular kernel without ifb loaded).
	fake := filepath.Join(root, fakeBin)
	if err := os.MkdirAll(fake, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"modprobe": "#!/bin/sh\nexit 1\n",
		"lsmod":    "#!/bin/sh\necho 'Module                  Size  Used by'\n",
		// lb-svc.sh runs busybox's `ipcalc -n|-p`; ipcalc-ng prints the
		// same NETWORK= and PREFIX= lines.
		"ipcalc": "#!/bin/sh\nexec ipcalc-ng \"$@\"\n",
		// This kernel has no fq_codel: the script's `tc qdisc replace
		// ... fq_codel` leaf would end every eip-*-qos-add and qos-add
		// with exit 2 before its tc filter. Skipping that one command
		// leaves HTB's default leaf, which is natgw's on this kernel
		// (nat/README.md "EIP shaping"); every other tc command runs.
		"tc": upstream.TCWithoutFqCodel("/usr/sbin/tc"),
	} {
		if err := os.WriteFile(filepath.Join(fake, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile("/etc/ld.so.cache"); err == nil {
		os.WriteFile(filepath.Join(root, "etc/ld.so.cache"), b, 0o644)
	}
	alt := filepath.Join(root, "etc/alternatives")
	os.MkdirAll(alt, 0o755)
	ents, _ := os.ReadDir("/etc/alternatives")
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join("/etc/alternatives", e.Name())); err == nil {
			os.Symlink(target, filepath.Join(alt, e.Name()))
		}
	}
	return root
}

// natgwRoot builds the natgw image (imagebuild, as make image does) and
// unpacks its root filesystem.
func natgwRoot(t *testing.T, ctx context.Context) string {
	dir := t.TempDir()
	mod, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "natgw-image.tar")
	res, err := imagebuild.Build(ctx, imagebuild.Options{ModuleDir: mod, Version: "0.0.0-difftest", Name: "natgw:difftest", Out: archive})
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "rootfs")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := imagebuild.Unpack(archive, root); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "proc"), 0o555); err != nil {
		t.Fatal(err)
	}
	t.Logf("natgw image %s unpacked into %s", res.Digest, root)
	return root
}

func newSides(t *testing.T, ctx context.Context) (*side, *side) {
	for _, tool := range []string{"bash", "iptables", "iptables-save", "iptables-legacy", "iptables-legacy-save", "arping", "conntrack", "ip", "ipcalc-ng", "nsenter", "unshare", "chroot", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: upstream's script needs its userland (hack/install-deps.sh installs it)", tool)
		}
	}
	scripts := map[string][]byte{}
	for name, rel := range map[string]string{"nat-gateway.sh": upstream.NatGatewayScript, "lb-svc.sh": upstream.LBSvcScript} {
		b, err := upstream.ReadFile(ctx, rel)
		if err != nil {
			t.Fatal(err)
		}
		scripts[name] = b
	}
	lab := netlab.ForTest(t)
	mk := func(name string) *netlab.Gateway {
		gw, err := lab.Gateway(netlab.GatewayOptions{Name: name, VMs: 3})
		if err != nil {
			t.Fatal(err)
		}
		return gw
	}
	up := &side{name: "up", gw: mk("up"), lab: lab, root: upstreamRoot(t, scripts)}
	ng := &side{name: "ng", gw: mk("ng"), lab: lab, root: natgwRoot(t, ctx)}
	tool := func(name string) string {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	nsenter, unshare, chroot := tool("nsenter"), tool("unshare"), tool("chroot")
	containerEnv := []string{"GATEWAY_V4=" + gatewayV4, "GATEWAY_V6="}
	up.env = append([]string{"PATH=" + fakeBin + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, containerEnv...)
	up.wrap = func(cmd []string) []string {
		// In a private mount namespace of its own: the host's /usr, a
		// procfs and /dev/null go into the root; all vanish with the call.
		setup := `set -e; r="$0"; mount -o bind,ro /usr "$r/usr"; mount -t proc proc "$r/proc"; mount --bind /dev/null "$r/dev/null"; exec chroot "$r" "$@"`
		return append([]string{nsenter, "--net=" + netns.Path(up.gw.GW), "--", unshare, "--mount", "--propagation", "private", "--", "/bin/sh", "-c", setup, up.root}, cmd...)
	}
	// The image's environment (imagebuild's config) and the pod's.
	ng.env = append([]string{"PATH=/usr/local/bin:/bin"}, containerEnv...)
	ng.wrap = func(cmd []string) []string {
		// The image's root with a procfs, as a container runtime gives it.
		return append([]string{nsenter, "--net=" + netns.Path(ng.gw.GW), "--", unshare, "--mount", "--propagation", "private", "--mount-proc=" + filepath.Join(ng.root, "proc"), "--",
			chroot, ng.root}, cmd...)
	}
	return up, ng
}

// Addresses of the scenarios (netlab's standard topology).
var (
	eips   = []netip.Addr{netlab.EIP(0), netlab.EIP(1), netlab.EIP(2), netlab.EIP(3)}
	vms    = []netip.Addr{netlab.VMAddr(0), netlab.VMAddr(1), netlab.VMAddr(2)}
	ports  = []int{80, 8080} // external ports probed on every EIP
	protos = []string{"tcp", "udp"}
)

// serverPort is where every probe server listens (VMs and ext).
const serverPort = 80

// startServers starts TCP and UDP probe servers on port 80 in ext and every
// VM of s.
func (s *side) startServers(t *testing.T, ctx context.Context) {
	hosts := append([]netlab.Host{s.gw.Ext}, s.gw.VMs...)
	for _, h := range hosts {
		addr := "0.0.0.0:" + strconv.Itoa(serverPort)
		if _, err := s.lab.ServeTCP(ctx, h.NS, addr); err != nil {
			t.Fatal(err)
		}
		if _, err := s.lab.ServeUDP(ctx, h.NS, addr); err != nil {
			t.Fatal(err)
		}
	}
}

// probe is one connection attempt: from a host of the topology to an
// address.
type probe struct {
	From  string // "ext" or "vm1".."vm3"
	Proto string
	To    netip.AddrPort
}

func (p probe) String() string { return fmt.Sprintf("%s %s -> %s", p.From, p.Proto, p.To) }

// probes: ext to every EIP and probed port (FIP, DNAT), every VM out to ext
// (SNAT, FIP: the source ext sees), every VM to every EIP on TCP (hairpin).
func probes() []probe {
	var out []probe
	for _, e := range eips {
		for _, port := range ports {
			for _, pr := range protos {
				out = append(out, probe{"ext", pr, netip.AddrPortFrom(e, uint16(port))})
			}
		}
	}
	for i := range vms {
		for _, pr := range protos {
			out = append(out, probe{"vm" + strconv.Itoa(i+1), pr, netip.AddrPortFrom(netlab.ExtAddr, serverPort)})
		}
		for _, e := range eips {
			out = append(out, probe{"vm" + strconv.Itoa(i+1), "tcp", netip.AddrPortFrom(e, serverPort)})
		}
	}
	return out
}

// run returns what the probe saw, in side-independent terms: "fail", or the
// client address the server saw and the server's host role.
func (s *side) run(ctx context.Context, p probe) string {
	return s.runTimeout(ctx, p, probeTimeout)
}

func (s *side) runTimeout(ctx context.Context, p probe, timeout time.Duration) string {
	ns := s.gw.Ext.NS
	if p.From != "ext" {
		i, _ := strconv.Atoi(strings.TrimPrefix(p.From, "vm"))
		ns = s.gw.VMs[i-1].NS
	}
	var r netlab.Reply
	var err error
	if p.Proto == "tcp" {
		r, err = netlab.Dial(ctx, ns, p.To.String(), timeout)
	} else {
		r, err = netlab.DialUDP(ctx, ns, p.To.String(), timeout)
	}
	if err != nil {
		return "fail"
	}
	server := strings.ReplaceAll(r.Server, s.lab.Name(s.name+"-"), "")
	return fmt.Sprintf("ok source=%s server=%s", r.Client.Addr(), server)
}

// observe probes s with every probe at once.
func (s *side) observe(ctx context.Context, ps []probe) []string {
	out := make([]string, len(ps))
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = s.run(ctx, p)
		}()
	}
	wg.Wait()
	return out
}

// links returns the gateway's net1 addresses and main-table routes.
func (s *side) links(t *testing.T) string {
	addrs, err := netlab.Addrs(s.gw.GW, s.gw.ExternalInterface)
	if err != nil {
		t.Fatal(err)
	}
	routes, err := netlab.Routes(s.gw.GW)
	if err != nil {
		t.Fatal(err)
	}
	var rs []string
	for _, r := range routes {
		rs = append(rs, r.String())
	}
	slices.Sort(rs)
	as := make([]string, len(addrs))
	for i, a := range addrs {
		as[i] = a.String()
	}
	slices.Sort(as)
	// Policy rules and table 100 (lb-svc.sh), as ip prints them.
	rules, err := netlab.Exec(context.Background(), s.gw.GW, "", "ip", "-4", "rule", "show")
	if err != nil {
		t.Fatal(err)
	}
	t100, err := netlab.Exec(context.Background(), s.gw.GW, "", "ip", "-4", "route", "show", "table", "100")
	if err != nil {
		t100 = "no table 100" // the kernel makes a table with its first route
	}
	return fmt.Sprintf("net1 %v; routes %v; rules %q; table 100 %q", as, rs, rules, t100)
}

// call is one controller call: nat-gateway.sh's OP and rules, as the
// controller joins them (init keeps its trailing blank).
type call struct {
	// Script is the script the call runs ("" is nat-gateway.sh).
	Script string
	Op     string
	Rules  []string
	// Note says why the call is there (scenario steps).
	Note string
	// Improvement, when set, names the README row that explains any
	// difference this call shows (calls made to show one).
	Improvement string
}

// execForm is how a Kube-OVN version's controller execs a call in the
// gateway container.
type execForm int

const (
	// formBashC is v1.13–v1.16's `/bin/bash -c "bash /kube-ovn/SCRIPT OP RULES"`
	// (the rules joined with blanks).
	formBashC execForm = iota
	// formArgv is master's argv exec, ["bash", "/kube-ovn/SCRIPT", OP,
	// RULE...] with no -c (Kube-OVN master's pkg/controller
	// vpc_nat_gateway.go:955, service_lb.go:279); get-iptables-version keeps the bash -c form
	// (:749-751).
	formArgv
)

func (f execForm) String() string {
	if f == formArgv {
		return "argv"
	}
	return "bash -c"
}

// argv is the container argv that runs c in form f.
func (c call) argv(f execForm) []string {
	if f == formArgv && c.Op != "get-iptables-version" {
		script := c.Script
		if script == "" {
			script = "nat-gateway.sh"
		}
		return append([]string{"bash", "/kube-ovn/" + script, c.Op}, c.Rules...)
	}
	return []string{"/bin/bash", "-c", c.line()}
}

func (c call) line() string {
	script := c.Script
	if script == "" {
		script = "nat-gateway.sh"
	}
	if c.Op == "get-iptables-version" {
		return "bash /kube-ovn/" + script + " " + c.Op
	}
	return "bash /kube-ovn/" + script + " " + c.Op + " " + strings.Join(c.Rules, " ")
}

// difference is one way the two gateways disagreed after a call.
type difference struct {
	Step     string
	What     string
	Upstream string
	Natgw    string
	// Improvement names the README row that explains the difference
	// ("" when none does).
	Improvement string
}

// tally counts what a run did.
type tally struct {
	form        execForm // how every call of the run is exec'd
	qos         bool     // compare the HTB limits the kernel holds after each call (qosClasses)
	mu          sync.Mutex
	calls       int
	probes      int
	answered    int // probes of the upstream side that got an answer
	differences []difference
}

func (tl *tally) add(d difference) {
	tl.mu.Lock()
	tl.differences = append(tl.differences, d)
	tl.mu.Unlock()
}

// report logs the differences the README explains, fails t on every other
// one, and returns how many were explained.
func (tl *tally) report(t *testing.T) (explained int) {
	t.Helper()
	for _, d := range tl.differences {
		if d.Improvement != "" {
			explained++
			t.Logf("difference explained by README (%s): %s: %s: upstream %s, natgw %s", d.Improvement, d.Step, d.What, d.Upstream, d.Natgw)
			continue
		}
		t.Errorf("difference: %s: %s\n  upstream: %s\n  natgw:    %s", d.Step, d.What, d.Upstream, d.Natgw)
	}
	return explained
}

// explainer says which deliberate improvement (gwimage/README.md's table)
// explains a probe difference, given the scenario's model, or "".
type explainer func(p probe, up, ng string) string

// step runs c on both sides, compares verdicts, addresses and routes, then
// probes both and compares every probe. A probe that differs is run again
// on both sides before it counts (a lost first packet under load is not a
// difference).
func step(t *testing.T, ctx context.Context, up, ng *side, tl *tally, name string, c call, explain explainer) {
	t.Helper()
	var vu, vn verdict
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); vu = up.exec(ctx, c.argv(tl.form)) }()
	go func() { defer wg.Done(); vn = ng.exec(ctx, c.argv(tl.form)) }()
	wg.Wait()
	tl.mu.Lock()
	tl.calls++
	tl.mu.Unlock()
	label := fmt.Sprintf("%s: %s", name, strings.TrimPrefix(strings.TrimPrefix(c.line(), "bash /kube-ovn/nat-gateway.sh "), "bash /kube-ovn/"))
	if vu.OK() != vn.OK() {
		tl.add(difference{Step: label, What: "verdict", Upstream: fmt.Sprintf("exit %d stderr %q stdout %q", vu.Code, vu.Stderr, vu.Stdout), Natgw: fmt.Sprintf("exit %d stderr %q", vn.Code, vn.Stderr), Improvement: c.Improvement})
	}
	t.Logf("%s: upstream ok=%v (exit %d), natgw ok=%v (exit %d)", label, vu.OK(), vu.Code, vn.OK(), vn.Code)
	if lu, ln := up.links(t), ng.links(t); lu != ln {
		tl.add(difference{Step: label, What: "addresses/routes", Upstream: lu, Natgw: ln, Improvement: c.Improvement})
	}
	if tl.qos {
		qu, qn := up.qosClasses(ctx, t), ng.qosClasses(ctx, t)
		t.Logf("%s: rate classes: upstream %s; natgw %s", label, qu, qn)
		if qu != qn {
			tl.add(difference{Step: label, What: "rate classes", Upstream: qu, Natgw: qn, Improvement: c.Improvement})
		}
	}
	ps := probes()
	var ru, rn []string
	wg.Add(2)
	go func() { defer wg.Done(); ru = up.observe(ctx, ps) }()
	go func() { defer wg.Done(); rn = ng.observe(ctx, ps) }()
	wg.Wait()
	n := 2 * len(ps)
	answered := 0
	for i := range ru {
		if ru[i] != "fail" {
			answered++
		}
	}
	for i, p := range ps {
		if ru[i] == rn[i] {
			continue
		}
		// Again, both sides, up to three times with a longer timeout,
		// before it counts: neighbour entries of an address that just
		// came or went take a few seconds to settle (ARP retries) on
		// either gateway.
		// Both answered (with different sources): once is enough.
		for try := 0; try < 3 && ru[i] != rn[i]; try++ {
			if try > 0 && ru[i] != "fail" && rn[i] != "fail" {
				break
			}
			time.Sleep(500 * time.Millisecond)
			n += 2
			wg.Add(2)
			go func() { defer wg.Done(); ru[i] = up.runTimeout(ctx, p, 3*probeTimeout) }()
			go func() { defer wg.Done(); rn[i] = ng.runTimeout(ctx, p, 3*probeTimeout) }()
			wg.Wait()
		}
		if ru[i] != rn[i] {
			d := difference{Step: label, What: "probe " + p.String(), Upstream: ru[i], Natgw: rn[i], Improvement: c.Improvement}
			if d.Improvement == "" && explain != nil {
				d.Improvement = explain(p, ru[i], rn[i])
			}
			if d.Improvement == "" {
				for _, s := range []*side{up, ng} {
					flows, err := netlab.ConntrackEntries(ctx, s.gw.GW)
					t.Logf("%s: %s gateway conntrack (%v):\n%v", label, s.name, err, flows)
				}
			}
			tl.add(d)
		}
	}
	tl.mu.Lock()
	tl.probes += n
	tl.answered += answered
	tl.mu.Unlock()
}

// model is the controller-side view of a gateway's objects: what valid
// IptablesEIP, IptablesFIPRule, IptablesDnatRule, IptablesSnatRule and
// VpcNatGateway routes exist. It generates the calls of valid lifecycles.
type model struct {
	eip    map[int]bool   // allocated EIPs (index into eips)
	use    map[int]string // "fip" or "nat" once used
	fip    map[int]int    // EIP -> VM
	dnat   map[dnatKey]int
	snat   []snatRule // in the order added
	routes map[string]bool
}

type dnatKey struct {
	eip, port int
	proto     string
}

type snatRule struct {
	eip  int
	cidr netip.Prefix
}

func newModel() *model {
	return &model{eip: map[int]bool{}, use: map[int]string{}, fip: map[int]int{}, dnat: map[dnatKey]int{}, routes: map[string]bool{}}
}

// snatCIDRs may overlap: the order they are matched in is one of the
// README's improvements.
var snatCIDRs = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("198.51.100.0/25"), netip.MustParsePrefix("198.51.100.11/32")}

var routeCIDRs = []string{"10.30.0.0/16", "10.31.0.0/16", "10.32.0.0/24"}

const routeNextHop = "198.51.100.12"

func (m *model) eipUsers(e int) int {
	n := 0
	if _, ok := m.fip[e]; ok {
		n++
	}
	for k := range m.dnat {
		if k.eip == e {
			n++
		}
	}
	for _, s := range m.snat {
		if s.eip == e {
			n++
		}
	}
	return n
}

func (m *model) vmHasFIP(v int) bool {
	for _, x := range m.fip {
		if x == v {
			return true
		}
	}
	return false
}

// next picks a random valid controller call and applies it to the model.
func (m *model) next(r *rand.Rand) call {
	var cands []func() call
	for e := range eips {
		switch {
		case !m.eip[e]:
			cands = append(cands, func() call {
				m.eip[e] = true
				return call{Op: "eip-add", Rules: []string{eips[e].String() + "/24"}}
			})
		case m.eipUsers(e) == 0:
			cands = append(cands, func() call {
				delete(m.eip, e)
				delete(m.use, e)
				return call{Op: "eip-del", Rules: []string{eips[e].String() + "/24"}}
			})
		}
		if !m.eip[e] {
			continue
		}
		if m.use[e] == "" {
			for v := range vms {
				if !m.vmHasFIP(v) {
					cands = append(cands, func() call {
						m.fip[e], m.use[e] = v, "fip"
						return call{Op: "floating-ip-add", Rules: []string{fmt.Sprintf("%s,%s", eips[e], vms[v])}}
					})
				}
			}
		}
		if v, ok := m.fip[e]; ok {
			cands = append(cands,
				func() call {
					delete(m.fip, e)
					delete(m.use, e)
					return call{Op: "floating-ip-del", Rules: []string{eips[e].String()}}
				},
				func() call { // the controller re-adds on a resync: a repeated add
					return call{Op: "floating-ip-add", Rules: []string{fmt.Sprintf("%s,%s", eips[e], vms[v])}}
				})
		}
		if m.use[e] == "" || m.use[e] == "nat" {
			for _, port := range ports {
				for _, pr := range protos {
					k := dnatKey{e, port, pr}
					if _, ok := m.dnat[k]; ok {
						continue
					}
					v := r.IntN(len(vms))
					cands = append(cands, func() call {
						m.dnat[k], m.use[e] = v, "nat"
						return call{Op: "dnat-add", Rules: []string{fmt.Sprintf("%s,%d,%s,%s,%d", eips[e], port, pr, vms[v], serverPort)}}
					})
				}
			}
			for _, c := range snatCIDRs {
				if slices.ContainsFunc(m.snat, func(s snatRule) bool { return s.cidr == c && s.eip == e }) {
					continue
				}
				cands = append(cands, func() call {
					m.snat = append(m.snat, snatRule{e, c})
					m.use[e] = "nat"
					return call{Op: "snat-add", Rules: []string{fmt.Sprintf("%s,%s,--random-fully", eips[e], c)}}
				})
			}
		}
	}
	for _, k := range m.dnatKeys() {
		v := m.dnat[k]
		cands = append(cands, func() call {
			delete(m.dnat, k)
			m.unuse(k.eip)
			rule := fmt.Sprintf("%s,%d,%s", eips[k.eip], k.port, k.proto)
			if r.IntN(2) == 0 { // the five-field form (v1.13-v1.15 controllers)
				rule += fmt.Sprintf(",%s,%d", vms[v], serverPort)
			}
			return call{Op: "dnat-del", Rules: []string{rule}}
		})
	}
	for i, s := range m.snat {
		cands = append(cands, func() call {
			m.snat = slices.Delete(slices.Clone(m.snat), i, i+1)
			m.unuse(s.eip)
			return call{Op: "snat-del", Rules: []string{fmt.Sprintf("%s,%s", eips[s.eip], s.cidr)}}
		})
	}
	var free []string
	for _, c := range routeCIDRs {
		if m.routes[c] {
			cands = append(cands, func() call {
				delete(m.routes, c)
				return call{Op: "subnet-route-del", Rules: []string{c}}
			})
		} else {
			free = append(free, c)
		}
	}
	if len(free) > 0 {
		cands = append(cands, func() call { // several routes per call, as the controller sends them
			n := 1 + r.IntN(len(free))
			var rules []string
			for _, c := range free[:n] {
				m.routes[c] = true
				rules = append(rules, c+","+routeNextHop)
			}
			return call{Op: "subnet-route-add", Rules: rules}
		})
	}
	return cands[r.IntN(len(cands))]()
}

// dnatKeys returns the DNATs' keys in a fixed order (the same seed makes
// the same sequence).
func (m *model) dnatKeys() []dnatKey {
	keys := make([]dnatKey, 0, len(m.dnat))
	for k := range m.dnat {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b dnatKey) int { return strings.Compare(fmt.Sprint(a), fmt.Sprint(b)) })
	return keys
}

func (m *model) unuse(e int) {
	if m.eipUsers(e) == 0 && m.use[e] == "nat" {
		delete(m.use, e)
	}
}

// teardown returns the next call that deletes what is left, in the
// controller's order (rules before their EIPs), and applies it to the
// model; ok is false when nothing is left.
func (m *model) teardown() (c call, ok bool) {
	for e := range eips {
		if _, ok := m.fip[e]; ok {
			delete(m.fip, e)
			delete(m.use, e)
			return call{Op: "floating-ip-del", Rules: []string{eips[e].String()}}, true
		}
	}
	if keys := m.dnatKeys(); len(keys) > 0 {
		k := keys[0]
		delete(m.dnat, k)
		return call{Op: "dnat-del", Rules: []string{fmt.Sprintf("%s,%d,%s", eips[k.eip], k.port, k.proto)}}, true
	}
	if len(m.snat) > 0 {
		s := m.snat[0]
		m.snat = slices.Clone(m.snat[1:])
		return call{Op: "snat-del", Rules: []string{fmt.Sprintf("%s,%s", eips[s.eip], s.cidr)}}, true
	}
	for _, c := range routeCIDRs {
		if m.routes[c] {
			delete(m.routes, c)
			return call{Op: "subnet-route-del", Rules: []string{c}}, true
		}
	}
	for e := range eips {
		if m.eip[e] {
			delete(m.eip, e)
			delete(m.use, e)
			return call{Op: "eip-del", Rules: []string{eips[e].String() + "/24"}}, true
		}
	}
	return call{}, false
}

// explain: the README's improvements, judged from the model.
func (m *model) explain(p probe, up, ng string) string {
	if p.From == "ext" {
		return ""
	}
	v, _ := strconv.Atoi(strings.TrimPrefix(p.From, "vm"))
	vm := vms[v-1]
	if p.To.Addr() != netlab.ExtAddr {
		if up == "fail" && strings.HasPrefix(ng, "ok") {
			return "hairpin NAT"
		}
		return ""
	}
	if m.vmHasFIP(v-1) || !strings.HasPrefix(up, "ok") || !strings.HasPrefix(ng, "ok") {
		return ""
	}
	// Upstream: the first SNAT added that covers the VM; natgw: the
	// longest prefix.
	var first, longest *snatRule
	for i, s := range m.snat {
		if !s.cidr.Contains(vm) {
			continue
		}
		if first == nil {
			first = &m.snat[i]
		}
		if longest == nil || s.cidr.Bits() > longest.cidr.Bits() {
			longest = &m.snat[i]
		}
	}
	if first != nil && longest != nil && first.eip != longest.eip &&
		strings.Contains(up, "source="+eips[first.eip].String()+" ") && strings.Contains(ng, "source="+eips[longest.eip].String()+" ") {
		return "CIDR SNAT longest-prefix-first"
	}
	return ""
}

// fixed is the scripted scenario: a gateway's life as kube-ovn-controller
// v1.16.2 drives it, with the calls it makes on resyncs and on conflicting
// objects, and calls upstream's script refuses.
func fixed() []call {
	e := func(i int) string { return eips[i].String() }
	v := func(i int) string { return vms[i].String() }
	return []call{
		{Op: "init", Rules: []string{""}, Note: "pod ready: init with no rules"},
		{Op: "get-iptables-version", Note: "the controller decides on --random-fully"},
		{Op: "init", Rules: []string{"eth0,net1"}, Note: "non-primary CNI mode: interface names"},
		{Op: "init", Rules: []string{"eth0,nosuch0"}, Note: "an interface that is not there"},
		{Op: "init", Rules: []string{""}},
		{Op: "eip-add", Rules: []string{e(0) + "/24"}, Note: "IptablesEIP: address, gratuitous ARP, default route from GATEWAY_V4"},
		{Op: "eip-add", Rules: []string{e(1) + "/24"}},
		{Op: "eip-add", Rules: []string{e(2) + "/24"}},
		{Op: "eip-add", Rules: []string{e(2) + "/24"}, Note: "repeated"},
		{Op: "floating-ip-add", Rules: []string{e(0) + "," + v(0)}, Note: "IptablesFIPRule"},
		{Op: "floating-ip-add", Rules: []string{e(0) + "," + v(0)}, Note: "repeated add: 0"},
		{Op: "floating-ip-add", Rules: []string{e(0) + "," + v(1)}, Note: "EIP bound to another internal IP: 1"},
		{Op: "dnat-add", Rules: []string{e(1) + ",8080,tcp," + v(1) + ",80"}, Note: "IptablesDnatRule"},
		{Op: "dnat-add", Rules: []string{e(1) + ",80,udp," + v(2) + ",80"}},
		{Op: "dnat-add", Rules: []string{e(1) + ",8080,tcp," + v(1) + ",80"}, Note: "repeated add: 0"},
		{Op: "dnat-add", Rules: []string{e(1) + ",8080,tcp," + v(2) + ",80"}, Note: "identity bound elsewhere: 1"},
		{Op: "dnat-add", Rules: []string{e(1) + ",9000,sctp," + v(1) + ",9000"}, Note: "sctp (verdict only: this kernel has no SCTP sockets to probe with)"},
		{Op: "dnat-add", Rules: []string{e(1) + ",9000,sctp," + v(1) + ",9000"}, Note: "repeated add: 0"},
		{Op: "dnat-del", Rules: []string{e(1) + ",9000,sctp"}},
		{Op: "snat-add", Rules: []string{e(2) + ",198.51.100.0/24,--random-fully"}, Note: "IptablesSnatRule (iptables above 1.6.2)"},
		{Op: "snat-add", Rules: []string{e(2) + ",198.51.100.0/24,--random-fully"}, Note: "repeated add: 0"},
		{Op: "eip-add", Rules: []string{e(3) + "/24"}},
		{Op: "snat-add", Rules: []string{e(3) + ",198.51.100.0/24"}, Note: "a second SNAT of the CIDR: accepted, the first matches"},
		{Op: "snat-del", Rules: []string{e(2) + ",198.51.100.0/24"}, Note: "the second one matches now"},
		{Op: "snat-add", Rules: []string{e(2) + ",198.51.100.0/24,--random-fully"}, Note: "behind the other one"},
		{Op: "snat-del", Rules: []string{e(3) + ",198.51.100.0/24"}},
		{Op: "subnet-route-add", Rules: []string{"10.30.0.0/16," + routeNextHop, "10.31.0.0/33," + routeNextHop}, Note: "a good rule then a bad one: both fail; upstream keeps the first route, natgw programs nothing",
			Improvement: "a call is one transaction"},
		{Op: "subnet-route-add", Rules: []string{"10.30.0.0/16," + routeNextHop, "10.31.0.0/16," + routeNextHop}, Note: "VpcNatGateway routes, several per call"},
		{Op: "subnet-route-del", Rules: []string{"10.30.0.0/16"}},
		{Op: "subnet-route-del", Rules: []string{"10.30.0.0/16"}, Note: "a route that is not there: ip route del fails"},
		{Op: "dnat-del", Rules: []string{e(1) + ",8080,tcp"}, Note: "v1.16: three fields"},
		{Op: "dnat-del", Rules: []string{e(1) + ",80,udp," + v(2) + ",80"}, Note: "v1.13-v1.15: five fields"},
		{Op: "dnat-del", Rules: []string{e(1) + ",80,udp"}, Note: "already gone: 0"},
		{Op: "floating-ip-del", Rules: []string{e(0)}, Note: "v1.16: EIP only"},
		{Op: "floating-ip-del", Rules: []string{e(0)}, Note: "already gone: 0"},
		{Op: "snat-del", Rules: []string{e(2) + ",198.51.100.0/24"}},
		{Op: "subnet-route-del", Rules: []string{"10.31.0.0/16"}},
		{Op: "eip-del", Rules: []string{e(0) + "/24"}},
		{Op: "eip-del", Rules: []string{e(1) + "/24"}},
		{Op: "eip-del", Rules: []string{e(2) + "/24"}},
		{Op: "eip-del", Rules: []string{e(2) + "/24"}, Note: "already gone: 0"},
		{Op: "eip-del", Rules: []string{e(3) + "/24"}},
		{Op: "explode", Note: "unknown subcommand"},
		{Op: "dnat-add", Rules: []string{e(1) + ",99999,tcp," + v(1) + ",80"}, Note: "malformed rule"},
	}
}

// startRun skips t without root or network namespaces; else it brings up
// both sides with their probe servers under a context that ends after
// budget (or with the test), and returns them with an empty tally.
func startRun(t *testing.T, budget time.Duration, form execForm) (context.Context, *side, *side, *tally) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, chroot, mounts)")
	}
	if reason := netlab.Unavailable(); reason != "" {
		t.Skip(reason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	t.Cleanup(cancel)
	up, ng := newSides(t, ctx)
	up.startServers(t, ctx)
	ng.startServers(t, ctx)
	return ctx, up, ng, &tally{form: form}
}

// TestAgainstUpstream is the differential test (gwimage/README.md): upstream
// v1.16.2's nat-gateway.sh and natgw's image, side by side, call for call.
func TestAgainstUpstream(t *testing.T) {
	start := time.Now()
	ctx, up, ng, tl := startRun(t, timeBudget+5*time.Minute, formBashC)

	nFixed := 0
	if os.Getenv("NATGW_DIFFTEST_FIXED") != "0" {
		for i, c := range fixed() {
			step(t, ctx, up, ng, tl, fmt.Sprintf("fixed %02d", i+1), c, nil)
			nFixed++
		}
	}
	generated := 0
	seeds := seedsFromEnv(t)
	for _, seed := range seeds {
		r := rand.New(rand.NewPCG(seed, 0x6e6174677721))
		m := newModel()
		step(t, ctx, up, ng, tl, fmt.Sprintf("seed %d init", seed), call{Op: "init", Rules: []string{""}}, nil)
		for i := 0; i < randomSteps && time.Since(start) < timeBudget; i++ {
			step(t, ctx, up, ng, tl, fmt.Sprintf("seed %d step %02d", seed, i+1), m.next(r), m.explain)
			generated++
		}
		for i := 1; ; i++ {
			c, ok := m.teardown()
			if !ok {
				break
			}
			step(t, ctx, up, ng, tl, fmt.Sprintf("seed %d teardown %02d", seed, i), c, m.explain)
		}
	}
	explained := tl.report(t)
	testsummary.Record(t, fmt.Sprintf("DIFFTEST-SUMMARY script=nat-gateway.sh upstream=%s@%s calls=%d (fixed %d, generated %d over seeds %v) probes=%d answered=%d differences=%d explained=%d unexplained=%d elapsed=%s cpus=%d",
		upstream.Module, upstream.Version, tl.calls, nFixed, generated, seeds, tl.probes, tl.answered, len(tl.differences), explained, len(tl.differences)-explained, time.Since(start).Round(time.Second), runtime.NumCPU()))
}

// lbSvc is the LoadBalancer-Service pods' life (service_lb.go): init, the
// Service's EIPs with the external gateway, DNATs of its ports to the
// cluster IP side, deletes, a gateway that does not answer ARP, an unknown
// subcommand. Each call as the controller builds it (trailing blank kept).
func lbSvc() []call {
	e := func(i int) string { return eips[i].String() }
	v := func(i int) string { return vms[i].String() }
	lb := func(op string, rules ...string) call {
		if len(rules) == 0 {
			rules = []string{""}
		}
		return call{Script: "lb-svc.sh", Op: op, Rules: rules}
	}
	return []call{
		lb("init"),
		lb("init"),
		lb("eip-add", e(0)+"/24,"+gatewayV4),
		lb("dnat-add", e(0)+",80,tcp,"+v(0)+",80,"+v(0)),
		lb("dnat-add", e(0)+",80,tcp,"+v(0)+",80,"+v(0)),
		lb("dnat-add", e(0)+",8080,udp,"+v(1)+",80,"+v(1)),
		lb("eip-add", e(1)+"/24,"+gatewayV4),
		lb("dnat-add", e(1)+",80,tcp,"+v(2)+",80,"+v(2), e(1)+",80,udp,"+v(2)+",80,"+v(2)),
		lb("dnat-del", e(0)+",80,tcp,"+v(0)+",80"),
		lb("dnat-del", e(0)+",80,tcp,"+v(0)+",80"),
		lb("dnat-del", e(1)+",80,udp,"+v(2)+",80"),
		lb("eip-add", e(2)+"/24,192.0.2.99"),
		lb("explode"),
		// A good rule then a malformed one: upstream's script applies the
		// first and (its masquerade being there already) ends with
		// success without reading the second; natgw checks every rule
		// first, fails the call and applies none (README: a call is one
		// transaction).
		func() call {
			c := lb("dnat-add", e(1)+",8080,tcp,"+v(0)+",80,"+v(0), e(1)+",99999,tcp,"+v(0)+",80,"+v(0))
			c.Improvement = "a call is one transaction"
			return c
		}(),
	}
}

// TestLBSvcAgainstUpstream: upstream v1.16.2's lb-svc.sh and natgw's image,
// side by side, call for call, with the same probes as TestAgainstUpstream.
func TestLBSvcAgainstUpstream(t *testing.T) {
	start := time.Now()
	ctx, up, ng, tl := startRun(t, 5*time.Minute, formBashC)
	for i, c := range lbSvc() {
		step(t, ctx, up, ng, tl, fmt.Sprintf("lb-svc %02d", i+1), c, nil)
	}
	explained := tl.report(t)
	testsummary.Record(t, fmt.Sprintf("DIFFTEST-SUMMARY script=lb-svc.sh upstream=%s@%s calls=%d probes=%d answered=%d differences=%d explained=%d unexplained=%d elapsed=%s",
		upstream.Module, upstream.Version, tl.calls, tl.probes, tl.answered, len(tl.differences), explained, len(tl.differences)-explained, time.Since(start).Round(time.Second)))
}

// TestAgainstUpstreamArgv: the fixed scenario and lb-svc.sh's calls again,
// exec'd in Kube-OVN master's argv form (["bash", "/kube-ovn/SCRIPT", OP,
// RULE...], no -c) on both sides: upstream v1.16.2's scripts (master's are
// not served by the module proxy) and natgw's image must still agree call
// for call. Each script gets gateways of its own, as each runs in
// pods of its own (a NAT gateway's iptables-legacy tables would make
// lb-svc.sh's iptables-save warn).
func TestAgainstUpstreamArgv(t *testing.T) {
	for _, tc := range []struct {
		script string
		calls  func() []call
	}{
		{"nat-gateway.sh", fixed},
		{"lb-svc.sh", lbSvc},
	} {
		t.Run(tc.script, func(t *testing.T) {
			start := time.Now()
			ctx, up, ng, tl := startRun(t, 5*time.Minute, formArgv)
			for i, c := range tc.calls() {
				step(t, ctx, up, ng, tl, fmt.Sprintf("argv %02d", i+1), c, nil)
			}
			explained := tl.report(t)
			testsummary.Record(t, fmt.Sprintf("DIFFTEST-SUMMARY script=%s form=argv upstream=%s@%s calls=%d probes=%d answered=%d differences=%d explained=%d unexplained=%d elapsed=%s",
				tc.script, upstream.Module, upstream.Version, tl.calls, tl.probes, tl.answered, len(tl.differences), explained, len(tl.differences)-explained, time.Since(start).Round(time.Second)))
		})
	}
}
