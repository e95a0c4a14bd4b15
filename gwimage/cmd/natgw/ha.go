//go:build !natgw_omit_ha

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/natgw/natgw/nat"
	"github.com/natgw/natgw/nat/ha"
	"github.com/natgw/natgw/nat/ha/kuberest"
	"github.com/natgw/natgw/nat/ha/leasefence"
	"github.com/natgw/natgw/nat/planes"
)

// prefixList is a repeatable flag of address/length values (also
// comma-separated).
type prefixList []netip.Prefix

func (p *prefixList) String() string {
	var s []string
	for _, x := range *p {
		s = append(s, x.String())
	}
	return strings.Join(s, ",")
}

func (p *prefixList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		x, err := netip.ParsePrefix(strings.TrimSpace(f))
		if err != nil {
			return fmt.Errorf("%q: want an IPv4 or IPv6 address/length", f)
		}
		*p = append(*p, x)
	}
	return nil
}

// haFlags are the flags of `natgw ha`.
type haFlags struct {
	id, local, peer        string
	eips, lanIPs           prefixList
	interval, lease        time.Duration
	misses                 int
	fenceSocket, fenceFile string
	fenceLease, kubeconfig string
	metricsAddr            string
	eipsFromDataplane      bool
	eipsPoll               time.Duration
	peerSibling            string
	rulesSyncedFile        string
}

// siblingPod returns the name of the other pod of a two-replica
// StatefulSet: the pod id with the ordinal 0 and 1 swapped.
func siblingPod(id string) (string, error) {
	base, ord, ok := cutLast(id, "-")
	switch {
	case !ok || base == "":
		return "", fmt.Errorf("--id %q: --peer-sibling wants a StatefulSet pod name ending in -0 or -1", id)
	case ord == "0":
		return base + "-1", nil
	case ord == "1":
		return base + "-0", nil
	}
	return "", fmt.Errorf("--id %q: --peer-sibling wants a StatefulSet pod name ending in -0 or -1 (a two-replica gateway)", id)
}

func cutLast(s, sep string) (string, string, bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// restConfig is the API server's configuration of --kubeconfig (empty: the
// pod's in-cluster one); flag names the option that needs it.
func (f *haFlags) restConfig(flag string) (*rest.Config, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	if err != nil {
		if f.kubeconfig == "" {
			return nil, fmt.Errorf("%s: no --kubeconfig and no in-cluster config: %w", flag, err)
		}
		return nil, fmt.Errorf("--kubeconfig %q: %w", f.kubeconfig, err)
	}
	return rc, nil
}

// siblingPeer follows the address of the sibling pod (--peer-sibling): it
// reads the pod from the API server every period and hands a new address
// (its status.podIP, port the local one) to the replica. The API server is
// only how the address is learnt, not the detector: the heartbeats go to
// the pod directly, and an API server that is gone keeps the last address.
type siblingPeer struct {
	pods      podGetter
	ns, name  string
	port      uint16
	log       logr.Logger
	setPeer   func(netip.AddrPort) error
	lastError string
}

// podGetter reads a pod namespace/name (kuberest.Resource of "pods").
type podGetter interface {
	Get(ctx context.Context, namespace, name string) (*corev1.Pod, error)
}

// read returns the sibling's address, zero when it has none yet (not
// created, not scheduled, or a non-IPv4 address).
func (s *siblingPeer) read(ctx context.Context) (netip.AddrPort, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	pod, err := s.pods.Get(ctx, s.ns, s.name)
	if apierrors.IsNotFound(err) {
		return netip.AddrPort{}, nil
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("get pod %s/%s: %w", s.ns, s.name, err)
	}
	for _, v := range append([]string{pod.Status.PodIP}, podIPs(pod)...) {
		if a, err := netip.ParseAddr(v); err == nil && a.Is4() {
			return netip.AddrPortFrom(a, s.port), nil
		}
	}
	return netip.AddrPort{}, nil
}

func podIPs(p *corev1.Pod) []string {
	var out []string
	for _, ip := range p.Status.PodIPs {
		out = append(out, ip.IP)
	}
	return out
}

// follow reads the sibling every period until ctx ends.
func (s *siblingPeer) follow(ctx context.Context, last netip.AddrPort, period time.Duration) {
	poll(ctx, period, func() {
		cur, err := s.read(ctx)
		if err != nil {
			if ctx.Err() == nil && err.Error() != s.lastError {
				s.log.Error(err, "reading the sibling pod's address; keeping the last one", "peer", last.String())
			}
			s.lastError = err.Error()
			return
		}
		s.lastError = ""
		if !cur.IsValid() || cur == last {
			return
		}
		if err := s.setPeer(cur); err != nil {
			s.log.Error(err, "sibling address refused", "peer", cur.String())
			return
		}
		last = cur
	})
}

// poll calls fn every period until ctx ends.
func poll(ctx context.Context, period time.Duration, fn func()) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		fn()
	}
}

