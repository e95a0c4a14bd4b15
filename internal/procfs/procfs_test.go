package procfs

import (
	"os"
	"slices"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    time.Duration
		wantErr bool
	}{
		{name: "plain", in: "42 (etcd) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 100", want: 3 * time.Second},
		{name: "spaces and parens in the name", in: "7 (a b) (c)) R 1 7 7 0 -1 0 0 0 0 0 1 2 0 0", want: 30 * time.Millisecond},
		{name: "no name", in: "7 R 1", wantErr: true},
		{name: "short", in: "7 (x) R 1 2 3", wantErr: true},
		{name: "not a number", in: "7 (x) R 1 7 7 0 -1 0 0 0 0 0 x 2 0 0", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStat(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseStat = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestSelf finds this test process by its command line and reads a CPU
// time that grows as it works.
func TestSelf(t *testing.T) {
	pids, err := Find(func(argv []string) bool { return slices.Equal(argv, os.Args) })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pids, os.Getpid()) {
		t.Fatalf("Find by this process's argv %q = %v, want it to include %d", os.Args, pids, os.Getpid())
	}
	before, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); time.Since(start) < 100*time.Millisecond; {
	}
	after, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 50*time.Millisecond {
		t.Errorf("CPU time grew by %v over 100 ms of spinning, want ≥50 ms", after-before)
	}
}
