package kubeovn_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/natgw/natgw/controller/api/v1"
	"github.com/natgw/natgw/controller/eipalloc"
	"github.com/natgw/natgw/controller/gwconfig"
	"github.com/natgw/natgw/controller/metrics"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/cluster"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/testsummary"
	"github.com/natgw/natgw/nat"
)

// MigrationFIPsEnv overrides the number of FIPs (each on its own EIP, as
// upstream requires) the migration runs with: 1,000, the count.
const MigrationFIPsEnv = "NATGW_MIGRATION_FIPS"

// MigrationNetworkEnv set to config runs natgw-controller with
// --network-source=config after the migration; the default is
// --network-source=kube-ovn, the default with --provision-gateways (see
// controller/docs/operations.md, "Migrating from Kube-OVN's gateways to natgw's").
const MigrationNetworkEnv = "NATGW_MIGRATION_NETWORK"

const (
	probeEvery   = 10 * time.Millisecond  // each probe's interval
	probeTimeout = 250 * time.Millisecond // a probe's dial; a miss is a gap
	// migrationFinalizer holds the gateway StatefulSets through Kube-OVN's
	// cleanup (step 3 of the migration).
	migrationFinalizer = "natgw.kubeovn.io/migration"
	// natgwFinalizer is natgw's own (controller/reconciler.Finalizer).
	natgwFinalizer = "natgw.kubeovn.io/finalizer"
)

var (
	// migNet is the external subnet: a /21 holds 1,000 EIPs and extHost
	// (192.0.2.1, its gateway).
	migNet  = netip.MustParsePrefix("192.0.0.0/21")
	migEIP0 = netip.MustParseAddr("192.0.4.0") // EIP i is migEIP0+i
	// sinkNet holds the FIPs' internal addresses (FIP i: sinkNet's
	// address i+1; FIP 0 is vm0's), all on one namespace, the sink.
	sinkNet = netip.MustParsePrefix("10.97.0.0/22")
)

// nth is a+i.
func nth(a netip.Addr, i int) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(a.AsSlice())+uint32(i))
	return netip.AddrFrom4(b)
}

func migEIPName(i int) string { return fmt.Sprintf("mig-eip-%d", i) }
func migFIPName(i int) string { return fmt.Sprintf("mig-fip-%d", i) }

// gapProbe is one probe run every probeEvery; it records the times of its
// successes.
type gapProbe struct {
	probe
	mu          sync.Mutex
	runs, fails int
	ok          []time.Time
}

func (g *gapProbe) record(ok bool, at time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.runs++
	if !ok {
		g.fails++
		return
	}
	g.ok = append(g.ok, at)
}

// gap is the longest time between two consecutive successes of the
// probe whose interval overlaps [from, to] (the time from its last success
// to to counts too), and when it ended.
func (g *gapProbe) gap(from, to time.Time) (time.Duration, time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	pts := g.ok
	if len(pts) == 0 {
		return to.Sub(from), to
	}
	var max time.Duration
	var end time.Time
	for i := 0; i+1 < len(pts); i++ {
		a, b := pts[i], pts[i+1]
		if b.Before(from) {
			continue
		}
		if a.After(to) {
			break
		}
		if b.Sub(a) > max {
			max, end = b.Sub(a), b
		}
	}
	if last := pts[len(pts)-1]; last.Before(to) && to.Sub(last) > max {
		max, end = to.Sub(last), to
	}
	return max, end
}

// gapProbes runs probes until stop.
type gapProbes struct {
	ps   []*gapProbe
	stop func()
}

// startGapProbes starts one goroutine per probe: every probeEvery a new
// TCP connection through the gateway (netlab.Dial, probeTimeout).
func (e *env) startGapProbes(probes []probe) *gapProbes {
	ctx, cancel := context.WithCancel(e.ctx)
	var wg sync.WaitGroup
	g := &gapProbes{}
	for _, p := range probes {
		gp := &gapProbe{probe: p}
		g.ps = append(g.ps, gp)
		wg.Add(1)
		go func() {
			defer wg.Done()
			tk := time.NewTicker(probeEvery)
			defer tk.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
				err := e.checkWithin(gp.probe, probeTimeout)
				if ctx.Err() != nil {
					return
				}
				gp.record(err == nil, time.Now())
			}
		}()
	}
	var once sync.Once
	g.stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
		})
	}
	e.t.Cleanup(g.stop)
	return g
}

// gaps returns each probe's longest gap overlapping [from, to], sorted,
// and the probes' runs and failures.
func (g *gapProbes) gaps(from, to time.Time) (gaps []time.Duration, runs, fails int) {
	for _, p := range g.ps {
		d, _ := p.gap(from, to)
		gaps = append(gaps, d)
		p.mu.Lock()
		runs += p.runs
		fails += p.fails
		p.mu.Unlock()
	}
	slices.Sort(gaps)
	return gaps, runs, fails
}

