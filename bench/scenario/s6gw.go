package scenario

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/bench/stats"
	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/e2e/framework"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/procfs"
)

// The second part of scenario 6: many small gateways ("1,000 gateways ×
// 100 rules"), the same machinery as the first part
// (s6Prepare, s6RunLoad, s6RunPaced, s6ColdStart, s6CheckKernel), and one
// change measured while a steady churn of creates and deletes spreads over
// every gateway.

const (
	s6GWSection = "s6-gateways"
	s6GWTitle   = "Scenario 6, many small gateways: the controller with 1,000 gateways × 100 rules"
)

// s6PartEnv selects a part of scenario 6: "rules" (many rules over a few
// gateways), "gateways" (many small gateways); unset or "" runs both.
const s6PartEnv = "NATGW_BENCH_S6_PART"

// s6GWSizeEnv overrides the second part's size:
// "GATEWAYS,RULES_PER_GATEWAY[,CHURN_PER_S]".
const s6GWSizeEnv = "NATGW_BENCH_S6_GATEWAYS"

// The second part's full size (make bench); -quick runs a tenth of the
// gateways with the same rules each.
const (
	s6GWFullGateways   = 1000
	s6GWRulesPerGW     = 100
	s6GWQuickGateways  = 100
	s6GWChurnPerSecond = 20
)

// Targets of the second part.
const (
	s6GWTargetRSS   = 256 << 20
	s6GWTargetCold  = 10 * time.Second
	s6GWTargetRatio = 2.0
)

// s6GWPlan is the second part's size: the first part's plan (its Rules are
// all gateways' rules) and the churn's rate.
type s6GWPlan struct {
	s6Plan
	// ChurnPerS is the churn's creates per second (each create also
	// deletes the gateway's previous churn object: twice the writes).
	ChurnPerS int
}

// s6Parts says which parts of scenario 6 run (s6PartEnv).
func s6Parts() (rulesPart, gwPart bool, err error) {
	switch v := strings.TrimSpace(os.Getenv(s6PartEnv)); v {
	case "":
		return true, true, nil
	case "rules":
		return true, false, nil
	case "gateways":
		return false, true, nil
	default:
		return false, false, fmt.Errorf("%s=%q: want rules, gateways or unset (both)", s6PartEnv, v)
	}
}

// s6Ints parses env's value v, "N,N[,N…]", into at least lo and at most
// len(into) integers; it returns how many it read.
func s6Ints(env, v, usage string, lo int, into []int) (int, error) {
	f := strings.Split(v, ",")
	if len(f) < lo || len(f) > len(into) {
		return 0, fmt.Errorf("%s=%q: want %s", env, v, usage)
	}
	for i := range f {
		x, err := strconv.Atoi(strings.TrimSpace(f[i]))
		if err != nil {
			return 0, fmt.Errorf("%s=%q: %w", env, v, err)
		}
		into[i] = x
	}
	return len(f), nil
}

func s6GWPlanFor(quick bool) (s6GWPlan, error) {
	p := s6GWPlan{s6Plan: s6Plan{Gateways: s6GWFullGateways, Paced: 30, Creators: 16, Workers: reconciler.DefaultWorkers}, ChurnPerS: s6GWChurnPerSecond}
	perGW := s6GWRulesPerGW
	if quick {
		p.Gateways = s6GWQuickGateways
	}
	if v := os.Getenv(s6GWSizeEnv); v != "" {
		var n [3]int
		got, err := s6Ints(s6GWSizeEnv, v, "GATEWAYS,RULES_PER_GATEWAY[,CHURN_PER_S]", 2, n[:])
		if err != nil {
			return p, err
		}
		p.Gateways, perGW = n[0], n[1]
		if got == 3 {
			p.ChurnPerS = n[2]
		}
	}
	p.Rules = p.Gateways * perGW
	return p, p.validate()
}

func (p s6GWPlan) validate() error {
	if p.ChurnPerS < 1 || p.ChurnPerS > 1000 {
		return fmt.Errorf("scenario 6, many gateways: churn of %d creates/s, want 1..1000", p.ChurnPerS)
	}
	return p.s6Plan.validate()
}

// s6Agents is the memory of the controller's `natgw serve` agents (the
// other processes of its process group).
type s6Agents struct {
	n        int
	rss, pss float64 // sums of VmRSS and of Pss (shared pages split)
	maxRSS   float64 // the largest agent's VmRSS
}

