package scenario

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/nat"
)

// Scenario 8: hot-standby failover and conntrack replication.
// The labs are the tests of nat/ha (two gateway replicas on shared bridges,
// a FIP, a TCP and a UDP DNAT and a SNAT, long-running TCP streams and a
// UDP flow, the faults) and nat/ha/ctsync (ctnetlink replication against
// conntrackd); `make bench-build` compiles them with `go test -c` and this
// scenario runs their figure tests, one lab per data plane, and turns the
// lines they print into the report's rows. The labs stay in one place (the
// correctness tests of make test run them too).

// s8Targets are the HA failover bounds.
const (
	s8P50 = 300 * time.Millisecond
	s8P99 = time.Second
	// s8LagP99 bounds the replication lag's p99 at 10k new flows/s.
	s8LagP99  = 100 * time.Millisecond
	s8LagRate = 10000
)

// haLine is one fault's line of TestFailoverFigures.
type haLine struct {
	Fault                    string
	N, Flows                 int
	TakeoverP50, TakeoverP99 time.Duration
	NewConnP50, NewConnP99   time.Duration
	EstablishedP50, EstabP99 time.Duration
	// RulesLost is how many programmed objects the new active's data
	// plane did not hold as programmed, summed over the takeovers, of
	// RulesChecked (objects × takeovers).
	RulesLost, RulesChecked int
}

var haLineRE = regexp.MustCompile(`^HA (.+?)\s+n=(\d+) takeover p50=(\S+) p99=(\S+) \| new conn to every EIP p50=(\S+) p99=(\S+) \| established flows move again p50=(\S+) p99=(\S+) \(of (\d+)\) \| rules lost (\d+) of (\d+)$`)

// parseHALines reads TestFailoverFigures' "HA ..." lines from its output.
func parseHALines(out []byte) ([]haLine, error) {
	var ls []haLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := haLineRE.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		l := haLine{Fault: m[1]}
		var err error
		if l.N, err = strconv.Atoi(m[2]); err != nil {
			return nil, fmt.Errorf("line %q: n: %w", m[0], err)
		}
		if l.Flows, err = strconv.Atoi(m[9]); err != nil {
			return nil, fmt.Errorf("line %q: flows: %w", m[0], err)
		}
		l.RulesLost, _ = strconv.Atoi(m[10]) // \d+ parses
		l.RulesChecked, _ = strconv.Atoi(m[11])
		for i, d := range []*time.Duration{&l.TakeoverP50, &l.TakeoverP99, &l.NewConnP50, &l.NewConnP99, &l.EstablishedP50, &l.EstabP99} {
			if *d, err = time.ParseDuration(m[3+i]); err != nil {
				return nil, fmt.Errorf("line %q: %w", m[0], err)
			}
		}
		ls = append(ls, l)
	}
	return ls, sc.Err()
}

// lagLine is one paced rate's line of the replication figures.
type lagLine struct {
	Who      string // "ctsync" or "conntrackd"
	Rate     int
	Offered  int // new flows/s the generator reached
	P50, P99 time.Duration
	CaughtUp bool
	// CPULoad, CPUActive and CPUStandby are percents of one core over the
	// measurement: the load generator (the lab's test process), the
	// active side (ctsync's sender process, conntrackd on the active) and
	// the standby side (ctsync's receiver process, which writes the
	// entries; conntrackd on the standby). All NaN when the line has no
	// CPU figure.
	CPULoad, CPUActive, CPUStandby float64
}

// lagCPURE is the CPU part of a paced line, the same for both replicators.
var lagCPURE = regexp.MustCompile(`CPU of the load generator (\d+)% of one core; CPU (ctsync|conntrackd) active (\d+)% standby (\d+)% of one core`)

var lagLineRE = regexp.MustCompile(`^(ctsync|conntrackd)\s+paced\s+(\d+) new flows/s \(offered (\d+)/s\): lag p50=(\S+) p99=(\S+) max=\S+ caught up=(true|false)`)

