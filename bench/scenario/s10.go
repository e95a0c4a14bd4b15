package scenario

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/natgw/natgw/bench/report"
)

// Scenario 10 (share DNAT) runs what nat/nattest already measures
// and checks, through `go test` in the backends' packages, so that the
// bench rows and the tests are the same code: BenchmarkShareDNAT
// (nattest.BenchShareDNAT: one backend add at N share identities against
// one plain DNAT add at N plain DNATs, interleaved) and the conformance
// case ShareDNAT/Spread (nattest's testShareSpread: new TCP connections
// through 1, 2, 8 and 64 backends in a namespace topology, counted per
// backend; it logs one SHARE-SPREAD line per backend count).

// s10SizeEnv names the variable that sets scenario 10's size for
// development: SHARE_N,CONNS (e.g. "1000,500"): the share identities (and
// plain DNATs) the programming benchmark preloads, and the new connections
// per backend count of the spread.
const s10SizeEnv = "NATGW_BENCH_S10"

// Variables of nat/nattest that the child `go test` runs read.
const (
	shareNEnv     = "NATGW_BENCH_SHARE_N" // nattest.BenchShareDNAT's N
	shareConnsEnv = "NATGW_SHARE_CONNS"   // nattest.ShareConnsEnv
)

// s10Plan is scenario 10's size.
type s10Plan struct {
	// BenchTime is -benchtime per backend of the programming benchmark
	// (a backend without an entry is left out).
	BenchTime map[string]string
	// ShareN is the benchmark's N (0: its default, 10,000).
	ShareN int
	// Conns is the spread's connections per backend count (0: the
	// test's default, 10,000).
	Conns int
	// Spread lists the backends whose spread is measured.
	Spread []string
	// Env is the value of s10SizeEnv that set ShareN and Conns.
	Env string
}

func s10PlanFor(quick bool) (s10Plan, error) {
	p := s10Plan{BenchTime: map[string]string{"nftables": "200x", "iptables": "10x"}, Spread: []string{"nftables", "iptables"}}
	if quick {
		p = s10Plan{BenchTime: map[string]string{"nftables": "50x"}, Conns: 2000, Spread: []string{"nftables"}}
	}
	v := os.Getenv(s10SizeEnv)
	if v == "" {
		return p, nil
	}
	f := strings.Split(v, ",")
	if len(f) != 2 {
		return p, fmt.Errorf("%s %q: want SHARE_N,CONNS", s10SizeEnv, v)
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 1 || n > 100_000 {
		return p, fmt.Errorf("%s %q: SHARE_N %q: want 1..100000", s10SizeEnv, v, f[0])
	}
	c, err := strconv.Atoi(f[1])
	if err != nil || c < 100 {
		return p, fmt.Errorf("%s %q: CONNS %q: want a count ≥ 100", s10SizeEnv, v, f[1])
	}
	p.ShareN, p.Conns, p.Env = n, c, v
	return p, nil
}

// s10Packages are the backends' package paths.
var s10Packages = map[string]string{"nftables": "./nat/nftables/", "iptables": "./nat/iptables/"}

// RunS10 measures share DNAT: programming one backend add against a plain
// DNAT add at 10k, and the spread of new connections over 1, 2, 8, 64
// backends.
func RunS10(ctx context.Context, e *Env) error {
	e.Progress.Scenario("scenario 10: share DNAT (programming one backend add, spread of new connections)")
	sec := e.Report.Section("s10", "Scenario 10: share DNAT")
	plan, err := s10PlanFor(e.Quick)
	if err != nil {
		sec.Notes = append(sec.Notes, err.Error())
		return err
	}
	root, err := moduleRoot(ctx)
	if err != nil {
		sec.Notes = append(sec.Notes, "Not measured: "+err.Error())
		return err
	}
	shareN := plan.ShareN
	if shareN == 0 {
		shareN = 10_000
	}
	conns := plan.Conns
	if conns == 0 {
		conns = 10_000
	}
	sec.Text = append(sec.Text,
		"A share DNAT is several DNAT objects on one EIP, protocol and external port (one identity), each naming one backend; new connections are spread over the backends, "+
			"an established one stays on its backend. Both figures come from nat/nattest, run with `go test` in each backend's package, "+
			"so the bench rows are the code `make test` runs (the pinning and removal checks are the conformance case ShareDNAT/Pinned, not re-run here).",
		fmt.Sprintf("**Programming**: `BenchmarkShareDNAT` (nattest.BenchShareDNAT) preloads %s plain DNATs and %s share identities of two backends each in one Sync, "+
			"then, interleaved, applies one plain DNAT (a new EIP) and one more backend to an existing identity, each deleted again untimed; "+
			"figures are the medians of single Apply calls. Target: share ÷ plain ≤ 2×.", report.SizeLabel(shareN), report.SizeLabel(shareN)),
		fmt.Sprintf("**Spread**: the conformance case ShareDNAT/Spread (nattest's testShareSpread): a gateway topology in network namespaces, one EIP, "+
			"identities of 1, 2, 8 and 64 TCP backends (spread over the VPC hosts, one port each), %s new TCP connections from ext per identity "+
			"(8 at a time, each answered by the backend's server, which names itself), counted per backend. "+
			"Max deviation = the largest |count − even| over the backends, in %% of even (conns ÷ backends). Target: within ±10%%. "+
			"The test itself fails a backend outside the wider of 10%% and 5 standard deviations of a fair random count (see the σ column): "+
			"at 64 backends 10%% of even is about 1.3σ, so a fair random spread misses the ±10%% target there almost surely at 10,000 connections.", report.Count(float64(conns))))
	var errs []error
	if err := s10Programming(ctx, e, plan, root, sec); err != nil {
		errs = append(errs, err)
	}
	if err := s10Spread(ctx, e, plan, root, conns, sec); err != nil {
		errs = append(errs, err)
	}
	if plan.Env != "" {
		sec.Notes = append(sec.Notes, fmt.Sprintf("Size set by %s=%s (development size, not the mode's).", s10SizeEnv, plan.Env))
	}
	return errors.Join(errs...)
}

// goTest runs `go test args...` in root with extra environment and returns
// its combined output; err is the command's failure, with its last lines.
func goTest(ctx context.Context, root string, timeout time.Duration, env []string, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, "go", append([]string{"test"}, args...)...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", strings.Join(env, " "), strings.Join(cmd.Args, " "), err, lastLines(string(out), 5))
	}
	return string(out), nil
}