// s6ChurnStats is what the background churn did.
type s6ChurnStats struct {
	perS             int
	creates, deletes int
	gateways         int // distinct gateways it changed
	span             time.Duration
	// During the paced phase under churn.
	pacedCreates, pacedGateways int
}

// s6GW is what the second part measured on top of s6Result.
type s6GW struct {
	plan s6GWPlan
	// idle: paced FIPs with every object in place and no other activity;
	// churn: the same while the churn runs.
	idle, churn  *s6Paced
	churnStats   s6ChurnStats
	agentsIdle   *s6Agents // gateways connected, before the load
	agentsReady  *s6Agents // every object Ready
	agentsCold   *s6Agents // after the cold start
	heapTop      []s6ProfileTop
	heapTopError string
}

// runS6GW runs the second part of scenario 6 at plan's size and reports
// it.
func runS6GW(ctx context.Context, e *Env, plan s6GWPlan) (*s6Result, error) {
	e.Progress.Scenario("scenario 6, many small gateways: %d gateways × %d rules, churn %d creates/s (natgw-controller process, kube-apiserver + etcd, natgw serve)",
		plan.Gateways, plan.rulesOn(0), plan.ChurnPerS)
	r := &s6Result{plan: plan.s6Plan, mix: s6MixOf(plan.rulesOn(0)), gw: &s6GW{plan: plan}}
	return runS6Part(ctx, e, r, s6Part{id: s6GWSection, title: s6GWTitle, run: s6GWRun, report: reportS6GW})
}

// s6GWRun: the gateways and the controller (s6Prepare); paced FIPs with
// ~0 objects; the load; paced FIPs with everything in place and nothing
// else happening (idle); the churn started, and after a warm-up the same
// paced FIPs while it runs; the churn stopped and its objects gone; the
// cold start and the kernel check. The agents' memory is read when the
// gateways are connected, with every object Ready and after the cold start.
func s6GWRun(ctx context.Context, e *Env, r *s6Result, cp *controlPlane, l *netlab.Lab, tmp, kubeconfig string) error {
	x := r.gw
	rg, err := s6Prepare(ctx, e, r, cp, l, tmp, kubeconfig)
	defer rg.close()
	if err != nil {
		return err
	}
	agents := func(into **s6Agents) {
		a, err := s6AgentMemory(rg.ctl.pid())
		if err != nil {
			e.Progress.Printf("agents' memory: %v", err)
			return
		}
		*into = &a
		e.Progress.Printf("%d natgw serve agents: VmRSS %s in all (largest %s), Pss %s in all", a.n, report.Bytes(a.rss), report.Bytes(a.maxRSS), report.Bytes(a.pss))
	}
	agents(&x.agentsIdle)
	eips, rules, err := rg.baseAndLoad(ctx, func() { agents(&x.agentsReady) })
	if err != nil {
		return err
	}
	readyHeap := "s6gw-heap-ready.pb.gz"
	s6SaveHeap(ctx, e, rg.ctl, readyHeap)
	if x.idle, err = rg.paced(ctx, "paced, every object in place, idle", "fip-idle"); err != nil {
		return fmt.Errorf("paced FIPs, idle: %w", err)
	}
	rg.phase("paced, every object in place, idle")

	ch := newS6Churn(rg.c, x.plan, r.mix)
	stop := make(chan struct{})
	stopChurn := sync.OnceFunc(func() { close(stop) })
	churnDone := make(chan error, 1)
	go func() { churnDone <- ch.run(ctx, stop) }()
	warm := s6ChurnWarmup(x.plan)
	e.Progress.Step(0, 0, "churn: %d creates/s over %d gateways, warm-up %s", x.plan.ChurnPerS, x.plan.Gateways, warm)
	select {
	case <-time.After(warm):
	case err := <-churnDone:
		stopChurn()
		return fmt.Errorf("churn: %w", err)
	case <-ctx.Done():
		stopChurn()
		return ctx.Err()
	}
	before := ch.stats()
	x.churn, err = rg.paced(ctx, "paced, every object in place, under churn", "fip-churn")
	after := ch.stats()
	stopChurn()
	cerr := <-churnDone
	if err != nil {
		return fmt.Errorf("paced FIPs under churn: %w", err)
	}
	if cerr != nil {
		return fmt.Errorf("churn: %w", cerr)
	}
	x.churnStats = after
	x.churnStats.pacedCreates = after.creates - before.creates
	x.churnStats.pacedGateways = ch.gatewaysSince(before.creates)
	rg.phase("paced under churn")
	e.Progress.Printf("churn: %d creates, %d deletes over %d gateways in %s; %d creates on %d gateways during the paced FIPs",
		after.creates, after.deletes, after.gateways, report.Seconds(after.span.Seconds()), x.churnStats.pacedCreates, x.churnStats.pacedGateways)
	if err := ch.cleanup(ctx); err != nil {
		return err
	}
	x.churnStats.deletes = ch.stats().deletes
	if err := s6WaitDNATs(ctx, rg.c, r.counts["dnat"]); err != nil {
		return err
	}
	if _, err := s6WaitDrained(ctx, rg.ctl, nil, 5*time.Minute); err != nil {
		return fmt.Errorf("after the churn: %w", err)
	}
	rg.phase("churn's objects deleted")
	e.Progress.Printf("one FIP at a time, create→Ready p50 %s p99 %s with ~0 objects; with %s in place p50 %s p99 %s idle, p50 %s p99 %s under churn",
		report.Seconds(r.base.ready.Median), report.Seconds(r.base.ready.P99), report.SizeLabel(len(eips)+len(rules)),
		report.Seconds(x.idle.ready.Median), report.Seconds(x.idle.ready.P99), report.Seconds(x.churn.ready.Median), report.Seconds(x.churn.ready.P99))

	coldHeap := "s6gw-heap-cold.pb.gz"
	if err := rg.coldStart(ctx, coldHeap, "s6gw-cpu-cold.pb.gz", eips, rules); err != nil {
		return err
	}
	agents(&x.agentsCold)
	x.heapTop, x.heapTopError = s6HeapTops(ctx, e, readyHeap, coldHeap)
	return nil
}

