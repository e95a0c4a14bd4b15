package scenario

import "testing"

func TestParseBench(t *testing.T) {
	out := `goos: linux
goarch: amd64
pkg: github.com/natgw/natgw/nat/nftables
cpu: AMD EPYC
BenchmarkFIP/Apply/N=0-2         	     300	     14213 ns/op	    5120 B/op	      61 allocs/op
BenchmarkFIP/Delete/N=10000-2    	     300	   1523456.5 ns/op	       262.8 µs-median/op	       998.1 µs-p90/op	     812 B/op	       9 allocs/op
BenchmarkFIP/Apply/N=10000        	       5	 812345678 ns/op	  123456 B/op	    1234 allocs/op
BenchmarkNoMem-2    	     300	   1523 ns/op
--- BENCH: something
PASS
ok  	github.com/natgw/natgw/nat/nftables	12.3s
`
	got := parseBench(out)
	want := []benchResult{
		{Name: "FIP/Apply/N=0", N: 300, NsPerOp: 14213, BytesPerOp: 5120, AllocsPerOp: 61},
		{Name: "FIP/Delete/N=10000", N: 300, NsPerOp: 1523456.5, BytesPerOp: 812, AllocsPerOp: 9},
		{Name: "FIP/Apply/N=10000", N: 5, NsPerOp: 812345678, BytesPerOp: 123456, AllocsPerOp: 1234},
	}
	if len(got) != len(want) {
		t.Fatalf("parsed %d lines, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if rs := parseBench("PASS\nok x 1s\n"); len(rs) != 0 {
		t.Errorf("parsed %d results from output without benchmarks", len(rs))
	}
}
