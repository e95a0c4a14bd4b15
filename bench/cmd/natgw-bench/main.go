// Command natgw-bench runs natgw's network-namespace benchmarks side by side
// with the upstream way of programming a VPC NAT gateway, and writes
// REPORT.md, one PNG plot per scenario and summary.json. It must run as
// root; every namespace it creates is removed on exit, also on Ctrl-C.
//
//	natgw-bench [-quick] [-out bench/results] [-natgw bin/natgw] [-scenarios 1,2,3,4,5,6]
//	            [-envtest-assets .cache/envtest/bin] [-crds controller/config/crd]
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/natgw/natgw/bench/progress"
	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/bench/scenario"
	"github.com/natgw/natgw/internal/apitest"
	"github.com/natgw/natgw/internal/netlab"
	"github.com/natgw/natgw/internal/procfs"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "natgw-bench:", err)
		os.Exit(1)
	}
}

func run() error {
	quick := flag.Bool("quick", false, "reduced sizes and repetitions (make bench-quick)")
	out := flag.String("out", "bench/results", "directory for REPORT.md, summary.json and the plots")
	natgw := flag.String("natgw", "", "path of the natgw binary for `natgw serve` (empty: leave the agent out)")
	only := flag.String("scenarios", allScenarios(), "comma-separated scenario numbers to run")
	assets := flag.String("envtest-assets", apitest.Assets(), "directory of the kube-apiserver and etcd binaries for scenario 3 (make envtest-assets)")
	crds := flag.String("crds", apitest.CRDDir(), "directory of natgw's CRDs for scenario 3")
	haLab := flag.String("ha-lab", "", "test binary of nat/ha (go test -c) for scenario 8's failover lab")
	ctsyncLab := flag.String("ctsync-lab", "", "test binary of nat/ha/ctsync (go test -c) for scenario 8's replication lab")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this process (harness, in-process backends and scenario 3's controller) to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if reason := netlab.Unavailable(); reason != "" {
		return errors.New(reason)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if removed, err := netlab.SweepStale(10 * time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "natgw-bench: sweeping stale namespaces:", err)
	} else if len(removed) > 0 {
		fmt.Fprintf(os.Stderr, "natgw-bench: removed %d stale namespaces of killed runs\n", len(removed))
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	mode := "full"
	if *quick {
		mode = "quick"
	}
	rep := &report.Report{Title: "natgw benchmarks"}
	rep.Meta = meta(ctx, mode, *natgw, *assets)
	rep.Intro = []string{
		"Every figure below was measured in this run, on this machine, in network namespaces the run created and removed. " +
			"Every figure is the median over repetitions that follow a warm-up; p90/p99 are given where latency is the point; " +
			"comparisons are ratios of medians from the same run. Targets are checked next to the figures (PASS/MISS). " +
			"The machine is shared (see the load average above), so absolute figures carry noise; ratios from the same run are the point.",
	}
	env := &scenario.Env{Quick: *quick, OutDir: *out, Natgw: *natgw, EnvtestAssets: *assets, CRDDir: *crds, HALab: *haLab, CtsyncLab: *ctsyncLab, Report: rep, Progress: progress.Stderr()}
	want := map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		want[strings.TrimSpace(s)] = true
	}
	var errs []error
	for _, s := range scenario.All() {
		if !want[s.ID] {
			continue
		}
		if err := s.Run(ctx, env); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted; no report written: %w", ctx.Err())
			}
			// The failures were printed as they happened and are in
			// the report; the exit status says the run is incomplete.
			errs = append(errs, fmt.Errorf("scenario %s failed (details above and in the report)", s.ID))
		}
	}
	if err := removeStalePlots(*out, rep); err != nil {
		return err
	}
	rep.Meta.Finished = time.Now()
	rep.Meta.LoadEnd, _ = procfs.LoadAverage() // "" when unreadable
	if err := rep.Write(*out); err != nil {
		return err
	}
	env.Progress.Printf("wrote %s/REPORT.md and summary.json (%s)", *out, rep.Meta.Finished.Sub(rep.Meta.Started).Round(time.Second))
	return errors.Join(errs...)
}

// allScenarios lists every scenario's number, comma-separated.
func allScenarios() string {
	var ids []string
	for _, s := range scenario.All() {
		ids = append(ids, s.ID)
	}
	return strings.Join(ids, ",")
}

// removeStalePlots removes the plots in dir that this run did not write
// (scenarios left out, failed or not run), so every file the report sits
// with comes from the same run as REPORT.md and summary.json.
func removeStalePlots(dir string, rep *report.Report) error {
	written := map[string]bool{}
	for _, s := range rep.Sections {
		if s.Plot != "" {
			written[s.Plot] = true
		}
	}
	for _, s := range scenario.All() {
		// ".png": the plots of runs before they became SVG.
		for _, ext := range []string{report.PlotExt, ".png"} {
			name := "s" + s.ID + ext
			if written[name] {
				continue
			}
			if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove the plot of an earlier run: %w", err)
			}
		}
	}
	return nil
}

func meta(ctx context.Context, mode, natgw, envtestAssets string) report.Meta {
	load, _ := procfs.LoadAverage() // "" when unreadable
	m := report.Meta{
		Command:   strings.Join(os.Args, " "),
		Mode:      mode,
		Started:   time.Now(),
		CPUs:      runtime.NumCPU(),
		CPUModel:  cpuModel(),
		LoadStart: load,
		Go:        runtime.Version() + " (runner)",
		Tools:     scenario.Tools(ctx, natgw, envtestAssets),
	}
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		m.Kernel = unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Machine[:])
	}
	if out, err := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
	}
	return m
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
