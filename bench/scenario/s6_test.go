package scenario

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/natgw/natgw/controller/api/v1"
)

// TestS6Tiny runs scenario 6 with 2 gateways, 30 rules and 3 paced FIPs:
// the natgw-controller process (built by the scenario), a real
// kube-apiserver + etcd and `natgw serve` in two namespaces. The figures
// must be there and consistent with each other and with the size.
func TestS6Tiny(t *testing.T) {
	e := controlPlaneEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	plan := s6Plan{Gateways: 2, Rules: 30, Paced: 3, Creators: 4, Workers: 2}
	r, err := runS6(ctx, e, plan)
	if err != nil {
		t.Fatalf("scenario 6: %v", err)
	}
	// 2 gateways × (1 FIP + 13 DNATs + 1 SNAT, and 3 EIPs).
	for kind, want := range map[string]int{"fip": 2, "dnat": 26, "snat": 2, "eip": 6} {
		if got := r.counts[kind]; got != want {
			t.Errorf("%d %s objects, want %d", got, kind, want)
		}
	}
	const objects = 36
	ld := r.load
	switch {
	case ld.span <= 0 || ld.eipsReady <= 0 || ld.rulesReady <= 0 || ld.span < ld.rulesReady:
		t.Errorf("load spans inconsistent: %+v", ld)
	case ld.writes.all < objects || ld.writes.natgw < objects || ld.writes.natgw > ld.writes.all:
		t.Errorf("load: %+v API writes for %d creates", ld.writes, objects)
	case ld.writes.natgw > 10*objects:
		t.Errorf("load: %v writes to natgw's objects for %d objects", ld.writes.natgw, objects)
	case ld.lostReady != 0:
		t.Errorf("load: %d objects lost Ready", ld.lostReady)
	case ld.reconcilesPerObj < 1:
		t.Errorf("load: %v reconciles per object", ld.reconcilesPerObj)
	}
	if r.idleRSS < 8<<20 || r.readyRSS < 8<<20 || r.readyRSS > s6TargetRSS || r.readyHWM < r.readyRSS {
		t.Errorf("controller memory: idle %v, ready %v, peak %v", r.idleRSS, r.readyRSS, r.readyHWM)
	}
	c := r.cold
	// What the gateways hold: 2 VpcNatGateway routes, 4 paced EIPs, the load.
	const onGateways = 2 + 4 + objects
	switch {
	case c.stop <= 0 || c.workers <= 0 || c.firstSynced <= 0 || c.firstSynced > c.synced || c.synced > c.drained || c.workers > c.drained:
		t.Errorf("cold start times out of order: stop %v, workers started %v, first synced %v, all synced %v, drained %v", c.stop, c.workers, c.firstSynced, c.synced, c.drained)
	case c.synced > time.Minute:
		t.Errorf("cold start of 2 gateways with %d objects took %v", objects, c.synced)
	case c.kernelTotal != 2 || c.kernelOK != 2 || c.kernelObjects != onGateways:
		t.Errorf("kernel check: %d of %d gateways exact, %d UIDs, want 2 of 2 and %d", c.kernelOK, c.kernelTotal, c.kernelObjects, onGateways)
	case c.syncedObjects != 0:
		// Every gateway holds its set: a new process's first connect
		// writes only a difference (controller/gateway, complete).
		t.Errorf("the cold start's syncs sent %d objects to gateways that held their %d, want 0", c.syncedObjects, onGateways)
	case c.writes.natgw > onGateways:
		t.Errorf("the cold start wrote %v times to natgw's objects, more than there are objects", c.writes.natgw)
	case c.rss <= 0 || c.hwm < c.rss:
		t.Errorf("memory after the cold start: %v, peak %v", c.rss, c.hwm)
	}
	for _, p := range []*s6Paced{r.base, r.loaded} {
		if p.ready.N != plan.Paced || p.gone.N != plan.Paced || !(p.ready.Median > 0 && p.ready.P99 < 30) || p.ready.P99 < p.ready.Median {
			t.Errorf("paced phase: %+v", p)
		}
	}

	sec := e.Report.Section("s6", "")
	if sec.NotRun != "" || len(sec.Tables) != 9 {
		t.Fatalf("not run %q, %d tables, want 9 (objects, load, memory, memory by phase, cold start, its CPU profile by flat and by cumulative time, its CPU by process, paced); notes %v", sec.NotRun, len(sec.Tables), sec.Notes)
	}
	// The cold start's CPU profile: saved, and its tops read (a row is a
	// function with samples).
	if _, err := os.Stat(filepath.Join(e.OutDir, c.cpuProfile)); c.cpuProfile == "" || err != nil || c.cpuTopError != "" {
		t.Errorf("cold start CPU profile %q (%v): %s", c.cpuProfile, err, c.cpuTopError)
	}
	for i, by := range []string{"flat", "cumulative"} {
		tb := sec.Tables[5+i]
		if !strings.Contains(tb.Caption, "CPU profile of the cold start") || !strings.Contains(tb.Caption, "by "+by) || len(tb.Rows) == 0 {
			t.Errorf("table %d: %q with %d rows, want the cold start CPU profile by %s time", 5+i, tb.Caption, len(tb.Rows), by)
		}
	}

	// The cold start's CPU by process: every window read without error,
	// the new controller and its 2 agents used some, and the machine was
	// busy at least as long as the processes read (a tick of 10 ms per
	// reading of each).
	var ctl, agents, api, busy time.Duration
	for _, w := range c.cpu {
		if w.err != nil || w.span <= 0 || w.ctl < 0 || w.agents < 0 || w.api < 0 {
			t.Errorf("cold start CPU window %+v", w)
		}
		ctl, agents, api, busy = ctl+w.ctl, agents+w.agents, api+w.api, busy+w.machineBusy
	}
	if n := len(c.cpu); n < 2 || n > 3 || c.cpu[n-1].agentsN != 2 {
		t.Errorf("cold start CPU windows %+v: want 2 or 3, the last with 2 agents running", c.cpu)
	}
	if ctl <= 0 || agents <= 0 || api <= 0 || busy < ctl+agents+api-time.Duration(len(c.cpu))*60*time.Millisecond {
		t.Errorf("cold start CPU: controller %v, agents %v, API server %v, machine busy %v", ctl, agents, api, busy)
	}
	if tb := sec.Tables[7]; !strings.Contains(tb.Caption, "CPU during the cold start") || len(tb.Rows) != len(c.cpu) {
		t.Errorf("table 7: %q with %d rows, want the cold start's CPU by process in %d windows", tb.Caption, len(tb.Rows), len(c.cpu))
	}

	if len(r.peaks) != 8 || len(sec.Tables[3].Rows) != 8 {
		t.Errorf("%d phases with a sampled peak, want 8: %+v", len(r.peaks), r.peaks)
	}
	for _, pk := range r.peaks {
		if pk.rss < 8<<20 || pk.rss > 4*r.readyHWM+c.hwm {
			t.Errorf("phase %q: sampled peak %v", pk.phase, pk.rss)
		}
	}
	if got := sec.Tables[4].Rows[0][9]; !strings.HasPrefix(got, "2 of 2 ") {
		t.Errorf("cold start table: kernel cell %q", got)
	}
	if len(sec.Targets) != 5 {
		t.Fatalf("%d targets, want RSS, cold start to all synced and to drained, p50 and p99 ratio", len(sec.Targets))
	}
	for _, tg := range sec.Targets {
		if tg.Got == "not measured" || tg.Reason == "" {
			t.Errorf("target %+v: not measured, or no reason", tg)
		}
	}
	names := map[string]bool{}
	for _, m := range e.Report.Metrics {
		names[m.Name] = true
		if m.Ours == nil || *m.Ours < 0 {
			t.Errorf("metric %s: %+v", m.Name, m)
		}
	}
	for _, n := range []string{"s6.controller_rss_ready", "s6.controller_rss_worst", "s6.cold_start.all_synced", "s6.cold_start.drained", "s6.cold_start.api_writes", "s6.paced_loaded.create_ready.p50"} {
		if !names[n] {
			t.Errorf("no metric %s in %v", n, names)
		}
	}
}

