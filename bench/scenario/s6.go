package scenario

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/bench/stats"
	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/procfs"
	"github.com/natgw/natgw/nat"
)

// s6Plan is the size of scenario 6.
type s6Plan struct {
	// Gateways are network namespaces, each with its own `natgw serve`.
	Gateways int
	// Rules are the FIP, DNAT and SNAT objects over all gateways (their
	// EIPs come on top, see s6MixOf).
	Rules int
	// Paced FIPs are created one at a time in each paced phase (after one
	// warm-up FIP checked in the kernel).
	Paced int
	// Creators are the parallel API clients that create the objects.
	Creators int
	// Workers is the controller's --workers (its default).
	Workers int
}

// s6SizeEnv overrides the size: "GATEWAYS,RULES[,PACED]" (development and
// tests; the report says the size it ran).
const s6SizeEnv = "NATGW_BENCH_S6"

// The full size (make bench); -quick runs a tenth of both.
const (
	s6FullGateways = 100
	s6FullRules    = 100000
)

func s6PlanFor(quick bool) (s6Plan, error) {
	p := s6Plan{Gateways: s6FullGateways, Rules: s6FullRules, Paced: 30, Creators: 16, Workers: reconciler.DefaultWorkers}
	if quick {
		p.Gateways, p.Rules = 10, 10000
	}
	if v := os.Getenv(s6SizeEnv); v != "" {
		f := strings.Split(v, ",")
		var n [3]int
		for i := range f {
			if i >= len(n) {
				return p, fmt.Errorf("%s=%q: want GATEWAYS,RULES[,PACED]", s6SizeEnv, v)
			}
			x, err := strconv.Atoi(strings.TrimSpace(f[i]))
			if err != nil {
				return p, fmt.Errorf("%s=%q: %w", s6SizeEnv, v, err)
			}
			n[i] = x
		}
		if len(f) < 2 {
			return p, fmt.Errorf("%s=%q: want GATEWAYS,RULES[,PACED]", s6SizeEnv, v)
		}
		p.Gateways, p.Rules = n[0], n[1]
		if len(f) == 3 {
			p.Paced = n[2]
		}
	}
	return p, p.validate()
}

func (p s6Plan) validate() error {
	switch {
	case p.Gateways < 1 || p.Gateways > s6MaxGateways:
		return fmt.Errorf("scenario 6: %d gateways, want 1..%d", p.Gateways, s6MaxGateways)
	case p.Rules < 3*p.Gateways:
		return fmt.Errorf("scenario 6: %d rules over %d gateways, want at least 3 per gateway (one of each kind)", p.Rules, p.Gateways)
	case p.Paced < 1 || p.Paced > 1000:
		return fmt.Errorf("scenario 6: %d paced FIPs, want 1..1000", p.Paced)
	case p.Creators < 1 || p.Workers < 1:
		return errors.New("scenario 6: creators and workers must be at least 1")
	}
	m := s6MixOf(p.rulesOn(0))
	if hosts := m.FIPs + (m.DNATs+s6PortsPerHost-1)/s6PortsPerHost; hosts > 100*250 || m.SNATs > 600 {
		return fmt.Errorf("scenario 6: %d rules per gateway do not fit the address plan (%+v)", p.rulesOn(0), m)
	}
	return nil
}

// rulesOn is gateway g's share of the rules.
func (p s6Plan) rulesOn(g int) int {
	n := p.Rules / p.Gateways
	if g < p.Rules%p.Gateways {
		n++
	}
	return n
}

// The mix of one gateway's rules: a tenth are FIPs, each with an EIP of
// its own; a tenth are SNATs of distinct /26 CIDRs sharing one EIP; the
// rest are DNATs (TCP port forwards), s6PortsPerEIP external ports per
// EIP, s6PortsPerHost forwards to each internal host.
const (
	s6FIPPercent   = 10
	s6SNATPercent  = 10
	s6PortsPerEIP  = 50
	s6PortsPerHost = 4
)

// s6Mix is one gateway's object counts.
type s6Mix struct{ FIPs, DNATs, SNATs, DNATEIPs int }

func s6MixOf(n int) s6Mix {
	m := s6Mix{FIPs: max(1, n*s6FIPPercent/100), SNATs: max(1, n*s6SNATPercent/100)}
	m.DNATs = n - m.FIPs - m.SNATs
	m.DNATEIPs = (m.DNATs + s6PortsPerEIP - 1) / s6PortsPerEIP
	return m
}

// EIPs is the gateway's EIP count: one per FIP, the DNATs', the SNATs' one.
func (m s6Mix) EIPs() int { return m.FIPs + m.DNATEIPs + 1 }

// s6Host is internal host h of net g: 10.g.(h/250).(h%250+2). Net 250
// holds the paced FIPs; gateway g's hosts are in net s6Net(g).
func s6Host(g, h int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(g), byte(h / 250), byte(h%250 + 2)})
}

const s6PacedNet = 250

// s6Net is the /16 of gateway g's internal addresses, 10.s6Net(g).0.0/16:
// gateways 250 apart share one, as VPCs may (each gateway is its own
// namespace, and natgw checks conflicts per gateway).
func s6Net(g int) int { return g % s6PacedNet }

// s6MaxGateways bounds a plan's gateways (each is a namespace with its own
// `natgw serve`).
const s6MaxGateways = 1000

func s6GatewayName(g int) string { return fmt.Sprintf("gw-%03d", g) }

// s6Obj is one object of the load with the gateway it belongs to.
type s6Obj struct {
	obj  client.Object
	kind string // "eip", "fip", "dnat", "snat"
	gw   int
}

// s6Objects builds the load: the EIPs (addresses Filler(i).EIP after the
// paced EIPs' ones) and the rules, each list interleaved over the gateways
// so that every gateway receives objects throughout the creation.
func s6Objects(p s6Plan) (eips, rules []s6Obj) {
	perGW := make([][]s6Obj, p.Gateways)
	perGWRules := make([][]s6Obj, p.Gateways)
	addr := p.Paced + 2 // Filler indexes 0..Paced+1 are the paced EIPs'
	eip := func(g int, name string) string {
		perGW[g] = append(perGW[g], s6Obj{obj: framework.EIP(name, s6GatewayName(g), Filler(addr).EIP), kind: "eip", gw: g})
		addr++
		return name
	}
	for g := 0; g < p.Gateways; g++ {
		m := s6MixOf(p.rulesOn(g))
		rule := func(kind string, o client.Object) {
			perGWRules[g] = append(perGWRules[g], s6Obj{obj: o, kind: kind, gw: g})
		}
		for k := 0; k < m.FIPs; k++ {
			e := eip(g, fmt.Sprintf("eip-g%03d-fip%05d", g, k))
			rule("fip", framework.FIP(fmt.Sprintf("fip-g%03d-%05d", g, k), e, s6Host(s6Net(g), k)))
		}
		var dnatEIP string
		for k := 0; k < m.DNATs; k++ {
			if k%s6PortsPerEIP == 0 {
				dnatEIP = eip(g, fmt.Sprintf("eip-g%03d-dnat%03d", g, k/s6PortsPerEIP))
			}
			rule("dnat", framework.DNAT(fmt.Sprintf("dnat-g%03d-%05d", g, k), dnatEIP, "tcp",
				10000+k%s6PortsPerEIP, s6Host(s6Net(g), m.FIPs+k/s6PortsPerHost), 8000+k%s6PortsPerHost))
		}
		snatEIP := eip(g, fmt.Sprintf("eip-g%03d-snat", g))
		for k := 0; k < m.SNATs; k++ {
			cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(s6Net(g)), byte(100 + k/4), byte(k % 4 * 64)}), 26)
			rule("snat", framework.SNAT(fmt.Sprintf("snat-g%03d-%04d", g, k), snatEIP, cidr.String()))
		}
	}
	interleave := func(lists [][]s6Obj) []s6Obj {
		var out []s6Obj
		for i := 0; ; i++ {
			added := false
			for _, l := range lists {
				if i < len(l) {
					out, added = append(out, l[i]), true
				}
			}
			if !added {
				return out
			}
		}
	}
	return interleave(perGW), interleave(perGWRules)
}

// s6Counts counts objects by kind.
func s6Counts(objs ...[]s6Obj) map[string]int {
	out := map[string]int{}
	for _, l := range objs {
		for _, o := range l {
			out[o.kind]++
		}
	}
	return out
}

// s6Paced is one paced phase: create→Ready and delete→gone of single FIPs.
type s6Paced struct {
	ready, gone, createCall stats.Summary
}

