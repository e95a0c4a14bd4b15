package ha_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/ha"
	"github.com/natgw/natgw/nat/ha/ctsync"
	"github.com/natgw/natgw/nat/ha/leasefence"
	"github.com/natgw/natgw/nat/iptables"
	"github.com/natgw/natgw/nat/nattest"
	"github.com/natgw/natgw/nat/netns"
	"github.com/natgw/natgw/nat/nftables"
)

// agentEnv carries an agent's spec (JSON) to the re-executed test binary.
const agentEnv = "NATGW_HA_AGENT"

// agentSpec is what the lab hands one agent process.
type agentSpec struct {
	ID        string
	Local     netip.AddrPort
	Peer      netip.AddrPort
	EIPs      []netip.Prefix
	LanIPs    []netip.Prefix
	Interval  time.Duration
	Misses    int
	FencePath string
	// With Kubeconfig: the Lease fence (Lease "ns/name", LeaseTTL) on
	// that API server, and the agent runs in the host namespace (where
	// the API server listens) with the gateway's namespace NetNS.
	Kubeconfig, Lease, NetNS string
	LeaseTTL                 time.Duration
	// RulesFile, if set, gates leadership on that file
	// (ha.RulesSyncedFile).
	RulesFile string
}

// rulesReady is the lab agent's Config.RulesReady for a RulesFile.
func rulesReady(path string) func() error {
	if path == "" {
		return nil
	}
	return ha.RulesSyncedFile(path)
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(agentEnv); spec != "" {
		os.Exit(runAgent(spec))
	}
	os.Exit(m.Run())
}

