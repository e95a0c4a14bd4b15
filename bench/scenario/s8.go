package scenario

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/nat"
)

// Scenario 8 (issue 23): hot-standby failover and conntrack replication.
// The labs are the tests of nat/ha (two gateway replicas on shared bridges,
// a FIP, a TCP and a UDP DNAT and a SNAT, long-running TCP streams and a
// UDP flow, the faults) and nat/ha/ctsync (ctnetlink replication against
// conntrackd); `make bench-build` compiles them with `go test -c` and this
// scenario runs their figure tests, one lab per data plane, and turns the
// lines they print into the report's rows. The labs stay in one place (the
// correctness tests of make test run them too).

// s8Targets are issue 23's bounds.
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
}

var haLineRE = regexp.MustCompile(`^HA (.+?)\s+n=(\d+) takeover p50=(\S+) p99=(\S+) \| new conn to every EIP p50=(\S+) p99=(\S+) \| established flows move again p50=(\S+) p99=(\S+) \(of (\d+)\)$`)

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
	P50, P99 time.Duration
	CaughtUp bool
}

var lagLineRE = regexp.MustCompile(`^(ctsync|conntrackd)\s+paced\s+(\d+) new flows/s \(offered \S+\): lag p50=(\S+) p99=(\S+) max=\S+ caught up=(true|false)`)

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
		l := lagLine{Who: m[1], CaughtUp: m[5] == "true"}
		var err error
		if l.Rate, err = strconv.Atoi(m[2]); err != nil {
			return nil, fmt.Errorf("line %q: %w", m[0], err)
		}
		if l.P50, err = time.ParseDuration(m[3]); err != nil {
			return nil, fmt.Errorf("line %q: %w", m[0], err)
		}
		if l.P99, err = time.ParseDuration(m[4]); err != nil {
			return nil, fmt.Errorf("line %q: %w", m[0], err)
		}
		ls = append(ls, l)
	}
	return ls, sc.Err()
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
		return out, fmt.Errorf("%s -test.run %s: %w\n%s", filepath.Base(bin), test, err, lastLines(string(out), 30))
	}
	if bytes.Contains(out, []byte("--- SKIP")) {
		return out, fmt.Errorf("%s skipped:\n%s", test, lastLines(string(out), 10))
	}
	return out, nil
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }

// RunS8 measures failover gaps on both data planes and the replication lag
// of ctsync against conntrackd.
func RunS8(ctx context.Context, e *Env) error {
	e.Progress.Scenario("scenario 8: hot-standby failover and conntrack replication")
	sec := e.Report.Section("s8", "Scenario 8: hot-standby failover (issue 23)")
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
		Header: []string{"data plane", "fault", "failovers", "takeover p50 / p99", "new conn to every EIP p50 / p99", "established flows move again p50 / p99", "flows kept"}}
	var errs []error
	for _, p := range nat.DataplaneNames {
		plane := string(p)
		e.Progress.Step(0, 0, "failover lab on %s, %d failovers per fault", plane, n)
		out, err := runLab(ctx, e.HALab, "nat/ha", "TestFailoverFigures", 40*time.Minute,
			"NATGW_HA_FIGURES="+strconv.Itoa(n), "NATGW_HA_PLANE="+plane)
		lines, perr := parseHALines(out)
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
				ms(l.NewConnP50) + " / " + ms(l.NewConnP99), ms(l.EstablishedP50) + " / " + ms(l.EstabP99), strconv.Itoa(l.Flows)})
			kept += l.Flows
			sec.Targets = append(sec.Targets,
				gapTarget(fmt.Sprintf("S8 %s, %s: new connection to every EIP", plane, l.Fault), l.NewConnP50, l.NewConnP99),
				establishedTarget(fmt.Sprintf("S8 %s, %s: established flows move again", plane, l.Fault), l.EstablishedP50, l.EstabP99))
			key := strings.NewReplacer(" ", "_", "+", "", "-", "").Replace(l.Fault)
			e.Report.AddMetric(
				report.NewMetric("s8."+plane+"."+key+".new_conn_p50", "s", report.LowerIsBetter, l.NewConnP50.Seconds(), math.NaN(), ""),
				report.NewMetric("s8."+plane+"."+key+".established_p50", "s", report.LowerIsBetter, l.EstablishedP50.Seconds(), math.NaN(), ""))
		}
		// The lab fails on any broken flow, so a passing run kept them all.
		sec.Targets = append(sec.Targets, report.Target{Name: "S8 " + plane + ": established flows survive every failover (0 resets)", Want: "100%",
			Got: fmt.Sprintf("%d of %d flow-failovers", kept, kept), Pass: true})
	}
	sec.Tables = append(sec.Tables, t)

	e.Progress.Step(0, 0, "replication lag: ctsync and conntrackd")
	lt := report.Table{Caption: "**replication lag** at paced new-flow rates (standby has the entry ← active created it), ctsync (ctnetlink, natgw's) and conntrackd (apt conntrack-tools) in the same run",
		Header: []string{"replicator", "new flows/s", "lag p50", "lag p99", "caught up"}}
	out, err := runLab(ctx, e.CtsyncLab, "nat/ha/ctsync", "TestReplicationFigures|TestConntrackdFigures", 30*time.Minute, "NATGW_CTSYNC_FIGURES=1")
	lags, perr := parseLagLines(out)
	if err == nil {
		err = perr
	}
	var ours, theirs = math.NaN(), math.NaN()
	for _, l := range lags {
		lt.Rows = append(lt.Rows, []string{l.Who, strconv.Itoa(l.Rate), report.Seconds(l.P50.Seconds()), report.Seconds(l.P99.Seconds()), strconv.FormatBool(l.CaughtUp)})
		if l.Rate == s8LagRate {
			if l.Who == "ctsync" {
				ours = l.P99.Seconds()
			} else {
				theirs = l.P99.Seconds()
			}
		}
	}
	sec.Tables = append(sec.Tables, lt)
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
		"Not measured here: the failover of two gateway pods in a cluster (the controller does not provision them yet), the Create→Ready ratio with two replicas, and replication at 100k concurrent flows.")
	return errors.Join(errs...)
}

// gapTarget checks a failover gap's p50 and p99 against issue 23's bounds.
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
