package procfs

import (
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestParseMachineCPU(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    MachineCPU
		wantErr bool
	}{
		// Guest time (the last two) is inside user and nice: not added.
		{name: "kernel line", in: "cpu  100 5 50 800 20 3 2 10 40 0",
			want: MachineCPU{Total: 9900 * time.Millisecond, Idle: 8200 * time.Millisecond}},
		{name: "four fields", in: "cpu 1 2 3 4", want: MachineCPU{Total: 100 * time.Millisecond, Idle: 40 * time.Millisecond}},
		{name: "a CPU's line", in: "cpu0 1 2 3 4 5 6 7 8", wantErr: true},
		{name: "too short", in: "cpu 1 2 3", wantErr: true},
		{name: "not a number", in: "cpu 1 2 x 4 5", wantErr: true},
		{name: "negative", in: "cpu 1 2 -3 4 5", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMachineCPU(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseMachineCPU = %+v, %v; want %+v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestReadMachineCPU spins on every CPU: the machine's busy time grows by
// at least what this process used, its total by about every CPU's wall
// time, and its idle time stays small.
func TestReadMachineCPU(t *testing.T) {
	before, err := ReadMachineCPU()
	if err != nil {
		t.Fatal(err)
	}
	self0, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for range runtime.NumCPU() {
		wg.Go(func() {
			for time.Since(start) < 400*time.Millisecond {
			}
		})
	}
	wg.Wait()
	self1, err := CPUTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	after, err := ReadMachineCPU()
	wall := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	d := after.Sub(before)
	cpus := time.Duration(runtime.NumCPU())
	// Ticks are 10 ms, per CPU: a few of them on each side.
	slack := cpus * 30 * time.Millisecond
	if spun := self1 - self0; d.Busy() < spun-slack {
		t.Errorf("machine busy %v while this process used %v", d.Busy(), spun)
	}
	if d.Total < cpus*wall-slack || d.Total > cpus*wall+slack {
		t.Errorf("machine total %v over %v of wall time on %d CPUs", d.Total, wall, runtime.NumCPU())
	}
	if d.Idle < 0 || d.Idle > d.Total/2 {
		t.Errorf("idle %v of total %v while every CPU spun", d.Idle, d.Total)
	}
}
