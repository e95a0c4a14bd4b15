package scenario

import (
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
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/procfs"
)

// RunS5 measures the agent's resident memory at several object counts and
// the allocations per Apply/Delete from the backends' Go benchmarks.
func RunS5(ctx context.Context, e *Env) error {
	plan := e.plan()
	e.Progress.Scenario("scenario 5: agent memory and allocations per operation")
	sec := e.Report.Section("s5", "Scenario 5: memory and allocations")
	var errs []error
	if e.Natgw == "" {
		sec.Notes = append(sec.Notes, "Agent RSS not measured: the natgw binary was not given (-natgw).")
	} else if err := s5RSS(ctx, e, plan, sec); err != nil {
		errs = append(errs, err)
	}
	if err := s5Allocs(ctx, e, plan, sec); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func s5RSS(ctx context.Context, e *Env, plan Plan, sec *report.Section) error {
	t := report.Table{
		Caption: "**`natgw serve` resident memory** (VmRSS from /proc/PID/status; peak = VmHWM). \"after sync\": the agent that received all N objects in one sync request, 1 s later; " +
			"\"restarted\": a new agent started on the same table (index rebuilt from the kernel), 1 s after its first answer.",
		Header: []string{"objects (FIPs)", "RSS after sync", "peak after sync", "RSS restarted", "peak restarted"},
	}
	var errs []error
	rssAt := map[int][2]float64{}
	for _, n := range plan.S5Sizes {
		e.Progress.Step(0, 0, "agent RSS at %s objects", report.SizeLabel(n))
		var row [4]float64
		err := withGateway(ctx, func(gw *netlab.Gateway) error {
			a, err := startAgentReady(ctx, e, gw.GW)
			if err != nil {
				return err
			}
			if err := a.Sync(ctx, Objects(Fillers(false, n))); err != nil {
				a.Close()
				return a.wrap(err)
			}
			time.Sleep(time.Second)
			row[0], row[1], err = procfs.Memory(a.PID())
			if cerr := a.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			b, err := startAgentReady(ctx, e, gw.GW)
			if err != nil {
				return err
			}
			if err := checkCount(ctx, b, n); err != nil {
				b.Close()
				return err
			}
			time.Sleep(time.Second)
			row[2], row[3], err = procfs.Memory(b.PID())
			if cerr := b.Close(); err == nil {
				err = cerr
			}
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("agent RSS at %s: %w", report.SizeLabel(n), err))
			sec.Notes = append(sec.Notes, fmt.Sprintf("agent RSS at %s failed: %v", report.SizeLabel(n), err))
			t.Rows = append(t.Rows, []string{report.SizeLabel(n), "failed", "failed", "failed", "failed"})
			continue
		}
		rssAt[n] = [2]float64{row[0], row[2]}
		t.Rows = append(t.Rows, []string{report.SizeLabel(n), report.Bytes(row[0]), report.Bytes(row[1]), report.Bytes(row[2]), report.Bytes(row[3])})
		e.Report.AddMetric(report.NewMetric("s5.agent_rss_after_sync.N="+report.SizeLabel(n), "bytes", report.LowerIsBetter, row[0], math.NaN(), ""))
		e.Progress.Printf("agent RSS at %s objects: %s after sync, %s restarted", report.SizeLabel(n), report.Bytes(row[0]), report.Bytes(row[2]))
	}
	sec.Tables = append(sec.Tables, t)
	big := plan.S5Sizes[len(plan.S5Sizes)-1]
	const limit = 64 << 20
	tg := report.Target{Name: fmt.Sprintf("S5 agent RSS at %s objects (the larger of after-sync and restarted)%s", report.SizeLabel(big), quickNote(big, 100000)), Want: "≤ 64 MiB"}
	if v, ok := rssAt[big]; ok {
		worst := math.Max(v[0], v[1])
		tg.Got, tg.Pass = report.Bytes(worst), worst <= limit
		tg.Reason = fmt.Sprintf("after sync %s, restarted %s", report.Bytes(v[0]), report.Bytes(v[1]))
		if v0, ok := rssAt[0]; ok && !tg.Pass {
			tg.Reason += fmt.Sprintf("; an empty agent takes %s, so the objects cost %s", report.Bytes(v0[0]), report.Bytes(worst-v0[0]))
		}
	} else {
		tg.Got, tg.Reason = "not measured", "see the notes"
	}
	sec.Targets = append(sec.Targets, tg)
	return errors.Join(errs...)
}

// benchSuffix is the GOMAXPROCS suffix of a benchmark name ("-2").
var benchSuffix = regexp.MustCompile(`-\d+$`)

// benchResult is one parsed benchmark line.
type benchResult struct {
	Name        string
	N           int
	NsPerOp     float64
	BytesPerOp  int64
	AllocsPerOp int64
}

// benchLine is one result line of `go test -bench` output: the benchmark's
// name (without "Benchmark" and the GOMAXPROCS suffix), its iterations and
// every "value unit" pair, custom metrics included.
type benchLine struct {
	Name    string
	N       int
	Metrics map[string]float64
}

// parseBenchLines extracts the result lines of `go test -bench` output:
// "BenchmarkName-P  N  v unit  v unit ...".
func parseBenchLines(out string) []benchLine {
	var ls []benchLine
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		l := benchLine{Name: benchSuffix.ReplaceAllString(strings.TrimPrefix(f[0], "Benchmark"), ""), N: n, Metrics: map[string]float64{}}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				l.Metrics[f[i+1]] = v
			}
		}
		ls = append(ls, l)
	}
	return ls
}

