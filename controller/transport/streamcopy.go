package transport

import (
	"errors"
	"io"
	"sync"
)

// quietCopy is the writer the exec transport gives client-go's remote
// command stream for the agent's stdout and stderr. client-go copies each
// of them with io.Copy for the session's life, and io.Copy reads through
// the destination's ReadFrom when it has one: this one reads into a
// 512-byte buffer while the stream is quiet (where an idle session waits
// for the agent's next line) and into a pooled 32 KiB buffer while reads
// fill their buffer, instead of io.Copy's own 32 KiB buffer, which every
// session would hold, twice, while idle.
type quietCopy struct{ w io.Writer }

// quietSmall is what a quiet copy reads into.
const quietSmall = 512

// copyBufs holds the 32 KiB buffers of copies that are moving data.
var copyBufs = sync.Pool{New: func() any {
	b := make([]byte, 32<<10)
	return &b
}}

// Write writes p to the destination.
func (q quietCopy) Write(p []byte) (int, error) { return q.w.Write(p) }

// ReadFrom copies r to the destination until r ends (nil at io.EOF, as
// io.Copy).
func (q quietCopy) ReadFrom(r io.Reader) (int64, error) {
	small := make([]byte, quietSmall)
	buf := small
	var big *[]byte
	defer func() {
		if big != nil {
			copyBufs.Put(big)
		}
	}()
	var n int64
	for {
		k, err := r.Read(buf)
		if k > 0 {
			w, werr := q.w.Write(buf[:k])
			n += int64(w)
			if werr != nil {
				return n, werr
			}
			if w != k {
				return n, io.ErrShortWrite
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			return n, err
		}
		// A read that filled its buffer says more is coming: the next
		// one goes to the large buffer; one that did not (the stream is
		// drained, perhaps quiet now) sends the next to the small one,
		// which is where a copy waits while the agent is idle.
		switch {
		case big == nil && k == len(small):
			big = copyBufs.Get().(*[]byte)
			buf = *big
		case big != nil && k < len(buf):
			copyBufs.Put(big)
			big, buf = nil, small
		}
	}
}
