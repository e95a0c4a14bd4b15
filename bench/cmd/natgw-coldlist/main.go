// Command natgw-coldlist measures natgw-controller's cold start's list
// alone: kube-apiserver + etcd (envtest) loaded with scenario 6's objects,
// then the natgw-controller binary started again and again (variants
// alternating) and timed from exec until every controller started its
// workers, with the CPU seconds of the controller, kube-apiserver and etcd
// (see bench/README.md, "Scenario 6: the cold start's list").
//
//	natgw-coldlist -gateways 1000 -rules 100000 -rounds 3 -variants default,watchlist-off -profile 45
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/natgw/natgw/bench/scenario"
	"github.com/natgw/natgw/internal/apitest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "natgw-coldlist:", err)
		os.Exit(1)
	}
}

func run() error {
	o := scenario.ColdListOptions{}
	var variants, bController string
	flag.StringVar(&o.Assets, "assets", apitest.Assets(), "envtest binaries (kube-apiserver, etcd)")
	flag.StringVar(&o.CRDDir, "crds", apitest.CRDDir(), "natgw's CRDs")
	flag.StringVar(&o.Controller, "controller", "", "natgw-controller binary (default: built now from this checkout)")
	flag.StringVar(&o.Dir, "dir", "", "directory of the logs and profiles (default: a new temporary one)")
	flag.IntVar(&o.Gateways, "gateways", 1000, "gateways (VpcNatGateways), the rules spread over them as in scenario 6")
	flag.IntVar(&o.Rules, "rules", 100000, "FIP, DNAT and SNAT rules (their EIPs come on top)")
	flag.IntVar(&o.Creators, "creators", 32, "parallel API clients that load the objects")
	flag.IntVar(&o.Rounds, "rounds", 3, "starts of each variant (alternating)")
	flag.IntVar(&o.ProfileSeconds, "profile", 0, "seconds of CPU profile of the controller and kube-apiserver from the start of each variant's first round (0: none)")
	flag.StringVar(&o.EtcdDir, "etcd-dir", "", "etcd's data directory, kept: a later run with the same directory and size reuses the loaded objects (default: a temporary one)")
	flag.DurationVar(&o.Timeout, "timeout", 5*time.Minute, "bound of one start until synced")
	flag.StringVar(&variants, "variants", "default", "comma-separated variants: "+strings.Join(scenario.ColdListVariantNames(), ", "))
	flag.StringVar(&bController, "b-controller", "", "a second natgw-controller binary: every variant also runs with it, as <variant>@b, alternating (an A/B of a change)")
	flag.Parse()
	for _, name := range strings.Split(variants, ",") {
		v, ok := scenario.ColdListVariantNamed(strings.TrimSpace(name))
		if !ok {
			return fmt.Errorf("-variants: %q is not one of %s", name, strings.Join(scenario.ColdListVariantNames(), ", "))
		}
		o.Variants = append(o.Variants, v)
		if bController != "" {
			b := v
			b.Name, b.Controller = v.Name+"@b", bController
			o.Variants = append(o.Variants, b)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "natgw-coldlist-")
		if err != nil {
			return err
		}
		o.Dir = d
	}
	if o.Controller == "" {
		bin, err := scenario.BuildController(ctx, o.Dir)
		if err != nil {
			return err
		}
		o.Controller = bin
	}
	o.Printf = func(format string, args ...any) {
		fmt.Printf("%s "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
	}
	o.Printf("dir %s, controller %s", o.Dir, o.Controller)
	res, err := scenario.RunColdList(ctx, o)
	if res != nil {
		summary(res)
	}
	return err
}

// summary prints each variant's medians (of an even count, the upper
// middle one).
func summary(res *scenario.ColdListResult) {
	by := map[string][]scenario.ColdListRun{}
	var order []string
	for _, r := range res.Runs {
		if _, ok := by[r.Variant]; !ok {
			order = append(order, r.Variant)
		}
		by[r.Variant] = append(by[r.Variant], r)
	}
	fmt.Printf("objects %v, loaded in %s\n", res.Objects, res.Load.Round(time.Second))
	fmt.Println("variant | runs | synced (median) | first workers | controller CPU | kube-apiserver CPU | etcd CPU | controller VmHWM")
	for _, name := range order {
		rs := by[name]
		med := func(f func(scenario.ColdListRun) time.Duration) float64 {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = f(r).Seconds()
			}
			sort.Float64s(v)
			return v[len(v)/2]
		}
		fmt.Printf("%s | %d | %.2f s | %.2f s | %.2f s | %.2f s | %.2f s | %.0f MiB\n", name, len(rs),
			med(func(r scenario.ColdListRun) time.Duration { return r.Synced }),
			med(func(r scenario.ColdListRun) time.Duration { return r.FirstWorkers }),
			med(func(r scenario.ColdListRun) time.Duration { return r.ControllerCPU }),
			med(func(r scenario.ColdListRun) time.Duration { return r.APIServerCPU }),
			med(func(r scenario.ColdListRun) time.Duration { return r.EtcdCPU }),
			med(func(r scenario.ColdListRun) time.Duration { return time.Duration(r.HWM * float64(time.Second)) }))
	}
	for _, p := range res.Profiles {
		fmt.Println("profile", p)
	}
}