// TestS6Objects: the load has the stated mix, unique names and EIP
// addresses, DNAT ports unique per EIP, and every rule's EIP on the rule's
// gateway.
func TestS6Objects(t *testing.T) {
	plan := s6Plan{Gateways: 3, Rules: 3001, Paced: 5, Creators: 1, Workers: 1}
	if err := plan.validate(); err != nil {
		t.Fatal(err)
	}
	eips, rules := s6Objects(plan)
	if len(rules) != plan.Rules {
		t.Fatalf("%d rules, want %d", len(rules), plan.Rules)
	}
	m := s6MixOf(1001)
	if m.FIPs != 100 || m.SNATs != 100 || m.DNATs != 801 || m.DNATEIPs != 17 || m.EIPs() != 118 {
		t.Errorf("mix of 1001 rules: %+v", m)
	}
	names := map[string]bool{}
	eipGW := map[string]int{}
	addrs := map[string]bool{}
	for i := 0; i < plan.Paced+2; i++ {
		addrs[Filler(i).EIP.String()] = true // the paced EIPs'
	}
	for _, o := range eips {
		e := o.obj.(*v1.IptablesEIP)
		if names[e.Name] || addrs[e.Spec.V4ip] {
			t.Fatalf("EIP %s (%s) not unique", e.Name, e.Spec.V4ip)
		}
		names[e.Name], addrs[e.Spec.V4ip], eipGW[e.Name] = true, true, o.gw
		if e.Spec.NatGwDp != s6GatewayName(o.gw) {
			t.Errorf("EIP %s on %s, want %s", e.Name, e.Spec.NatGwDp, s6GatewayName(o.gw))
		}
	}
	ports := map[string]bool{}
	perEIP := map[string]int{}
	for i, o := range rules {
		if o.gw != i%plan.Gateways {
			t.Fatalf("rule %d on gateway %d: the rules are not interleaved over the gateways", i, o.gw)
		}
		var eip string
		switch r := o.obj.(type) {
		case *v1.IptablesFIPRule:
			eip = r.Spec.EIP
		case *v1.IptablesDnatRule:
			eip = r.Spec.EIP
			key := eip + "/" + r.Spec.ExternalPort
			if ports[key] {
				t.Fatalf("DNAT %s: port %s of %s used twice", r.Name, r.Spec.ExternalPort, eip)
			}
			ports[key] = true
		case *v1.IptablesSnatRule:
			eip = r.Spec.EIP
			if _, err := netip.ParsePrefix(r.Spec.InternalCIDR); err != nil {
				t.Errorf("SNAT %s: %v", r.Name, err)
			}
		}
		if names[o.obj.GetName()] {
			t.Fatalf("name %s used twice", o.obj.GetName())
		}
		names[o.obj.GetName()] = true
		if g, ok := eipGW[eip]; !ok || g != o.gw {
			t.Errorf("%s %s: EIP %q on gateway %d (found %v), want gateway %d", o.kind, o.obj.GetName(), eip, g, ok, o.gw)
		}
		if o.kind != "dnat" {
			perEIP[eip]++
		}
	}
	for eip, n := range perEIP {
		if strings.Contains(eip, "fip") && n != 1 {
			t.Errorf("FIP EIP %s has %d FIPs", eip, n)
		}
	}
	if err := (s6Plan{Gateways: 2, Rules: 5, Paced: 1, Creators: 1, Workers: 1}).validate(); err == nil {
		t.Error("5 rules over 2 gateways validated (want at least 3 per gateway)")
	}
}

