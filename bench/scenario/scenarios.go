package scenario

import (
	"context"
	"os/exec"
	"strings"

	"github.com/natgw/natgw/bench/report"
)

// Scenario is one numbered benchmark.
type Scenario struct {
	ID  string // "1".."5"
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
	}
}

// Tools returns the versions of the external programs the benchmarks run.
func Tools(ctx context.Context, natgw string) []report.Tool {
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
	if _, err := exec.LookPath("go"); err == nil {
		tools = append(tools, report.Tool{Name: "go (toolchain on PATH)", Version: strings.TrimPrefix(toolVersion(ctx, "go", "version"), "go version ")})
	}
	return tools
}