// parseLagLines reads the "paced" lines of TestReplicationFigures and
// TestConntrackdFigures.
func parseLagLines(out []byte) ([]lagLine, error) {
	var ls []lagLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := lagLineRE.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		l := lagLine{Who: m[1], CaughtUp: m[6] == "true", CPULoad: math.NaN(), CPUActive: math.NaN(), CPUStandby: math.NaN()}
		var err error
		if c := lagCPURE.FindStringSubmatch(strings.TrimSpace(sc.Text())); c != nil && c[2] == l.Who {
			l.CPULoad, _ = strconv.ParseFloat(c[1], 64) // \d+ parses
			l.CPUActive, _ = strconv.ParseFloat(c[3], 64)
			l.CPUStandby, _ = strconv.ParseFloat(c[4], 64)
		}
		if l.Rate, err = strconv.Atoi(m[2]); err != nil {
			return nil, fmt.Errorf("line %q: %w", m[0], err)
		}
		l.Offered, _ = strconv.Atoi(m[3]) // \d+ parses
		if l.P50, err = time.ParseDuration(m[4]); err != nil {
			return nil, fmt.Errorf("line %q: %w", m[0], err)
		}
		if l.P99, err = time.ParseDuration(m[5]); err != nil {
			return nil, fmt.Errorf("line %q: %w", m[0], err)
		}
		ls = append(ls, l)
	}
	return ls, sc.Err()
}

// catchUpLine is a burst or full-dump line of the replication figures:
// Flows concurrent flows reached the standby After (CaughtUp), or did not
// (Has of them after After).
type catchUpLine struct {
	Who      string // "ctsync" or "conntrackd"
	Kind     string // "burst" or "full dump"
	Flows    int
	CaughtUp bool
	After    time.Duration
	Has      int
}

var (
	burstRE      = regexp.MustCompile(`^(ctsync|conntrackd)\s+burst of (\d+) new flows \(created in \S+\): standby has them all after (\S+): \d+ entries/s`)
	burstMissRE  = regexp.MustCompile(`^(ctsync|conntrackd)\s+burst of (\d+) new flows \(created in \S+\): standby has (\d+) of them after (\S+): not caught up`)
	dumpRE       = regexp.MustCompile(`^(ctsync|conntrackd)\s+full dump of (\d+) concurrent flows to a reconnecting standby: (\S+) \(\d+ entries/s`)
	dumpMissRE   = regexp.MustCompile(`^(ctsync|conntrackd)\s+full dump of (\d+) concurrent flows to a reconnecting standby: has (\d+) of them after (\S+): not caught up`)
	partitionRE  = regexp.MustCompile(`^HA-PARTITION two actives=(\S+) detection interval=(\S+) cut=(\S+)$`)
	errNoFigures = errors.New("no figure line")
)

// Rate is the line's entries per second (flows over the time until the
// standby had them all); NaN when it did not catch up.
func (l catchUpLine) Rate() float64 {
	if !l.CaughtUp || l.After <= 0 {
		return math.NaN()
	}
	return float64(l.Flows) / l.After.Seconds()
}

// parseCatchUpLines reads the burst and full-dump lines of
// TestReplicationFigures and TestConntrackdFigures.
func parseCatchUpLines(out []byte) ([]catchUpLine, error) {
	var ls []catchUpLine
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		var l catchUpLine
		var after, has string
		if m := burstRE.FindStringSubmatch(line); m != nil {
			l, after = catchUpLine{Who: m[1], Kind: "burst", CaughtUp: true}, m[3]
			l.Flows, _ = strconv.Atoi(m[2]) // \d+ parses
		} else if m := burstMissRE.FindStringSubmatch(line); m != nil {
			l, has, after = catchUpLine{Who: m[1], Kind: "burst"}, m[3], m[4]
			l.Flows, _ = strconv.Atoi(m[2])
		} else if m := dumpRE.FindStringSubmatch(line); m != nil {
			l, after = catchUpLine{Who: m[1], Kind: "full dump", CaughtUp: true}, m[3]
			l.Flows, _ = strconv.Atoi(m[2])
		} else if m := dumpMissRE.FindStringSubmatch(line); m != nil {
			l, has, after = catchUpLine{Who: m[1], Kind: "full dump"}, m[3], m[4]
			l.Flows, _ = strconv.Atoi(m[2])
		} else {
			continue
		}
		var err error
		if l.After, err = time.ParseDuration(after); err != nil {
			return nil, fmt.Errorf("line %q: %w", line, err)
		}
		if l.CaughtUp {
			l.Has = l.Flows
		} else if l.Has, err = strconv.Atoi(has); err != nil {
			return nil, fmt.Errorf("line %q: %w", line, err)
		}
		ls = append(ls, l)
	}
	return ls, sc.Err()
}