// migrationClient is a client of the cluster for the test's bulk writes
// and reads (no client-side rate limit).
func (e *env) migrationClient() client.Client {
	t := e.t
	t.Helper()
	cfg, err := e.c.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS = -1
	scheme := apitest.Scheme(t)
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// createAll creates objs with 8 writers.
func createAll(ctx context.Context, cl client.Client, objs []client.Object) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	ch := make(chan client.Object)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range ch {
				if err := cl.Create(ctx, o); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("create %s: %w", o.GetName(), err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	for _, o := range objs {
		ch <- o
	}
	close(ch)
	wg.Wait()
	return first
}

// waitReadyCount waits until count() reports want objects ready, asking
// every second (a list of 1,000 objects is not free on 2 CPUs) and logging
// the progress every 15 s. onStall, if not nil, runs when the count has not
// moved for stallAfter (and again after each further stallAfter); an error
// from it ends the wait.
func (e *env) waitReadyCount(what string, want int, limit time.Duration, count func(context.Context) (int, error), onStall func() error) (time.Duration, error) {
	t0 := time.Now()
	var logged time.Time
	best, moved := -1, time.Now()
	for {
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		n, err := count(ctx)
		cancel()
		if err == nil && n > best {
			best, moved = n, time.Now()
		}
		switch {
		case err == nil && n >= want:
			return time.Since(t0), nil
		case time.Since(t0) > limit:
			return time.Since(t0), fmt.Errorf("%s: %d of %d ready after %v (last error: %v)", what, n, want, limit, err)
		case onStall != nil && time.Since(moved) > stallAfter:
			if err := onStall(); err != nil {
				return time.Since(t0), fmt.Errorf("%s: %d of %d ready after %v: %w", what, n, want, time.Since(t0).Round(time.Second), err)
			}
			moved = time.Now()
		case time.Since(logged) > 15*time.Second:
			e.t.Logf("%s: %d of %d ready after %v", what, n, want, time.Since(t0).Round(time.Millisecond))
			logged = time.Now()
		}
		select {
		case <-e.ctx.Done():
			return time.Since(t0), e.ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// kubectlLong is kubectl with a longer bound than mustKubectl's minute
// (bulk commands over 2,000 objects).
func (e *env) kubectlLong(stdin string, args ...string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Minute)
	defer cancel()
	var in *strings.Reader
	if stdin != "" {
		in = strings.NewReader(stdin)
	}
	var out string
	var err error
	if in != nil {
		out, err = e.c.Kubectl(ctx, in, args...)
	} else {
		out, err = e.c.Kubectl(ctx, nil, args...)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// Step 2's patches: natgw's finalizer appended to the list Kube-OVN's
// finalizer starts on the four rule kinds, or as the list on the
// VpcNatGateways (Kube-OVN gives them none). Not a server-side apply: on
// an object created by a client-side `kubectl apply`, kubectl hands the
// apply's field manager the fields of the last-applied configuration, and
// an apply naming only the finalizer then deletes the spec (seen here: a
// VpcNatGateway lost spec.vpc).
const (
	appendFinalizer = `[{"op":"add","path":"/metadata/finalizers/-","value":"` + natgwFinalizer + `"}]`
	setFinalizer    = `[{"op":"add","path":"/metadata/finalizers","value":["` + natgwFinalizer + `"]}]`
)

// countReady counts the items named with prefix that are ready (as
// nameReady says), recording the names of the others in notReady (which
// it empties first).
func countReady[T any](items []T, prefix string, nameReady func(*T) (string, bool), notReady *[]string) int {
	k := 0
	*notReady = (*notReady)[:0]
	for i := range items {
		name, ready := nameReady(&items[i])
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		if ready {
			k++
		} else {
			*notReady = append(*notReady, name)
		}
	}
	return k
}

// podState is the gateway pod's identity and its StatefulSet owner.
type podState struct {
	UID, Phase, Owner, Revision string
	Restarts                    int
}

func (e *env) gatewayPodState() (podState, error) {
	p, err := e.getPod(podName)
	if err != nil {
		return podState{}, err
	}
	s := podState{UID: string(p.UID), Phase: string(p.Status.Phase), Revision: p.Labels["controller-revision-hash"]}
	if len(p.OwnerReferences) > 0 {
		s.Owner = string(p.OwnerReferences[0].UID)
	}
	for _, c := range p.Status.ContainerStatuses {
		s.Restarts += int(c.RestartCount)
	}
	return s, nil
}

// histogram reads a histogram's sample count and sum.
func histogram(o interface{ Write(*dto.Metric) error }) (uint64, float64) {
	var m dto.Metric
	if err := o.Write(&m); err != nil {
		return 0, 0
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestMigration is the migration test: a gateway with 1,000 FIPs
// (each on its own EIP) that Kube-OVN v1.16.2's own controller created and
// programmed through the natgw image's compat path, with natgw-controller
// in companion mode beside it, moves to natgw-controller's replace mode by
// the steps controller/docs/operations.md documents ("Migrating from Kube-OVN's
// gateways to natgw's"), run here as the same kubectl commands. Probes
// through several FIPs (a new TCP connection every 10 ms each, real
// packets between the test's namespaces through the gateway pod) measure
// the longest gap in their traffic. Afterwards: the pod is the same (no
// restart), adopted by natgw's StatefulSet; the gateway holds every object
// under its CR's UID and no compat object; every FIP forwards; every EIP
// kept its status; a new EIP and FIP are programmed by natgw, not by
// Kube-OVN. With --network-source=kube-ovn (the default) the migrated
// addresses stay Kube-OVN's reservations (migratedIPAM).
func TestMigration(t *testing.T) {
	n := 1000
	if v := os.Getenv(MigrationFIPsEnv); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 || n > 1000 {
			t.Fatalf("%s=%q: want 1..1000", MigrationFIPsEnv, v)
		}
	}
	kubeOVNNet := os.Getenv(MigrationNetworkEnv) != "config"
	tStart := time.Now()
	e := setupWith(t, migNet)
	ctx := e.ctx
	vm0 := e.vms[0]
	cl := e.migrationClient()

	// natgw-controller in companion mode beside Kube-OVN's controller, at
	// its default --companion-period (a sweep's claims over 1,000 EIPs cost
	// the test process real CPU under -race at TestCompanion's 1 s).
	var sw sweeps
	_, stopCompanion := e.startCompanion(&sw, 30*time.Second)

	// The sink: a namespace on the pod network holding the FIPs' internal
	// addresses, routed from the gateway pod (the VPC's hosts).
	sinkAddr, err := e.c.HostAddr(cluster.PodRangeEnd + 1 + len(e.vms))
	if err != nil {
		t.Fatal(err)
	}
	sink, err := e.lab.NS("sink")
	if err != nil {
		t.Fatal(err)
	}
	if err := netlab.Veth(netlab.End{NS: sink, Name: "eth0", Addrs: []netip.Prefix{netip.PrefixFrom(sinkAddr, 24)}}, netlab.End{NS: "", Name: "ngwkosink"}); err != nil {
		t.Fatal(err)
	}
	if err := netlab.Enslave("", "ngwkosink", cluster.BridgeName); err != nil {
		t.Fatal(err)
	}
	var batch strings.Builder
	for i := 1; i < n; i++ {
		fmt.Fprintf(&batch, "addr add %s/32 dev eth0\n", nth(sinkNet.Addr(), i+1))
	}
	fmt.Fprintf(&batch, "route replace default via %s dev eth0\n", e.pod.ip)
	if _, err := netlab.Exec(ctx, sink, batch.String(), "ip", "-batch", "-"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.lab.ServeTCP(ctx, sink, net.JoinHostPort("0.0.0.0", strconv.Itoa(vmPort))); err != nil {
		t.Fatal(err)
	}
	if _, err := netlab.Exec(ctx, e.pod.netns, "", "ip", "route", "replace", sinkNet.String(), "via", sinkAddr.String(), "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	internal := func(i int) (netip.Addr, string) {
		if i == 0 {
			return vm0.Addr, vm0.NS
		}
		return nth(sinkNet.Addr(), i+1), sink
	}

	// 1,000 EIPs, then a FIP on each, through Kube-OVN's controller.
	var eips, fips []client.Object
	for i := 0; i < n; i++ {
		in, _ := internal(i)
		eips = append(eips, &v1.IptablesEIP{ObjectMeta: metav1.ObjectMeta{Name: migEIPName(i)}, Spec: v1.IptablesEIPSpec{NatGwDp: gwName, V4ip: nth(migEIP0, i).String()}})
		fips = append(fips, &v1.IptablesFIPRule{ObjectMeta: metav1.ObjectMeta{Name: migFIPName(i)}, Spec: v1.IptablesFIPRuleSpec{EIP: migEIPName(i), InternalIP: in.String()}})
	}
	// The counts record the objects not ready for kubeOVNStall.
	var notReady []string
	countEIPs := func(ctx context.Context) (int, error) {
		var l v1.IptablesEIPList
		if err := cl.List(ctx, &l); err != nil {
			return 0, err
		}
		return countReady(l.Items, "mig-eip-", func(x *v1.IptablesEIP) (string, bool) { return x.Name, x.Status.Ready && x.Status.IP != "" }, &notReady), nil
	}
	countFIPs := func(ctx context.Context) (int, error) {
		var l v1.IptablesFIPRuleList
		if err := cl.List(ctx, &l); err != nil {
			return 0, err
		}
		return countReady(l.Items, "mig-fip-", func(x *v1.IptablesFIPRule) (string, bool) { return x.Name, x.Status.Ready }, &notReady), nil
	}
	stalled := e.kubeOVNStall(func() []string { return slices.Clone(notReady) })
	t0 := time.Now()
	if err := createAll(ctx, cl, eips); err != nil {
		t.Fatal(err)
	}
	eipsIn, err := e.waitReadyCount("Kube-OVN EIPs", n, 10*time.Minute, countEIPs, stalled)
	if err != nil {
		t.Fatal(err)
	}
	t0f := time.Now()
	if err := createAll(ctx, cl, fips); err != nil {
		t.Fatal(err)
	}
	fipsIn, err := e.waitReadyCount("Kube-OVN FIPs", n, 10*time.Minute, countFIPs, stalled)
	if err != nil {
		t.Fatal(err)
	}
	companionIn := time.Since(t0)
	t.Logf("Kube-OVN programmed %d EIPs in %v and %d FIPs in %v", n, eipsIn.Round(time.Millisecond), n, time.Since(t0f).Round(time.Millisecond))

	fipProbe := func(i int) probe {
		_, srv := internal(i)
		return probe{fmt.Sprintf("ext->%s", migFIPName(i)), e.ext, net.JoinHostPort(nth(migEIP0, i).String(), strconv.Itoa(vmPort)), srv, extHost}
	}
	// allForward dials every FIP from the external host (8 at a time).
	allForward := func() (time.Duration, error) {
		t0 := time.Now()
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			bad  []string
			next = make(chan int)
		)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					p := fipProbe(i)
					if err := eventually(ctx, 20*time.Second, func() error { return e.check(p) }); err != nil {
						mu.Lock()
						bad = append(bad, err.Error())
						mu.Unlock()
					}
				}
			}()
		}
		for i := 0; i < n; i++ {
			next <- i
		}
		close(next)
		wg.Wait()
		if len(bad) > 0 {
			sort.Strings(bad)
			return 0, fmt.Errorf("%d of %d FIPs do not forward, e.g. %s", len(bad), n, bad[0])
		}
		return time.Since(t0), nil
	}
	if _, err := allForward(); err != nil {
		t.Fatalf("companion mode: %v", err)
	}
	before, err := e.gatewayObjects()
	if err != nil {
		t.Fatal(err)
	}
	compatBefore := 0
	for uid := range before {
		if strings.HasPrefix(uid, "compat-") {
			compatBefore++
		}
	}
	if compatBefore < 2*n {
		t.Fatalf("the gateway holds %d compat objects, want at least %d (Kube-OVN's EIPs and FIPs)", compatBefore, 2*n)
	}
	// The EIPs' status.ip as Kube-OVN wrote it (its status.nat may still
	// lag here: Kube-OVN writes it after the FIP, for a few EIPs seconds
	// later).
	eipStatus := map[string]string{}
	{
		var l v1.IptablesEIPList
		if err := cl.List(ctx, &l); err != nil {
			t.Fatal(err)
		}
		for _, x := range l.Items {
			eipStatus[x.Name] = x.Status.IP
		}
	}
	podBefore, err := e.gatewayPodState()
	if err != nil {
		t.Fatal(err)
	}

	// The probes: several FIPs, both directions of the first.
	probes := []probe{
		fipProbe(0),
		{"FIP vm0->ext", vm0.NS, net.JoinHostPort(extHost.String(), strconv.Itoa(extPort)), e.ext, nth(migEIP0, 0)},
	}
	for _, i := range []int{n / 3, 2 * n / 3, n - 1} {
		if i > 0 && !slices.ContainsFunc(probes, func(p probe) bool { return p.name == fipProbe(i).name }) {
			probes = append(probes, fipProbe(i))
		}
	}
	if err := e.checkAll(probes, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	gp := e.startGapProbes(probes)
	time.Sleep(3 * time.Second) // the probes' own rhythm before anything changes

	// The migration, step by step (controller/docs/operations.md).
	steps := map[string]time.Duration{}
	step := func(name string, f func()) {
		t.Helper()
		t0 := time.Now()
		f()
		steps[name] = time.Since(t0)
		t.Logf("migration step %s: %v", name, steps[name].Round(time.Millisecond))
	}
	migStart := time.Now()
	// 1. Stop natgw-controller --mode=companion.
	step("1-stop-companion", stopCompanion)
	// 2. natgw's finalizer on every NAT object, so that natgw-controller's
	// first sync of the gateway holds all of them.
	step("2-finalizers", func() {
		for _, k := range []struct{ kind, patch string }{
			{"iptables-eip", appendFinalizer}, {"iptables-fip-rule", appendFinalizer},
			{"iptables-dnat-rule", appendFinalizer}, {"iptables-snat-rule", appendFinalizer},
			{"vpc-nat-gw", setFinalizer},
		} {
			// xargs -r -n 5 -P 8 kubectl patch ...: kubectl's client
			// allows 5 requests a second after a burst of 10, and a
			// patch is two (get, patch).
			names := strings.Fields(e.kubectlLong("", "get", k.kind, "-o", "name"))
			var wg sync.WaitGroup
			sem := make(chan struct{}, 8)
			for i := 0; i < len(names); i += 5 {
				batch := names[i:min(i+5, len(names))]
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					if _, err := e.kubectl("", append([]string{"patch", "--type=json", "-p", k.patch}, batch...)...); err != nil {
						t.Errorf("step 2: %v", err)
					}
				}()
			}
			wg.Wait()
		}
		missing := e.kubectlLong("", "get", "iptables-eip,iptables-fip-rule,vpc-nat-gw", "-o", `go-template={{range .items}}{{$f := false}}{{range .metadata.finalizers}}{{if eq . "`+natgwFinalizer+`"}}{{$f = true}}{{end}}{{end}}{{if not $f}}{{.metadata.name}} {{end}}{{end}}`)
		if strings.TrimSpace(missing) != "" {
			t.Fatalf("objects without natgw's finalizer after step 2: %.200s", missing)
		}
	})
	// 3. Hold the gateway StatefulSet through Kube-OVN's cleanup.
	step("3-hold-sts", func() {
		e.mustKubectl("", "-n", ns, "patch", "sts", stsName, "--type=merge", "-p", `{"metadata":{"finalizers":["`+migrationFinalizer+`"]}}`)
	})
	// 4. Kube-OVN's feature off: it stops programming and deletes the
	// StatefulSet, which the finalizer holds (its pod runs on).
	step("4-feature-off", func() {
		e.mustKubectl("", "-n", ns, "patch", "configmap", "ovn-vpc-nat-gw-config", "--type=merge", "-p", `{"data":{"enable-vpc-nat-gw":"false"}}`)
		if err := eventually(ctx, 2*time.Minute, func() error {
			out, err := e.kubectl("", "-n", ns, "get", "sts", stsName, "-o", "jsonpath={.metadata.deletionTimestamp}")
			if err != nil {
				return err
			}
			if out == "" {
				return fmt.Errorf("Kube-OVN has not deleted StatefulSet %s yet", stsName)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})
	// 5. Orphan the pod, release the StatefulSet, wait until it and its
	// ControllerRevisions are gone.
	step("5-orphan-pod", func() {
		e.mustKubectl("", "-n", ns, "patch", "pod", podName, "--type=json", "-p", `[{"op":"remove","path":"/metadata/ownerReferences"}]`)
		e.mustKubectl("", "-n", ns, "patch", "sts", stsName, "--type=json", "-p", `[{"op":"remove","path":"/metadata/finalizers"}]`)
		if err := eventually(ctx, 2*time.Minute, func() error {
			out, err := e.kubectl("", "-n", ns, "get", "sts,controllerrevisions", "-l", "app="+stsName, "-o", "name")
			if err != nil {
				return err
			}
			if strings.TrimSpace(out) != "" {
				return fmt.Errorf("not gone yet: %s", out)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	})
	// 6. natgw-controller --mode=replace --provision-gateways: it creates
	// the StatefulSet in upstream's shape (which adopts the running pod)
	// and syncs the gateway once.
	bootSyncs := metrics.CounterValue(metrics.Resyncs.WithLabelValues(gwName, "bootid"))
	syncHist := metrics.ProgramDuration.WithLabelValues("sync", "all", string(nat.DataplaneNftables)).(interface{ Write(*dto.Metric) error })
	syncN0, syncSum0 := histogram(syncHist)
	var syncAt time.Time // when the first boot-id sync was counted
	syncSeen := make(chan struct{})
	go func() {
		defer close(syncSeen)
		for ctx.Err() == nil {
			if metrics.CounterValue(metrics.Resyncs.WithLabelValues(gwName, "bootid")) > bootSyncs {
				syncAt = time.Now()
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	step("6-start-replace", func() {
		if kubeOVNNet {
			e.startReplace(nil)
		} else {
			e.startReplace(&gwconfig.Entry{ExternalPrefixLen: migNet.Bits(), ExternalGateway: extHost.String()})
		}
		if err := waitSyncs(ctx, bootSyncs+1); err != nil {
			t.Fatal(err)
		}
	})
	migrateIn := time.Since(migStart)
	<-syncSeen
	syncN1, syncSum1 := histogram(syncHist)
	var syncDur time.Duration
	if syncN1 > syncN0 {
		syncDur = time.Duration((syncSum1 - syncSum0) / float64(syncN1-syncN0) * float64(time.Second))
	}
	time.Sleep(5 * time.Second) // the probes after the sync
	gp.stop()
	migEnd := time.Now()
	// The gaps: before the migration (the probes' own rhythm), over the
	// whole migration (steps 1-6 and 5 s after), and across the sync (the
	// probes' intervals that overlap the sync's call, as the controller
	// timed it).
	syncFrom := syncAt.Add(-syncDur)
	baseGaps, _, _ := gp.gaps(migStart.Add(-3*time.Second), migStart)
	allGaps, probeRuns, probeFails := gp.gaps(migStart, migEnd)
	syncGaps, _, _ := gp.gaps(syncFrom, syncAt)
	for _, p := range gp.ps {
		d, end := p.gap(migStart, migEnd)
		ds, _ := p.gap(syncFrom, syncAt)
		t.Logf("probe %s: longest gap over the migration %v (ended %s), across the sync %v; %d runs, %d misses", p.name, d, end.Format("15:04:05.000"), ds, p.runs, p.fails)
	}
	t.Logf("migration %s..%s, sync %s..%s (%v)", migStart.Format("15:04:05.000"), migEnd.Format("15:04:05.000"), syncFrom.Format("15:04:05.000"), syncAt.Format("15:04:05.000"), syncDur)
	gapMax, gapMedian := allGaps[len(allGaps)-1], allGaps[len(allGaps)/2]
	syncGapMax, syncGapMedian := syncGaps[len(syncGaps)-1], syncGaps[len(syncGaps)/2]
	if syncGapMax > syncDur+time.Second {
		t.Errorf("the probes' gap across the sync, %v, exceeds the sync (%v) by more than a second", syncGapMax, syncDur)
	}

	// After: the same pod, adopted by natgw's StatefulSet.
	var podAfter podState
	if err := eventually(ctx, time.Minute, func() error {
		var err error
		if podAfter, err = e.gatewayPodState(); err != nil {
			return err
		}
		stsUID := e.mustKubectl("", "-n", ns, "get", "sts", stsName, "-o", "jsonpath={.metadata.uid}")
		if podAfter.Owner != stsUID {
			return fmt.Errorf("pod %s owned by %q, not by natgw's StatefulSet %s", podName, podAfter.Owner, stsUID)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	samePod := podAfter.UID == podBefore.UID && podAfter.Restarts == podBefore.Restarts && podAfter.Phase == "Running"
	if !samePod {
		t.Errorf("gateway pod before %+v, after %+v: not the same running pod", podBefore, podAfter)
	}
	owner := e.mustKubectl("", "-n", ns, "get", "sts", stsName, "-o", "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}")
	if owner != "VpcNatGateway/"+gwName {
		t.Errorf("StatefulSet %s owner %q, want natgw's VpcNatGateway/%s", stsName, owner, gwName)
	}

	// Every object under its CR's UID, no compat object left.
	uids := map[string]string{}
	{
		var le v1.IptablesEIPList
		var lf v1.IptablesFIPRuleList
		if err := cl.List(ctx, &le); err != nil {
			t.Fatal(err)
		}
		if err := cl.List(ctx, &lf); err != nil {
			t.Fatal(err)
		}
		for _, x := range le.Items {
			uids[string(x.UID)] = "IptablesEIP/" + x.Name
		}
		for _, x := range lf.Items {
			uids[string(x.UID)] = "IptablesFIPRule/" + x.Name
		}
	}
	after, err := e.gatewayObjects()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[nat.Kind]int{}
	var stray []string
	for uid, o := range after {
		kinds[o.Kind]++
		if o.Kind == nat.KindRoute {
			continue
		}
		if _, ok := uids[uid]; !ok {
			stray = append(stray, o.String())
		}
	}
	if len(stray) > 0 || kinds[nat.KindEIP] != n || kinds[nat.KindFIP] != n {
		sort.Strings(stray)
		if len(stray) > 5 {
			stray = stray[:5]
		}
		t.Errorf("after the migration the gateway holds %v; objects not keyed by a CR's UID (first 5): %v", kinds, stray)
	}

	// Every FIP forwards.
	forwardIn, err := allForward()
	if err != nil {
		t.Errorf("after the migration: %v", err)
	}

	natgwReadyIn, err := e.waitReadyCount("natgw-programmed FIPs", n, 5*time.Minute, func(ctx context.Context) (int, error) {
		var l v1.IptablesFIPRuleList
		if err := cl.List(ctx, &l); err != nil {
			return 0, err
		}
		k := 0
		for _, x := range l.Items {
			if c := v1.FindCondition(x.Status.Conditions, v1.ConditionReady); strings.HasPrefix(x.Name, "mig-fip-") && x.Status.Ready && c != nil && c.Reason == v1.ReasonProgrammed {
				k++
			}
		}
		return k, nil
	}, nil)
	if err != nil {
		t.Error(err)
	}
	// Every EIP kept its status once natgw has reconciled it (its address,
	// Ready, and nat "fip" as upstream writes it for an EIP with a FIP).
	var statusChanged []string
	if err := eventually(ctx, time.Minute, func() error {
		var l v1.IptablesEIPList
		if err := cl.List(ctx, &l); err != nil {
			return err
		}
		statusChanged = nil
		for _, x := range l.Items {
			if w := eipStatus[x.Name]; w != x.Status.IP || !x.Status.Ready || x.Status.Nat != "fip" {
				statusChanged = append(statusChanged, fmt.Sprintf("%s: ip=%s nat=%s ready=%v, was ip=%s", x.Name, x.Status.IP, x.Status.Nat, x.Status.Ready, w))
			}
		}
		if len(statusChanged) > 0 {
			sort.Strings(statusChanged)
			return fmt.Errorf("%d EIPs changed status, e.g. %s", len(statusChanged), statusChanged[0])
		}
		return nil
	}); err != nil {
		t.Error(err)
	}

	// Kube-OVN no longer programs: a new EIP and FIP are natgw's.
	newEIP := nth(migEIP0, n)
	e.mustKubectl(fmt.Sprintf(`apiVersion: kubeovn.io/v1
kind: IptablesEIP
metadata:
  name: mig-eip-new
spec:
  natGwDp: %s
  v4ip: %s
---
apiVersion: kubeovn.io/v1
kind: IptablesFIPRule
metadata:
  name: mig-fip-new
spec:
  eip: mig-eip-new
  internalIp: %s
`, gwName, newEIP, e.vms[1].Addr), "apply", "-f", "-")
	newProbe := probe{"ext->mig-fip-new", e.ext, net.JoinHostPort(newEIP.String(), strconv.Itoa(vmPort)), e.vms[1].NS, extHost}
	if err := e.checkAll([]probe{newProbe}, time.Minute); err != nil {
		t.Error(err)
	}
	time.Sleep(3 * time.Second)
	final, err := e.gatewayObjects()
	if err != nil {
		t.Fatal(err)
	}
	compatAfter := 0
	for uid := range final {
		if strings.HasPrefix(uid, "compat-") {
			compatAfter++
		}
	}
	newUID := e.mustKubectl("", "get", "iptables-fip-rule", "mig-fip-new", "-o", "jsonpath={.metadata.uid}")
	if _, ok := final[newUID]; !ok || compatAfter > 0 {
		t.Errorf("after the migration: the new FIP under its UID: %v; compat objects: %d (Kube-OVN programmed?)", ok, compatAfter)
	}
	if err := e.k.Alive(); err != nil {
		t.Fatal(err)
	}

	network := "config"
	var ipam ipamResult
	if kubeOVNNet {
		network = "kube-ovn"
		ipam = e.migratedIPAM(n, probes)
	}
	restart := e.restartKubeOVN(probes, podBefore)
	testsummary.Scenario(t, "CLUSTER-SUMMARY", fmt.Sprintf("replace-migrate-%dfip", n), "nftables",
		"kube_ovn", "v1.16.2", "fips", n, "eips", n, "network_source", network,
		"kubeovn_eips_ready", eipsIn, "kubeovn_fips_ready", fipsIn, "companion_setup", companionIn,
		"compat_objects_before", compatBefore,
		"probes", len(probes), "probe_every", probeEvery, "probe_timeout", probeTimeout,
		"gap_before_max", baseGaps[len(baseGaps)-1],
		"gap_sync_median", syncGapMedian, "gap_sync_max", syncGapMax, "gap_migration_median", gapMedian, "gap_migration_max", gapMax,
		"probe_runs", probeRuns, "probe_misses", probeFails,
		"sync", syncDur, "migration_steps", migrateIn,
		"step_finalizers", steps["2-finalizers"], "step_feature_off", steps["4-feature-off"], "step_orphan", steps["5-orphan-pod"], "step_replace_synced", steps["6-start-replace"],
		"same_pod", samePod, "objects_after", len(after), "stray_objects", len(stray), "compat_after", compatAfter,
		"all_fips_forward", forwardIn, "eip_status_changed", len(statusChanged), "natgw_fips_ready", natgwReadyIn,
		"natgw_vips_for_migrated", ipam.natgwVips, "ipam_refused_migrated", ipam.refused, "migrated_released", ipam.releasedIn,
		"kubeovn_restart_sts_recreated", restart.recreatedIn, "kubeovn_restart_same_pod", restart.samePod,
		"kubeovn_restart_gap_max", restart.gapMax, "kubeovn_restart_bootid_syncs", restart.syncs,
		"total", time.Since(tStart))
}

// ipamResult is what migratedIPAM measured.
type ipamResult struct {
	natgwVips  int           // natgw Vips for migrated EIPs (want 0)
	refused    bool          // a Vip asking for a migrated address got nothing
	releasedIn time.Duration // delete of a migrated EIP to its address free
}

// migratedIPAM checks, with --network-source=kube-ovn after the
// migration, that the migrated EIPs' addresses stay Kube-OVN's own
// reservations under the EIPs' names (eipalloc.KubeOVNAllocated): natgw
// made no Vip for them, a Vip asking Kube-OVN for one gets nothing, and
// deleting a migrated FIP and its EIP takes the address off net1 and
// lets Kube-OVN release it (its deletion path, feature off, then removes
// its finalizer): a Vip asking for it then gets it.
func (e *env) migratedIPAM(n int, probes []probe) ipamResult {
	t := e.t
	t.Helper()
	var r ipamResult
	out := e.mustKubectl("", "get", "vip", "-o", "name")
	for _, l := range strings.Fields(out) {
		if strings.HasPrefix(l, "vip.kubeovn.io/"+eipalloc.NamePrefix+"mig-eip-") && l != "vip.kubeovn.io/"+eipalloc.VipName("mig-eip-new") {
			r.natgwVips++
		}
	}
	if r.natgwVips > 0 {
		t.Errorf("natgw made %d Vips for migrated EIPs (Kube-OVN already holds their addresses)", r.natgwVips)
	}
	del := n - 2
	if del < 1 || slices.ContainsFunc(probes, func(p probe) bool { return strings.HasSuffix(p.name, "->"+migFIPName(del)) }) {
		t.Logf("migratedIPAM: %d FIPs leave none to delete outside the probes; release not checked", n)
		return r
	}
	addr := nth(migEIP0, del)
	taken, again := "ngw-mig-taken", "ngw-mig-again"
	defer func() { _, _ = e.kubectl("", "delete", "vip", "--ignore-not-found", "--wait=false", taken, again) }()
	e.mustKubectl(vipManifest(taken, addr.String()), "apply", "-f", "-")
	time.Sleep(3 * time.Second)
	if got := e.mustKubectl("", "get", "vip", taken, "-o", "jsonpath={.status.v4ip}"); got != "" {
		t.Errorf("Kube-OVN gave vip %s the address %s of migrated IptablesEIP %s", taken, got, migEIPName(del))
	} else {
		r.refused = true
	}
	e.mustKubectl("", "delete", "vip", taken, "--timeout=1m")

	t0 := time.Now()
	e.mustKubectl("", "delete", "iptables-fip-rule", migFIPName(del), "--timeout=2m")
	e.mustKubectl("", "delete", "iptables-eip", migEIPName(del), "--timeout=2m")
	r.releasedIn = time.Since(t0)
	addrs, err := netlab.Addrs(e.pod.netns, "net1")
	if err != nil || slices.Contains(addrs, netip.PrefixFrom(addr, migNet.Bits())) {
		t.Errorf("%s still on net1 after its EIP was deleted (%v)", addr, err)
	}
	e.mustKubectl(vipManifest(again, addr.String()), "apply", "-f", "-")
	if err := eventually(e.ctx, time.Minute, func() error {
		got, err := e.kubectl("", "get", "vip", again, "-o", "jsonpath={.status.v4ip}")
		if err != nil {
			return err
		}
		if got != addr.String() {
			return fmt.Errorf("vip %s: status.v4ip %q, want the released %s", again, got, addr)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	r.releasedIn = time.Since(t0)
	return r
}

// restartResult is what restartKubeOVN measured.
type restartResult struct {
	recreatedIn time.Duration // restart to natgw's StatefulSet applied again, owning the pod
	samePod     bool
	gapMax      time.Duration // the probes' longest interval over the restart
	syncs       float64       // boot-id syncs over the restart (want 0)
}

// restartKubeOVN restarts Kube-OVN's controller in replace mode: with its
// feature off, each start deletes every vpc-nat-gw-<name> StatefulSet
// (cleanUpVpcNatGw), natgw's included. natgw's finalizer holds it; natgw
// orphans the pod, lets the StatefulSet go and applies it again, which
// adopts the running pod. The probes run throughout: the pod must be the
// same (no restart), no new boot id, and no traffic gap beyond the probes'
// own rhythm.
func (e *env) restartKubeOVN(probes []probe, podBefore podState) restartResult {
	t := e.t
	t.Helper()
	var r restartResult
	cleanups := e.kubeOVNLogCount(kubeOVNCleanupLine)
	stsUID := e.mustKubectl("", "-n", ns, "get", "sts", stsName, "-o", "jsonpath={.metadata.uid}")
	syncs := metrics.CounterValue(metrics.Resyncs.WithLabelValues(gwName, "bootid"))
	gp := e.startGapProbes(probes)
	time.Sleep(2 * time.Second)
	t0 := time.Now()
	if err := e.k.RestartController(e.ctx); err != nil {
		t.Fatal(err)
	}
	if err := eventually(e.ctx, 2*time.Minute, func() error {
		if n := e.kubeOVNLogCount(kubeOVNCleanupLine); n <= cleanups {
			return fmt.Errorf("kube-ovn-controller logged %q %d times, want more than %d", kubeOVNCleanupLine, n, cleanups)
		}
		uid, err := e.kubectl("", "-n", ns, "get", "sts", stsName, "-o", "jsonpath={.metadata.uid}")
		if err != nil || uid == "" || uid == stsUID {
			return fmt.Errorf("StatefulSet %s: uid %q (was %s), %v: not re-created yet", stsName, uid, stsUID, err)
		}
		st, err := e.gatewayPodState()
		if err != nil {
			return err
		}
		if st.Owner != uid {
			return fmt.Errorf("pod %s owned by %q, not yet by the new StatefulSet %s", podName, st.Owner, uid)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	r.recreatedIn = time.Since(t0)
	time.Sleep(3 * time.Second)
	gp.stop()
	gaps, _, _ := gp.gaps(t0, time.Now())
	r.gapMax = gaps[len(gaps)-1]
	after, err := e.gatewayPodState()
	r.samePod = err == nil && after.UID == podBefore.UID && after.Restarts == podBefore.Restarts && after.Phase == "Running"
	if !r.samePod {
		t.Errorf("gateway pod before Kube-OVN's restart %+v, after %+v (%v): not the same running pod", podBefore, after, err)
	}
	r.syncs = metrics.CounterValue(metrics.Resyncs.WithLabelValues(gwName, "bootid")) - syncs
	if r.syncs != 0 {
		t.Errorf("%v boot-id syncs over Kube-OVN's restart, want 0 (the pod should not have changed)", r.syncs)
	}
	if r.gapMax > 2*time.Second { // a pod rebuilt would cost many seconds; the probing process itself stalls up to ~0.5 s on 2 CPUs
		t.Errorf("the probes' longest interval over Kube-OVN's restart was %v", r.gapMax)
	}
	if err := e.k.Alive(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Kube-OVN restarted: its cleanup deleted %s, natgw re-created it in %v, same pod %v, longest probe interval %v", stsName, r.recreatedIn, r.samePod, r.gapMax)
	return r
}

// kubeOVNCleanupLine is what kube-ovn-controller logs once it has queued
// the deletion of every gateway StatefulSet (feature off, at its start).
const kubeOVNCleanupLine = "finish clean up vpc nat gateway"
