package scenario

import "context"

// RunS2 is scenario 2 (bulk and restart).
func RunS2(ctx context.Context, e *Env) error {
	sec := e.Report.Section("s2", "Scenario 2: bulk programming and restart")
	sec.NotRun = "natgw's backends are not available in this build yet"
	return nil
}

// RunS5 is scenario 5 (memory and allocations).
func RunS5(ctx context.Context, e *Env) error {
	sec := e.Report.Section("s5", "Scenario 5: memory and allocations")
	sec.NotRun = "natgw's agent and backends are not available in this build yet"
	return nil
}