// s6ChurnWarmup is how long the churn runs before the paced FIPs: one round
// over every gateway, at least 5 s, at most a minute.
func s6ChurnWarmup(p s6GWPlan) time.Duration {
	d := time.Duration(float64(p.Gateways) / float64(p.ChurnPerS) * float64(time.Second))
	return min(time.Minute, max(5*time.Second, d))
}

// s6Churn creates DNATs at a steady rate, gateway after gateway: each
// create on gateway g deletes g's previous churn DNAT, so every gateway
// holds at most one. Its DNATs use the gateway's first DNAT EIP with
// external and internal ports from 20000 (the load's are below) and the
// gateway's first unused internal host.
type s6Churn struct {
	c    client.Client
	plan s6GWPlan
	host int // the internal host index the churn's DNATs forward to

	mu   sync.Mutex
	live map[int]*v1.IptablesDnatRule
	// leftover are DNATs replaced in live whose delete failed.
	leftover []*v1.IptablesDnatRule
	order    []int // the gateway of every create, in order
	st       s6ChurnStats
	t0       time.Time
	seen     map[int]bool
}

func newS6Churn(c client.Client, plan s6GWPlan, m s6Mix) *s6Churn {
	return &s6Churn{c: c, plan: plan, host: m.FIPs + (m.DNATs+s6PortsPerHost-1)/s6PortsPerHost,
		live: map[int]*v1.IptablesDnatRule{}, seen: map[int]bool{}, st: s6ChurnStats{perS: plan.ChurnPerS}}
}

// s6ChurnDNAT is churn create n on gateway g.
func (ch *s6Churn) dnat(n, g int) *v1.IptablesDnatRule {
	port := 20000 + (n/ch.plan.Gateways)%10000
	return framework.DNAT(fmt.Sprintf("churn-g%03d-%07d", g, n), fmt.Sprintf("eip-g%03d-dnat000", g), "tcp",
		port, s6Host(s6Net(g), ch.host), port)
}

