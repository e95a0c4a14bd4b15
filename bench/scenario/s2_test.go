package scenario

import (
	"slices"
	"strings"
	"testing"
)

// TestS2Size: the size NATGW_BENCH_S2 sets, and bad values refused with
// the part named.
func TestS2Size(t *testing.T) {
	q := QuickPlan()
	for _, tc := range []struct {
		env     string
		sync    []int
		startup int
		reps    int
		wantErr string
	}{
		{env: "", sync: q.S2SyncSizes, startup: q.S2StartupSize, reps: q.S2Reps},
		{env: "100000,3", sync: []int{100000}, startup: 100000, reps: 3},
		{env: "1,1", sync: []int{1}, startup: 1, reps: 1},
		{env: "100000", wantErr: "want SIZE,REPS"},
		{env: "0,3", wantErr: `SIZE "0"`},
		{env: "many,3", wantErr: `SIZE "many"`},
		{env: "100000,0", wantErr: `REPS "0"`},
		{env: "100000,x", wantErr: `REPS "x"`},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(s2SizeEnv, tc.env)
			p, err := s2Size(q)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), s2SizeEnv) {
					t.Fatalf("error %v, want one naming %s and %q", err, s2SizeEnv, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			resync := q.S2ResyncSizes
			if tc.env != "" {
				resync = tc.sync
			}
			if !slices.Equal(p.S2SyncSizes, tc.sync) || !slices.Equal(p.S2ResyncSizes, resync) || p.S2StartupSize != tc.startup || p.S2Reps != tc.reps || p.S2Env != tc.env {
				t.Errorf("plan sync %v resync %v startup %d reps %d env %q, want %v %v %d %d %q",
					p.S2SyncSizes, p.S2ResyncSizes, p.S2StartupSize, p.S2Reps, p.S2Env, tc.sync, resync, tc.startup, tc.reps, tc.env)
			}
		})
	}
}
