package agentapi

import (
	"bytes"
	"errors"
	"io"
	"os"
	"sync"
)

// prefixKeep is how much of an over-long line is kept, to recover its
// request id (see idFromPrefix).
const prefixKeep = 128

// keepBuf is the largest line buffer kept between lines by next.
const keepBuf = 1 << 20

// idleBuf is the size of a lineReader's own buffer, the only one it holds
// once release gave its larger buffer back: what an idle session keeps,
// and where a reader waiting for the next line reads into. Short lines
// (every response but a list's) fit in it.
const idleBuf = 512

// poolBuf is the size of the pooled buffers a line that outgrows idleBuf
// continues in (a reader that needs more grows its own, by doubling).
const poolBuf = 64 << 10

// bufs holds poolBuf-sized buffers between the lines of all readers: one
// session per gateway, most idle, share the few that calls use at a time.
var bufs = sync.Pool{New: func() any {
	b := make([]byte, 0, poolBuf)
	return &b
}}

// lineReader reads newline-terminated lines of at most max bytes. A longer
// line is not buffered: its bytes are discarded up to the next newline and
// reported as an overflow, keeping only a short prefix.
//
// It reads straight into its line buffer (no bufio.Reader in front), and
// while waiting for a line it reads into its own small buffer (idleBuf):
// a reader that waits, or is idle after release, holds no large buffer.
type lineReader struct {
	r   io.Reader
	max int
	// buf[off:] is read and not yet returned; no newline is in its first
	// scan bytes. buf is small[:] unless the line outgrew it: then a
	// pooled buffer (pooled points at it, for its return) or a larger one.
	buf    []byte
	off    int
	scan   int
	pooled *[]byte
	err    error // the last read's error, returned once buf holds no line
	empty  int   // reads in a row that returned nothing
	// cur is the line being read; resume says a read deadline cut it
	// short and the next call goes on with it.
	cur    line
	resume bool
	// last is the length of the last line that outgrew poolBuf: grow
	// goes straight to about that size once a line has come within
	// hintReach of it, instead of doubling (and copying) all the way.
	last int
	// onData, when set, is called after each read that returned bytes
	// (Serve: input arrived, so a memory release waits).
	onData func()
	small  [idleBuf]byte
}

// hintReach: grow jumps to the last large line's size once the buffer
// it would double to is at least that size / hintReach. Lines of a
// similar size (a controller's syncs of the same gateway) then cost one
// large buffer and a few small copies; a much shorter line after a long
// one doubles as before, never allocating the long one's size.
const hintReach = 8

func newLineReader(r io.Reader, max int) *lineReader {
	lr := &lineReader{r: r, max: max}
	lr.buf = lr.small[:0]
	return lr
}

// line is one line read by lineReader.
type line struct {
	data     []byte // the line without its newline (nil when overflowed)
	overflow int64  // >0: the line was this many bytes long (more than max) and was dropped
	prefix   []byte // the first bytes of an overflowed line
}

// next returns the next line. A last line without a newline before EOF is
// returned as a line; io.EOF comes only when nothing is left. The returned
// data is valid until the next call (of next or release).
//
// When the underlying reader's deadline passes (os.ErrDeadlineExceeded),
// the bytes of the line read so far are kept and the next call goes on with
// them, so a read given up on does not lose a partly received line.
func (lr *lineReader) next() (line, error) {
	if !lr.resume {
		lr.cur = line{}
		if lr.off == len(lr.buf) && cap(lr.buf) > keepBuf {
			lr.shrink() // do not hold on to the memory of one huge line
		}
	}
	lr.resume = false
	for {
		pending := lr.buf[lr.off:]
		if lr.cur.overflow > 0 {
			// Skipping an over-long line: count its bytes up to the newline.
			if i := bytes.IndexByte(pending, '\n'); i >= 0 {
				lr.cur.overflow += int64(i + 1)
				lr.off += i + 1
				return lr.cur, nil
			}
			lr.cur.overflow += int64(len(pending))
			lr.buf, lr.off = lr.buf[:0], 0
			pending = nil
		} else if i := bytes.IndexByte(pending[lr.scan:], '\n'); i >= 0 {
			end := lr.scan + i
			lr.off += end + 1
			lr.scan = 0
			if end > lr.max {
				return line{overflow: int64(end + 1), prefix: append([]byte(nil), pending[:min(prefixKeep, end+1)]...)}, nil
			}
			if end >= poolBuf {
				lr.last = end + 1
			}
			return line{data: bytes.TrimSuffix(pending[:end], []byte{'\r'})}, nil
		} else if len(pending) > lr.max {
			lr.cur = line{overflow: int64(len(pending)), prefix: append([]byte(nil), pending[:min(prefixKeep, len(pending))]...)}
			lr.buf, lr.off, lr.scan = lr.buf[:0], 0, 0
			pending = nil
		} else {
			lr.scan = len(pending)
		}
		if err := lr.err; err != nil {
			switch {
			case errors.Is(err, io.EOF):
				// EOF stays: every later call ends the same way.
				if lr.cur.overflow > 0 {
					l := lr.cur
					lr.cur = line{}
					return l, nil
				}
				if len(pending) == 0 {
					return line{}, io.EOF
				}
				lr.off, lr.scan = len(lr.buf), 0
				return line{data: bytes.TrimSuffix(pending, []byte{'\r'})}, nil
			case errors.Is(err, os.ErrDeadlineExceeded):
				lr.err = nil
				lr.resume = true
				return line{}, err
			default:
				return line{}, err
			}
		}
		lr.fill()
	}
}