// s6Load is the first programming of every object.
type s6Load struct {
	eips, rules int
	// From the first EIP create: all EIPs created, all Ready; from the
	// first rule create: all rules created, all Ready.
	eipsCreated, eipsReady, rulesCreated, rulesReady time.Duration
	// Over the whole load (first EIP create to last rule Ready).
	span             time.Duration
	writes           apiWrites
	apiCPU, ctlCPU   time.Duration
	lostReady        int
	drained          time.Duration // last rule Ready → the controller's queues empty
	reconcilesPerObj float64
}

// s6Cold is the restart of the controller with everything in place.
type s6Cold struct {
	stop                  time.Duration // SIGTERM → exit
	firstSynced, synced   time.Duration // exec → first / last gateway synced
	workers               time.Duration // exec → the first controller's workers started (its caches synced)
	drained               time.Duration // exec → queues empty
	syncedObjects         int           // objects the gateways' syncs sent, all gateways
	writes                apiWrites     // API writes from SIGTERM until drained
	ctlCPU                time.Duration // the new process's CPU until drained
	lostReady             int
	rss, hwm              float64
	kernelOK, kernelTotal int // gateways whose kernel state held exactly their objects
	kernelObjects         int // UIDs found in all gateways' kernel state
	// The CPU profile from the first answer of the new process's endpoint
	// until every gateway synced: its top by flat and by cumulative time,
	// or why there is none.
	cpuProfile      string
	cpuFlat, cpuCum []s6ProfileTop
	cpuTopError     string
	// cpu is where the machine's CPU went: exec → caches synced → every
	// gateway synced → queues drained (the first reading after each was
	// seen).
	cpu []s6CPUSpan
}

// s6PhasePeak is the controller's largest sampled VmRSS in one phase.
type s6PhasePeak struct {
	phase string
	rss   float64
}

// s6Result is what one run measured.
type s6Result struct {
	plan    s6Plan
	mix     s6Mix
	counts  map[string]int // load objects by kind (EIPs included)
	apiUp   time.Duration
	gwSetup time.Duration
	ctlBin  string
	// Controller memory: idle (gateways connected, paced EIPs only), with
	// every object Ready (and the peak since the start), after the cold
	// start (the new process: now and its peak).
	idleRSS, readyRSS, readyHWM float64
	// peaks are the largest VmRSS sampled every 500 ms during each phase.
	peaks        []s6PhasePeak
	base, loaded *s6Paced
	load         *s6Load
	cold         *s6Cold
	log          string // the controller's log, kept when the run failed
	took         time.Duration
	gw           *s6GW // the second part's figures (nil in the first part)
}