// run creates and deletes until stop is closed (nil then), ctx ends or a
// request fails. A create and the delete it comes with both complete (under
// ctx, not stop): the churn leaves only the objects in live.
func (ch *s6Churn) run(ctx context.Context, stop <-chan struct{}) error {
	tick := time.NewTicker(time.Second / time.Duration(ch.plan.ChurnPerS))
	defer tick.Stop()
	ch.mu.Lock()
	ch.t0 = time.Now()
	ch.mu.Unlock()
	for n := 0; ; n++ {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		g := n % ch.plan.Gateways
		d := ch.dnat(n, g)
		if err := ch.c.Create(ctx, d); err != nil {
			return fmt.Errorf("create IptablesDnatRule %s: %w", d.Name, err)
		}
		ch.mu.Lock()
		prev := ch.live[g]
		ch.live[g] = d
		ch.order = append(ch.order, g)
		ch.seen[g] = true
		ch.st.creates++
		ch.st.gateways = len(ch.seen)
		ch.st.span = time.Since(ch.t0)
		ch.mu.Unlock()
		if prev == nil {
			continue
		}
		if err := ch.c.Delete(ctx, prev); err != nil && !apierrors.IsNotFound(err) {
			ch.mu.Lock()
			ch.leftover = append(ch.leftover, prev)
			ch.mu.Unlock()
			return fmt.Errorf("delete IptablesDnatRule %s: %w", prev.Name, err)
		}
		ch.mu.Lock()
		ch.st.deletes++
		ch.mu.Unlock()
	}
}

func (ch *s6Churn) stats() s6ChurnStats {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	return ch.st
}

// gatewaysSince counts the distinct gateways of the creates from index i.
func (ch *s6Churn) gatewaysSince(i int) int {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	seen := map[int]bool{}
	for _, g := range ch.order[min(i, len(ch.order)):] {
		seen[g] = true
	}
	return len(seen)
}

// cleanup deletes the churn's remaining DNATs (after run returned).
func (ch *s6Churn) cleanup(ctx context.Context) error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	all := ch.leftover
	for _, d := range ch.live {
		all = append(all, d)
	}
	for _, d := range all {
		if err := ch.c.Delete(ctx, d); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete IptablesDnatRule %s: %w", d.Name, err)
		}
		ch.st.deletes++
	}
	ch.live, ch.leftover = map[int]*v1.IptablesDnatRule{}, nil
	return nil
}

// s6WaitDNATs waits until the API server holds want DNATs (the churn's
// are gone: the controller removed their finalizer).
func s6WaitDNATs(ctx context.Context, c client.Client, want int) error {
	_, err := framework.Wait(ctx, 5*time.Minute, func() error {
		var l v1.IptablesDnatRuleList
		if err := c.List(ctx, &l); err != nil {
			return fmt.Errorf("list IptablesDnatRules: %w", err)
		}
		if len(l.Items) != want {
			return fmt.Errorf("%d IptablesDnatRules, want %d (the churn's gone)", len(l.Items), want)
		}
		return nil
	})
	return err
}

// s6AgentMemory reads the memory of the processes in the controller's
// process group other than the controller: its `natgw serve` agents.
func s6AgentMemory(pgid int) (s6Agents, error) {
	var a s6Agents
	if pgid == 0 {
		return a, errors.New("natgw-controller not running")
	}
	agents, err := s6GroupMembers(pgid)
	if err != nil {
		return a, fmt.Errorf("agents' memory: %w", err)
	}
	for pid := range agents {
		rss, _, err := procfs.Memory(pid)
		if err != nil {
			continue
		}
		a.n++
		a.rss += rss
		a.maxRSS = max(a.maxRSS, rss)
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid)); err == nil {
			a.pss += s6Pss(string(b))
		}
	}
	if a.n == 0 {
		return a, fmt.Errorf("no agent in natgw-controller's process group %d", pgid)
	}
	return a, nil
}

// s6GroupMembers returns the /proc/PID/stat of every process in process
// group pgid but its leader (the controller): its agents. A process that
// exits while the group is read is left out.
func s6GroupMembers(pgid int) (map[int]procfs.Stat, error) {
	pids, err := procfs.Pids()
	if err != nil {
		return nil, err
	}
	out := map[int]procfs.Stat{}
	for _, pid := range pids {
		if pid == pgid {
			continue
		}
		if st, err := procfs.ReadStat(pid); err == nil && st.Pgrp == pgid {
			out[pid] = st
		}
	}
	return out, nil
}

// s6Pss returns the Pss line of /proc/PID/smaps_rollup in bytes (0 when
// there is none).
func s6Pss(rollup string) float64 {
	for _, line := range strings.Split(rollup, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != "Pss" {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 2 && f[1] == "kB" {
			if kb, err := strconv.ParseFloat(f[0], 64); err == nil {
				return kb * 1024
			}
		}
	}
	return 0
}

// s6Paced percentiles the rows compare.
var s6Quantiles = []struct {
	name string
	get  func(stats.Summary) float64
}{{"p50", func(s stats.Summary) float64 { return s.Median }}, {"p99", func(s stats.Summary) float64 { return s.P99 }}}