// fill makes room after the pending bytes and reads once into it.
func (lr *lineReader) fill() {
	if len(lr.buf) == cap(lr.buf) {
		if lr.off > 0 {
			n := copy(lr.buf, lr.buf[lr.off:])
			lr.buf, lr.off = lr.buf[:n], 0
		}
		if len(lr.buf) == cap(lr.buf) {
			lr.grow()
		}
	}
	n, err := lr.r.Read(lr.buf[len(lr.buf):cap(lr.buf)])
	lr.buf = lr.buf[:len(lr.buf)+n]
	switch {
	case err != nil:
		lr.err = err
	case n == 0:
		if lr.empty++; lr.empty >= 100 {
			lr.err = io.ErrNoProgress
		}
	default:
		lr.empty = 0
	}
	if n > 0 && lr.onData != nil {
		lr.onData()
	}
}

// grow moves the pending bytes (off is 0) to a buffer twice as large: a
// pooled one when that is large enough, else one of its own, at most
// max+1 bytes (a line longer than max is not buffered). Near the size
// of the last large line it goes to that size and an eighth at once
// (see last).
func (lr *lineReader) grow() {
	size := max(2*cap(lr.buf), poolBuf)
	if size > poolBuf && size < lr.last && size*hintReach >= lr.last {
		size = lr.last + lr.last/8
	}
	var grown []byte
	var pooled *[]byte
	if size == poolBuf && poolBuf <= lr.max+1 {
		pooled = bufs.Get().(*[]byte)
		grown = (*pooled)[:0]
	} else {
		grown = make([]byte, 0, min(size, lr.max+1))
	}
	grown = append(grown, lr.buf...)
	lr.putPooled()
	lr.buf, lr.pooled = grown, pooled
}

// putPooled returns the pooled buffer, if buf is one.
func (lr *lineReader) putPooled() {
	if lr.pooled != nil {
		*lr.pooled = (*lr.pooled)[:0]
		bufs.Put(lr.pooled)
		lr.pooled = nil
	}
}

// shrink goes back to the reader's own small buffer. Nothing is pending.
func (lr *lineReader) shrink() {
	lr.putPooled()
	lr.buf, lr.off, lr.scan = lr.small[:0], 0, 0
}

// release gives back the line buffer once the last line was used and
// nothing more is pending: a Client holding one session per gateway would
// otherwise keep a buffer per session (and the memory of each gateway's
// last List response, hundreds of KiB at 1k objects) until its next call.
// A partly read line is kept.
func (lr *lineReader) release() {
	if !lr.resume && lr.off == len(lr.buf) {
		lr.shrink()
	}
}

// idFromPrefix recovers the request id from the beginning of a line that
// could not be decoded (over-long or malformed), so that the error response
// can name it: it accepts `{"id":123` with optional spaces, the form Client
// writes. complete says p is the whole line rather than a cut-off prefix (a
// number running into the cut is not trusted). It returns 0, false when the
// line does not start like that.
func idFromPrefix(p []byte, complete bool) (uint64, bool) {
	p = bytes.TrimLeft(p, " \t")
	if len(p) == 0 || p[0] != '{' {
		return 0, false
	}
	p = bytes.TrimLeft(p[1:], " \t")
	if !bytes.HasPrefix(p, []byte(`"id"`)) {
		return 0, false
	}
	p = bytes.TrimLeft(p[4:], " \t")
	if len(p) == 0 || p[0] != ':' {
		return 0, false
	}
	p = bytes.TrimLeft(p[1:], " \t")
	var id uint64
	n := 0
	for _, c := range p {
		if c < '0' || c > '9' {
			break
		}
		d := uint64(c - '0')
		if id > (^uint64(0)-d)/10 {
			return 0, false // overflow
		}
		id = id*10 + d
		n++
	}
	if n == 0 || n == len(p) && !complete {
		return 0, false
	}
	if n < len(p) {
		switch p[n] {
		case ',', '}', ' ', '\t':
		default:
			return 0, false
		}
	}
	return id, true
}