// partitionLine is TestPartition's figure line.
type partitionLine struct {
	TwoActives, Detection, Cut time.Duration
}

// parsePartition reads TestPartition's HA-PARTITION line (figures mode).
func parsePartition(out []byte) (partitionLine, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := partitionRE.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		var p partitionLine
		for i, d := range []*time.Duration{&p.TwoActives, &p.Detection, &p.Cut} {
			var err error
			if *d, err = time.ParseDuration(m[1+i]); err != nil {
				return p, fmt.Errorf("line %q: %w", m[0], err)
			}
		}
		return p, nil
	}
	if err := sc.Err(); err != nil {
		return partitionLine{}, err
	}
	return partitionLine{}, fmt.Errorf("TestPartition: %w (HA-PARTITION)", errNoFigures)
}

// runLab runs one figure test of a lab binary (root; the namespaces are the
// lab's own) in its package directory and returns its output.
func runLab(ctx context.Context, bin, pkgDir, test string, timeout time.Duration, env ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run", "^"+test+"$", "-test.v", "-test.count=1", "-test.timeout", timeout.String())
	cmd.Dir = filepath.Join(apitest.RepoRoot(), pkgDir)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s -test.run %s: %w\nwhat the tests said: %s\nthe end: %s", filepath.Base(bin), test, err, testLines(out), lastLines(string(out), 30))
	}
	if bytes.Contains(out, []byte("--- SKIP")) {
		return out, fmt.Errorf("%s skipped:\n%s", test, lastLines(string(out), 10))
	}
	return out, nil
}

// testLineRE is a line a test wrote through t.Log/t.Fatal ("  x_test.go:12: ...").
var testLineRE = regexp.MustCompile(`^\s+\w+_test\.go:\d+: `)

