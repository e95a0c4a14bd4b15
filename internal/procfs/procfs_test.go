package procfs

import (
	"os"
	"slices"
	"testing"
	"time"
)

func TestParseCmdline(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{name: "args", in: "kube-apiserver\x00--secure-port=6443\x00", want: []string{"kube-apiserver", "--secure-port=6443"}},
		{name: "empty argument kept", in: "sh\x00-c\x00\x00", want: []string{"sh", "-c"}},
		{name: "no trailing NUL", in: "natgw\x00serve", want: []string{"natgw", "serve"}},
		{name: "kernel thread", in: "", want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := parseCmdline(tc.in); !slices.Equal(got, tc.want) {
				t.Errorf("parseCmdline(%q) = %q, want %q", tc.in, got, tc.want)
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