// runAgent is the agent process: one replica in the namespace it was
// started in (nsenter), reporting "ROLE <role> <unix ns> <reason>" and
// "STATS <json>" lines on stdout.
func runAgent(specJSON string) int {
	var s agentSpec
	if err := json.Unmarshal([]byte(specJSON), &s); err != nil {
		fmt.Fprintln(os.Stderr, "agent spec:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var mu sync.Mutex
	say := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", a...)
	}
	var fence ha.Fence = ha.SocketFence{Path: s.FencePath}
	if s.Kubeconfig != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
		if err == nil {
			ns, name, _ := strings.Cut(s.Lease, "/")
			fence, err = leasefence.ForConfig(rc, ns, name)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "agent lease fence:", err)
			return 2
		}
	}
	r, err := ha.New(ha.Config{
		ID: s.ID, Local: s.Local, Peer: s.Peer, EIPs: s.EIPs, LanIPs: s.LanIPs, NetNS: s.NetNS, LeaseTTL: s.LeaseTTL,
		Interval: s.Interval, Misses: s.Misses, Fence: fence,
		RulesReady: rulesReady(s.RulesFile),
		Log: funcr.New(func(prefix, args string) {
			say("LOG %s %s", prefix, args)
		}, funcr.Options{Verbosity: 1}),
		OnRole: func(r ha.Role, reason string) {
			say("ROLE %s %d %s", r, time.Now().UnixNano(), reason)
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() {
		for ctx.Err() == nil {
			time.Sleep(200 * time.Millisecond)
			st := r.SenderStats()
			b, _ := json.Marshal(struct {
				Sent, Dump int64
				Lags       []time.Duration
				Recv       any
				Status     ha.Status
			}{st.Sent, st.DumpSent, st.LagSamples, r.ReceiverStats(), r.Status()})
			say("STATS %s", b)
		}
	}()
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// Lab addresses: the shared networks of netlab's standard topology, with
// two gateways. Each replica has its own address on each side; the EIPs
// and the lanIp float.
var (
	lanIP  = netip.PrefixFrom(netlab.GWVPCAddr, 24) // 198.51.100.1, the VPC's default route
	eipFIP = netlab.EIP(0)                          // 192.0.2.10 → vm1
	eipDN  = netlab.EIP(1)                          // 192.0.2.11 tcp 8080, udp 5353 → vm2
	eipSN  = netlab.EIP(2)                          // 192.0.2.12 SNAT 198.51.100.0/24
	vm1    = netlab.VMAddr(0)
	vm2    = netlab.VMAddr(1)
	// The IPv6 lab (labIPv6) adds netlab's dual-stack addresses: the
	// EIPs become dual-stack (their IPv6 addresses float beside the
	// IPv4 ones) and the lanIp gets its IPv6 address, the VMs' IPv6
	// default route.
	lanIP6 = netip.PrefixFrom(netlab.GWVPCAddr6, netlab.VPCNet6.Bits()) // 2001:db8:100::1/64
)

// labFamily is the address family of the lab's flows and probes.
type labFamily int

const (
	// labIPv4: the IPv4 topology, IPv4 objects, flows and probes.
	labIPv4 labFamily = 4
	// labIPv6: the same, dual-stack: the EIPs carry an IPv6 address
	// too, the same FIP, DNATs and SNAT exist in IPv6, and the flows and
	// probes are IPv6. (The replicas' own addresses, heartbeats and the
	// replication stream stay IPv4: the pods' internal network.)
	labIPv6 labFamily = 6
)

func (f labFamily) String() string {
	if f == labIPv6 {
		return "ipv6"
	}
	return "ipv4"
}

// famAddrs are the addresses of one family the flows and probes use.
type famAddrs struct {
	fip, dn, sn netip.Addr // the EIPs of the FIP, the DNATs and the SNAT
	vm1, vm2    netip.Addr
	ext         netip.Addr // the external host
	vpc         netip.Prefix
}

func (f labFamily) addrs() famAddrs {
	if f == labIPv6 {
		return famAddrs{fip: netlab.EIP6(0), dn: netlab.EIP6(1), sn: netlab.EIP6(2),
			vm1: netlab.VMAddr6(0), vm2: netlab.VMAddr6(1), ext: netlab.ExtAddr6, vpc: netlab.VPCNet6}
	}
	return famAddrs{fip: eipFIP, dn: eipDN, sn: eipSN, vm1: vm1, vm2: vm2, ext: netlab.ExtAddr, vpc: netlab.VPCNet}
}

const (
	haPort   = 7400
	echoPort = 7001
	udpPort  = 7002
)

type replica struct {
	name string
	ns   string
	ext  netip.Addr // own address on net1
	in   netip.Addr // own address on eth0
	// ext6 and in6: the own IPv6 addresses of the IPv6 lab (invalid in
	// the IPv4 one).
	ext6, in6 netip.Addr
	cmd       *exec.Cmd
	done      chan struct{}
	events    []roleEvent
	stats     agentStats
	logs      []string // the agent's last log lines
	// rulesFile is the agent's RulesFile (see agentSpec); "" for none.
	rulesFile string
	// gen counts the agent's starts (syncMark).
	gen int
}

type roleEvent struct {
	role   string
	at     time.Time
	reason string
}

type agentStats struct {
	Sent, Dump int64
	Lags       []time.Duration
	Recv       ctsync.ReceiverStats
	Status     ha.Status // the replica's counters (what its metrics export)
}

// waitStatus waits until replica i's reported Status satisfies ok.
func (h *haLab) waitStatus(i int, what string, ok func(ha.Status) bool, timeout time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		h.mu.Lock()
		st := h.r[i].stats.Status
		h.mu.Unlock()
		if ok(st) {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: status %+v after %s, want %s", h.r[i].name, st, timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type haLab struct {
	t testing.TB
	// kubeconfig, lease, leaseTTL: agents use the Lease fence (see
	// agentSpec) instead of the arbiter when kubeconfig is set.
	kubeconfig, lease string
	leaseTTL          time.Duration
	lab               *netlab.Lab
	ext, vm1          string
	vm2               string
	// fam is the family of the flows and probes; a the addresses they
	// use.
	fam      labFamily
	a        famAddrs
	r        [2]*replica
	fence    string // the arbiter's socket
	arbiter  *ha.Arbiter
	arbStop  context.CancelFunc
	interval time.Duration
	misses   int
	// objs are the NAT objects programmed on both replicas (newHALab).
	objs []nat.Object
	mu   sync.Mutex
}

// labPlaneEnv picks the data plane the lab programs in both replicas:
// "nftables" (the default) or "iptables" (iptables-legacy).
const labPlaneEnv = "NATGW_HA_PLANE"

// labPlane opens the data plane of $NATGW_HA_PLANE in the replica's
// namespace ns, without plumbing: the EIPs and the lanIp float, nat/ha adds
// them where it is active.
func labPlane(ctx context.Context, ns string) (nat.Dataplane, error) {
	switch p := nat.DataplaneName(os.Getenv(labPlaneEnv)); p {
	case "", nat.DataplaneNftables:
		return nftables.New(ctx, nat.Config{NetNS: ns}, nftables.WithoutPlumbing())
	case nat.DataplaneIptables:
		return iptables.New(ctx, nat.Config{NetNS: ns}, iptables.WithoutPlumbing())
	default:
		return nil, fmt.Errorf("%s=%q: want %q or %q", labPlaneEnv, p, nat.DataplaneNftables, nat.DataplaneIptables)
	}
}

// labIntervalEnv sets the lab replicas' heartbeat interval (a Go duration).
const labIntervalEnv = "NATGW_HA_INTERVAL"

// labInterval is the lab's heartbeat interval: $NATGW_HA_INTERVAL, else
// 100 ms for the correctness tests, twice the product's default, so that a
// loop turn made late by a loaded CI machine (make test runs two packages
// at once on 2 cores) does not break the timing margins the tests check;
// TestFailoverFigures measures at the product's 50 ms.
func labInterval(t testing.TB) time.Duration {
	if v := os.Getenv(labIntervalEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", labIntervalEnv, v, err)
		}
		return d
	}
	return 100 * time.Millisecond
}

// labLeaseEnv sets the lab replicas' lease (a Go duration; default
// ha.DefaultLeaseTTL of the lab's interval), to measure other timings.
const labLeaseEnv = "NATGW_HA_LEASE"

func labLease(t testing.TB) time.Duration {
	v := os.Getenv(labLeaseEnv)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", labLeaseEnv, v, err)
	}
	return d
}

// newHALab builds:
//
//	ext ─┐                         ┌─ vm1 (198.51.100.10)
//	     xsw br0 ─ net1 gwa eth0 ─ isw br0
//	             ─ net1 gwb eth0 ─        └─ vm2 (198.51.100.11)
//
// and programs the same FIP, DNAT (tcp, udp) and SNAT on both gateways
// through the data plane of labPlane (no addresses: the replicas own
// them). With labIPv6 every namespace also has its IPv6 address of
// netlab's dual-stack topology (the VMs an IPv6 default route via the
// lanIp's IPv6 address), the EIPs are dual-stack and the FIP, DNATs and
// SNAT are programmed in IPv6 as well.
func newHALab(t testing.TB, fam labFamily) *haLab {
	t.Helper()
	lab := netlab.ForTest(t)
	ctx := context.Background()
	h := &haLab{t: t, lab: lab, fence: filepath.Join(t.TempDir(), "arbiter.sock"), arbiter: &ha.Arbiter{}, interval: labInterval(t), misses: 3,
		fam: fam, a: fam.addrs(), leaseTTL: labLease(t)}
	v6 := fam == labIPv6
	h.serveArbiter()
	t.Cleanup(func() { h.arbStop() })
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	ns := func(role string) string {
		n, err := lab.NS(role)
		must(err)
		return n
	}
	xsw, isw := ns("xsw"), ns("isw")
	h.ext, h.vm1, h.vm2 = ns("ext"), ns("vm1"), ns("vm2")
	must(netlab.Bridge(xsw, "br0"))
	must(netlab.Bridge(isw, "br0"))
	port := func(sw, name string, e netlab.End) {
		must(netlab.Veth(e, netlab.End{NS: sw, Name: name}))
		must(netlab.Enslave(sw, name, "br0"))
	}
	// pfx gives an interface its IPv4 address and, in the IPv6 lab, its
	// IPv6 one (a6; invalid: none).
	pfx := func(a, a6 netip.Addr) []netip.Prefix {
		out := []netip.Prefix{netip.PrefixFrom(a, 24)}
		if v6 && a6.IsValid() {
			out = append(out, netip.PrefixFrom(a6, 64))
		}
		return out
	}
	if v6 {
		for _, n := range []string{h.ext, h.vm1, h.vm2} {
			must(netlab.IPv6Sysctls(n, false))
		}
	}
	port(xsw, "ext", netlab.End{NS: h.ext, Name: "eth0", Addrs: pfx(netlab.ExtAddr, netlab.ExtAddr6)})
	port(isw, "vm1", netlab.End{NS: h.vm1, Name: "eth0", Addrs: pfx(vm1, netlab.VMAddr6(0))})
	port(isw, "vm2", netlab.End{NS: h.vm2, Name: "eth0", Addrs: pfx(vm2, netlab.VMAddr6(1))})
	for _, vm := range []string{h.vm1, h.vm2} {
		must(netlab.AddRoute(vm, netip.MustParsePrefix("0.0.0.0/0"), netlab.GWVPCAddr, "eth0"))
		if v6 {
			must(netlab.AddRoute(vm, netip.MustParsePrefix("::/0"), netlab.GWVPCAddr6, "eth0"))
		}
	}
	objs := []nat.Object{
		nattest.EIP(nattest.UID(nat.KindEIP, 0), eipFIP),
		nattest.EIP(nattest.UID(nat.KindEIP, 1), eipDN),
		nattest.EIP(nattest.UID(nat.KindEIP, 2), eipSN),
		nattest.FIP(nattest.UID(nat.KindFIP, 0), eipFIP, vm1),
		nattest.DNAT(nattest.UID(nat.KindDNAT, 0), eipDN, nat.TCP, 8080, vm2, echoPort),
		nattest.DNAT(nattest.UID(nat.KindDNAT, 1), eipDN, nat.UDP, 5353, vm2, udpPort),
		nattest.SNAT(nattest.UID(nat.KindSNAT, 0), eipSN, netlab.VPCNet, false),
	}
	if v6 {
		a := h.a
		for i, e := range []netip.Addr{eipFIP, eipDN, eipSN} {
			objs[i] = nattest.DualEIP(nattest.UID(nat.KindEIP, i), e, netlab.EIP6(i))
		}
		objs = append(objs,
			nattest.FIP(nattest.UID(nat.KindFIP, 1), a.fip, a.vm1),
			nattest.DNAT(nattest.UID(nat.KindDNAT, 2), a.dn, nat.TCP, 8080, a.vm2, echoPort),
			nattest.DNAT(nattest.UID(nat.KindDNAT, 3), a.dn, nat.UDP, 5353, a.vm2, udpPort),
			nattest.SNAT(nattest.UID(nat.KindSNAT, 1), a.sn, a.vpc, false),
		)
	}
	for i, name := range []string{"gwa", "gwb"} {
		r := &replica{name: name, ns: ns(name),
			ext: netip.AddrFrom4([4]byte{192, 0, 2, byte(251 + i)}),
			in:  netip.AddrFrom4([4]byte{198, 51, 100, byte(2 + i)})}
		if v6 {
			r.ext6 = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 2, 15: byte(0xfb + i)})      // 2001:db8:2::fb, ::fc
			r.in6 = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0x01, 0, 0, 15: byte(2 + i)}) // 2001:db8:100::2, ::3
			must(netlab.IPv6Sysctls(r.ns, true))
		}
		port(xsw, name, netlab.End{NS: r.ns, Name: "net1", Addrs: pfx(r.ext, r.ext6)})
		port(isw, name, netlab.End{NS: r.ns, Name: "eth0", Addrs: pfx(r.in, r.in6)})
		must(netlab.Sysctl(r.ns, "net.ipv4.ip_forward", "1"))
		dp, err := labPlane(ctx, r.ns)
		must(err)
		must(dp.Apply(ctx, objs...))
		must(dp.Close())
		h.r[i] = r
	}
	h.objs = objs
	// The probe servers listen on the IPv4 wildcard and, in the IPv6
	// lab, on the host's IPv6 address.
	for _, s := range []struct {
		ns    string
		v6    netip.Addr
		uPort uint16 // a UDP echo server's port too (0: none)
	}{{h.vm1, netlab.VMAddr6(0), 0}, {h.vm2, netlab.VMAddr6(1), udpPort}, {h.ext, netlab.ExtAddr6, 0}} {
		addrs := []netip.Addr{netip.IPv4Unspecified()}
		if v6 {
			addrs = append(addrs, s.v6)
		}
		for _, a := range addrs {
			_, err := lab.ServeTCP(ctx, s.ns, netip.AddrPortFrom(a, echoPort).String())
			must(err)
			if s.uPort != 0 {
				_, err = lab.ServeUDP(ctx, s.ns, netip.AddrPortFrom(a, s.uPort).String())
				must(err)
			}
		}
	}
	t.Cleanup(func() {
		for _, r := range h.r {
			if r.cmd != nil && r.cmd.Process != nil {
				_ = r.cmd.Process.Signal(syscall.SIGCONT)
				_ = r.cmd.Process.Kill()
				<-r.done
			}
		}
	})
	return h
}