// testLines joins what the tests of a lab's output wrote (their failures
// among it) and their FAIL lines: a lab's last lines are often a daemon's
// log and hide why it failed.
func testLines(out []byte) string {
	var keep []string
	for _, l := range strings.Split(string(out), "\n") {
		if testLineRE.MatchString(l) || strings.HasPrefix(strings.TrimSpace(l), "--- FAIL") {
			keep = append(keep, strings.TrimSpace(l))
		}
	}
	return strings.Join(keep, " | ")
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// RunS8 measures failover gaps on both data planes and the replication lag
// of ctsync against conntrackd.
func RunS8(ctx context.Context, e *Env) error {
	e.Progress.Scenario("scenario 8: hot-standby failover and conntrack replication")
	sec := e.Report.Section("s8", "Scenario 8: hot-standby failover")
	if e.HALab == "" || e.CtsyncLab == "" {
		sec.NotRun = "the HA labs were not built (-ha-lab and -ctsync-lab: the test binaries of nat/ha and nat/ha/ctsync, `make bench-build`)"
		return nil
	}
	n := 20
	if e.Quick {
		n = 3
	}
	sec.Text = append(sec.Text, fmt.Sprintf("Failovers: %d per fault and data plane in nat/ha's lab (two replicas on shared bridges, heartbeat every 50 ms, 3 misses, lease 175 ms; "+
		"a FIP, a TCP and a UDP DNAT and a SNAT; a TCP stream through each of FIP, DNAT and SNAT and a UDP flow through the DNAT, each echoing every 5 ms; "+
		"alternating directions, the failed replica restored and resynced between runs). \"New conn\" is fault → a new TCP connection to every EIP and out through the SNAT "+
		"succeeded; \"established\" is fault → each long-running flow moved data again (p50/p99 over flows × runs). A flow that breaks (reset, 10 s silent) fails the lab. "+
		"`NATGW_HA_FIGURES=%d NATGW_HA_PLANE=PLANE go test -run TestFailoverFigures -v ./nat/ha/`", n, n))
	t := report.Table{Caption: "**failover gap** (ms), per fault and data plane",
		Header: []string{"data plane", "fault", "failovers", "takeover p50 / p99", "new conn to every EIP p50 / p99", "established flows move again p50 / p99", "flows kept", "rules lost"}}
	var errs []error
	for _, p := range nat.DataplaneNames {
		plane := string(p)
		e.Progress.Step(0, 0, "failover lab on %s, %d failovers per fault", plane, n)
		out, err := runLab(ctx, e.HALab, "nat/ha", "TestFailoverFigures", 40*time.Minute,
			"NATGW_HA_FIGURES="+strconv.Itoa(n), "NATGW_HA_PLANE="+plane)
		lines, perr := parseHALines(out)
		pt, pterr := s8Partition(ctx, e, plane)
		sec.Targets = append(sec.Targets, pt)
		if pterr != nil {
			errs = append(errs, pterr)
			sec.Notes = append(sec.Notes, pterr.Error())
		}
		if err == nil {
			err = perr
		}
		if err == nil && len(lines) == 0 {
			err = errors.New("TestFailoverFigures printed no HA line")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("failover lab on %s: %w", plane, err))
			sec.Notes = append(sec.Notes, fmt.Sprintf("failover lab on %s failed: %v", plane, err))
			sec.Targets = append(sec.Targets, report.Target{Name: "S8 " + plane + ": established flows survive every failover (0 resets)", Want: "100%", Got: "failed", Reason: "the lab failed (see the notes)"})
			continue
		}
		kept := 0
		for _, l := range lines {
			t.Rows = append(t.Rows, []string{plane, l.Fault, strconv.Itoa(l.N), ms(l.TakeoverP50) + " / " + ms(l.TakeoverP99),
				ms(l.NewConnP50) + " / " + ms(l.NewConnP99), ms(l.EstablishedP50) + " / " + ms(l.EstabP99), strconv.Itoa(l.Flows),
				fmt.Sprintf("%d of %d", l.RulesLost, l.RulesChecked)})
			kept += l.Flows
			sec.Targets = append(sec.Targets,
				gapTarget(fmt.Sprintf("S8 %s, %s: new connection to every EIP", plane, l.Fault), l.NewConnP50, l.NewConnP99),
				establishedTarget(fmt.Sprintf("S8 %s, %s: established flows move again", plane, l.Fault), l.EstablishedP50, l.EstabP99),
				rulesLostTarget(fmt.Sprintf("S8 %s, %s: rules lost", plane, l.Fault), l))
			key := strings.NewReplacer(" ", "_", "+", "", "-", "").Replace(l.Fault)
			e.Report.AddMetric(
				report.NewMetric("s8."+plane+"."+key+".new_conn_p50", "s", report.LowerIsBetter, l.NewConnP50.Seconds(), math.NaN(), ""),
				report.NewMetric("s8."+plane+"."+key+".established_p50", "s", report.LowerIsBetter, l.EstablishedP50.Seconds(), math.NaN(), ""),
				report.NewMetric("s8."+plane+"."+key+".rules_lost", "objects", report.LowerIsBetter, float64(l.RulesLost), math.NaN(), ""))
		}
		// The lab fails on any broken flow, so a passing run kept them all.
		sec.Targets = append(sec.Targets, report.Target{Name: "S8 " + plane + ": established flows survive every failover (0 resets)", Want: "100%",
			Got: fmt.Sprintf("%d of %d flow-failovers", kept, kept), Pass: true})
	}
	sec.Tables = append(sec.Tables, t)

	e.Progress.Step(0, 0, "replication lag: ctsync and conntrackd")
	lt := report.Table{Caption: "**replication lag** at paced new-flow rates (standby has the entry ← active created it), ctsync (ctnetlink, natgw's) and conntrackd (apt conntrack-tools) in the same run",
		Header: []string{"replicator", "new flows/s (offered)", "lag p50", "lag p99", "caught up", "CPU active, % of one core", "CPU standby, % of one core", "CPU load generator, % of one core"}}
	out, err := runLab(ctx, e.CtsyncLab, "nat/ha/ctsync", "TestReplicationFigures|TestConntrackdFigures", 30*time.Minute, "NATGW_CTSYNC_FIGURES=1")
	lags, perr := parseLagLines(out)
	if err == nil {
		err = perr
	}
	catchUps, cerr := parseCatchUpLines(out)
	if err == nil {
		err = cerr
	}
	var ours, theirs = math.NaN(), math.NaN()
	type rateFig struct{ ours, theirs *lagLine }
	byRate := map[int]*rateFig{}
	for i, l := range lags {
		cpu := []string{"—", "—", "—"}
		if !math.IsNaN(l.CPUActive) {
			cpu = []string{fmt.Sprintf("%.0f", l.CPUActive), fmt.Sprintf("%.0f", l.CPUStandby), fmt.Sprintf("%.0f", l.CPULoad)}
		}
		lt.Rows = append(lt.Rows, append([]string{l.Who, fmt.Sprintf("%d (%d)", l.Rate, l.Offered), report.Seconds(l.P50.Seconds()), report.Seconds(l.P99.Seconds()), strconv.FormatBool(l.CaughtUp)}, cpu...))
		if l.Rate == s8LagRate {
			if l.Who == "ctsync" {
				ours = l.P99.Seconds()
			} else {
				theirs = l.P99.Seconds()
			}
		}
		f := byRate[l.Rate]
		if f == nil {
			f = &rateFig{}
			byRate[l.Rate] = f
		}
		if l.Who == "ctsync" {
			f.ours = &lags[i]
		} else {
			f.theirs = &lags[i]
		}
	}
	sec.Tables = append(sec.Tables, lt)
	// Per rate: CPU of the active side and of the standby side (ctsync's
	// sender and receiver processes against the two conntrackd
	// processes), and at rates other than the bounded one, whether the
	// standby kept up.
	for _, rate := range slices.Sorted(maps.Keys(byRate)) {
		f := byRate[rate]
		oAct, oSb, tAct, tSb := math.NaN(), math.NaN(), math.NaN(), math.NaN()
		ol, tl := math.NaN(), math.NaN()
		if f.ours != nil {
			oAct, oSb, ol = f.ours.CPUActive, f.ours.CPUStandby, f.ours.P99.Seconds()
		}
		if f.theirs != nil {
			tAct, tSb, tl = f.theirs.CPUActive, f.theirs.CPUStandby, f.theirs.P99.Seconds()
		}
		k := rateKey(rate)
		e.Report.AddMetric(
			report.NewMetric("s8.replication_cpu_pct.active.rate="+k, "% of one core", report.LowerIsBetter, oAct, tAct,
				"conntrackd on the active (ctsync: its sender process), same run"),
			report.NewMetric("s8.replication_cpu_pct.standby.rate="+k, "% of one core", report.LowerIsBetter, oSb, tSb,
				"conntrackd on the standby (ctsync: its receiver process, which writes the entries), same run"))
		if rate == s8LagRate {
			continue
		}
		e.Report.AddMetric(report.NewMetric("s8.replication_lag_p99.rate="+k, "s", report.LowerIsBetter, ol, tl, "conntrackd (conntrack-tools), same run"))
		tg := report.Target{Name: fmt.Sprintf("S8 replication at %s new flows/s (ctsync): the standby has every entry", k), Want: "all entries (no lag bound at this rate)", Got: "not measured", Reason: "the ctsync line is missing (see the notes)"}
		if f.ours != nil {
			tg.Got, tg.Pass, tg.Reason = fmt.Sprintf("lag p99 %s, caught up %t (offered %d/s)", report.Seconds(ol), f.ours.CaughtUp, f.ours.Offered), f.ours.CaughtUp, ""
		}
		if f.theirs != nil {
			tg.Reason = fmt.Sprintf("conntrackd in the same run: lag p99 %s, caught up %t (offered %d/s; the generator is one Go process writing through ctnetlink and may not reach the rate)", report.Seconds(tl), f.theirs.CaughtUp, f.theirs.Offered)
		}
		sec.Targets = append(sec.Targets, tg)
	}
	ct := report.Table{Caption: "**concurrent flows**: a burst created at once until the standby has them all, and a reconnecting standby's catch-up (ctsync: a new session's full dump; conntrackd: restarted on a flushed standby, resync requested with `conntrackd -n`)",
		Header: []string{"replicator", "what", "flows", "standby has them all after", "entries/s"}}
	type cuKey struct{ kind, who string }
	cus := map[cuKey]catchUpLine{}
	var kinds []catchUpLine
	for _, l := range catchUps {
		after := report.Seconds(l.After.Seconds())
		if !l.CaughtUp {
			after = fmt.Sprintf("not caught up: %d after %s", l.Has, after)
		}
		ct.Rows = append(ct.Rows, []string{l.Who, l.Kind, strconv.Itoa(l.Flows), after, fmt.Sprintf("%.0f", l.Rate())})
		cus[cuKey{l.Kind, l.Who}] = l
		if l.Who == "ctsync" {
			kinds = append(kinds, l)
		}
	}
	sec.Tables = append(sec.Tables, ct)
	for _, o := range kinds {
		th, ok := cus[cuKey{o.Kind, "conntrackd"}]
		k := rateKey(o.Flows)
		tg := report.Target{Name: fmt.Sprintf("S8 %s of %s concurrent flows (ctsync): the standby has them all", o.Kind, k), Want: "all, within 60 s",
			Got: fmt.Sprintf("%s (%.0f entries/s)", report.Seconds(o.After.Seconds()), o.Rate()), Pass: o.CaughtUp}
		if !o.CaughtUp {
			tg.Got = fmt.Sprintf("%d of %d after %s", o.Has, o.Flows, report.Seconds(o.After.Seconds()))
		}
		theirRate, theirAfter := math.NaN(), math.NaN()
		if ok {
			theirRate = th.Rate()
			if th.CaughtUp {
				theirAfter = th.After.Seconds()
				tg.Reason = fmt.Sprintf("conntrackd in the same run: %s (%.0f entries/s)", report.Seconds(theirAfter), theirRate)
			} else {
				tg.Reason = fmt.Sprintf("conntrackd in the same run: %d of %d after %s", th.Has, th.Flows, report.Seconds(th.After.Seconds()))
			}
		}
		sec.Targets = append(sec.Targets, tg)
		name := "s8.burst"
		if o.Kind == "full dump" {
			name = "s8.full_dump"
		}
		e.Report.AddMetric(
			report.NewMetric(name+"_entries_per_s.flows="+k, "entries/s", report.HigherIsBetter, o.Rate(), theirRate, "conntrackd (conntrack-tools), same run"))
		if o.Kind == "full dump" {
			ours := math.NaN()
			if o.CaughtUp {
				ours = o.After.Seconds()
			}
			e.Report.AddMetric(report.NewMetric(name+"_catchup.flows="+k, "s", report.LowerIsBetter, ours, theirAfter, "conntrackd (conntrack-tools), same run"))
		}
	}
	if len(kinds) == 0 && err == nil {
		err = fmt.Errorf("replication lab: %w (burst and full dump)", errNoFigures)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("replication lab: %w", err))
		sec.Notes = append(sec.Notes, fmt.Sprintf("replication lab failed: %v", err))
	}
	lag := maxTarget(fmt.Sprintf("S8 replication lag p99 at %dk new flows/s (ctsync)", s8LagRate/1000), s8LagP99, ours)
	if !math.IsNaN(theirs) {
		lag.Reason = "conntrackd in the same run: " + report.Seconds(theirs)
	}
	sec.Targets = append(sec.Targets, lag)
	e.Report.AddMetric(report.NewMetric(fmt.Sprintf("s8.replication_lag_p99.rate=%dk", s8LagRate/1000), "s", report.LowerIsBetter, ours, theirs, "conntrackd (conntrack-tools), same run"))
	sec.Notes = append(sec.Notes,
		"CPU: each replicator's active side (ctsync's sender, conntrackd on the active) and standby side (ctsync's receiver, which writes the entries; conntrackd on the standby) are processes of their own, measured apart over the paced run (/proc/PID/stat, 10 ms ticks); the load generator is the lab's test process, measured beside them. "+
			"The conntrackd catch-up is a restarted conntrackd on a flushed standby asking for a resync (`conntrackd -n`); ctsync's is a new session's full dump (until the receiver counts the dump).",
		"Partition: nat/ha TestPartition cuts heartbeats and replication both ways for 40 intervals and heals; the time with two actives is from both agents' own role reports.",
		"Rules lost: after every takeover the lab opens the new active's data plane, reads its objects back from the kernel and compares them by UID and spec with the objects programmed on both replicas (a missing or changed one counts); \"N of M\" sums over the takeovers (M = objects × takeovers).",
		"The Create→Ready ratio with two replicas is scenario 7's (the real cluster). The cluster failover of two gateway pods exists as a test (e2e/kubeovn TestHAFailoverCluster; its figures are in controller/docs/operations.md) and is not part of make bench.")
	return errors.Join(errs...)
}

