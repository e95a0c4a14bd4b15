package procfs

import (
	"strings"
	"testing"
)

func TestParseLoadAvg(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    [3]string
		one     float64
		wantErr bool
	}{
		{name: "kernel line", in: "0.52 0.58 0.59 2/345 12345\n", want: [3]string{"0.52", "0.58", "0.59"}, one: 0.52},
		{name: "three fields only", in: "12.00 9.50 3.25", want: [3]string{"12.00", "9.50", "3.25"}, one: 12},
		{name: "two fields", in: "0.52 0.58\n", wantErr: true},
		{name: "empty", in: "", wantErr: true},
		{name: "not a number", in: "0.52 high 0.59 2/345 12345\n", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, one, err := parseLoadAvg(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want || one != tc.one {
				t.Errorf("parseLoadAvg = %q, %v, %v; want %q, %v, error %v", got, one, err, tc.want, tc.one, tc.wantErr)
			}
		})
	}
}

// TestLoadAverage reads this machine's load: three numbers, the first the
// one LoadAverage1 gives (as text, so equal unless the kernel updated it
// between the reads, which it does every 5 s: then read again).
func TestLoadAverage(t *testing.T) {
	for try := 0; ; try++ {
		la, err := LoadAverage()
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(la)
		if len(f) != 3 {
			t.Fatalf("LoadAverage() = %q, want three fields", la)
		}
		one, err := LoadAverage1()
		if err != nil {
			t.Fatal(err)
		}
		if _, o, _ := parseLoadAvg(la); o == one {
			return
		}
		if try == 2 {
			t.Fatalf("LoadAverage() = %q, LoadAverage1() = %v: the first fields differ over 3 reads", la, one)
		}
	}
}