// serveArbiter (re)starts serving the lease on h.fence: the lab's
// stand-in for the API server holding a Lease.
func (h *haLab) serveArbiter() {
	h.t.Helper()
	ln, err := net.Listen("unix", h.fence)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = h.arbiter.Serve(ctx, ln) }()
	h.arbStop = func() { cancel(); <-done }
}

func (h *haLab) detection() time.Duration { return time.Duration(h.misses) * h.interval }

// start runs replica i's agent in its namespace.
func (h *haLab) start(i int) {
	h.t.Helper()
	r, peer := h.r[i], h.r[1-i]
	agentNS := "" // the agent runs in the gateway's namespace
	if h.kubeconfig != "" {
		agentNS = r.ns // the agent runs in the host's, the API server's
	}
	eips := []netip.Prefix{netip.PrefixFrom(eipFIP, 24), netip.PrefixFrom(eipDN, 24), netip.PrefixFrom(eipSN, 24)}
	lanIPs := []netip.Prefix{lanIP}
	if h.fam == labIPv6 {
		// A dual-stack EIP floats as its two prefixes.
		for _, a := range []netip.Addr{h.a.fip, h.a.dn, h.a.sn} {
			eips = append(eips, netip.PrefixFrom(a, 64))
		}
		lanIPs = append(lanIPs, lanIP6)
	}
	spec, _ := json.Marshal(agentSpec{
		ID: r.name, Local: netip.AddrPortFrom(r.in, haPort), Peer: netip.AddrPortFrom(peer.in, haPort),
		EIPs:     eips,
		LanIPs:   lanIPs,
		Interval: h.interval, Misses: h.misses, FencePath: h.fence,
		Kubeconfig: h.kubeconfig, Lease: h.lease, LeaseTTL: h.leaseTTL, NetNS: agentNS,
		RulesFile: r.rulesFile,
	})
	cmd := netlab.Command(context.Background(), r.ns, os.Args[0], "-test.run=^$")
	if h.kubeconfig != "" {
		cmd = exec.Command(os.Args[0], "-test.run=^$")
	}
	cmd.Env = append(os.Environ(), agentEnv+"="+string(spec))
	cmd.Stderr = &prefixWriter{t: h.t, prefix: r.name + ": "}
	out, err := cmd.StdoutPipe()
	if err != nil {
		h.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		h.t.Fatalf("start agent %s: %v", r.name, err)
	}
	r.cmd, r.done = cmd, make(chan struct{})
	h.mu.Lock()
	r.gen++
	h.mu.Unlock()
	go func() {
		defer close(r.done)
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			f := strings.SplitN(sc.Text(), " ", 4)
			switch {
			case len(f) >= 3 && f[0] == "ROLE":
				ns, _ := strconv.ParseInt(f[2], 10, 64)
				ev := roleEvent{role: f[1], at: time.Unix(0, ns)}
				if len(f) == 4 {
					ev.reason = f[3]
				}
				h.mu.Lock()
				r.events = append(r.events, ev)
				h.mu.Unlock()
			case len(f) >= 2 && f[0] == "LOG":
				h.mu.Lock()
				r.logs = append(r.logs, sc.Text())
				if len(r.logs) > 40 {
					r.logs = r.logs[1:]
				}
				h.mu.Unlock()
				if os.Getenv("NATGW_HA_DEBUG") != "" {
					fmt.Fprintf(os.Stderr, "%s %s\n", r.name, sc.Text())
				}
			case len(f) >= 2 && f[0] == "STATS":
				var st agentStats
				if json.Unmarshal([]byte(strings.TrimPrefix(sc.Text(), "STATS ")), &st) == nil {
					h.mu.Lock()
					r.stats = st
					h.mu.Unlock()
				}
			}
		}
		_ = cmd.Wait()
	}()
}

