package scenario

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestS4Size: the size NATGW_BENCH_S4 sets, and bad values refused with
// the part named.
func TestS4Size(t *testing.T) {
	for _, tc := range []struct {
		env     string
		sizes   []int
		reps    int
		window  time.Duration
		wantErr string
	}{
		{env: "", sizes: QuickPlan().S4Sizes, reps: QuickPlan().S4Reps, window: QuickPlan().S4Window},
		{env: "1+50000,5,300ms", sizes: []int{1, 50000}, reps: 5, window: 300 * time.Millisecond},
		{env: "10,1,10ms", sizes: []int{10}, reps: 1, window: 10 * time.Millisecond},
		{env: "1+50000,5", wantErr: "want SIZE[+SIZE...],REPS,WINDOW"},
		{env: "0+50000,5,300ms", wantErr: `SIZE "0"`},
		{env: "1+x,5,300ms", wantErr: `SIZE "x"`},
		{env: "1,0,300ms", wantErr: `REPS "0"`},
		{env: "1,2,1ms", wantErr: `WINDOW "1ms"`},
		{env: "1,2,soon", wantErr: `WINDOW "soon"`},
	} {
		t.Run(tc.env, func(t *testing.T) {
			t.Setenv(s4SizeEnv, tc.env)
			p, err := s4Size(QuickPlan())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), s4SizeEnv) {
					t.Fatalf("error %v, want one naming %s and %q", err, s4SizeEnv, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(p.S4Sizes, tc.sizes) || p.S4Reps != tc.reps || p.S4Window != tc.window || p.S4Env != tc.env {
				t.Errorf("plan sizes %v reps %d window %s env %q, want %v %d %s %q", p.S4Sizes, p.S4Reps, p.S4Window, p.S4Env, tc.sizes, tc.reps, tc.window, tc.env)
			}
		})
	}
}