func TestS6PlanEnv(t *testing.T) {
	t.Setenv(s6SizeEnv, "4, 400, 7")
	p, err := s6PlanFor(false)
	if err != nil || p.Gateways != 4 || p.Rules != 400 || p.Paced != 7 {
		t.Errorf("%s=4,400,7: %+v, %v", s6SizeEnv, p, err)
	}
	for _, bad := range []string{"4", "x,1", "1,2,3,4", "1001,100000"} {
		t.Setenv(s6SizeEnv, bad)
		if _, err := s6PlanFor(true); err == nil {
			t.Errorf("%s=%q accepted", s6SizeEnv, bad)
		}
	}
}

func TestParseProm(t *testing.T) {
	ms, err := parseProm(`# HELP x y
apiserver_request_total{code="201",group="kubeovn.io",resource="iptables-fip-rules",verb="POST"} 12
apiserver_request_total{code="200",group="kubeovn.io",resource="iptables-fip-rules",subresource="status",verb="PATCH"} 3
apiserver_request_total{code="201",group="",resource="events",verb="POST"} 2
apiserver_request_total{code="200",group="coordination.k8s.io",resource="leases",verb="PUT"} 5 1700000000000
apiserver_request_total{code="200",group="kubeovn.io",resource="iptables-fip-rules",verb="LIST"} 100
workqueue_depth{controller="iptables-eip",name="iptables-eip"} 0
weird{a="x\"y,z}",b="\\"} 1.5e+01
plain 7
`)
	if err != nil {
		t.Fatal(err)
	}
	if w := ms.apiWrites(); w != (apiWrites{natgw: 15, events: 2, all: 22}) {
		t.Errorf("apiWrites = %+v", w)
	}
	if v := ms.sum("weird", map[string]string{"a": `x"y,z}`, "b": `\`}); v != 15 {
		t.Errorf("escaped labels: sum = %v", v)
	}
	if v := ms.sum("plain", nil); v != 7 {
		t.Errorf("plain = %v", v)
	}
	for _, bad := range []string{"x{a=\"1} 2", "x{a=1} 2", "x", "x{} y"} {
		if _, err := parseProm(bad); err == nil {
			t.Errorf("parseProm(%q) accepted", bad)
		}
	}
}