type prefixWriter struct {
	t      testing.TB
	prefix string
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if l != "" {
			fmt.Fprintln(os.Stderr, w.prefix+l)
		}
	}
	return len(p), nil
}

// role returns replica i's last reported role ("standby" before any).
func (h *haLab) role(i int) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ev := h.r[i].events; len(ev) > 0 {
		return ev[len(ev)-1].role
	}
	return "standby"
}

func (h *haLab) activeAt(i int, since time.Time) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ev := range h.r[i].events {
		if ev.role == "active" && !ev.at.Before(since) {
			return ev.at, true
		}
	}
	return time.Time{}, false
}

// waitActive waits until exactly replica i reports active.
func (h *haLab) waitActive(i int, within time.Duration) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if h.role(i) == "active" && h.role(1-i) != "active" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.t.Fatalf("replica %s not the single active after %s (roles %s/%s)", h.r[i].name, within, h.role(0), h.role(1))
}

// soleActive waits until exactly one replica reports active and returns
// it.
func (h *haLab) soleActive(within time.Duration) int {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for {
		switch a, b := h.role(0) == "active", h.role(1) == "active"; {
		case a && !b:
			return 0
		case b && !a:
			return 1
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("not exactly one active after %s (roles %s/%s)", within, h.role(0), h.role(1))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// overlap returns how long both replicas reported active at the same time
// between from and to.
func (h *haLab) overlap(from, to time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	spans := func(evs []roleEvent) [][2]time.Time {
		var out [][2]time.Time
		var start time.Time
		on := false
		for _, ev := range evs {
			switch {
			case ev.role == "active" && !on:
				start, on = ev.at, true
			case ev.role != "active" && on:
				out = append(out, [2]time.Time{start, ev.at})
				on = false
			}
		}
		if on {
			out = append(out, [2]time.Time{start, to})
		}
		return out
	}
	var total time.Duration
	for _, a := range spans(h.r[0].events) {
		for _, b := range spans(h.r[1].events) {
			s := maxTime(a[0], b[0], from)
			e := minTime(a[1], b[1], to)
			if e.After(s) {
				total += e.Sub(s)
			}
		}
	}
	return total
}

func maxTime(ts ...time.Time) time.Time { return slices.MaxFunc(ts, time.Time.Compare) }

func minTime(ts ...time.Time) time.Time { return slices.MinFunc(ts, time.Time.Compare) }

// waitLeft waits (up to 5 s after since) until replica i is no longer
// active and returns its last role event.
func (h *haLab) waitLeft(i int, since time.Time, what string) roleEvent {
	h.t.Helper()
	for h.role(i) == "active" {
		if time.Since(since) > 5*time.Second {
			h.t.Fatalf("%s still active 5 s after %s", h.r[i].name, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.r[i].events[len(h.r[i].events)-1]
}

// flow is a long-running exchange through the gateway that records when
// each round trip completed.
type flow struct {
	name string
	mu   sync.Mutex
	done []time.Time
	err  error
	stop chan struct{}
	wg   sync.WaitGroup
}

func (f *flow) record(at time.Time) {
	f.mu.Lock()
	f.done = append(f.done, at)
	f.mu.Unlock()
}

func (f *flow) fail(err error) {
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
}

// firstAfter returns the first round trip completed after t.
func (f *flow) firstAfter(t time.Time) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range f.done {
		if d.After(t) {
			return d, true
		}
	}
	return time.Time{}, false
}

func (f *flow) close() error {
	close(f.stop)
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// tcpStream keeps echoing 32-byte messages over one TCP connection from ns
// to addr every 5 ms. Any error (a reset, 10 s without an answer) ends it.
func tcpStream(t testing.TB, name, ns, addr string) *flow {
	t.Helper()
	c, _, err := netlab.Connect(context.Background(), ns, addr, 3*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	f := &flow{name: name, stop: make(chan struct{})}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		defer c.Close()
		msg := []byte("0123456789abcdef0123456789abcde\n")
		buf := make([]byte, len(msg))
		// The probe server echoes what follows the first line.
		for i := 0; ; i++ {
			select {
			case <-f.stop:
				return
			default:
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(msg); err != nil {
				f.fail(fmt.Errorf("%s: write: %w", name, err))
				return
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				f.fail(fmt.Errorf("%s: read: %w", name, err))
				return
			}
			if string(buf) != string(msg) {
				f.fail(fmt.Errorf("%s: echo %q, want %q", name, buf, msg))
				return
			}
			f.record(time.Now())
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return f
}

// udpFlow sends a datagram from ns to addr (IPv4 or IPv6) every 5 ms over
// one socket (one conntrack entry) and records each answer.
func udpFlow(t testing.TB, name, ns, addr string) *flow {
	t.Helper()
	var c net.Conn
	network := "udp4"
	if ap, err := netip.ParseAddrPort(addr); err == nil && ap.Addr().Is6() {
		network = "udp6"
	}
	err := netns.Do(ns, func() error {
		var err error
		c, err = net.Dial(network, addr)
		return err
	})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	f := &flow{name: name, stop: make(chan struct{})}
	f.wg.Add(2)
	go func() {
		defer f.wg.Done()
		buf := make([]byte, 2048)
		for {
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := c.Read(buf); err != nil {
				select {
				case <-f.stop:
					return
				default:
				}
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue
				}
				continue // ICMP errors while a gateway is gone: keep going
			}
			f.record(time.Now())
		}
	}()
	go func() {
		defer f.wg.Done()
		defer c.Close()
		for {
			select {
			case <-f.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, _ = c.Write([]byte("probe\n"))
		}
	}()
	return f
}

// flows starts a TCP stream through the FIP, the DNAT and the SNAT and a
// UDP flow through the DNAT, in the lab's family, and waits until each
// moved data.
func (h *haLab) flows() []*flow {
	h.t.Helper()
	a := h.a
	fs := []*flow{
		tcpStream(h.t, "fip", h.ext, netip.AddrPortFrom(a.fip, echoPort).String()),
		tcpStream(h.t, "dnat", h.ext, netip.AddrPortFrom(a.dn, 8080).String()),
		tcpStream(h.t, "snat", h.vm2, netip.AddrPortFrom(a.ext, echoPort).String()),
		udpFlow(h.t, "udp-dnat", h.ext, netip.AddrPortFrom(a.dn, 5353).String()),
	}
	start := time.Now()
	for _, f := range fs {
		for {
			if _, ok := f.firstAfter(start); ok {
				break
			}
			if time.Since(start) > 5*time.Second {
				h.t.Fatalf("%s moved no data", f.name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return fs
}

// probeNew dials every EIP (and out through the SNAT), in the lab's
// family, with short attempts until each answers and returns when the
// last one first did.
func (h *haLab) probeNew(within time.Duration) (time.Time, error) {
	targets := []struct{ ns, addr string }{
		{h.ext, netip.AddrPortFrom(h.a.fip, echoPort).String()},
		{h.ext, netip.AddrPortFrom(h.a.dn, 8080).String()},
		{h.vm2, netip.AddrPortFrom(h.a.ext, echoPort).String()},
	}
	var mu sync.Mutex
	var last time.Time
	var errs []error
	var wg sync.WaitGroup
	for _, tg := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			deadline := time.Now().Add(within)
			for {
				_, err := netlab.Dial(context.Background(), tg.ns, tg.addr, 100*time.Millisecond)
				if err == nil {
					mu.Lock()
					last = maxTime(last, time.Now())
					mu.Unlock()
					return
				}
				if time.Now().After(deadline) {
					mu.Lock()
					errs = append(errs, fmt.Errorf("new connection to %s: %w", tg.addr, err))
					mu.Unlock()
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	return last, errors.Join(errs...)
}

// gaps is what one failover measured.
type gaps struct {
	newConn  time.Duration            // fault → a new connection to every EIP succeeded
	streams  map[string]time.Duration // fault → the flow moved data again
	takeover time.Duration            // fault → the new active reported
	at       time.Time                // the fault
	// marks are both replicas' syncMarks before the fault (settle).
	marks [2]syncMark
	// rulesLost is how many of the programmed objects the new active's
	// data plane did not hold as programmed once everything moved again
	// (rulesLost).
	rulesLost int
}

// failover applies fault to the active replica a and measures until the
// standby b leads and everything moves again.
func (h *haLab) failover(fs []*flow, a int, fault func()) gaps {
	h.t.Helper()
	b := 1 - a
	// Let replication settle: every flow's entry is on the standby.
	time.Sleep(4 * h.interval)
	if os.Getenv("NATGW_HA_DEBUG") != "" {
		for _, r := range h.r {
			out, _ := netlab.Exec(context.Background(), r.ns, "", "conntrack", "-L")
			fmt.Fprintf(os.Stderr, "== %s\n%s", r.name, out)
		}
	}
	marks := [2]syncMark{h.mark(0), h.mark(1)}
	t0 := time.Now()
	fault()
	// Measure through b: wait for its takeover (a stopped agent's kernel
	// may still forward for a while), then probe.
	g := gaps{streams: map[string]time.Duration{}, at: t0, marks: marks}
	for {
		if at, ok := h.activeAt(b, t0); ok {
			g.takeover = at.Sub(t0)
			break
		}
		if time.Since(t0) > 10*time.Second {
			h.t.Fatalf("%s did not take over within 10 s of the fault on %s", h.r[b].name, h.r[a].name)
		}
		time.Sleep(2 * time.Millisecond)
	}
	last, err := h.probeNew(10 * time.Second)
	if err != nil {
		h.t.Fatalf("after the fault on %s: %v", h.r[a].name, err)
	}
	g.newConn = last.Sub(t0)
	deadline := time.Now().Add(10 * time.Second)
	for _, f := range fs {
		for {
			if at, ok := f.firstAfter(t0.Add(g.takeover)); ok {
				g.streams[f.name] = at.Sub(t0)
				break
			}
			f.mu.Lock()
			ferr := f.err
			f.mu.Unlock()
			if ferr != nil {
				if os.Getenv("NATGW_HA_DEBUG") != "" {
					for _, r := range h.r {
						out, _ := netlab.Exec(context.Background(), r.ns, "", "conntrack", "-L")
						st, _ := netlab.Exec(context.Background(), r.ns, "", "conntrack", "-S")
						fmt.Fprintf(os.Stderr, "== after: %s\n%s%s", r.name, out, st)
					}
				}
				h.t.Fatalf("flow broken by the failover: %v", ferr)
			}
			if time.Now().After(deadline) {
				h.t.Fatalf("%s moved no data within 10 s of the fault", f.name)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	g.rulesLost = h.rulesLost(b)
	return g
}

func (g gaps) String() string {
	var s []string
	for _, k := range slices.Sorted(mapsKeys(g.streams)) {
		s = append(s, fmt.Sprintf("%s=%s", k, g.streams[k].Round(time.Millisecond)))
	}
	return fmt.Sprintf("takeover=%s newconn=%s rules lost=%d streams: %s", g.takeover.Round(time.Millisecond), g.newConn.Round(time.Millisecond), g.rulesLost, strings.Join(s, " "))
}

func mapsKeys[M ~map[K]V, K comparable, V any](m M) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func (h *haLab) kill(i int) {
	r := h.r[i]
	_ = r.cmd.Process.Signal(syscall.SIGCONT)
	_ = r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
	h.mu.Lock()
	r.events = append(r.events, roleEvent{role: "dead", at: time.Now()})
	h.mu.Unlock()
}

// floating returns the floating addresses (IPv4 and IPv6) replica i's
// namespace holds.
func (h *haLab) floating(i int) []netip.Prefix {
	h.t.Helper()
	r := h.r[i]
	var out []netip.Prefix
	for _, dev := range []string{"net1", "eth0"} {
		for _, list := range []func(ns, dev string) ([]netip.Prefix, error){netlab.Addrs, netlab.Addrs6} {
			as, err := list(r.ns, dev)
			if err != nil {
				h.t.Fatal(err)
			}
			for _, a := range as {
				if own := []netip.Addr{r.ext, r.in, r.ext6, r.in6}; !slices.Contains(own, a.Addr()) {
					out = append(out, a)
				}
			}
		}
	}
	return out
}

// rulesLost counts the objects programmed on the replicas (h.objs) that
// replica i's data plane no longer holds as programmed (missing, or with
// another spec), read back from its kernel by a data plane opened for the
// purpose (labPlane).
func (h *haLab) rulesLost(i int) int {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dp, err := labPlane(ctx, h.r[i].ns)
	if err != nil {
		h.t.Fatalf("read %s's rules: %v", h.r[i].name, err)
	}
	defer dp.Close()
	held, err := dp.List(ctx)
	if err != nil {
		h.t.Fatalf("list %s's rules: %v", h.r[i].name, err)
	}
	byUID := make(map[string]nat.Object, len(held))
	for _, o := range held {
		byUID[o.UID] = o
	}
	lost := 0
	for _, o := range h.objs {
		if got, ok := byUID[o.UID]; !ok || !got.Equal(o) {
			lost++
		}
	}
	return lost
}

func closeFlows(t testing.TB, fs []*flow) {
	t.Helper()
	for _, f := range fs {
		if err := f.close(); err != nil {
			t.Errorf("flow %s: %v", f.name, err)
		}
	}
}
