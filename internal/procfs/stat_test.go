package procfs

import (
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Stat
		wantErr bool
	}{
		{name: "plain", in: "42 (etcd) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 1234 0 0",
			want: Stat{State: 'S', Pgrp: 42, CPU: 3 * time.Second, Start: 12340 * time.Millisecond}},
		{name: "reaped children", in: "42 (natgw-controller) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 700 25 20 0 12 0 1234 0 0",
			want: Stat{State: 'S', Pgrp: 42, CPU: 3 * time.Second, ChildrenCPU: 7250 * time.Millisecond, Start: 12340 * time.Millisecond}},
		{name: "cstime not a number", in: "7 (x) R 1 7 7 0 -1 0 0 0 0 0 1 2 0 ? 20 0 1 0 5", wantErr: true},
		{name: "spaces and parens in the name", in: "7 (a b) (c)) Z 1 9 7 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5\n",
			want: Stat{State: 'Z', Pgrp: 9, CPU: 30 * time.Millisecond, Start: 50 * time.Millisecond}},
		{name: "no name", in: "7 R 1", wantErr: true},
		{name: "missing fields", in: "7 (x) R 1 2 3", wantErr: true},
		{name: "no starttime", in: "7 (x) R 1 7 7 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0", wantErr: true},
		{name: "utime not a number", in: "7 (x) R 1 7 7 0 -1 0 0 0 0 0 x 2 0 0 20 0 1 0 5", wantErr: true},
		{name: "pgrp not a number", in: "7 (x) R 1 - 7 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5", wantErr: true},
		{name: "state not one letter", in: "7 (x) RR 1 7 7 0 -1 0 0 0 0 0 1 2 0 0 20 0 1 0 5", wantErr: true},
		{name: "empty", in: "", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStat(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseStat = %+v, %v; want %+v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestParseUptime(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    time.Duration
		wantErr bool
	}{
		{name: "kernel line", in: "12345.67 23456.78\n", want: 12345670 * time.Millisecond},
		{name: "one field", in: "42.00", want: 42 * time.Second},
		{name: "empty", in: "", wantErr: true},
		{name: "not a number", in: "soon 1.0\n", wantErr: true},
		{name: "negative", in: "-1.00 1.00\n", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseUptime(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("parseUptime = %v, %v; want %v, error %v", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestReadStatSelf reads this process's stat: alive, in its own process
// group, started before the test and not before boot. The state of a Go
// process is its main thread's, which may sleep while the test runs on
// another thread, so it is only required to be a live one (R, S or D);
// TestReadStatStopped checks that the state field is read.
func TestReadStatSelf(t *testing.T) {
	st, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.ContainsRune("RSD", rune(st.State)) {
		t.Errorf("state %q, want R, S or D (this process is alive)", st.State)
	}
	if want := syscall.Getpgrp(); st.Pgrp != want {
		t.Errorf("process group %d, want %d", st.Pgrp, want)
	}
	// The process started before processStart, by the time to reach
	// package init; /proc/uptime is truncated to 10 ms.
	since := time.Since(processStart)
	age, err := Age(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if age < since-10*time.Millisecond || age > since+time.Minute {
		t.Errorf("age %v, the package initialised %v ago", age, since)
	}
	start, err := StartTime(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := processStart.Sub(start); d < -time.Second || d > time.Minute {
		t.Errorf("StartTime %v, %v before the package initialised (%v)", start, d, processStart)
	}
	if _, err := Age(-1); err == nil {
		t.Error("Age(-1): no error")
	}
	if _, err := ReadStat(-1); err == nil {
		t.Error("ReadStat(-1): no error")
	}
}

// processStart is about when this test binary started.
var processStart = time.Now()

// TestReadStatStopped reads the state of a child as it changes: sleeping,
// then stopped by SIGSTOP, then sleeping again after SIGCONT.
func TestReadStatStopped(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep(1) to start: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	waitState := func(want byte) {
		t.Helper()
		var st Stat
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			var err error
			if st, err = ReadStat(pid); err != nil {
				t.Fatal(err)
			}
			if st.State == want {
				return
			}
		}
		t.Fatalf("pid %d: state %q after 10 s, want %q", pid, st.State, want)
	}
	waitState('S')
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState('T')
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitState('S')
}
