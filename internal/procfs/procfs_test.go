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
	// Spin until the CPU time moves by at least one tick (10 ms); a busy
	// machine may give this process little CPU, so only a generous bound
	// fails the test.
	deadline := time.Now().Add(30 * time.Second)
	for {
		after, err := CPUTime(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if after > before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time stayed at %v over 30 s of spinning", before)
		}
		for start := time.Now(); time.Since(start) < 10*time.Millisecond; {
		}
	}
}