func s10Programming(ctx context.Context, e *Env, plan s10Plan, root string, sec *report.Section) error {
	t := report.Table{
		Caption: "**programming one share backend add vs one plain DNAT add** (`go test -run '^$' -bench '^BenchmarkShareDNAT$'`), medians of single Apply calls",
		Header:  []string{"backend", "identities / plain DNATs", "iterations", "plain DNAT add", "share backend add", "share ÷ plain"},
	}
	var env []string
	if plan.ShareN > 0 {
		env = append(env, fmt.Sprintf("%s=%d", shareNEnv, plan.ShareN))
	}
	n := plan.ShareN
	if n == 0 {
		n = 10_000
	}
	var errs []error
	for _, b := range []string{"nftables", "iptables"} {
		bt, ok := plan.BenchTime[b]
		if !ok {
			sec.Notes = append(sec.Notes, fmt.Sprintf("Programming of the %s backend not measured in this mode.", b))
			continue
		}
		e.Progress.Step(0, 0, "go test -bench BenchmarkShareDNAT -benchtime %s %s", bt, s10Packages[b])
		out, err := goTest(ctx, root, 15*time.Minute, env, "-count", "1", "-run", "^$", "-bench", "^BenchmarkShareDNAT$", "-benchtime", bt, s10Packages[b])
		var line *benchLine
		for _, l := range parseBenchLines(out) {
			if l.Name == "ShareDNAT" {
				line = &l
			}
		}
		if err == nil && line == nil {
			err = fmt.Errorf("%s: no BenchmarkShareDNAT line in the output: %s", b, lastLines(out, 5))
		}
		if err == nil {
			for _, k := range []string{"µs-plain/op", "µs-share/op", "share/plain"} {
				if _, ok := line.Metrics[k]; !ok {
					err = fmt.Errorf("%s: BenchmarkShareDNAT reported no %s: %s", b, k, lastLines(out, 5))
				}
			}
		}
		if err != nil {
			errs = append(errs, err)
			sec.Notes = append(sec.Notes, "programming of "+b+" failed: "+err.Error())
			t.Rows = append(t.Rows, []string{b, report.SizeLabel(n), "failed", "failed", "failed", "—"})
			sec.Targets = append(sec.Targets, report.Target{Name: fmt.Sprintf("S10 %s: one share backend add ÷ one plain DNAT add at %s", b, report.SizeLabel(n)), Want: "≤ 2×", Got: "not measured", Reason: "see the notes"})
			continue
		}
		plain, share, ratio := line.Metrics["µs-plain/op"]/1e6, line.Metrics["µs-share/op"]/1e6, line.Metrics["share/plain"]
		t.Rows = append(t.Rows, []string{b, report.SizeLabel(n), strconv.Itoa(line.N), report.Seconds(plain), report.Seconds(share), report.Times(ratio)})
		sec.Targets = append(sec.Targets, report.Target{
			Name: fmt.Sprintf("S10 %s: one share backend add ÷ one plain DNAT add at %s", b, report.SizeLabel(n)),
			Want: "≤ 2×", Got: report.Times(ratio), Pass: ratio <= 2,
			Reason: fmt.Sprintf("share %s, plain %s (medians of %d each)", report.Seconds(share), report.Seconds(plain), line.N),
		})
		e.Report.AddMetric(report.NewMetric("s10.share_backend_add_vs_plain_dnat_add."+b+".N="+report.SizeLabel(n), "s", report.LowerIsBetter, share, plain, b+": one plain DNAT add"))
		e.Progress.Printf("share DNAT programming, %s: plain %s, share %s (%s)", b, report.Seconds(plain), report.Seconds(share), report.Times(ratio))
	}
	sec.Tables = append(sec.Tables, t)
	return errors.Join(errs...)
}