// rateKey writes n as the metric keys do: 10000 → "10k".
func rateKey(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return strconv.Itoa(n/1000) + "k"
	}
	return strconv.Itoa(n)
}

// s8Partition runs nat/ha's TestPartition on plane at the product's
// heartbeat (50 ms) and checks the time with two actives against one
// detection interval.
func s8Partition(ctx context.Context, e *Env, plane string) (report.Target, error) {
	name := "S8 " + plane + ": time with two actives on the partition test"
	out, err := runLab(ctx, e.HALab, "nat/ha", "TestPartition", 5*time.Minute,
		"NATGW_HA_FIGURES=1", "NATGW_HA_PLANE="+plane, "NATGW_HA_INTERVAL=50ms")
	p, perr := parsePartition(out)
	if perr != nil {
		if err == nil {
			err = perr
		}
		return report.Target{Name: name, Want: "≤ one detection interval", Got: "not measured", Reason: "the partition lab failed (see the notes)"},
			fmt.Errorf("partition lab on %s: %w", plane, err)
	}
	t := report.Target{Name: name, Want: "≤ one detection interval (" + ms(p.Detection) + " ms)", Got: ms(p.TwoActives) + " ms",
		Pass: p.TwoActives <= p.Detection, Reason: "path cut both ways for " + ms(p.Cut) + " ms, then healed"}
	e.Report.AddMetric(report.NewMetric("s8."+plane+".partition_two_actives", "s", report.LowerIsBetter, p.TwoActives.Seconds(), math.NaN(), ""))
	if err != nil { // the lab failed on the bound after printing the line
		return t, fmt.Errorf("partition lab on %s: %w", plane, err)
	}
	return t, nil
}

// rulesLostTarget checks a fault's rules lost against its bound, 0.
func rulesLostTarget(name string, l haLine) report.Target {
	return report.Target{Name: name, Want: "0", Got: fmt.Sprintf("%d of %d objects (%d takeovers)", l.RulesLost, l.RulesChecked, l.N),
		Pass: l.RulesLost == 0 && l.RulesChecked > 0}
}

// gapTarget checks a failover gap's p50 and p99 against s8P50 and s8P99.
func gapTarget(name string, p50, p99 time.Duration) report.Target {
	return report.Target{Name: name, Want: "p50 ≤ " + ms(s8P50) + " ms, p99 ≤ " + ms(s8P99) + " ms",
		Got: ms(p50) + " / " + ms(p99) + " ms", Pass: p50 <= s8P50 && p99 <= s8P99}
}

// establishedTarget is gapTarget for established flows, with the reason a
// miss has in this lab.
func establishedTarget(name string, p50, p99 time.Duration) report.Target {
	t := gapTarget(name, p50, p99)
	if !t.Pass {
		t.Reason = "an established TCP flow needs one retransmission after the takeover to find the new path (RTO ≥ 200 ms on top of the takeover; nat/ha/README.md \"Measured\")"
	}
	return t
}