// RunS6 measures natgw-controller at scale: a natgw-controller process
// (the binary, local transport) with many gateways and objects against a
// real kube-apiserver + etcd: memory, cold start, one change under load.
// Its two parts (s6PartEnv selects one): many rules over a few gateways
// (s6Run), and many small gateways under churn (s6GWRun).
func RunS6(ctx context.Context, e *Env) error {
	rulesPart, gwPart, err := s6Parts()
	if err != nil {
		sec := e.Report.Section("s6", "Scenario 6: the controller at scale")
		sec.NotRun = err.Error()
		return err
	}
	var errs []error
	if rulesPart {
		plan, err := s6PlanFor(e.Quick)
		if err != nil {
			sec := e.Report.Section("s6", "Scenario 6: the controller at scale")
			sec.NotRun = err.Error()
			return err
		}
		if _, err := runS6(ctx, e, plan); err != nil {
			errs = append(errs, err)
		}
	}
	if gwPart && ctx.Err() == nil {
		plan, err := s6GWPlanFor(e.Quick)
		if err != nil {
			sec := e.Report.Section(s6GWSection, s6GWTitle)
			sec.NotRun = err.Error()
			return errors.Join(append(errs, err)...)
		}
		if _, err := runS6GW(ctx, e, plan); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// s6Part is one part of scenario 6: its report section, how it runs once
// the control plane and the lab are up, and how it reports.
type s6Part struct {
	id, title string
	run       func(ctx context.Context, e *Env, r *s6Result, cp *controlPlane, l *netlab.Lab, tmp, kubeconfig string) error
	report    func(e *Env, sec *report.Section, r *s6Result, err error)
}

// runS6 runs the first part of scenario 6 at plan's size and reports it;
// the result is nil when the scenario did not run.
func runS6(ctx context.Context, e *Env, plan s6Plan) (*s6Result, error) {
	e.Progress.Scenario("scenario 6: the controller at scale (%s rules over %d gateways; natgw-controller process, kube-apiserver + etcd, natgw serve)",
		report.SizeLabel(plan.Rules), plan.Gateways)
	return runS6Part(ctx, e, &s6Result{plan: plan, mix: s6MixOf(plan.rulesOn(0))},
		s6Part{id: "s6", title: "Scenario 6: the controller at scale", run: s6Run, report: reportS6})
}

// runS6Part runs one part of scenario 6 on r's plan and reports it; the
// result is nil when the part did not run.
func runS6Part(ctx context.Context, e *Env, r *s6Result, part s6Part) (*s6Result, error) {
	sec := e.Report.Section(part.id, part.title)
	switch {
	case e.Natgw == "":
		sec.NotRun = "the natgw binary was not given (-natgw), and the controller drives `natgw serve`"
		return nil, nil
	case envtestReady(e) != "":
		sec.NotRun = envtestReady(e)
		return nil, errors.New(sec.NotRun)
	}
	t0 := time.Now()
	err := measureS6(ctx, e, r, part.run)
	r.took = time.Since(t0)
	if ctx.Err() != nil {
		return r, ctx.Err()
	}
	if err != nil {
		err = fmt.Errorf("%s: %w", part.title, err)
		e.Progress.Printf("FAILED: %v", err)
	}
	part.report(e, sec, r, err)
	return r, err
}

func measureS6(ctx context.Context, e *Env, r *s6Result, run func(ctx context.Context, e *Env, r *s6Result, cp *controlPlane, l *netlab.Lab, tmp, kubeconfig string) error) (err error) {
	tmp, err := os.MkdirTemp("", "natgw-bench-s6-")
	if err != nil {
		return err
	}
	defer func() {
		// A failure keeps the controller's log for the report; an
		// interrupted run writes no report, so it keeps nothing.
		if err != nil && ctx.Err() == nil {
			r.log = filepath.Join(tmp, "controller.log")
			return
		}
		os.RemoveAll(tmp)
	}()
	e.Progress.Step(0, 0, "natgw-controller binary")
	if r.ctlBin, err = controllerBinary(ctx, e.Natgw, tmp); err != nil {
		return err
	}
	e.Progress.Step(0, 0, "kube-apiserver + etcd")
	t0 := time.Now()
	cp, err := startControlPlane(e)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := cp.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	r.apiUp = time.Since(t0)
	// As users install natgw (`kubectl apply -k controller/config`): the
	// admission policy gives objects natgw's finalizer at creation.
	if err := apitest.InstallAdmission(ctx, cp.cfg, apitest.AdmissionOptions{Dir: filepath.Join(filepath.Dir(e.CRDDir), "admission")}); err != nil {
		return err
	}
	kubeconfig := filepath.Join(tmp, "kubeconfig")
	if err := os.WriteFile(kubeconfig, cp.env.KubeConfig, 0o600); err != nil {
		return err
	}
	return withLab(ctx, func(l *netlab.Lab) error {
		return run(ctx, e, r, cp, l, tmp, kubeconfig)
	})
}

// s6Gateway makes gateway g's namespace with Kube-OVN's interface names
// and the standard topology's addresses on one end of a veth pair each
// (no peers: the scenario programs and reads state, it sends no traffic).
func s6Gateway(l *netlab.Lab, g int) (*netlab.Gateway, error) {
	ns, err := l.NS(fmt.Sprintf("g%03d", g))
	if err != nil {
		return nil, err
	}
	gw := &netlab.Gateway{Name: s6GatewayName(g), GW: ns, ExternalInterface: "net1", InternalInterface: "eth0"}
	if err := netlab.Stub(ns, gw.ExternalInterface, netip.PrefixFrom(netlab.GWExtAddr, netlab.ExtNet.Bits())); err != nil {
		return nil, err
	}
	if err := netlab.Stub(ns, gw.InternalInterface, netip.PrefixFrom(netlab.GWVPCAddr, netlab.VPCNet.Bits())); err != nil {
		return nil, err
	}
	return gw, nil
}

// s6Dataplane is the data plane scenario 6 runs (the controller's default).
const s6Dataplane = string(nat.DataplaneNftables)

// s6Rig is what both parts of scenario 6 share once the controller runs:
// the gateways, the controller process, the API client, the Ready and FIP
// watches, every gateway's VpcNatGateway and the paced FIPs' EIPs.
type s6Rig struct {
	e         *Env
	r         *s6Result
	cp        *controlPlane
	ctl       *ctlProcess
	c         client.Client
	tr        *readyTracker
	fw        *fipWatch
	gws       []*netlab.Gateway
	gwObjs    []s6Obj
	pacedEIPs []s6Obj
	closers   []func()
}

// close ends what s6Prepare started, the controller last started first.
func (rg *s6Rig) close() {
	for i := len(rg.closers) - 1; i >= 0; i-- {
		rg.closers[i]()
	}
}

// phase records the controller's largest sampled VmRSS since the last
// phase under name.
func (rg *s6Rig) phase(name string) {
	rg.r.peaks = append(rg.r.peaks, s6PhasePeak{name, rg.ctl.takePeak()})
}

// kernel reads gateway g's kernel state.
func (rg *s6Rig) kernel(ctx context.Context, g int) (framework.Kernel, error) {
	gw := rg.gws[g]
	k, err := framework.ReadKernel(ctx, &framework.Topology{Gateway: gw, Name: gw.Name}, s6Dataplane)
	if err != nil {
		return k, fmt.Errorf("read gateway %s's kernel state: %w", gw.Name, err)
	}
	return k, nil
}

// s6PacedEIP names paced EIP k.
func s6PacedEIP(k int) string { return fmt.Sprintf("eip-paced-%04d", k) }

// paced runs one paced phase (s6RunPaced) on the paced EIPs.
func (rg *s6Rig) paced(ctx context.Context, label, prefix string) (*s6Paced, error) {
	kernel := func(g int) (framework.Kernel, error) { return rg.kernel(ctx, g) }
	return s6RunPaced(ctx, rg.e, rg.c, rg.fw, kernel, rg.r.plan, label, prefix, s6PacedEIP)
}

// baseAndLoad runs the paced FIPs with ~0 objects, then creates the plan's
// objects (s6RunLoad) and reads the controller's memory with every object
// Ready; ready (optional) runs then, before that phase ends.
func (rg *s6Rig) baseAndLoad(ctx context.Context, ready func()) (eips, rules []s6Obj, err error) {
	r := rg.r
	if r.base, err = rg.paced(ctx, "paced, ~0 objects", "fip-base"); err != nil {
		return nil, nil, fmt.Errorf("paced FIPs before the load: %w", err)
	}
	rg.phase("paced, ~0 objects")
	defer rg.phase("every object Ready, queues drained")
	eips, rules = s6Objects(r.plan)
	r.counts = s6Counts(eips, rules)
	if r.load, err = s6RunLoad(ctx, rg.e, rg.cp, rg.c, rg.ctl, rg.tr, r.plan, eips, rules, rg.phase); err != nil {
		return nil, nil, err
	}
	time.Sleep(2 * time.Second) // settle: what the memory is when nothing happens
	if r.readyRSS, r.readyHWM, err = rg.ctl.memory(); err != nil {
		return nil, nil, err
	}
	rg.e.Progress.Printf("controller with %s objects Ready: VmRSS %s, peak VmHWM %s (idle before the load: %s)",
		report.SizeLabel(len(eips)+len(rules)), report.Bytes(r.readyRSS), report.Bytes(r.readyHWM), report.Bytes(r.idleRSS))
	if ready != nil {
		ready()
	}
	return eips, rules, nil
}

// coldStart restarts the controller (s6ColdStart: its heap profile saved as
// heapName, its CPU profile until every gateway synced as cpuName) and then checks every
// gateway's kernel state against objs (the load's EIPs and rules).
func (rg *s6Rig) coldStart(ctx context.Context, heapName, cpuName string, objs ...[]s6Obj) error {
	r := rg.r
	var err error
	if r.cold, err = s6ColdStart(ctx, rg.e, rg.cp, rg.ctl, rg.tr, r.plan, r.counts, rg.phase, heapName, cpuName); err != nil {
		return err
	}
	kernel := func(g int) (framework.Kernel, error) { return rg.kernel(ctx, g) }
	return s6CheckKernel(ctx, rg.e, r.cold, r.plan, kernel, append([][]s6Obj{rg.gwObjs, rg.pacedEIPs}, objs...)...)
}

// s6Prepare makes the gateways' namespaces and configuration, starts the
// controller and the watches, creates every gateway's VpcNatGateway and
// the paced FIPs' EIPs, and waits until every gateway is connected and the
// queues are drained (the controller's idle memory). The caller closes the
// rig, also after an error.
func s6Prepare(ctx context.Context, e *Env, r *s6Result, cp *controlPlane, l *netlab.Lab, tmp, kubeconfig string) (*s6Rig, error) {
	plan := r.plan
	rg := &s6Rig{e: e, r: r, cp: cp}
	t0 := time.Now()
	rg.gws = make([]*netlab.Gateway, plan.Gateways)
	cfg := gwconfig.Config{Defaults: gwconfig.Entry{ExternalPrefixLen: s3EIPPrefixLen, ExternalGateway: netlab.ExtAddr.String()}}
	for g := range rg.gws {
		e.Progress.Step(g, plan.Gateways, "gateway namespaces")
		var err error
		if rg.gws[g], err = s6Gateway(l, g); err != nil {
			return rg, err
		}
		cfg.Gateways = append(cfg.Gateways, gwconfig.Entry{Name: rg.gws[g].Name, NetNS: rg.gws[g].GW})
	}
	r.gwSetup = time.Since(t0)
	if err := cfg.Validate(); err != nil {
		return rg, err
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return rg, err
	}
	cfgPath := filepath.Join(tmp, "gateways.yaml")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		return rg, err
	}
	metricsAddr, err := freeLocalAddr()
	if err != nil {
		return rg, err
	}
	ctl := &ctlProcess{bin: r.ctlBin, logPath: filepath.Join(tmp, "controller.log"), metricsAddr: metricsAddr, memCap: s6MemCap(), args: []string{
		"--kubeconfig", kubeconfig,
		"--transport", "local",
		"--natgw-binary", e.Natgw,
		"--gateway-config", cfgPath,
		"--dataplane", s6Dataplane,
		"--workers", strconv.Itoa(plan.Workers),
		"--leader-elect=false",
		"--metrics-bind-address", metricsAddr,
		"--health-probe-bind-address", "0",
		"--pprof",
	}}
	rg.ctl = ctl
	rg.closers = append(rg.closers, func() { _ = ctl.kill() })

	c, err := cp.client()
	if err != nil {
		return rg, err
	}
	rg.c = c
	if rg.tr, err = trackReady(ctx, cp); err != nil {
		return rg, err
	}
	rg.closers = append(rg.closers, rg.tr.Stop)
	if rg.fw, err = watchFIPs(ctx, c); err != nil {
		return rg, err
	}
	rg.closers = append(rg.closers, rg.fw.Stop)
	if err := ctl.start(); err != nil {
		return rg, err
	}

	// Every gateway's VpcNatGateway, and the EIPs of the paced FIPs
	// (Paced + one warm-up, spread over the gateways): every gateway's
	// session is open before the first measurement.
	e.Progress.Step(0, 0, "%d VpcNatGateways and %d EIPs for the paced FIPs", plan.Gateways, plan.Paced+1)
	// A VpcNatGateway's default route (via the configured external
	// gateway) is in its gateway's kernel state under its UID.
	rg.gwObjs = make([]s6Obj, plan.Gateways)
	for g := range rg.gwObjs {
		rg.gwObjs[g] = s6Obj{obj: &v1.VpcNatGateway{ObjectMeta: metav1.ObjectMeta{Name: s6GatewayName(g)}, Spec: v1.VpcNatGatewaySpec{Vpc: "vpc1", Subnet: "subnet1"}}, kind: "gw", gw: g}
	}
	if err := parallel(ctx, plan.Gateways, plan.Creators, func(g int) error {
		return createObj(ctx, c, rg.gwObjs[g].obj)
	}); err != nil {
		return rg, err
	}
	rg.pacedEIPs = make([]s6Obj, plan.Paced+1)
	for k := range rg.pacedEIPs {
		g := k % plan.Gateways
		rg.pacedEIPs[k] = s6Obj{obj: framework.EIP(s6PacedEIP(k), s6GatewayName(g), Filler(k).EIP), kind: "eip", gw: g}
	}
	if err := parallel(ctx, len(rg.pacedEIPs), plan.Creators, func(k int) error {
		return createObj(ctx, c, rg.pacedEIPs[k].obj)
	}); err != nil {
		return rg, err
	}
	if _, err := rg.tr.wait(ctx, map[string]int{"eip": plan.Paced + 1}, 2*time.Minute, ctl.alive, nil); err != nil {
		return rg, fmt.Errorf("paced EIPs: %w", err)
	}
	if err := s6WaitConnected(ctx, ctl, plan.Gateways); err != nil {
		return rg, err
	}
	if _, err := s6WaitDrained(ctx, ctl, nil, time.Minute); err != nil {
		return rg, err
	}
	if r.idleRSS, _, err = ctl.memory(); err != nil {
		return rg, err
	}
	rg.phase("start, gateways connected")
	return rg, nil
}

// s6Run is the first part of scenario 6: many rules over a few gateways.
func s6Run(ctx context.Context, e *Env, r *s6Result, cp *controlPlane, l *netlab.Lab, tmp, kubeconfig string) error {
	rg, err := s6Prepare(ctx, e, r, cp, l, tmp, kubeconfig)
	defer rg.close()
	if err != nil {
		return err
	}
	eips, rules, err := rg.baseAndLoad(ctx, nil)
	if err != nil {
		return err
	}
	s6SaveHeap(ctx, e, rg.ctl, "s6-heap-ready.pb.gz")
	if r.loaded, err = rg.paced(ctx, "paced, all objects in place", "fip-load"); err != nil {
		return fmt.Errorf("paced FIPs with the load in place: %w", err)
	}
	rg.phase("paced, every object in place")
	e.Progress.Printf("one FIP at a time, create→Ready p50 %s p99 %s with ~0 objects, p50 %s p99 %s with %s in place",
		report.Seconds(r.base.ready.Median), report.Seconds(r.base.ready.P99), report.Seconds(r.loaded.ready.Median),
		report.Seconds(r.loaded.ready.P99), report.SizeLabel(len(eips)+len(rules)))
	return rg.coldStart(ctx, "s6-heap-cold.pb.gz", "s6-cpu-cold.pb.gz", eips, rules)
}

// s6ConnectStall is how long s6WaitConnected waits for one more gateway
// to connect before it gives up.
const s6ConnectStall = 2 * time.Minute

// s6WaitConnected waits until the controller's natgw_gateway_connected
// says every gateway has a session. The gateways connect through a
// bounded number of slots, so the whole wait grows with their number
// (1,000 gateways take minutes on a loaded 2-core machine): it gives up
// when the count has not grown for s6ConnectStall, not after a fixed time.
func s6WaitConnected(ctx context.Context, ctl *ctlProcess, n int) error {
	last, since := -1, time.Now()
	for {
		err := ctl.alive()
		if err != nil {
			return err
		}
		ms, err := ctl.metrics(ctx)
		if err == nil {
			got := int(ms.sum("natgw_gateway_connected", nil))
			if got == n {
				return nil
			}
			if got != last {
				last, since = got, time.Now()
			}
			err = fmt.Errorf("%d of %d gateways connected", got, n)
		}
		if time.Since(since) > s6ConnectStall {
			return fmt.Errorf("no gateway connected for %v: %w", s6ConnectStall, err)
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), err)
		case <-time.After(framework.Poll):
		}
	}
}