// leaseFence returns the Lease fence of --fence-lease NAMESPACE/NAME, with
// the API server of --kubeconfig (empty: the pod's in-cluster config).
func (f *haFlags) leaseFence() (ha.Fence, error) {
	ns, name, ok := strings.Cut(f.fenceLease, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return nil, fmt.Errorf("--fence-lease %q: want NAMESPACE/NAME", f.fenceLease)
	}
	rc, err := f.restConfig("--fence-lease")
	if err != nil {
		return nil, err
	}
	fence, err := leasefence.ForConfig(rc, ns, name)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig %q: %w", f.kubeconfig, err)
	}
	return fence, nil
}

// haConfig checks the flags and returns the replica's configuration; the
// error names the flag and the value.
func (f *haFlags) haConfig(g *globals) (ha.Config, error) {
	cfg := ha.Config{ID: f.id, NetNS: g.netns, ExternalInterface: g.extIface, InternalInterface: g.intIface,
		EIPs: f.eips, LanIPs: f.lanIPs, Interval: f.interval, Misses: f.misses, LeaseTTL: f.lease}
	if f.rulesSyncedFile != "" {
		cfg.RulesReady = ha.RulesSyncedFile(f.rulesSyncedFile)
	}
	lease := f.lease
	if lease == 0 {
		lease = ha.DefaultLeaseTTL(f.interval, f.misses)
	}
	if err := ha.CheckTiming(f.interval, f.misses, lease); err != nil {
		var te *ha.TimingError
		if errors.As(err, &te) {
			flag := map[string]string{"interval": "--interval", "misses": "--misses", "leaseTTL": "--lease"}[te.Field]
			return cfg, fmt.Errorf("%s %s: want %s", flag, te.Value, te.Want)
		}
		return cfg, err
	}
	var err error
	if cfg.Local, err = netip.ParseAddrPort(f.local); err != nil {
		return cfg, fmt.Errorf("--local %q: want ip:port (this replica's own internal address)", f.local)
	}
	switch {
	case f.peer != "" && f.peerSibling != "":
		return cfg, fmt.Errorf("--peer %q and --peer-sibling %q: give one", f.peer, f.peerSibling)
	case f.peerSibling != "":
		if _, err := siblingPod(f.id); err != nil {
			return cfg, err
		}
		if strings.Contains(f.peerSibling, "/") {
			return cfg, fmt.Errorf("--peer-sibling %q: want the pods' NAMESPACE", f.peerSibling)
		}
	default:
		if cfg.Peer, err = netip.ParseAddrPort(f.peer); err != nil {
			return cfg, fmt.Errorf("--peer %q: want ip:port (the other replica's internal address), or --peer-sibling", f.peer)
		}
	}
	n := 0
	for _, v := range []string{f.fenceSocket, f.fenceFile, f.fenceLease} {
		if v != "" {
			n++
		}
	}
	switch {
	case n > 1:
		return cfg, errors.New("--fence-socket, --fence-file and --fence-lease: give one")
	case f.kubeconfig != "" && f.fenceLease == "" && f.peerSibling == "":
		return cfg, fmt.Errorf("--kubeconfig %q: only with --fence-lease or --peer-sibling", f.kubeconfig)
	case f.fenceLease != "":
		if cfg.Fence, err = f.leaseFence(); err != nil {
			return cfg, err
		}
	case f.fenceSocket != "":
		cfg.Fence = ha.SocketFence{Path: f.fenceSocket}
	case f.fenceFile != "":
		cfg.Fence = ha.FileFence{Path: f.fenceFile}
	default:
		return cfg, errors.New("no fence: give --fence-lease, --fence-socket or --fence-file")
	}
	switch {
	case f.eipsFromDataplane && len(f.eips) > 0:
		return cfg, fmt.Errorf("--eip %s and --eips-from-dataplane: give one", f.eips.String())
	case f.eipsFromDataplane && (f.eipsPoll < 10*time.Millisecond || f.eipsPoll > time.Minute):
		return cfg, fmt.Errorf("--eips-poll %s: want 10ms..1m", f.eipsPoll)
	case !f.eipsFromDataplane && len(f.eips) == 0 && len(f.lanIPs) == 0:
		return cfg, errors.New("no floating address: give --eip, --eips-from-dataplane and/or --lan-ip")
	}
	return cfg, nil
}

