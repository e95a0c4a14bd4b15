package transport

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

// TestQuietCopy: what io.Copy through quietCopy delivers is the stream,
// byte for byte, whatever the sizes of the writes that made it (quiet
// lines, buffer-filling bursts, everything between); the end of the
// stream ends it without error, a failed write ends it with that error.
func TestQuietCopy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var want bytes.Buffer
	var chunks [][]byte
	for want.Len() < 3<<20 {
		size := []int{1, 100, quietSmall - 1, quietSmall, quietSmall + 1, 32 << 10, 32<<10 + 7, 100 << 10}[rng.IntN(8)]
		c := make([]byte, size)
		for i := range c {
			c[i] = byte(rng.Uint32())
		}
		chunks = append(chunks, c)
		want.Write(c)
	}
	r, w := io.Pipe()
	go func() {
		for _, c := range chunks {
			if _, err := w.Write(c); err != nil {
				return
			}
		}
		w.Close()
	}()
	var got bytes.Buffer
	n, err := io.Copy(quietCopy{&got}, r)
	if err != nil || n != int64(want.Len()) || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Fatalf("copied %d bytes, %v; want the %d bytes written (equal: %v)", n, err, want.Len(), bytes.Equal(got.Bytes(), want.Bytes()))
	}

	broken := errors.New("destination gone")
	r2, w2 := io.Pipe()
	go func() { _, _ = w2.Write(make([]byte, 2000)) }()
	if _, err := io.Copy(quietCopy{failWriter{broken}}, r2); !errors.Is(err, broken) {
		t.Fatalf("copy to a failing writer = %v, want its error", err)
	}
	r2.Close()
}

type failWriter struct{ err error }

func (f failWriter) Write([]byte) (int, error) { return 0, f.err }