// s6Controllers are natgw-controller's controllers (as named in
// controller-runtime's metrics) and the kinds whose objects each one
// reconciles at least once after a start.
var s6Controllers = []struct{ name, kind string }{
	{"iptables-eip", "eip"},
	{"iptables-fip-rule", "fip"},
	{"iptables-dnat-rule", "dnat"},
	{"iptables-snat-rule", "snat"},
	{"vpc-nat-gateway", "gw"},
}

// s6WaitDrained waits until every controller's work queue is empty with no
// reconcile running and, per controller, at least min[kind] reconciles
// done since the process started; it returns when that was first seen
// (polled every 100 ms).
func s6WaitDrained(ctx context.Context, ctl *ctlProcess, minReconciles map[string]int, timeout time.Duration) (time.Time, error) {
	var at time.Time
	_, err := framework.Wait(ctx, timeout, func() error {
		if err := ctl.alive(); err != nil {
			return err
		}
		ms, err := ctl.metrics(ctx)
		if err != nil {
			return err
		}
		now := time.Now()
		for _, c := range s6Controllers {
			depth := ms.sum("workqueue_depth", map[string]string{"name": c.name})
			active := ms.sum("controller_runtime_active_workers", map[string]string{"controller": c.name})
			done := ms.sum("controller_runtime_reconcile_total", map[string]string{"controller": c.name})
			if depth > 0 || active > 0 || done < float64(minReconciles[c.kind]) {
				return fmt.Errorf("controller %s: %v queued, %v running, %v of at least %d reconciles done", c.name, depth, active, done, minReconciles[c.kind])
			}
		}
		at = now
		return nil
	})
	return at, err
}

// s6RunPaced creates plan.Paced FIPs one at a time after one warm-up FIP
// (checked in its gateway's kernel after Ready and after gone): create,
// wait until Ready, delete, wait until gone, next. FIP k uses the paced
// EIP k, on gateway k mod Gateways.
func s6RunPaced(ctx context.Context, e *Env, c client.Client, fw *fipWatch, kernel func(int) (framework.Kernel, error),
	plan s6Plan, label, prefix string, eip func(int) string) (*s6Paced, error) {
	var readies, gones, calls []float64
	for k := 0; k <= plan.Paced; k++ {
		warm := k == 0
		if warm {
			e.Progress.Step(0, 0, "%s: warm-up FIP (checked in the kernel)", label)
		} else {
			e.Progress.Step(k, plan.Paced, "%s: create → Ready → delete → gone, one FIP at a time", label)
		}
		f := framework.FIP(fmt.Sprintf("%s-%04d", prefix, k), eip(k), s6Host(s6PacedNet, k))
		g := k % plan.Gateways
		start := time.Now()
		if err := createObj(ctx, c, f); err != nil {
			return nil, err
		}
		call := since(start)
		at, err := fw.waitReady(ctx, time.Minute, f.Name)
		if err != nil {
			return nil, err
		}
		ready := at[0].Sub(start).Seconds()
		if warm {
			if k, err := kernel(g); err != nil {
				return nil, err
			} else if len(k.Entries[string(f.UID)]) == 0 {
				return nil, fmt.Errorf("warm-up FIP %s (%s) is Ready but not in gateway %s's kernel state", f.Name, f.UID, s6GatewayName(g))
			}
		}
		start = time.Now()
		if err := c.Delete(ctx, f); err != nil {
			return nil, fmt.Errorf("delete IptablesFIPRule %s: %w", f.Name, err)
		}
		if at, err = fw.waitGone(ctx, time.Minute, f.Name); err != nil {
			return nil, err
		}
		if warm {
			if k, err := kernel(g); err != nil {
				return nil, err
			} else if len(k.Entries[string(f.UID)]) != 0 {
				return nil, fmt.Errorf("warm-up FIP %s (%s) is gone but still in gateway %s's kernel state", f.Name, f.UID, s6GatewayName(g))
			}
			continue
		}
		readies, gones, calls = append(readies, ready), append(gones, at[0].Sub(start).Seconds()), append(calls, call)
	}
	return &s6Paced{ready: stats.Summarize(readies), gone: stats.Summarize(gones), createCall: stats.Summarize(calls)}, nil
}