// cmdHA runs one replica of an active/standby gateway until SIGTERM or
// SIGINT (see nat/ha/README.md). Role changes go to stdout as JSON lines.
func cmdHA(ctx context.Context, e env, g *globals, args []string) int {
	fs := subFlags("ha", e, g, "ha --local IP:PORT --peer IP:PORT|--peer-sibling NAMESPACE --eip A/L[,...]|--eips-from-dataplane [--lan-ip A/L] --fence-lease NS/NAME|--fence-socket PATH|--fence-file PATH [flags]")
	host, _ := os.Hostname()
	var f haFlags
	fs.StringVar(&f.id, "id", host, "this replica's name (the lease holder)")
	fs.StringVar(&f.local, "local", "", "own internal address and port: heartbeats (UDP) and the conntrack stream (TCP)")
	fs.StringVar(&f.peer, "peer", "", "the other replica's internal address and port")
	fs.StringVar(&f.peerSibling, "peer-sibling", "", "the peer is the other pod (ordinal 0 <-> 1) of --id's StatefulSet in this NAMESPACE: its address (status.podIP, --local's port) is read from the API server (--kubeconfig) every --peer-poll and followed; until it has one the replica runs as with a silent peer")
	peerPoll := fs.Duration("peer-poll", time.Second, "how often --peer-sibling reads the sibling pod")
	fs.Var(&f.eips, "eip", "floating EIP address/length on the external interface (repeatable)")
	fs.Var(&f.lanIPs, "lan-ip", "floating lanIp address/length on the internal interface (repeatable)")
	fs.DurationVar(&f.interval, "interval", 50*time.Millisecond, "heartbeat period")
	fs.IntVar(&f.misses, "misses", 3, "missing heartbeats that mean the peer is gone")
	fs.DurationVar(&f.lease, "lease", 0, "lease duration (0: max(misses, 3) × interval + interval/2, the detection interval and the step-down margin; at least 3 × interval)")
	fs.StringVar(&f.fenceSocket, "fence-socket", "", "unix socket of a lease arbiter (ha.Arbiter)")
	fs.StringVar(&f.fenceFile, "fence-file", "", "lease file shared by both replicas (one host)")
	fs.StringVar(&f.fenceLease, "fence-lease", "", "Kubernetes Lease NAMESPACE/NAME shared by both replicas (coordination.k8s.io/v1)")
	fs.StringVar(&f.metricsAddr, "metrics-address", "", "serve Prometheus metrics (natgw_ha_*) on this address at /metrics (empty: none)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig for --fence-lease (empty: in-cluster service account)")
	fs.BoolVar(&f.eipsFromDataplane, "eips-from-dataplane", false, "the floating EIPs are the EIP objects of the gateway's data plane (--dataplane, as programmed by `natgw serve --rules-only`), read every --eips-poll")
	fs.DurationVar(&f.eipsPoll, "eips-poll", time.Second, "how often --eips-from-dataplane reads the data plane")
	fs.StringVar(&f.rulesSyncedFile, "rules-synced-file", "", "this replica may not lead until this file exists: the mark the gateway's agent leaves after its first sync (`natgw serve --synced-file`); empty: no gate")
	if code, ok := noArgs(fs, args); !ok {
		return code
	}
	cfg, err := f.haConfig(g)
	if err != nil {
		fmt.Fprintf(e.stderr, "natgw ha: %v\n", err)
		return exitUsage
	}
	cfg.Log = g.logger(e.stderr)
	enc := json.NewEncoder(e.stdout)
	cfg.OnRole = func(r ha.Role, reason string) {
		_ = enc.Encode(map[string]string{"role": r.String(), "reason": reason, "time": time.Now().UTC().Format(time.RFC3339Nano)})
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var eips *dataplaneEIPs
	if f.eipsFromDataplane {
		eips = &dataplaneEIPs{g: g, log: cfg.Log.WithName("eips")}
		// The first read gives the set Run starts with (and clears
		// what a previous run left on the interface); a failure here
		// starts with none and the polls retry.
		if cfg.EIPs, err = eips.read(ctx); err != nil {
			cfg.Log.Error(err, "reading the EIPs of the data plane; starting with none")
		}
	}
	var sib *siblingPeer
	if f.peerSibling != "" {
		if sib, err = f.sibling(cfg); err != nil {
			fmt.Fprintf(e.stderr, "natgw ha: %v\n", err)
			return exitUsage
		}
		// A first read, so that a sibling already running is known
		// from the first beat on; none yet is fine.
		if cfg.Peer, err = sib.read(ctx); err != nil {
			cfg.Log.Error(err, "reading the sibling pod's address; starting without a peer")
		}
	}
	r, err := ha.New(cfg)
	if err != nil {
		fmt.Fprintf(e.stderr, "natgw ha: %v\n", err)
		return exitFail
	}
	if sib != nil {
		if *peerPoll < 10*time.Millisecond || *peerPoll > time.Minute {
			fmt.Fprintf(e.stderr, "natgw ha: --peer-poll %s: want 10ms..1m\n", *peerPoll)
			return exitUsage
		}
		sib.setPeer = r.SetPeer
		done := make(chan struct{})
		pctx, cancel := context.WithCancel(ctx)
		go func() {
			defer close(done)
			sib.follow(pctx, cfg.Peer, *peerPoll)
		}()
		defer func() { cancel(); <-done }()
	}
	if eips != nil {
		done := make(chan struct{})
		pctx, cancel := context.WithCancel(ctx)
		go func() {
			defer close(done)
			eips.follow(pctx, r, cfg.EIPs, f.eipsPoll)
		}()
		defer func() { cancel(); <-done }()
	}
	if f.metricsAddr != "" {
		_, shutdown, err := serveHAMetrics(f.metricsAddr, ha.NewCollector(r.Status))
		if err != nil {
			fmt.Fprintf(e.stderr, "natgw ha: %v\n", err)
			return exitFail
		}
		defer shutdown()
	}
	if err := r.Run(ctx); err != nil {
		fmt.Fprintf(e.stderr, "natgw ha: %v\n", err)
		return exitFail
	}
	return exitOK
}

// sibling returns the follower of --peer-sibling for cfg.
func (f *haFlags) sibling(cfg ha.Config) (*siblingPeer, error) {
	name, err := siblingPod(f.id)
	if err != nil {
		return nil, err
	}
	rc, err := f.restConfig("--peer-sibling")
	if err != nil {
		return nil, err
	}
	// A RESTClient knowing core/v1 only, not the typed clientset (whose
	// package initialisers cost every natgw start; nat/ha/kuberest).
	c, err := kuberest.ForGroupVersion(rc, corev1.SchemeGroupVersion, corev1.AddToScheme)
	if err != nil {
		return nil, fmt.Errorf("--peer-sibling: client: %w", err)
	}
	pods := kuberest.Resource[corev1.Pod, *corev1.Pod]{Client: c, Name: "pods"}
	return &siblingPeer{pods: pods, ns: f.peerSibling, name: name,
		port: cfg.Local.Port(), log: cfg.Log.WithName("peer")}, nil
}

// serveHAMetrics serves c (and nothing else) at addr/metrics until the
// returned function is called; it returns the address it listens on.
func serveHAMetrics(addr string, c prometheus.Collector) (net.Addr, func(), error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		return nil, nil, fmt.Errorf("--metrics-address %q: %w", addr, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics-address %q: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}, nil
}

var _ flag.Value = (*prefixList)(nil)

// dataplaneEIPs reads the floating EIP set of `natgw ha
// --eips-from-dataplane` from the gateway's own data plane: the EIP objects
// the agent (`natgw serve --rules-only`) keeps in its table.
type dataplaneEIPs struct {
	g   *globals
	log logr.Logger
}

// read returns the EIP prefixes (IPv4 and IPv6) of the data plane's EIP objects, sorted: of
// --dataplane when it holds natgw's state, else of the other data plane. A
// data plane that holds no state yet (the agent has not started) holds
// none; it is then not created. The data plane is opened without plumbing and only
// read (List), like `natgw list`.
func (d *dataplaneEIPs) read(ctx context.Context) ([]netip.Prefix, error) {
	ctx, cancel := context.WithTimeout(ctx, d.g.timeout)
	defer cancel()
	cfg := d.g.config(d.log)
	// --dataplane first, then the other one: the agent's data plane may
	// be switched by the controller (serve empties the other one), and a
	// pod's `natgw ha` is started before anyone knows which it will be.
	var name nat.DataplaneName
	for _, n := range []nat.DataplaneName{d.g.dataplane, otherDataplane(d.g.dataplane)} {
		holds, err := planes.Holds(ctx, n, cfg)
		if err != nil {
			return nil, fmt.Errorf("data plane %s in netns %q: %w", n, d.g.netns, err)
		}
		if holds {
			name = n
			break
		}
	}
	if name == "" {
		return nil, nil
	}
	dp, err := planes.OpenWithoutPlumbing(ctx, name, cfg)
	if err != nil {
		return nil, fmt.Errorf("open data plane %s in netns %q: %w", name, d.g.netns, err)
	}
	defer dp.Close()
	objs, err := dp.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("list data plane %s in netns %q: %w", name, d.g.netns, err)
	}
	var out []netip.Prefix
	for _, o := range objs {
		// Both families float: a dual-stack EIP is its two prefixes.
		if o.Kind == nat.KindEIP && o.EIP != nil {
			out = append(out, o.EIP.Prefixes()...)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out), nil
}

// otherDataplane is the data plane that is not name.
func otherDataplane(name nat.DataplaneName) nat.DataplaneName {
	if name == nat.DataplaneIptables {
		return nat.DataplaneNftables
	}
	return nat.DataplaneIptables
}

// follow reads the data plane every period until ctx ends and hands each
// changed set to r. A failed read keeps the last set (an agent restarting
// must not make the active replica drop its EIPs).
func (d *dataplaneEIPs) follow(ctx context.Context, r *ha.Replica, last []netip.Prefix, period time.Duration) {
	poll(ctx, period, func() {
		cur, err := d.read(ctx)
		if err != nil {
			if ctx.Err() == nil {
				d.log.Error(err, "reading the EIPs of the data plane; keeping the last set", "eips", last)
			}
			return
		}
		if slices.Equal(cur, last) {
			return
		}
		if err := r.SetEIPs(cur); err != nil {
			d.log.Error(err, "the data plane holds an EIP that cannot float; keeping the last set", "eips", cur)
			return
		}
		d.log.Info("floating EIPs follow the data plane", "eips", cur)
		last = cur
	})
}
