// Package scenario holds natgw's benchmark scenarios. Each one builds its own
// network namespaces (internal/netlab), measures the ways of doing one job
// side by side in the same run, and adds its tables, targets, plot and
// metrics to a report.Report.
package scenario

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/natgw/natgw/bench/progress"
	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/controller/reconciler"
	"github.com/natgw/natgw/internal/netlab"
)

// Env is what every scenario gets.
type Env struct {
	// Quick selects reduced sizes and repetitions (make bench-quick).
	Quick bool
	// OutDir receives the plots (the report itself is written by the caller).
	OutDir string
	// Natgw is the path of the natgw binary (for `natgw serve`); "" when
	// not built, which leaves out the methods that need it.
	Natgw string
	// EnvtestAssets is the directory of the kube-apiserver and etcd
	// binaries (make envtest-assets), CRDDir natgw's CRDs
	// (controller/config/crd); scenario 3 needs both.
	EnvtestAssets, CRDDir string
	// HALab and CtsyncLab are the test binaries of nat/ha and
	// nat/ha/ctsync (`go test -c`, make bench-build) whose figure tests
	// scenario 8 runs; "" leaves scenario 8 out.
	HALab, CtsyncLab string
	// Report collects the results.
	Report *report.Report
	// Progress shows what runs (nil prints nothing).
	Progress *progress.Printer
}

// Plan is the size of a run: which table sizes, how many repetitions.
type Plan struct {
	// S1Sizes are the existing-FIP counts of scenario 1.
	S1Sizes []int
	// S1Budget bounds the measured time of one (method, size) cell; the
	// repetitions are chosen from the warm-up's duration to fit it, within
	// [S1MinReps, S1MaxReps] (S1MaxExecReps for process-exec methods).
	S1Budget                            time.Duration
	S1Warmup                            int
	S1MinReps, S1MaxReps, S1MaxExecReps int
	// S1Flows is the number of live conntrack flows of the FIP's EIP
	// made before every delete.
	S1Flows int

	// S4Sizes are the FIP counts of scenario 4.
	S4Sizes []int
	// S4Window bounds one new-flow measurement in time, S4MaxFlows in
	// packets; S4Reps windows per size follow one warm-up window.
	S4Window   time.Duration
	S4MaxFlows int
	S4Reps     int
	// S4TCPWindow is the length of one established-TCP throughput run.
	S4TCPWindow time.Duration
	S4TCPReps   int
	// S4Env is the value of NATGW_BENCH_S4 that set the sizes, windows
	// and repetitions ("" when the mode's apply).
	S4Env string

	// S2OneByOne FIPs are added one request each through natgw serve,
	// S2ScriptOneByOne one script exec each with (a) (its cost grows with
	// the table, so fewer). S2SyncSizes are bulk sizes (one Sync vs one
	// iptables-legacy-restore), S2ResyncSizes the table sizes lost and
	// resynced, S2StartupSize the table an agent starts on. S2Reps
	// repetitions each.
	S2OneByOne, S2ScriptOneByOne int
	S2SyncSizes, S2ResyncSizes   []int
	S2StartupSize                int
	S2Reps                       int
	// S2Env is the value of NATGW_BENCH_S2 that set the size and
	// repetitions ("" when the mode's apply).
	S2Env string

	// S5Sizes are the object counts of the agent's RSS; S5BenchTime is
	// `go test -benchtime` per backend package (a backend without an
	// entry is left out).
	S5Sizes     []int
	S5BenchTime map[string]string

	// S3Burst FIPs (each on its own EIP) are created at once by
	// S3Creators parallel clients, then deleted at once; S3Paced FIPs are
	// created and deleted one at a time, each waited for. S3Workers is
	// the controller's --workers (its default).
	S3Burst, S3Paced, S3Creators, S3Workers int
	// S3StartTogether starts every data plane's kube-apiserver + etcd at
	// once before the first run, instead of each just before its run.
	S3StartTogether bool
}

// FullPlan is `make bench`.
func FullPlan() Plan {
	return Plan{
		S1Sizes: []int{0, 1000, 10000, 100000}, S1Budget: 12 * time.Second, S1Warmup: 2,
		S1MinReps: 5, S1MaxReps: 300, S1MaxExecReps: 60, S1Flows: 8,
		S4Sizes: []int{1, 1000, 10000, 50000}, S4Window: 700 * time.Millisecond, S4MaxFlows: 200000, S4Reps: 7,
		S4TCPWindow: 2 * time.Second, S4TCPReps: 3,
		S2OneByOne: 1000, S2ScriptOneByOne: 100, S2SyncSizes: []int{1000, 10000, 100000}, S2ResyncSizes: []int{10000, 100000},
		S2StartupSize: 100000, S2Reps: 3,
		S5Sizes: []int{0, 10000, 100000}, S5BenchTime: map[string]string{"nftables": "300x", "iptables": "5x"},
		S3Burst: 1000, S3Paced: 100, S3Creators: 16, S3Workers: reconciler.DefaultWorkers,
	}
}

// QuickPlan is `make bench-quick`: smaller tables, fewer repetitions,
// every scenario and method still run (under 3 minutes with the build on
// this 2-core machine).
func QuickPlan() Plan {
	return Plan{
		S1Sizes: []int{0, 10000}, S1Budget: 500 * time.Millisecond, S1Warmup: 1,
		S1MinReps: 2, S1MaxReps: 40, S1MaxExecReps: 10, S1Flows: 4,
		S4Sizes: []int{1, 10000, 50000}, S4Window: 250 * time.Millisecond, S4MaxFlows: 80000, S4Reps: 2,
		S4TCPWindow: 400 * time.Millisecond, S4TCPReps: 1,
		S2OneByOne: 200, S2ScriptOneByOne: 10, S2SyncSizes: []int{1000, 10000}, S2ResyncSizes: []int{10000},
		// S2Reps 5, not 2: the median of two syncs of 1k FIPs (4-5 ms) is
		// their mean, so one slow sync (20-35 ms, now and then the first
		// timed one) set it; bench/README, "bulk load at 1k". Five cost
		// about a second more.
		S2StartupSize: 10000, S2Reps: 5,
		S5Sizes: []int{0, 10000}, S5BenchTime: map[string]string{"nftables": "20x"},
		S3Burst: 50, S3Paced: 20, S3Creators: 16, S3Workers: reconciler.DefaultWorkers, S3StartTogether: true,
	}
}

func (e *Env) plan() Plan {
	if e.Quick {
		return QuickPlan()
	}
	return FullPlan()
}

// plotPath is where the plot of a section goes; the report links it by
// base name.
func (e *Env) plotPath(id string) (path, name string) {
	name = id + report.PlotExt
	return filepath.Join(e.OutDir, name), name
}

// withLab runs fn with a fresh Lab and removes it afterwards, also when
// fn fails or ctx is cancelled.
func withLab(ctx context.Context, fn func(l *netlab.Lab) error) (err error) {
	l, err := netlab.New(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := l.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	return fn(l)
}

// since is time.Since as float seconds.
func since(t time.Time) float64 { return time.Since(t).Seconds() }

// sizeErr wraps err with the method and size it happened at.
func sizeErr(method string, n int, err error) error {
	return fmt.Errorf("%s at N=%d: %w", method, n, err)
}