// s6APIWrites reads the API server's write counters.
func s6APIWrites(ctx context.Context, cp *controlPlane) (apiWrites, error) {
	cs, err := kubernetes.NewForConfig(cp.cfg)
	if err != nil {
		return apiWrites{}, fmt.Errorf("API clientset: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	b, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return apiWrites{}, fmt.Errorf("GET /metrics of kube-apiserver: %w", err)
	}
	ms, err := parseProm(string(b))
	if err != nil {
		return apiWrites{}, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	return ms.apiWrites(), nil
}

// s6RunLoad creates every EIP (parallel clients), waits until they are
// Ready, then creates every rule and waits until all are Ready, with the
// controller running: the first programming overlaps the creation.
func s6RunLoad(ctx context.Context, e *Env, cp *controlPlane, c client.Client, ctl *ctlProcess, tr *readyTracker,
	plan s6Plan, eips, rules []s6Obj, phase func(string)) (*s6Load, error) {
	ld := &s6Load{eips: len(eips), rules: len(rules)}
	counts := s6Counts(eips, rules)
	_, lost0 := tr.counts()
	w0, err := s6APIWrites(ctx, cp)
	if err != nil {
		return nil, err
	}
	cpu0, err := cp.cpu()
	if err != nil {
		return nil, err
	}
	ctlCPU0, err := procfs.CPUTime(ctl.pid())
	if err != nil {
		return nil, err
	}
	create := func(objs []s6Obj, what string) error {
		var mu sync.Mutex
		done := 0
		return parallel(ctx, len(objs), plan.Creators, func(i int) error {
			if err := createObj(ctx, c, objs[i].obj); err != nil {
				return err
			}
			mu.Lock()
			done++
			e.Progress.Step(done, len(objs), "creating %s", what)
			mu.Unlock()
			return nil
		})
	}
	// Ready is awaited with a stall bound (no object changed state for
	// that long), not a total one: the total grows with the size.
	const stall = 3 * time.Minute
	t0 := time.Now()
	if err := create(eips, "EIPs"); err != nil {
		return nil, err
	}
	ld.eipsCreated = time.Since(t0)
	wantEIPs := map[string]int{"eip": counts["eip"] + plan.Paced + 1}
	at, err := tr.wait(ctx, wantEIPs, stall, ctl.alive, func(ready, total int) { e.Progress.Step(ready, total, "EIPs Ready") })
	if err != nil {
		return nil, fmt.Errorf("EIPs: %w", err)
	}
	ld.eipsReady = at.Sub(t0)
	phase("load: EIPs created until Ready")
	e.Progress.Printf("%d EIPs created in %s, all Ready after %s", len(eips), report.Seconds(ld.eipsCreated.Seconds()), report.Seconds(ld.eipsReady.Seconds()))

	t1 := time.Now()
	if err := create(rules, "rules"); err != nil {
		return nil, err
	}
	ld.rulesCreated = time.Since(t1)
	want := map[string]int{"fip": counts["fip"], "dnat": counts["dnat"], "snat": counts["snat"]}
	at, err = tr.wait(ctx, want, stall, ctl.alive, func(ready, total int) { e.Progress.Step(ready, total, "rules Ready") })
	if err != nil {
		return nil, fmt.Errorf("rules: %w", err)
	}
	ld.rulesReady, ld.span = at.Sub(t1), at.Sub(t0)
	phase("load: rules created until Ready")
	w1, err := s6APIWrites(ctx, cp)
	if err != nil {
		return nil, err
	}
	cpu1, err := cp.cpu()
	if err != nil {
		return nil, err
	}
	ctlCPU1, err := procfs.CPUTime(ctl.pid())
	if err != nil {
		return nil, err
	}
	ld.writes, ld.apiCPU, ld.ctlCPU = w1.sub(w0), cpu1-cpu0, ctlCPU1-ctlCPU0
	_, lost1 := tr.counts()
	ld.lostReady = lost1 - lost0
	e.Progress.Printf("%d rules created in %s, all Ready after %s; %s objects Ready %s after the first create (%s API writes, %s/s)",
		len(rules), report.Seconds(ld.rulesCreated.Seconds()), report.Seconds(ld.rulesReady.Seconds()), report.SizeLabel(len(eips)+len(rules)),
		report.Seconds(ld.span.Seconds()), report.Count(ld.writes.all), report.Count(ld.writes.all/ld.span.Seconds()))
	e.Progress.Step(0, 0, "waiting for the controller's queues to drain")
	drainedAt, err := s6WaitDrained(ctx, ctl, nil, 10*time.Minute)
	if err != nil {
		return nil, fmt.Errorf("after the load: %w", err)
	}
	ld.drained = max(0, drainedAt.Sub(at))
	if ms, err := ctl.metrics(ctx); err == nil {
		ld.reconcilesPerObj = ms.sum("controller_runtime_reconcile_total", nil) / float64(len(eips)+len(rules))
	}
	return ld, nil
}

// s6ColdStart stops the controller (SIGTERM) and starts it again with
// every object in place: the time from exec until every gateway is synced
// (the controller's "gateway connected" log line, logged once the gateway
// holds its desired set: synced, or found holding it) and until its queues
// are drained, and the
// API writes the restart made.
func s6ColdStart(ctx context.Context, e *Env, cp *controlPlane, ctl *ctlProcess, tr *readyTracker, plan s6Plan, counts map[string]int, phase func(string), heapName, cpuName string) (*s6Cold, error) {
	cs := &s6Cold{}
	_, lost0 := tr.counts()
	w0, err := s6APIWrites(ctx, cp)
	if err != nil {
		return nil, err
	}
	e.Progress.Step(0, 0, "cold start: stopping the controller (SIGTERM)")
	if cs.stop, err = ctl.stop(time.Minute); err != nil {
		return nil, err
	}
	ctl.takePeak() // the old process's last samples: in the previous phase
	offset := ctl.logSize()
	e.Progress.Step(0, 0, "cold start: starting the controller with everything in place")
	cpuExec := s6ReadCPU(cp, 0)
	if err := ctl.start(); err != nil {
		return nil, err
	}
	exec := ctl.started
	var cpuWorkers s6CPUAt
	// The CPU profile runs from the new process's first answer on its
	// endpoint until every gateway synced; a failure to record it is
	// reported, not fatal.
	var cpu *s6CPURecorder
	if e.OutDir != "" {
		if cpu, err = s6RecordCPU(ctx, ctl); err != nil {
			cs.cpuTopError = err.Error()
		} else {
			defer cpu.discard()
		}
	}
	synced := map[string]time.Time{}
	shown := -1
	_, err = framework.Wait(ctx, 10*time.Minute, func() error {
		if err := ctl.alive(); err != nil {
			return err
		}
		lines, next, err := ctl.readLog(offset)
		if err != nil {
			return err
		}
		offset = next
		for _, l := range lines {
			switch {
			case l.Msg == "synced the gateway" && l.Objects != nil:
				cs.syncedObjects += *l.Objects
			case l.Msg == "Starting workers" && cs.workers == 0:
				cs.workers = l.Time.Sub(exec)
			case l.Msg == "gateway connected" && l.Gateway != "":
				if _, ok := synced[l.Gateway]; !ok {
					synced[l.Gateway] = l.Time
				}
			}
		}
		if cs.workers != 0 && cpuWorkers.at.IsZero() {
			cpuWorkers = s6ReadCPU(cp, ctl.pid())
		}
		if len(synced) != shown {
			shown = len(synced)
			e.Progress.Step(shown, plan.Gateways, "cold start: gateways synced")
		}
		if len(synced) < plan.Gateways {
			return fmt.Errorf("%d of %d gateways synced", len(synced), plan.Gateways)
		}
		// A gateway's session does not wait for the reconcilers'
		// caches: with few objects every gateway can be synced before
		// the first workers start; their line is read too.
		if cs.workers == 0 {
			return errors.New("every gateway synced, no controller's workers started yet")
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cold start: %w", err)
	}
	cpuSynced := s6ReadCPU(cp, ctl.pid())
	for _, t := range synced {
		d := t.Sub(exec)
		if cs.firstSynced == 0 || d < cs.firstSynced {
			cs.firstSynced = d
		}
		cs.synced = max(cs.synced, d)
	}
	phase("cold start: exec until every gateway synced")
	if cpu != nil {
		cpu.stop()
	}
	e.Progress.Step(0, 0, "cold start: waiting for the queues to drain")
	minRec := map[string]int{"gw": plan.Gateways}
	for k, n := range counts {
		minRec[k] = n
	}
	minRec["eip"] += plan.Paced + 1
	at, err := s6WaitDrained(ctx, ctl, minRec, 10*time.Minute)
	if err != nil {
		return nil, fmt.Errorf("cold start: %w", err)
	}
	cs.drained = at.Sub(exec)
	cpuDrained := s6ReadCPU(cp, ctl.pid())
	cs.cpu = []s6CPUSpan{
		s6CPUBetween("exec → caches synced (first workers started)", cpuExec, cpuWorkers),
		s6CPUBetween("caches synced → every gateway synced", cpuWorkers, cpuSynced),
		s6CPUBetween("every gateway synced → queues drained", cpuSynced, cpuDrained),
	}
	if cs.synced <= cs.workers {
		// Every gateway synced before the caches did (few objects): one
		// window until both.
		cs.cpu = []s6CPUSpan{s6CPUBetween("exec → caches and every gateway synced", cpuExec, cpuSynced), cs.cpu[2]}
	}
	phase("cold start: until the queues drained")
	s6SaveHeap(ctx, e, ctl, heapName)
	if cpu != nil {
		s6SaveCPU(ctx, e, cs, cpu, cpuName)
	}
	if cs.ctlCPU, err = procfs.CPUTime(ctl.pid()); err != nil {
		return nil, err
	}
	if cs.rss, cs.hwm, err = ctl.memory(); err != nil {
		return nil, err
	}
	// Writes that land just after the queues drained (a status patch
	// whose reconcile ended) are counted too.
	time.Sleep(2 * time.Second)
	w1, err := s6APIWrites(ctx, cp)
	if err != nil {
		return nil, err
	}
	cs.writes = w1.sub(w0)
	_, lost1 := tr.counts()
	cs.lostReady = lost1 - lost0
	e.Progress.Printf("cold start: SIGTERM→exit %s; exec→caches synced (first workers started) %s, first gateway synced %s, all %d synced %s, queues drained %s; %s API writes to natgw's objects, %d objects lost Ready",
		report.Seconds(cs.stop.Seconds()), report.Seconds(cs.workers.Seconds()), report.Seconds(cs.firstSynced.Seconds()), plan.Gateways, report.Seconds(cs.synced.Seconds()),
		report.Seconds(cs.drained.Seconds()), report.Count(cs.writes.natgw), cs.lostReady)
	return cs, nil
}

// s6CheckKernel reads every gateway's kernel state and checks it holds
// exactly the UIDs of its objects (objs, by gateway), and on net1 exactly
// its EIPs' addresses.
func s6CheckKernel(ctx context.Context, e *Env, cs *s6Cold, plan s6Plan, kernel func(int) (framework.Kernel, error), objs ...[]s6Obj) error {
	want := make([]map[string]bool, plan.Gateways)
	addrs := make([]int, plan.Gateways)
	for g := range want {
		want[g] = map[string]bool{}
	}
	for _, l := range objs {
		for _, o := range l {
			if o.obj.GetUID() == "" {
				return fmt.Errorf("%s %s has no UID after its create", o.kind, o.obj.GetName())
			}
			want[o.gw][string(o.obj.GetUID())] = true
			if o.kind == "eip" {
				addrs[o.gw]++
			}
		}
	}
	cs.kernelTotal = plan.Gateways
	var mu sync.Mutex
	var bad []string
	checked := 0
	err := parallel(ctx, plan.Gateways, 2, func(g int) error {
		k, err := kernel(g)
		if err != nil {
			return err
		}
		var missing, extra int
		var other []string
		for u, es := range k.Entries {
			if !want[g][u] {
				extra++
				if len(other) < 2 {
					other = append(other, fmt.Sprintf("%q: %v", u, es))
				}
			}
		}
		for u := range want[g] {
			if len(k.Entries[u]) == 0 {
				missing++
			}
		}
		mu.Lock()
		defer mu.Unlock()
		checked++
		e.Progress.Step(checked, plan.Gateways, "cold start: checking every gateway's kernel state")
		cs.kernelObjects += len(k.Entries)
		switch {
		case missing > 0 || extra > 0:
			bad = append(bad, fmt.Sprintf("%s: %d of its %d objects missing, %d UIDs that are not its objects' (e.g. %s)", s6GatewayName(g), missing, len(want[g]), extra, strings.Join(other, ", ")))
		case len(k.EIPAddrs()) != addrs[g]:
			bad = append(bad, fmt.Sprintf("%s: %d EIP addresses on %s, want %d", s6GatewayName(g), len(k.EIPAddrs()), "net1", addrs[g]))
		default:
			cs.kernelOK++
		}
		return nil
	})
	if err != nil {
		return err
	}
	if len(bad) > 0 {
		if len(bad) > 5 {
			bad = append(bad[:5], fmt.Sprintf("and %d more", len(bad)-5))
		}
		return fmt.Errorf("after the cold start %d of %d gateways do not hold exactly their objects: %s", plan.Gateways-cs.kernelOK, plan.Gateways, strings.Join(bad, "; "))
	}
	e.Progress.Printf("cold start: every gateway's kernel state holds exactly its objects (%d of %d gateways, %s UIDs)", cs.kernelOK, cs.kernelTotal, report.Count(float64(cs.kernelObjects)))
	return nil
}

// Targets of scenario 6 (raised from 512 MiB and 30 s once the
// controller had been measured): the controller's RSS with every object
// Ready, its cold start included; the cold start to every gateway synced and
// to its queues drained; and one FIP's create→Ready with everything in place
// over the same with ~0 objects.
const (
	s6TargetRSS     = 256 << 20
	s6TargetCold    = 10 * time.Second
	s6TargetDrained = 30 * time.Second
	s6TargetRatio   = 2.0
)

func reportS6(e *Env, sec *report.Section, r *s6Result, runErr error) {
	p := r.plan
	m := r.mix
	sec.Text = append(sec.Text,
		fmt.Sprintf("natgw-controller runs as its own process (the `natgw-controller` binary, `--transport=local --gateway-config` with %d gateways, "+
			"%d workers, leader election off, default sweep and drift periods) against a real kube-apiserver + etcd (envtest binaries, natgw's CRDs and controller/config/admission installed as `kubectl apply -k controller/config` installs them: objects are created with natgw's finalizer), "+
			"each gateway a network namespace of this run with its own `natgw serve` (nftables) started by the controller. ", p.Gateways, p.Workers)+
			fmt.Sprintf("The load is %s rules over %d gateways; per gateway (%s rules): %d FIPs, each with its own EIP; %d DNATs (TCP port forwards, %d external ports per EIP, %d forwards per internal host) on %d EIPs; "+
				"%d SNATs of distinct /26 CIDRs sharing one EIP: %d EIPs per gateway. ",
				report.SizeLabel(p.Rules), p.Gateways, report.SizeLabel(p.rulesOn(0)), m.FIPs, m.DNATs, s6PortsPerEIP, s6PortsPerHost, m.DNATEIPs, m.SNATs, m.EIPs())+
			fmt.Sprintf("Steps: every gateway's VpcNatGateway and %d EIPs for paced FIPs; **paced, ~0 objects**: %d FIPs one at a time (create, Ready, delete, gone) after a warm-up FIP checked in the kernel; "+
				"**load**: every EIP created by %d parallel clients (client-side rate limiting off), awaited Ready, then every rule, with the controller running (its first programming overlaps the creation); "+
				"controller memory from /proc/PID/status; **paced, all objects in place**: the same paced FIPs on the same controller; "+
				"**cold start**: SIGTERM, then the same binary started again with everything in place: exec → every gateway synced (its \"gateway connected\" log line, logged once the gateway's agent holds its desired set: synced, or found holding it, which sends no sync) "+
				"and → its work queues drained (controller-runtime's workqueue_depth and active workers 0, every object reconciled once, from its /metrics), the API writes the restart made (kube-apiserver's apiserver_request_total), "+
				"then every gateway's nft table read: it must hold exactly the UIDs of its objects, and net1 exactly their addresses. "+
				"Ready is as a watch (informers) on the API server sees it: Ready=True for the object's generation.", p.Paced+1, p.Paced, p.Creators))
	s6ReportCommon(sec, r, runErr)
	total := 0
	for _, n := range r.counts {
		total += n
	}
	s6LatencyTable(sec, []s6PacedRow{{fmt.Sprintf("~0 (%d gateways, %d EIPs)", p.Gateways, p.Paced+1), r.base}, {report.SizeLabel(total), r.loaded}})
	s6TargetRows(sec, r)
	s6Metrics(e, r)
	sec.Notes = append(sec.Notes,
		"The controller, the agents, kube-apiserver, etcd and the benchmark's clients share the machine's CPUs (see CPUs and load average above).")
}

// s6RSSReason says what the controller's memory was: with every object
// Ready, idle before the load, after the cold start, the largest sample.
func s6RSSReason(r *s6Result) string {
	reason := fmt.Sprintf("VmRSS %s, peak VmHWM %s (the load included); idle before the load %s", report.Bytes(r.readyRSS), report.Bytes(r.readyHWM), report.Bytes(r.idleRSS))
	if c := r.cold; c != nil {
		reason += fmt.Sprintf("; after the cold start %s, its peak %s", report.Bytes(c.rss), report.Bytes(c.hwm))
	}
	var top s6PhasePeak
	for _, pk := range r.peaks {
		if pk.rss > top.rss {
			top = pk
		}
	}
	if top.rss > 0 {
		reason += fmt.Sprintf("; the largest sample (%s) in the phase \"%s\"", report.Bytes(top.rss), top.phase)
	}
	return reason
}

func s6TargetRows(sec *report.Section, r *s6Result) {
	p := r.plan
	size := fmt.Sprintf("%s rules over %d gateways", report.SizeLabel(p.Rules), p.Gateways)
	if p.Rules != s6FullRules || p.Gateways != s6FullGateways {
		size += fmt.Sprintf(" (not the full size: %s over %d)", report.SizeLabel(s6FullRules), s6FullGateways)
	}
	rss := report.Target{Name: "S6 natgw-controller RSS with every object Ready (the largest of VmRSS and peak VmHWM, the cold start's process included, and of the VmRSS sampled in every phase), " + size, Want: "≤ " + report.Bytes(s6TargetRSS)}
	if r.readyRSS > 0 {
		worst := s6WorstRSS(r)
		rss.Got, rss.Pass = report.Bytes(worst), worst <= s6TargetRSS
		rss.Reason = s6RSSReason(r) + "; the figure counts the phase samples too, as the second part's does (before 2026-12-06 it was VmRSS/VmHWM at Ready and after the cold start only: a sample taken after those reads, in the paced phase with every object in place, can raise it)"
	} else {
		rss.Got, rss.Reason = "not measured", "the run failed before every object was Ready (see the notes)"
	}
	sec.Targets = append(sec.Targets, rss)

	cold := math.NaN()
	if r.cold != nil {
		cold = r.cold.synced.Seconds()
	}
	ct := maxTarget("S6 cold start: exec → every gateway synced, "+size, s6TargetCold, cold)
	if c := r.cold; c != nil {
		ct.Reason = fmt.Sprintf("first gateway synced after %s, queues drained after %s; the restart made %s API writes to natgw's objects, %d objects lost Ready; %d of %d gateways held exactly their objects",
			report.Seconds(c.firstSynced.Seconds()), report.Seconds(c.drained.Seconds()), report.Count(c.writes.natgw), c.lostReady, c.kernelOK, c.kernelTotal)
	}
	sec.Targets = append(sec.Targets, ct)

	drained := math.NaN()
	if r.cold != nil {
		drained = r.cold.drained.Seconds()
	}
	dt := maxTarget("S6 cold start: exec → queues drained (every object reconciled once), "+size, s6TargetDrained, drained)
	if c := r.cold; c != nil {
		dt.Reason = fmt.Sprintf("all gateways synced after %s; the controller's CPU until drained %s; %s API writes to natgw's objects",
			report.Seconds(c.synced.Seconds()), report.Seconds(c.ctlCPU.Seconds()), report.Count(c.writes.natgw))
	}
	sec.Targets = append(sec.Targets, dt)

	sec.Targets = append(sec.Targets, s6RatioRows(
		func(q string) string {
			return fmt.Sprintf("S6 one FIP create→Ready %s with everything in place ÷ with ~0 objects (%d paced each), %s", q, p.Paced, size)
		},
		s6TargetRatio, r.loaded, r.base, "with everything in place", "with ~0 objects", nil)...)
}

// s6RatioRows are the paced-ratio target rows of both parts, one per
// quantile (p50, p99): create→Ready in phase num ÷ the same quantile in
// phase den, PASS at ≤ bound. name names the row of a quantile; numWhat
// and denWhat say what each phase was in the row's reason; more, when not
// nil, adds to a measured row's reason (get reads the row's quantile).
func s6RatioRows(name func(q string) string, bound float64, num, den *s6Paced, numWhat, denWhat string, more func(get func(stats.Summary) float64) string) []report.Target {
	var out []report.Target
	for _, q := range s6Quantiles {
		t := report.Target{Name: name(q.name), Want: fmt.Sprintf("≤ %.0f×", bound)}
		if num == nil || den == nil {
			t.Got, t.Reason = "not measured", "the run failed before both paced phases (see the notes)"
		} else {
			n, d := q.get(num.ready), q.get(den.ready)
			ratio := n / d
			t.Got, t.Pass = fmt.Sprintf("%.2f×", ratio), ratio <= bound
			t.Reason = fmt.Sprintf("%s %s, %s %s", report.Seconds(n), numWhat, report.Seconds(d), denWhat)
			if more != nil {
				t.Reason += more(q.get)
			}
		}
		out = append(out, t)
	}
	return out
}

// s6WorstRSS is the RSS figure both parts' target rows check: the largest
// of the controller's VmRSS and peak VmHWM with every object Ready, of the
// restarted process's after its cold start, and of the VmRSS sampled in
// every phase (NaN when nothing was measured).
func s6WorstRSS(r *s6Result) float64 {
	worst := math.NaN()
	up := func(v float64) {
		if v > 0 && (math.IsNaN(worst) || v > worst) {
			worst = v
		}
	}
	if r.readyRSS > 0 {
		up(r.readyRSS)
		up(r.readyHWM)
	}
	if c := r.cold; c != nil {
		up(c.rss)
		up(c.hwm)
	}
	for _, pk := range r.peaks {
		up(pk.rss)
	}
	return worst
}

func s6Metrics(e *Env, r *s6Result) {
	nan := math.NaN()
	add := func(name, unit, better string, v float64) {
		e.Report.AddMetric(report.NewMetric("s6."+name, unit, better, v, nan, ""))
	}
	if r.readyRSS > 0 {
		add("controller_rss_ready", "bytes", report.LowerIsBetter, r.readyRSS)
		add("controller_hwm_ready", "bytes", report.LowerIsBetter, r.readyHWM)
		add("controller_rss_worst", "bytes", report.LowerIsBetter, s6WorstRSS(r))
	}
	if ld := r.load; ld != nil {
		add("load.objects_ready_per_s", "objects/s", report.HigherIsBetter, float64(ld.eips+ld.rules)/ld.span.Seconds())
		add("load.api_writes_per_object", "writes", report.LowerIsBetter, ld.writes.all/float64(ld.eips+ld.rules))
	}
	if c := r.cold; c != nil {
		add("cold_start.all_synced", "s", report.LowerIsBetter, c.synced.Seconds())
		add("cold_start.drained", "s", report.LowerIsBetter, c.drained.Seconds())
		add("cold_start.api_writes", "writes", report.LowerIsBetter, c.writes.natgw)
		add("cold_start.controller_hwm", "bytes", report.LowerIsBetter, c.hwm)
	}
	if r.base != nil && r.loaded != nil {
		const baseName = "the same controller with ~0 objects"
		e.Report.AddMetric(
			report.NewMetric("s6.paced_loaded.create_ready.p50", "s", report.LowerIsBetter, r.loaded.ready.Median, r.base.ready.Median, baseName),
			report.NewMetric("s6.paced_loaded.create_ready.p99", "s", report.LowerIsBetter, r.loaded.ready.P99, r.base.ready.P99, baseName))
	}
}

// s6SaveCPU merges the cold start's CPU profile into the output directory
// as name and reads its tops into cs.
func s6SaveCPU(ctx context.Context, e *Env, cs *s6Cold, cpu *s6CPURecorder, name string) {
	path := filepath.Join(e.OutDir, name)
	if err := cpu.finish(ctx, path); err != nil {
		cs.cpuTopError = err.Error()
		e.Progress.Printf("CPU profile %s: %v", name, err)
		if _, serr := os.Stat(path); serr != nil {
			return
		}
	}
	e.Progress.Printf("CPU profile of natgw-controller's cold start: %s", path)
	cs.cpuProfile = name
	var errs []string
	for _, v := range []struct {
		into *[]s6ProfileTop
		args []string
	}{{&cs.cpuFlat, []string{"-sample_index=cpu"}}, {&cs.cpuCum, []string{"-sample_index=cpu", "-cum"}}} {
		tops, msg := s6ProfileTops(ctx, e, s6CPUTopLines, v.args, name)
		*v.into = tops
		if msg != "" {
			errs = append(errs, msg)
		}
	}
	if len(errs) > 0 {
		cs.cpuTopError = strings.Join(append([]string{cs.cpuTopError}, errs...), "; ")
	}
}

// s6SaveHeap writes the controller's heap profile into the output
// directory (`go tool pprof -top -sample_index=inuse_space FILE`); a failure
// is reported as progress, not as the scenario's failure.
func s6SaveHeap(ctx context.Context, e *Env, ctl *ctlProcess, name string) {
	if e.OutDir == "" {
		return
	}
	path := filepath.Join(e.OutDir, name)
	if err := ctl.heapProfile(ctx, path); err != nil {
		e.Progress.Printf("heap profile %s: %v", name, err)
		return
	}
	e.Progress.Printf("heap profile of natgw-controller: %s", path)
}

// s6ReportCommon adds what both parts of scenario 6 report: the run's
// notes, the objects, the first programming, the controller's memory (and
// by phase), the cold start.
func s6ReportCommon(sec *report.Section, r *s6Result, runErr error) {
	p := r.plan
	m := r.mix
	if r.took > 0 {
		sec.Notes = append(sec.Notes, fmt.Sprintf("The scenario took %s (kube-apiserver + etcd up in %s, %d gateway namespaces in %s).",
			report.Seconds(r.took.Seconds()), report.Seconds(r.apiUp.Seconds()), p.Gateways, report.Seconds(r.gwSetup.Seconds())))
	}
	if runErr != nil {
		note := fmt.Sprintf("Failed: %v", runErr)
		if r.log != "" {
			note += fmt.Sprintf(" (the controller's log is kept in %s)", r.log)
		}
		sec.Notes = append(sec.Notes, note)
	}
	total := 0
	for _, n := range r.counts {
		total += n
	}
	if len(r.counts) > 0 {
		sec.Tables = append(sec.Tables, report.Table{Caption: "**the objects**",
			Header: []string{"kind", "per gateway", "all gateways"},
			Rows: [][]string{
				{"IptablesFIPRule", strconv.Itoa(m.FIPs), strconv.Itoa(r.counts["fip"])},
				{"IptablesDnatRule", strconv.Itoa(m.DNATs), strconv.Itoa(r.counts["dnat"])},
				{"IptablesSnatRule", strconv.Itoa(m.SNATs), strconv.Itoa(r.counts["snat"])},
				{"IptablesEIP", strconv.Itoa(m.EIPs()), strconv.Itoa(r.counts["eip"])},
				{"all", strconv.Itoa(m.FIPs + m.DNATs + m.SNATs + m.EIPs()), strconv.Itoa(total)},
			}})
	}
	if ld := r.load; ld != nil {
		n := float64(ld.eips + ld.rules)
		sec.Tables = append(sec.Tables, report.Table{Caption: "**first programming** (the load; the controller running while the objects are created)",
			Header: []string{"EIPs: created / all Ready after", "rules: created / all Ready after", "all objects Ready after (objects/s)",
				"API writes (per object, per s)", "of them to natgw's objects / Events", "kube-apiserver + etcd CPU (share of all CPUs)", "controller CPU (share)",
				"reconciles per object", "queues drained after the last Ready", "objects that lost Ready"},
			Rows: [][]string{{
				report.Seconds(ld.eipsCreated.Seconds()) + " / " + report.Seconds(ld.eipsReady.Seconds()),
				report.Seconds(ld.rulesCreated.Seconds()) + " / " + report.Seconds(ld.rulesReady.Seconds()),
				fmt.Sprintf("%s (%s/s)", report.Seconds(ld.span.Seconds()), report.Count(n/ld.span.Seconds())),
				writesCell(ld.writes.all, int(n), ld.span),
				report.Count(ld.writes.natgw) + " / " + report.Count(ld.writes.events),
				cpuCell(ld.apiCPU, ld.span), cpuCell(ld.ctlCPU, ld.span),
				report.Count(ld.reconcilesPerObj), report.Seconds(ld.drained.Seconds()), strconv.Itoa(ld.lostReady),
			}}})
	}
	mem := report.Table{Caption: "**natgw-controller memory** (VmRSS, peak VmHWM from /proc/PID/status)", Header: []string{"when", "objects", "VmRSS", "peak VmHWM"}}
	if r.idleRSS > 0 {
		mem.Rows = append(mem.Rows, []string{"idle: gateways connected, before the load", strconv.Itoa(p.Paced + 1 + p.Gateways), report.Bytes(r.idleRSS), "—"})
	}
	if r.readyRSS > 0 {
		mem.Rows = append(mem.Rows, []string{"every object Ready (peak: since the start, the load included)", strconv.Itoa(total), report.Bytes(r.readyRSS), report.Bytes(r.readyHWM)})
	}
	if c := r.cold; c != nil && c.rss > 0 {
		mem.Rows = append(mem.Rows, []string{"after the cold start, queues drained (peak: of the new process)", strconv.Itoa(total), report.Bytes(c.rss), report.Bytes(c.hwm)})
	}
	if len(mem.Rows) > 0 {
		sec.Tables = append(sec.Tables, mem)
	}
	if len(r.peaks) > 0 {
		t := report.Table{Caption: "**natgw-controller VmRSS by phase** (the largest of samples every 500 ms during the phase)", Header: []string{"phase", "largest VmRSS sampled"}}
		for _, pk := range r.peaks {
			t.Rows = append(t.Rows, []string{pk.phase, report.Bytes(pk.rss)})
		}
		sec.Tables = append(sec.Tables, t)
	}
	if c := r.cold; c != nil {
		sec.Tables = append(sec.Tables, report.Table{Caption: "**cold start** with every object in place (the new process, times from its exec)",
			Header: []string{"SIGTERM → exit", "caches synced (first workers started)", "first gateway synced", "all gateways synced", "queues drained", "objects in the gateways' syncs",
				"API writes to natgw's objects (Events; all)", "objects that lost Ready", "controller CPU until drained", "gateways holding exactly their objects (UIDs in the kernel)"},
			Rows: [][]string{{
				report.Seconds(c.stop.Seconds()), report.Seconds(c.workers.Seconds()), report.Seconds(c.firstSynced.Seconds()), report.Seconds(c.synced.Seconds()), report.Seconds(c.drained.Seconds()),
				report.Count(float64(c.syncedObjects)),
				fmt.Sprintf("%s (%s; %s)", report.Count(c.writes.natgw), report.Count(c.writes.events), report.Count(c.writes.all)),
				strconv.Itoa(c.lostReady), cpuCell(c.ctlCPU, c.drained),
				fmt.Sprintf("%d of %d (%s)", c.kernelOK, c.kernelTotal, report.Count(float64(c.kernelObjects))),
			}}})
		for _, v := range []struct {
			by   string
			tops []s6ProfileTop
		}{{"flat", c.cpuFlat}, {"cumulative", c.cpuCum}} {
			for _, h := range v.tops {
				sec.Tables = append(sec.Tables, report.Table{Caption: fmt.Sprintf("**natgw-controller CPU profile of the cold start** `%s` "+
					"(from the new process's first answer on its profile endpoint until every gateway synced, %s windows merged; `go tool pprof -top`, by %s time, first %d lines)",
					h.profile, report.Seconds(s6CPUWindow.Seconds()), v.by, s6CPUTopLines),
					Header: []string{"flat", "flat%", "sum%", "cum", "cum%", "function"}, Rows: h.rows})
			}
		}
		if c.cpuTopError != "" {
			sec.Notes = append(sec.Notes, "Cold start CPU profile: "+c.cpuTopError)
		}
		if len(c.cpu) > 0 {
			t, notes := s6CPUTable(c.cpu)
			if len(t.Rows) > 0 {
				sec.Tables = append(sec.Tables, t)
			}
			sec.Notes = append(sec.Notes, notes...)
		}
	}
}

// s6PacedRow is one row of the paced latency table: the conditions, the
// phase (nil when it did not run).
type s6PacedRow struct {
	what string
	ps   *s6Paced
}

// s6LatencyTable adds the paced phases' create→Ready and delete→gone.
func s6LatencyTable(sec *report.Section, rows []s6PacedRow) {
	lat := report.Table{Caption: "**one FIP at a time** on the same controller, create→Ready and delete→gone per FIP, p50 / p90 / p99",
		Header: []string{"objects in place", "FIPs", "create→Ready p50 / p90 / p99", "delete→gone p50 / p90 / p99", "Create request p50"}}
	for _, v := range rows {
		if v.ps != nil {
			lat.Rows = append(lat.Rows, []string{v.what, strconv.Itoa(v.ps.ready.N), pct(v.ps.ready), pct(v.ps.gone), report.Seconds(v.ps.createCall.Median)})
		}
	}
	if len(lat.Rows) > 0 {
		sec.Tables = append(sec.Tables, lat)
	}
}