// parseBench extracts the -benchmem lines of `go test -bench` output:
// those with ns/op, B/op and allocs/op (custom metrics ignored).
func parseBench(out string) []benchResult {
	var rs []benchResult
	for _, l := range parseBenchLines(out) {
		ns, ok1 := l.Metrics["ns/op"]
		b, ok2 := l.Metrics["B/op"]
		a, ok3 := l.Metrics["allocs/op"]
		if ok1 && ok2 && ok3 {
			rs = append(rs, benchResult{Name: l.Name, N: l.N, NsPerOp: ns, BytesPerOp: int64(b), AllocsPerOp: int64(a)})
		}
	}
	return rs
}

// moduleRoot finds the natgw source tree the runner was started in.
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the natgw module (run from the source tree)")
	}
	return filepath.Dir(mod), nil
}

func s5Allocs(ctx context.Context, e *Env, plan Plan, sec *report.Section) error {
	root, err := moduleRoot(ctx)
	if err != nil {
		sec.Notes = append(sec.Notes, "Allocations not measured: "+err.Error())
		return err
	}
	t := report.Table{
		Caption: "**allocations per operation** from `go test -run '^$' -bench BenchmarkFIP -benchmem` in nat/nftables and nat/iptables (nat/nattest.BenchFIP: Apply or Delete of one FIP at N existing FIPs, in-process)",
		Header:  []string{"backend", "benchmark", "iterations", "time/op", "B/op", "allocs/op"},
	}
	var errs []error
	for _, b := range []struct{ name, pkg string }{{"nftables", "./nat/nftables/"}, {"iptables", "./nat/iptables/"}} {
		bt, ok := plan.S5BenchTime[b.name]
		if !ok {
			sec.Notes = append(sec.Notes, fmt.Sprintf("Allocations of the %s backend not measured in this mode (quick mode leaves out its slow benchmark).", b.name))
			continue
		}
		e.Progress.Step(0, 0, "go test -bench BenchmarkFIP -benchmem -benchtime %s %s", bt, b.pkg)
		cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		cmd := exec.CommandContext(cctx, "go", "test", "-run", "^$", "-bench", "^BenchmarkFIP$", "-benchmem", "-benchtime", bt, "-count", "1", b.pkg)
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			err = fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, lastLines(string(out), 5))
			errs = append(errs, err)
			sec.Notes = append(sec.Notes, "allocations of "+b.name+" failed: "+err.Error())
			continue
		}
		rs := parseBench(string(out))
		if len(rs) == 0 {
			err := fmt.Errorf("%s: no benchmark results in the output: %s", strings.Join(cmd.Args, " "), lastLines(string(out), 5))
			errs = append(errs, err)
			sec.Notes = append(sec.Notes, err.Error())
			continue
		}
		for _, r := range rs {
			t.Rows = append(t.Rows, []string{b.name, r.Name, strconv.Itoa(r.N), report.Seconds(r.NsPerOp / 1e9), strconv.FormatInt(r.BytesPerOp, 10), strconv.FormatInt(r.AllocsPerOp, 10)})
			e.Report.AddMetric(report.NewMetric(fmt.Sprintf("s5.allocs_per_op.%s.%s", b.name, r.Name), "allocs/op", report.LowerIsBetter, float64(r.AllocsPerOp), math.NaN(), ""))
		}
		e.Progress.Printf("allocations: %s: %d benchmark lines", b.name, len(rs))
	}
	sec.Tables = append(sec.Tables, t)
	sec.Notes = append(sec.Notes, fmt.Sprintf("-benchtime per backend: %v (iptables-legacy's operations grow with its table, so it gets fewer iterations).", plan.S5BenchTime))
	return errors.Join(errs...)
}
