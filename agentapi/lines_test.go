package agentapi

import (
	"bytes"
	"runtime"
	"testing"
)

// TestLineReaderSizeHint: a line of the size of the last large one is read
// into one buffer of about its size (not doubled up to it), lines stay
// intact, and a much shorter line after a long one allocates no more than
// doubling would.
func TestLineReaderSizeHint(t *testing.T) {
	long := bytes.Repeat([]byte("0123456789abcdef"), 3<<20/16) // 3 MiB
	short := bytes.Repeat([]byte("x"), 200<<10)
	r := &pipeLike{}
	lr := newLineReader(r, MaxLineBytes)
	// Each line comes alone, as a request the agent answers before the
	// next is sent: the buffer of the last one is not kept.
	read := func(want []byte) (allocated uint64) {
		t.Helper()
		r.rest = append(append([]byte(nil), want...), '\n')
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		l, err := lr.next()
		runtime.ReadMemStats(&after)
		if err != nil || !bytes.Equal(l.data, want) {
			t.Fatalf("line of %d bytes (%v), want %d", len(l.data), err, len(want))
		}
		return after.TotalAlloc - before.TotalAlloc
	}
	first := read(long)
	second := read(long)
	if limit := uint64(len(long)) * 3 / 2; second > limit || second >= first {
		t.Errorf("second line of %d bytes allocated %d bytes (first %d), want at most %d and less than the first", len(long), second, first, limit)
	}
	if got := read(short); got > 4*uint64(len(short)) {
		t.Errorf("short line of %d bytes after long ones allocated %d bytes, want at most %d", len(short), got, 4*len(short))
	}
}