// shareSpreadLine is one SHARE-SPREAD line the spread test logs.
type shareSpreadLine struct {
	Backends, Conns int
	Even            float64
	Min, Max        int
}

// The line is nattest's testShareSpread Logf: "SHARE-SPREAD <backend> <family>
// backends=...".
var shareSpreadRE = regexp.MustCompile(`SHARE-SPREAD \S+ IPv[46] backends=(\d+) conns=(\d+) even=([0-9.]+) min=(\d+) max=(\d+)`)

// parseShareSpread extracts the SHARE-SPREAD lines of the spread test's
// verbose output.
func parseShareSpread(out string) []shareSpreadLine {
	var ls []shareSpreadLine
	for _, m := range shareSpreadRE.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(m[1])
		c, _ := strconv.Atoi(m[2])
		even, _ := strconv.ParseFloat(m[3], 64)
		lo, _ := strconv.Atoi(m[4])
		hi, _ := strconv.Atoi(m[5])
		ls = append(ls, shareSpreadLine{Backends: n, Conns: c, Even: even, Min: lo, Max: hi})
	}
	return ls
}

// maxDeviation is the largest distance of min and max from even, as a
// fraction of even.
func (l shareSpreadLine) maxDeviation() float64 {
	if l.Even <= 0 {
		return math.NaN()
	}
	return math.Max(l.Even-float64(l.Min), float64(l.Max)-l.Even) / l.Even
}

// sigma is one standard deviation of a fair random count, as a fraction of
// even.
func (l shareSpreadLine) sigma() float64 {
	p := 1 / float64(l.Backends)
	return math.Sqrt(float64(l.Conns)*p*(1-p)) / l.Even
}

func pctOf(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" }

func s10Spread(ctx context.Context, e *Env, plan s10Plan, root string, conns int, sec *report.Section) error {
	t := report.Table{
		Caption: fmt.Sprintf("**spread of %s new TCP connections per identity** over its backends (conformance case ShareDNAT/Spread)", report.Count(float64(conns))),
		Header:  []string{"backend", "backends", "even", "min", "max", "max deviation from even", "σ of a fair random count"},
	}
	var errs []error
	for _, b := range plan.Spread {
		e.Progress.Step(0, 0, "go test -run ShareDNAT/Spread %s (%d connections per backend count)", s10Packages[b], conns)
		out, err := goTest(ctx, root, 30*time.Minute, []string{fmt.Sprintf("%s=%d", shareConnsEnv, conns)},
			"-count", "1", "-v", "-timeout", "30m", "-run", "^TestConformance$/^ShareDNAT$/^Spread$", s10Packages[b])
		ls := parseShareSpread(out)
		if err != nil {
			// The test fails a backend outside its tolerance; the
			// lines it logged are still the figures.
			errs = append(errs, err)
			sec.Notes = append(sec.Notes, fmt.Sprintf("the spread test of %s failed: %v", b, err))
		}
		if len(ls) == 0 {
			if err == nil {
				err = fmt.Errorf("%s: no SHARE-SPREAD lines in the output: %s", b, lastLines(out, 5))
				errs = append(errs, err)
				sec.Notes = append(sec.Notes, err.Error())
			}
			t.Rows = append(t.Rows, []string{b, "failed", "—", "—", "—", "—", "—"})
			continue
		}
		for _, l := range ls {
			dev := l.maxDeviation()
			t.Rows = append(t.Rows, []string{b, strconv.Itoa(l.Backends), strconv.FormatFloat(l.Even, 'f', 1, 64), strconv.Itoa(l.Min), strconv.Itoa(l.Max), "±" + pctOf(dev), pctOf(l.sigma())})
			tg := report.Target{
				Name: fmt.Sprintf("S10 %s: spread over %d backends, max deviation from even (%s new connections)", b, l.Backends, report.Count(float64(l.Conns))),
				Want: "≤ ±10%", Got: "±" + pctOf(dev), Pass: dev <= 0.10,
				Reason: fmt.Sprintf("even %.1f, min %d, max %d", l.Even, l.Min, l.Max),
			}
			if !tg.Pass {
				tg.Reason += fmt.Sprintf("; a fair random count has σ = %s of even here, so ±10%% is %.1fσ", pctOf(l.sigma()), 0.10/l.sigma())
			}
			sec.Targets = append(sec.Targets, tg)
			e.Report.AddMetric(report.NewMetric(fmt.Sprintf("s10.share_spread_max_deviation.%s.backends=%d", b, l.Backends), "fraction of even", report.LowerIsBetter, dev, math.NaN(), ""))
		}
		e.Progress.Printf("share DNAT spread, %s: %d backend counts", b, len(ls))
	}
	sec.Tables = append(sec.Tables, t)
	return errors.Join(errs...)
}
