package scenario

import (
	"context"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"

	"github.com/natgw/natgw/bench/report"
	"github.com/natgw/natgw/internal/apitest"
)

// Scenario is one numbered benchmark.
type Scenario struct {
	ID  string // "1".."10"
	Run func(ctx context.Context, e *Env) error
}

// All lists the scenarios in report order.
func All() []Scenario {
	return []Scenario{
		{ID: "1", Run: RunS1},
		{ID: "2", Run: RunS2},
		{ID: "3", Run: RunS3},
		{ID: "4", Run: RunS4},
		{ID: "5", Run: RunS5},
		{ID: "6", Run: RunS6},
		{ID: "7", Run: RunS7},
		{ID: "8", Run: RunS8},
		{ID: "9", Run: RunS9},
		{ID: "10", Run: RunS10},
	}
}

// Tools returns the versions of the external programs the benchmarks run
// (natgw's agent and envtestAssets' kube-apiserver and etcd when given) and
// of the Go modules natgw's packages are built with.
func Tools(ctx context.Context, natgw, envtestAssets string) []report.Tool {
	tools := []report.Tool{
		{Name: "iptables-legacy", Version: toolVersion(ctx, "iptables-legacy", "--version")},
		{Name: "iptables-nft", Version: toolVersion(ctx, "iptables-nft", "--version")},
		{Name: "nft", Version: toolVersion(ctx, "nft", "--version")},
		{Name: "conntrack", Version: toolVersion(ctx, "conntrack", "--version")},
		{Name: "ip", Version: toolVersion(ctx, "ip", "-V")},
		{Name: "bash", Version: toolVersion(ctx, "bash", "--version")},
	}
	if natgw != "" {
		tools = append(tools, report.Tool{Name: "natgw", Version: toolVersion(ctx, natgw, "version")})
	}
	if envtestAssets != "" && apitest.Missing(envtestAssets) == "" {
		tools = append(tools,
			report.Tool{Name: "kube-apiserver (scenario 3)", Version: toolVersion(ctx, filepath.Join(envtestAssets, "kube-apiserver"), "--version")},
			report.Tool{Name: "etcd (scenario 3)", Version: toolVersion(ctx, filepath.Join(envtestAssets, "etcd"), "--version")})
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/google/nftables", "sigs.k8s.io/controller-runtime", "k8s.io/client-go":
				tools = append(tools, report.Tool{Name: d.Path + " (Go module)", Version: d.Version})
			}
		}
	}
	if _, err := exec.LookPath("go"); err == nil {
		tools = append(tools, report.Tool{Name: "go (toolchain on PATH)", Version: strings.TrimPrefix(toolVersion(ctx, "go", "version"), "go version ")})
	}
	return tools
}
