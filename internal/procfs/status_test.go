package procfs

import (
	"os"
	"runtime"
	"testing"
)

func TestStatusFields(t *testing.T) {
	const status = "Name:\tetcd\nState:\tS (sleeping)\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t12\n"
	tests := []struct {
		name    string
		in, key string
		want    float64
		wantErr bool
	}{
		{name: "VmRSS", in: status, key: "VmRSS", want: 100 << 20},
		{name: "VmHWM", in: status, key: "VmHWM", want: 200 << 20},
		{name: "missing (a kernel thread)", in: "Name:\tkthreadd\nThreads:\t1\n", key: "VmRSS", wantErr: true},
		{name: "no unit", in: "VmRSS:\t100\n", key: "VmRSS", wantErr: true},
		{name: "other unit", in: "VmRSS:\t100 MB\n", key: "VmRSS", wantErr: true},
		{name: "not a number", in: "VmRSS:\tlots kB\n", key: "VmRSS", wantErr: true},
		{name: "key is a prefix of another", in: "VmRSSx:\t1 kB\n", key: "VmRSS", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := statusKB(tc.in, tc.key)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("statusKB(%s) = %v, %v; want %v, error %v", tc.key, got, err, tc.want, tc.wantErr)
			}
		})
	}
	if v, err := statusValue(status, "Threads"); v != "12" || err != nil {
		t.Errorf("statusValue(Threads) = %q, %v; want 12", v, err)
	}
}

// TestMemorySelf reads this process's memory and threads: a resident set
// no larger than its peak, and at least the threads this test locks.
func TestMemorySelf(t *testing.T) {
	rss, hwm, err := Memory(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if rss <= 0 || hwm < rss {
		t.Errorf("VmRSS %v, VmHWM %v: want 0 < VmRSS ≤ VmHWM", rss, hwm)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	n, err := Threads(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if n < 1 {
		t.Errorf("%d threads, want ≥ 1", n)
	}
	if _, _, err := Memory(-1); err == nil {
		t.Error("Memory(-1): no error")
	}
}
